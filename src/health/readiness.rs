//! Agent readiness: is NVML up and the newest snapshot fresh? Kept apart from GPU verdicts on
//! purpose: a sick GPU must keep being scraped, so it never makes the agent unready.

use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::Status;
use crate::snapshot::{NvmlStatus, Snapshot};

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

/// Ready once NVML is initialised, the newest snapshot is younger than 3 poll intervals, and
/// every GPU NVML counts has been read or declared unreadable (a GPU's worker that has not
/// answered its first read is in no snapshot until it answers or is declared stuck, after 3
/// poll intervals and at least 5 s; until then the agent cannot vouch for the node).
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
    let seen = snapshot.gpus.len();
    if let Some(count) = snapshot.gpu_count.filter(|&n| n as usize > seen) {
        return not_ready(format!(
            "NVML counts {count} GPUs and {seen} have answered so far: waiting for the first \
             reading of the others (a GPU whose reads hang is reported unreadable after 3 poll \
             intervals, at least 5 s)"
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
    use crate::snapshot::SourceStatus;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn readiness_needs_nvml_and_a_fresh_snapshot() {
        let interval = Duration::from_secs(5);
        let mut s = Snapshot::starting(at(100));
        assert!(!readiness(&s, interval, at(100)).ready);
        s.nvml = NvmlStatus::Down {
            reason: "driver not loaded".into(),
            error: crate::snapshot::NvmlCode::DriverNotLoaded,
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

    fn board(index: u32) -> crate::snapshot::GpuSnapshot {
        crate::snapshot::GpuSnapshot {
            index,
            identity: None,
            status: crate::snapshot::GpuStatus::Up,
            reading: Default::default(),
            failed_calls: 0,
            failing_runs: 0,
            xids: Default::default(),
            last_xid: None,
        }
    }

    #[test]
    fn gpus_counted_but_not_read_yet_keep_the_agent_unready() {
        let interval = Duration::from_secs(1);
        let mut s = Snapshot::starting(at(100));
        s.nvml = NvmlStatus::Up;
        s.gpu_count = Some(2);
        let r = readiness(&s, interval, at(100));
        assert!(!r.ready, "{r:?}");
        assert!(
            r.reason.contains("NVML counts 2 GPUs and 0 have answered"),
            "{r:?}"
        );
        s.gpus.push(board(0));
        assert!(!readiness(&s, interval, at(100)).ready);
        s.gpus.push(board(1));
        assert!(readiness(&s, interval, at(100)).ready);
        // A node without GPUs is ready: the agent vouches for all none of them.
        s.gpus.clear();
        s.gpu_count = Some(0);
        assert!(readiness(&s, interval, at(100)).ready);
    }
}
