//! Idle GPUs: detection, the report → warn → reclaim ladder, and per-owner accounting.
//!
//! - [`idle`]: idleness per GPU and MIG instance, a pure function over successive snapshots;
//! - [`ladder`]: which step is due for which unit, pure, with exemptions and the hourly limit;
//! - `[reclaim]` and `[accounting]` are configuration data: [`crate::config::reclaim`];
//! - [`replay`]: the hourly count read back from the audit log at start;
//! - [`stage`]: what reclaim keeps across polls, run once per publication by [`task`], the
//!   actor that receives publications and hands on its view, findings and series;
//! - [`jobs`]: what each owner used (per-job GPU reports), folded by [`task`] from each
//!   publication and the steps of its run, kept in the state directory.
//!
//! Decisions are pure; everything that touches the node (hooks, signals) is elsewhere and is
//! off unless `[reclaim] enabled = true` and `dry_run = false`.

pub mod accounting;
pub mod act;
pub mod cri;
pub mod idle;
pub mod jobs;
pub mod ladder;
pub mod metrics;
pub mod replay;
pub mod stage;
pub mod task;

#[cfg(test)]
pub(crate) mod testkit;

pub use crate::config::reclaim::{AccountingConfig, ActionKind, ReclaimConfig};
pub use stage::{Settings, View};
pub use task::Reclaim;
