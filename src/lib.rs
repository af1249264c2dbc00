//! gpu-steward: a node-local GPU agent.
//!
//! It polls NVML (one worker thread per GPU, reads tiered by cost), publishes an immutable
//! snapshot each interval, and serves dcgm-exporter compatible and native Prometheus metrics and
//! an honest health API from it.
//!
//! # Layout
//!
//! From the bottom up; every arrow points down, at folder level too (ten floors, none back up).
//! The layers, who owns what and the import rules are in `docs/architecture.md`;
//! `layers_tests` checks them against the source.
//!
//! - Data: [`snapshot`] (the immutable view of the node at one instant; imports nothing of the
//!   crate); [`config`]: one validated `Config` from file, environment and flags, plain data
//!   that imports no subsystem: every section type with its defaults lives there, and the files
//!   the configuration names (drop-ins, mig-parted and device-plugin YAML, web config and TLS
//!   files) are read once at load through [`bounded`].
//! - Boundaries: [`gpu`] (the only module that names `nvml_wrapper`: plain data and typed
//!   errors out, the table of reads and their cost tiers), [`attribution`] (process owners from
//!   procfs), [`kubernetes`] (the kubelet pod-resources client) over [`grpc`] (the one
//!   gRPC-over-Unix-socket client), [`audit`], [`exec`], [`procs`], [`shutdown`] (the stop
//!   budget and the stop flag that blocking changes read).
//! - [`health`] (pure verdicts over snapshots: per-GPU health and actions, readiness), [`mig`]
//!   (MIG layouts, mig-parted compatible: planner, applier, the node lock), and
//!   [`publication`] (what each poll publishes: snapshot, health, journal and the page).
//! - [`changes`]: the one owner of changes to the node, in the daemon and the CLI alike: one
//!   audit writer, one NVML write session, the node lock; typed requests (MIG and sharing
//!   applies, Slurm drains) and decisions on record (reclaim, remediation, the memory guard).
//!   It is given its settings and a waker for the poller, and imports neither.
//! - [`metrics`]: renders a snapshot into the page once per poll (dcgm family, native family,
//!   agent), indexing each series as it writes it, and collects the actors' series through
//!   [`metrics::Collector`].
//! - [`poller`]: observe (per-GPU workers) → enrich → judge → render → publish. It calls no
//!   actor: the actors hand it their collectors and findings once, at start.
//! - Actors that receive publications: [`remediation`] (routes, safety rails, hooks and
//!   built-in actions), [`reclaim`] (idle GPUs and per-owner accounting), [`sharing`]
//!   (time-slicing, the memory guard and the Kubernetes device plugin; its apply as a change),
//!   [`slurm`] (drain on a failed GPU; its change) and [`nvsentinel`]; [`rules`] (Prometheus
//!   alerting rules over the page's index of its series, and `rules::served::load`, the one
//!   builder of the configuration and its rule set).
//! - [`http`]: the axum router and its server (`/metrics`, `/health*`, `/livez`, `/readyz`,
//!   `/api/v1`), reading publications and the actors' handles.
//! - [`cli`]: the command line and its subcommands; [`app`]: wiring, signals, graceful
//!   shutdown; [`logging`]; [`human`] (durations written for people); [`demo`].

pub mod app;
pub mod attribution;
pub mod audit;
pub mod bounded;
pub mod changes;
pub mod cli;
pub mod config;
pub mod demo;
pub mod exec;
pub mod gpu;
pub mod grpc;
pub mod health;
pub mod http;
pub mod human;
pub mod kubernetes;
pub mod logging;
pub mod metrics;
pub mod mig;
pub mod nvsentinel;
pub mod poller;
pub mod port_holder;
pub mod procs;
pub mod publication;
pub mod reclaim;
pub mod remediation;
pub mod rules;
pub mod sharing;
pub mod shutdown;
pub mod slurm;
pub mod snapshot;
pub mod terminal;
pub mod warnings;

/// The import rules of docs/architecture.md, checked against the source.
#[cfg(test)]
mod layers_tests;

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
