//! Sharing GPUs: time-slicing on the node (compute mode through NVML, time-slice length through
//! `nvidia-smi compute-policy`) and in Kubernetes (a device plugin that advertises replicas,
//! fed by the agent's own health verdicts).
//!
//! - `[sharing]` and k8s-device-plugin's YAML are configuration data, read once at load:
//!   [`crate::config::sharing`].
//! - [`plan`]: observe → diff (pure); [`apply`]: the steps, with undo on failure and audit;
//!   [`change`]: an apply as a change the owner of changes runs (the node lock, its session);
//!   [`timeslice`]: the `nvidia-smi compute-policy` backend.
//! - [`service`]: the daemon's handle (applies at start, SIGHUP and API); [`status`]: what it,
//!   the plugin and the guard publish for metrics.
//! - [`plugin`]: the Kubernetes device plugin; [`guard`]: the replica memory guard;
//!   [`preferred`]: the topology-aware choice of whole GPUs (pure).
//!
//! Nothing here runs unless `[sharing]` asks for it: without compute mode or time-slice keys
//! the node is left as it is, and the device plugin is off until
//! `[sharing.device_plugin] enabled = true`.

pub mod apply;
pub mod change;
pub mod guard;
pub mod plan;
pub mod plugin;
pub mod preferred;
pub mod service;
pub mod status;
pub mod timeslice;

pub use crate::config::sharing::{
    Devices, GpuSelector, NodeSettings, SharedResource, SharingConfig, TimeSlicing, Timeslice,
};
pub use service::Sharing;
pub use status::{SharingFeed, StatusSink};
