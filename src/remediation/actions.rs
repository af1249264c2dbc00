//! Built-in actions: what a hook would do, done by the agent itself where it already knows the
//! answer.
//!
//! - `signal_processes` signals every process NVML lists on the alert's GPU in the newest
//!   snapshot; each PID's identity (PID and start time) is read just before and re-checked by
//!   [`crate::procs::signal_verified`], so a PID reused since the poll is never hit. Nothing is
//!   undone on resolution.
//! - `power_limit` sets the GPU's power limit; on resolution, back to the default limit.
//! - `fence` sets compute mode `PROHIBITED` (no new CUDA contexts); on resolution, `DEFAULT`.
//!
//! Blocking (procfs reads, NVML writes on the owner of changes' session, [`Acting::nvml`]);
//! run on a blocking thread, as a change the owner has recorded.

use std::path::Path;
use std::time::Instant;

use serde_json::{json, Value};

use crate::procs::{self, SignalResult};
use crate::snapshot::Snapshot;

use super::alert::{Alert, Status};
use crate::changes::{Acting, NvmlGuard};
use crate::config::remediation::ActionKind;
use crate::snapshot::GpuSnapshot;

/// What an action did: the metric's result label and the details for the audit log.
pub struct ActionOutput {
    pub result: &'static str,
    pub details: Value,
    pub duration: std::time::Duration,
}

pub fn run(
    kind: ActionKind,
    alert: &Alert,
    snapshot: &Snapshot,
    procfs: &Path,
    acting: &Acting<'_>,
) -> ActionOutput {
    let started = Instant::now();
    let (result, details) = match target(alert, snapshot) {
        None => (
            "error",
            json!({"error": "the alert names no GPU of this node (labels uuid/UUID or gpu)"}),
        ),
        Some(gpu) => {
            let firing = alert.status == Status::Firing;
            match kind {
                ActionKind::SignalProcesses(sig) if firing => signal_processes(gpu, procfs, sig),
                ActionKind::SignalProcesses(_) => ("success", json!({"skipped": "resolved"})),
                ActionKind::PowerLimit(w) => {
                    let want = firing.then_some(w);
                    written(session(acting).and_then(|nvml| {
                        nvml.session()
                            .set_power_limit(gpu.uuid(), want)
                            .map(|now| json!({"uuid": gpu.uuid(), "requested_watts": want, "power_limit_watts": now}))
                            .map_err(|e| e.to_string())
                    }))
                }
                ActionKind::Fence => written(session(acting).and_then(|nvml| {
                    nvml.session()
                        .fence(gpu.uuid(), firing)
                        .map(|now| json!({"uuid": gpu.uuid(), "compute_mode": now}))
                        .map_err(|e| e.to_string())
                })),
            }
        }
    };
    ActionOutput {
        result,
        details,
        duration: started.elapsed(),
    }
}

/// The owner's NVML write session (one per process, shared by the changes that write).
fn session(acting: &Acting<'_>) -> Result<NvmlGuard, String> {
    acting
        .nvml()
        .map_err(|e| format!("cannot open NVML to write: {e}"))
}

fn written(r: Result<Value, String>) -> (&'static str, Value) {
    match r {
        Ok(v) => ("success", v),
        Err(e) => ("failure", json!({"error": e})),
    }
}

/// The GPU an alert is about: by its `uuid`/`UUID` label, else its `gpu` index.
fn target<'s>(alert: &Alert, snapshot: &'s Snapshot) -> Option<&'s GpuSnapshot> {
    snapshot.gpus.iter().find(|g| match alert.gpu_uuid() {
        Some(uuid) => g.uuid() == uuid,
        None => alert.gpu().and_then(|i| i.parse().ok()) == Some(g.index),
    })
}

fn signal_processes(
    gpu: &GpuSnapshot,
    procfs: &Path,
    sig: nix::sys::signal::Signal,
) -> (&'static str, Value) {
    let Some(processes) = &gpu.reading.processes else {
        return (
            "error",
            json!({"error": "the GPU's process list is unknown (NVML did not give it)"}),
        );
    };
    let mut outcomes = Vec::new();
    let mut failed = false;
    for p in processes {
        let outcome = match procs::identify(procfs, p.pid) {
            None => "gone".to_string(),
            Some(who) => match procs::signal_verified(procfs, &who, sig) {
                SignalResult::Sent => "sent".to_string(),
                SignalResult::Gone => "gone".to_string(),
                SignalResult::Replaced => "replaced".to_string(),
                SignalResult::Failed(e) => {
                    failed = true;
                    format!("failed: {e}")
                }
            },
        };
        outcomes.push(json!({"pid": p.pid, "outcome": outcome}));
    }
    (
        if failed { "failure" } else { "success" },
        json!({"signal": sig.as_str(), "gpu": gpu.index, "uuid": gpu.uuid(), "processes": outcomes}),
    )
}
