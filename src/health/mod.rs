//! Verdicts: is the agent ready, and is each GPU healthy, and what should an operator do.
//!
//! Pure functions of a snapshot and the time, so they are tested without a runtime or a GPU.
//! The agent's own status (NVML up, snapshot fresh) is kept apart from GPU verdicts: a sick GPU
//! must keep being scraped, so it never makes the agent unready.

use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::snapshot::{GpuSnapshot, GpuStatus, NvmlStatus, Snapshot};

/// Health status as the draft RFC "Health Check Response Format for HTTP APIs" spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Warn,
    Fail,
}

/// What an operator (or a remediation hook) should do about a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    None,
    RestartApp,
    ResetGpu,
    RebootNode,
    DrainAndReset,
    ContactSupport,
}

/// One active condition on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Condition {
    pub name: &'static str,
    pub severity: Status,
    pub reason: String,
    pub action: Action,
}

/// A GPU's verdict: the worst condition decides the status and the action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuVerdict {
    pub status: Status,
    pub conditions: Vec<Condition>,
    pub action: Action,
}

/// Evaluates one GPU of a snapshot.
pub fn evaluate_gpu(gpu: &GpuSnapshot) -> GpuVerdict {
    let mut conditions = Vec::new();
    match &gpu.status {
        GpuStatus::Up => {}
        GpuStatus::Lost => conditions.push(Condition {
            name: "gpu_lost",
            severity: Status::Fail,
            reason: "NVML reports the GPU as lost (fallen off the bus or inaccessible)".into(),
            // NVIDIA's XID catalog buckets XID 79 (fallen off the bus) as RESTART_BM.
            action: Action::RebootNode,
        }),
        GpuStatus::Unreadable(why) => conditions.push(Condition {
            name: "gpu_unreadable",
            severity: Status::Fail,
            reason: why.clone(),
            action: Action::ResetGpu,
        }),
    }
    verdict(conditions)
}

fn verdict(conditions: Vec<Condition>) -> GpuVerdict {
    let status = conditions
        .iter()
        .map(|c| c.severity)
        .max()
        .unwrap_or(Status::Pass);
    let action = conditions
        .iter()
        .map(|c| c.action)
        .max()
        .unwrap_or(Action::None);
    GpuVerdict {
        status,
        conditions,
        action,
    }
}

/// Whether the agent can serve trustworthy data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Readiness {
    pub ready: bool,
    /// `pass` when ready with every source answering, `warn` when ready but some NVML source
    /// failed in the last poll, `fail` when not ready.
    pub status: Status,
    pub reason: String,
    pub snapshot_age: Duration,
}

/// Ready once NVML is initialised and the newest snapshot is younger than 3 poll intervals.
pub fn readiness(snapshot: &Snapshot, interval: Duration, now: SystemTime) -> Readiness {
    let age = now.duration_since(snapshot.taken_at).unwrap_or_default();
    let not_ready = |reason: String| Readiness {
        ready: false,
        status: Status::Fail,
        reason,
        snapshot_age: age,
    };
    match &snapshot.nvml {
        NvmlStatus::Starting => return not_ready("no poll has completed yet".into()),
        NvmlStatus::Down {
            reason, attempts, ..
        } => {
            return not_ready(format!(
                "NVML is not initialised ({attempts} attempts so far): {reason}"
            ))
        }
        NvmlStatus::Up => {}
    }
    let limit = interval * 3;
    if age >= limit {
        return not_ready(format!(
            "the newest snapshot is {:.1}s old, older than 3 poll intervals ({:.1}s): the \
             poller is stuck, probably in an NVML call",
            age.as_secs_f64(),
            limit.as_secs_f64()
        ));
    }
    let failing: Vec<&str> = snapshot
        .sources
        .iter()
        .filter(|(_, s)| !s.success)
        .map(|(name, _)| *name)
        .collect();
    if failing.is_empty() {
        Readiness {
            ready: true,
            status: Status::Pass,
            reason: "NVML is up and the snapshot is fresh".into(),
            snapshot_age: age,
        }
    } else {
        Readiness {
            ready: true,
            status: Status::Warn,
            reason: format!(
                "NVML is up and the snapshot is fresh, but some calls failed in the last poll \
                 (sources: {}); see gpu_steward_nvml_errors_total",
                failing.join(", ")
            ),
            snapshot_age: age,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{GpuReading, SourceStatus};
    use std::collections::BTreeMap;

    fn gpu(status: GpuStatus) -> GpuSnapshot {
        GpuSnapshot {
            index: 0,
            identity: None,
            status,
            reading: GpuReading::default(),
            failed_calls: 0,
            xids: BTreeMap::new(),
            last_xid: None,
        }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn lost_and_unreadable_gpus_fail_with_an_action() {
        assert_eq!(evaluate_gpu(&gpu(GpuStatus::Up)).status, Status::Pass);
        let lost = evaluate_gpu(&gpu(GpuStatus::Lost));
        assert_eq!(
            (lost.status, lost.action),
            (Status::Fail, Action::RebootNode)
        );
        assert_eq!(lost.conditions[0].name, "gpu_lost");
        let bad = evaluate_gpu(&gpu(GpuStatus::Unreadable("x".into())));
        assert_eq!((bad.status, bad.action), (Status::Fail, Action::ResetGpu));
    }

    #[test]
    fn readiness_needs_nvml_and_a_fresh_snapshot() {
        let interval = Duration::from_secs(5);
        let mut s = Snapshot::starting(at(100));
        assert!(!readiness(&s, interval, at(100)).ready);
        s.nvml = NvmlStatus::Down {
            reason: "driver not loaded".into(),
            error: "driver_not_loaded".into(),
            since: at(90),
            attempts: 3,
        };
        let r = readiness(&s, interval, at(100));
        assert!(!r.ready && r.reason.contains("driver not loaded"), "{r:?}");
        s.nvml = NvmlStatus::Up;
        assert!(readiness(&s, interval, at(114)).ready);
        let stale = readiness(&s, interval, at(115));
        assert!(!stale.ready && stale.reason.contains("older than 3 poll intervals"));
        s.sources.insert(
            "power",
            SourceStatus {
                duration: Duration::ZERO,
                success: false,
            },
        );
        let warn = readiness(&s, interval, at(101));
        assert!(warn.ready);
        assert_eq!(warn.status, Status::Warn);
    }
}
