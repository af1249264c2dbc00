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

use crate::audit::event::{ProcessOutcome, StepDetails};
use crate::procs::{self, SignalResult};
use crate::snapshot::Snapshot;

use super::alert::{Alert, Status};
use crate::changes::{Acting, NvmlGuard};
use crate::config::remediation::ActionKind;
use crate::snapshot::GpuSnapshot;

/// What an action did: the metric's result label and the details for the audit log.
pub struct ActionOutput {
    pub result: &'static str,
    pub details: StepDetails,
    /// The GPU acted on, when the action names it in its record (`signal_processes`).
    pub gpu: Option<u32>,
    pub duration: std::time::Duration,
}

fn error(e: impl Into<String>) -> StepDetails {
    StepDetails {
        error: Some(e.into()),
        ..StepDetails::default()
    }
}

pub fn run(
    kind: ActionKind,
    alert: &Alert,
    snapshot: &Snapshot,
    procfs: &Path,
    acting: &Acting<'_>,
) -> ActionOutput {
    let started = Instant::now();
    let mut acted_on = None;
    let (result, details) = match target(alert, snapshot) {
        None => (
            "error",
            error("the alert names no GPU of this node (labels uuid/UUID or gpu)"),
        ),
        Some(gpu) => {
            let firing = alert.status == Status::Firing;
            match kind {
                ActionKind::SignalProcesses(sig) if firing => {
                    let (result, details) = signal_processes(gpu, procfs, sig);
                    if details.processes.is_some() {
                        acted_on = Some(gpu.index);
                    }
                    (result, details)
                }
                ActionKind::SignalProcesses(_) => (
                    "success",
                    StepDetails {
                        skipped: Some("resolved".into()),
                        ..StepDetails::default()
                    },
                ),
                ActionKind::PowerLimit(w) => {
                    let want = firing.then_some(w);
                    written(session(acting).and_then(|nvml| {
                        nvml.session()
                            .set_power_limit(gpu.uuid(), want)
                            .map(|now| StepDetails {
                                uuid: Some(gpu.uuid().to_string()),
                                requested_watts: Some(want),
                                power_limit_watts: Some(now),
                                ..StepDetails::default()
                            })
                            .map_err(|e| e.to_string())
                    }))
                }
                ActionKind::Fence => written(session(acting).and_then(|nvml| {
                    nvml.session()
                        .fence(gpu.uuid(), firing)
                        .map(|now| StepDetails {
                            uuid: Some(gpu.uuid().to_string()),
                            compute_mode: Some(now),
                            ..StepDetails::default()
                        })
                        .map_err(|e| e.to_string())
                })),
            }
        }
    };
    ActionOutput {
        result,
        details,
        gpu: acted_on,
        duration: started.elapsed(),
    }
}

/// The owner's NVML write session (one per process, shared by the changes that write).
fn session(acting: &Acting<'_>) -> Result<NvmlGuard, String> {
    acting
        .nvml()
        .map_err(|e| format!("cannot open NVML to write: {e}"))
}

fn written(r: Result<StepDetails, String>) -> (&'static str, StepDetails) {
    match r {
        Ok(v) => ("success", v),
        Err(e) => ("failure", error(e)),
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
) -> (&'static str, StepDetails) {
    let Some(processes) = &gpu.reading.processes else {
        return (
            "error",
            error("the GPU's process list is unknown (NVML did not give it)"),
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
        outcomes.push(ProcessOutcome {
            outcome,
            pid: p.pid,
        });
    }
    (
        if failed { "failure" } else { "success" },
        StepDetails {
            processes: Some(outcomes),
            signal: Some(sig.as_str().to_string()),
            uuid: Some(gpu.uuid().to_string()),
            ..StepDetails::default()
        },
    )
}
