//! gpu-steward: a node-local GPU agent.
//!
//! It polls NVML (one worker thread per GPU, reads tiered by cost), publishes an immutable
//! snapshot each interval, and serves dcgm-exporter compatible and native Prometheus metrics and
//! an honest health API from it.
//!
//! # Layout
//!
//! - [`cli`]: command line (clap); [`config`]: one validated `Config` from file, env and flags.
//! - [`gpu`]: the NVML boundary, the only module that names `nvml_wrapper`; plain data and
//!   typed errors out; the table of reads and their cost tiers.
//! - [`poller`]: observe (per-GPU workers) → enrich → judge → render → publish `Published`.
//! - [`snapshot`]: the immutable view of the node at one instant; plain data, imports nothing.
//! - [`metrics`]: renders the snapshot once per poll (dcgm family, native family, agent).
//! - [`attribution`]: process name, user and owner (container, pod, unit, Slurm job) from procfs.
//! - [`kubernetes`]: the kubelet pod-resources client (GPU → pod, namespace, container).
//! - [`health`]: pure verdicts (agent readiness, per-GPU health and actions).
//! - [`reclaim`]: idle GPUs (pure idleness and ladder, the acting path) and per-owner accounting;
//!   a stage of the poll between enrich and judge.
//! - [`http`]: the axum router (`/metrics`, `/health*`, `/livez`, `/readyz`, `/`).
//! - [`mig`]: MIG layouts (mig-parted compatible), the planner and the applier.
//! - [`sharing`]: time-slicing (compute mode, time-slice length) and the Kubernetes device
//!   plugin.
//! - [`app`]: wiring, signals, graceful shutdown; [`shutdown`]: the stop budget and the stop
//!   flag that blocking changes (a MIG apply, a hook) read; [`logging`]; [`demo`].
//! - Shared by everything that changes the node: [`audit`] (the fsynced JSON-lines log of
//!   decisions), [`exec`] (hooks: argv, no shell, process group, timeout, bounded output),
//!   [`procs`] (signals checked against the process start time), `http::api` (the API switch
//!   and its bearer token).
//! - [`rules`]: Prometheus alerting rules evaluated over the agent's own published series;
//!   [`remediation`]: routes, safety rails, hooks and built-in actions for the alerts of the
//!   rules and of Alertmanager's webhook.
//!
//! Dependencies point one way: `app` → `http`/`poller` → `metrics`/`health` → `snapshot`;
//! `poller` → `gpu`/`attribution`/`kubernetes` → `snapshot`; `app` → `rules` → `remediation`
//! → `exec`/`audit`/`procs`/`snapshot`.

pub mod app;
pub mod attribution;
pub mod audit;
pub mod cli;
pub mod config;
pub mod demo;
pub mod exec;
pub mod gpu;
pub mod health;
pub mod http;
pub mod kubernetes;
pub mod logging;
pub mod metrics;
pub mod mig;
pub mod poller;
pub mod procs;
pub mod publication;
pub mod reclaim;
pub mod remediation;
pub mod rules;
pub mod sharing;
pub mod shutdown;
pub mod snapshot;

use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

/// Counters the rest of the agent bumps and the metrics renderer reads.
#[derive(Debug)]
pub struct AgentCounters {
    pub started_at: SystemTime,
    pub reloads_ok: AtomicU64,
    pub reloads_failed: AtomicU64,
}

impl AgentCounters {
    pub fn new() -> Self {
        AgentCounters {
            started_at: SystemTime::now(),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
        }
    }
}

impl Default for AgentCounters {
    fn default() -> Self {
        Self::new()
    }
}
