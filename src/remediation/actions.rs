//! Built-in actions: what a hook would do, done by the agent itself where it already knows the
//! answer. `signal_processes` signals every process NVML lists on the alert's GPU in the newest
//! snapshot; each PID's identity (PID and start time) is read just before and re-checked by
//! [`crate::procs::signal_verified`], so a PID reused since the poll is never hit.
//!
//! Blocking (procfs reads); run it on a blocking thread.

use std::path::Path;
use std::time::Instant;

use serde_json::{json, Value};

use crate::procs::{self, SignalResult};
use crate::snapshot::Snapshot;

use super::alert::Alert;
use super::config::ActionKind;

/// What an action did: the metric's result label and the details for the audit log.
pub struct ActionOutput {
    pub result: &'static str,
    pub details: Value,
    pub duration: std::time::Duration,
}

pub fn run(kind: ActionKind, alert: &Alert, snapshot: &Snapshot, procfs: &Path) -> ActionOutput {
    let started = Instant::now();
    let (result, details) = match kind {
        ActionKind::SignalProcesses(sig) => signal_processes(alert, snapshot, procfs, sig),
    };
    ActionOutput {
        result,
        details,
        duration: started.elapsed(),
    }
}

fn signal_processes(
    alert: &Alert,
    snapshot: &Snapshot,
    procfs: &Path,
    sig: nix::sys::signal::Signal,
) -> (&'static str, Value) {
    let gpu = snapshot.gpus.iter().find(|g| match alert.gpu_uuid() {
        Some(uuid) => g.uuid() == uuid,
        None => alert.gpu().and_then(|i| i.parse().ok()) == Some(g.index),
    });
    let Some(gpu) = gpu else {
        return (
            "error",
            json!({"error": "the alert names no GPU of this node (labels uuid/UUID or gpu)"}),
        );
    };
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
