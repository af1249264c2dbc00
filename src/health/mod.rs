//! Verdicts: is the agent ready, is each GPU healthy, and what should an operator do.
//!
//! Everything here is a pure function of snapshots and the time (passed in, never read from the
//! clock), so it is tested without a runtime or a GPU. The `Evaluator` keeps what evaluation
//! needs across polls (when each condition began, XID history, counter baselines) and turns
//! successive snapshots into per-GPU verdicts plus the condition changes to journal. The agent's
//! own readiness (`readiness`) is kept apart from GPU verdicts: a sick GPU must keep being
//! scraped, so it never makes the agent unready.
//!
//! - [`catalog`]: NVIDIA's XID catalog as data and the bucket → severity/action table;
//! - [`conditions`]: the checks of one GPU reading (ECC, memory, driver action, thermal, ...);
//! - [`xid`]: XID occurrences per GPU, the window and escalation;
//! - [`nvlink`]: NVLink links, error rates and the GPU fabric;
//! - [`degraded`]: a GPU that answers while it degrades (correctable ECC storm, PCIe link
//!   below its maximum);
//! - [`evaluator`]: the state across polls and the condition diff;
//! - [`journal`]: the bounded event journal behind `/api/v1/events`, and [`journal_file`], its
//!   copy in the state directory that outlives a restart.

pub mod catalog;
pub mod conditions;
pub mod degraded;
pub mod evaluator;
pub mod event;
pub mod journal;
pub mod journal_file;
pub mod nvlink;
mod readiness;
pub mod xid;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::{Serialize, Serializer};

pub use crate::config::health::{Action, HealthConfig, Status, XidOverride, ACTIONS};

/// Findings about GPUs that an actor made (reclaim's `idle_held`), by GPU index, for the next
/// judgement: they are raised, kept and cleared like the evaluator's own.
pub type ExtraFindings = std::sync::Arc<BTreeMap<u32, Vec<conditions::Finding>>>;
pub use evaluator::Evaluator;
pub use journal::{EventKind, HealthEvent, Journal};
pub use readiness::{readiness, Readiness};

/// One active condition on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Condition {
    /// Stable identifier: `gpu_lost`, `ecc_dbe`, `xid_48`, ... (the metrics' `condition` label).
    pub name: String,
    pub severity: Status,
    pub reason: String,
    pub action: Action,
    /// When the condition was first raised (kept while it stays active, even if it escalates).
    #[serde(serialize_with = "rfc3339")]
    pub since: SystemTime,
}

pub(crate) fn rfc3339<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*t))
}

/// A GPU's verdict: the worst condition decides the status; the action is the most drastic
/// one, except that the driver's own recovery action, when it asks for one, wins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuVerdict {
    pub status: Status,
    pub conditions: Vec<Condition>,
    pub action: Action,
}

impl GpuVerdict {
    pub fn new(conditions: Vec<Condition>) -> Self {
        let status = conditions
            .iter()
            .map(|c| c.severity)
            .max()
            .unwrap_or(Status::Pass);
        let driver = conditions
            .iter()
            .find(|c| c.name == conditions::RECOVERY_ACTION)
            .map(|c| c.action);
        let action = driver.unwrap_or_else(|| {
            conditions
                .iter()
                .map(|c| c.action)
                .max()
                .unwrap_or(Action::None)
        });
        GpuVerdict {
            status,
            conditions,
            action,
        }
    }
}

/// One GPU's health at one poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHealth {
    pub index: u32,
    pub uuid: String,
    pub verdict: GpuVerdict,
    /// XIDs seen within `xid_count_window`, by XID (`DCGM_EXP_XID_ERRORS_COUNT`).
    pub xid_window_counts: BTreeMap<u64, u64>,
}

/// Every GPU's health at one poll, published with the snapshot it was computed from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHealth {
    pub gpus: Vec<GpuHealth>,
    /// The window of `xid_window_counts`, for the `window_size_in_ms` label.
    pub xid_count_window_ms: u64,
}

impl NodeHealth {
    pub fn gpu(&self, index: u32) -> Option<&GpuHealth> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// The worst GPU status (pass when there is no GPU).
    pub fn worst(&self) -> Status {
        self.gpus
            .iter()
            .map(|g| g.verdict.status)
            .max()
            .unwrap_or(Status::Pass)
    }
}
