//! The ledger's vocabulary: every record the agent writes to the audit log is one [`Event`],
//! written by the owner of changes ([`crate::changes::Owner::record`]) and read back by every
//! replay ([`super::read_back`]) as the same type. No record is built or read as loose JSON.
//!
//! A line is `{"ts":…,"component":…,"event":…,<fields>}`: the component tags [`Event`], the
//! event tags the component's own enum, and the fields follow in the order declared here. The
//! fields of each record are declared in alphabetical order, the order the records had when they
//! were built as JSON maps, so a flat record is written byte for byte as before. Nested values
//! (a MIG plan, a reclaim's processes) keep their declaration order now (they were sorted).
//!
//! Reading is lenient where the log may be newer or older than the agent:
//!
//! - a component or event this agent does not know (a newer agent's) is [`Event::Other`] or the
//!   component's `Other`, not an error: a replay skips it;
//! - a field added by a newer agent is ignored; a field that older agents did not write yet is
//!   an `Option` (or defaults);
//! - a line that is not JSON, or a known record whose fields have the wrong type, is damaged
//!   ([`super::ReadBack::damaged`]), as before.
//!
//! A change of shape is a change of the audit log's format: docs/safety.md ("Audit record
//! changes") lists them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::mig::{PendingReset, Plan, Step as MigStep};

/// One audit record, tagged by its component.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "component")]
pub enum Event {
    #[serde(rename = "api")]
    Api(Api),
    #[serde(rename = "mig")]
    Mig(Mig),
    #[serde(rename = "sharing")]
    Sharing(Sharing),
    #[serde(rename = "reclaim")]
    Reclaim(Reclaim),
    #[serde(rename = "remediation")]
    Remediation(Remediation),
    #[serde(rename = "slurm")]
    Slurm(Slurm),
    /// A component this agent does not know (written by a newer one).
    #[serde(other)]
    Other,
}

impl Event {
    /// The component's name, as the line and the metrics spell it.
    pub fn component(&self) -> &'static str {
        match self {
            Event::Api(_) => "api",
            Event::Mig(_) => "mig",
            Event::Sharing(_) => "sharing",
            Event::Reclaim(_) => "reclaim",
            Event::Remediation(_) => "remediation",
            Event::Slurm(_) => "slurm",
            Event::Other => "other",
        }
    }
}

/// One line read back: when it was written, and what.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Entry {
    pub ts: String,
    #[serde(flatten)]
    pub event: Event,
}

impl From<Api> for Event {
    fn from(e: Api) -> Event {
        Event::Api(e)
    }
}
impl From<Mig> for Event {
    fn from(e: Mig) -> Event {
        Event::Mig(e)
    }
}
impl From<Sharing> for Event {
    fn from(e: Sharing) -> Event {
        Event::Sharing(e)
    }
}
impl From<Reclaim> for Event {
    fn from(e: Reclaim) -> Event {
        Event::Reclaim(e)
    }
}
impl From<Remediation> for Event {
    fn from(e: Remediation) -> Event {
        Event::Remediation(e)
    }
}
impl From<Slurm> for Event {
    fn from(e: Slurm) -> Event {
        Event::Slurm(e)
    }
}

// ---- api ----

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event")]
pub enum Api {
    /// An admitted request to a changing endpoint, before it is served.
    #[serde(rename = "request")]
    Request {
        auth: String,
        method: String,
        path: String,
        peer: String,
        trigger: String,
    },
    #[serde(other)]
    Other,
}

// ---- mig ----

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event")]
pub enum Mig {
    /// The decision to apply: written before the first change.
    #[serde(rename = "apply.start")]
    ApplyStart {
        force: bool,
        layout: String,
        plan: Plan,
        trigger: String,
    },
    /// A refused apply (processes would be destroyed).
    #[serde(rename = "apply.refused")]
    ApplyRefused {
        layout: String,
        reason: String,
        trigger: String,
    },
    /// The `pre-apply` hook failed: nothing was changed.
    #[serde(rename = "apply.aborted")]
    ApplyAborted {
        layout: String,
        reason: String,
        trigger: String,
    },
    #[serde(rename = "apply.failed")]
    ApplyFailed {
        layout: String,
        problems: Vec<String>,
        reason: String,
        restored: bool,
        trigger: String,
    },
    #[serde(rename = "apply.done")]
    ApplyDone {
        layout: String,
        pending: Vec<PendingReset>,
        steps: usize,
        trigger: String,
    },
    #[serde(rename = "step")]
    Step {
        gpu: u32,
        layout: String,
        result: String,
        step: MigStep,
        trigger: String,
        uuid: String,
    },
    #[serde(rename = "rollback")]
    Rollback {
        gpu: u32,
        result: String,
        trigger: String,
        undo: String,
        uuid: String,
    },
    /// A GPU whose mode change waits for a reset (the fields of a [`PendingReset`]).
    #[serde(rename = "mode.pending")]
    ModePending {
        blocking_pids: Vec<u32>,
        enable: bool,
        index: u32,
        status: String,
        trigger: String,
        uuid: String,
    },
    /// An apply found the intent record of an earlier one that was killed half-way (the GPUs
    /// may be half-made): written under the node lock, before the apply's own records. The
    /// fields are the found record's; `trigger` is the new apply's.
    #[serde(rename = "intent.found")]
    IntentFound {
        /// The found record's own earlier records (oldest first), when it carried any.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        earlier: Vec<super::mig::IntentRecord>,
        layout: String,
        pid: u32,
        started: u64,
        trigger: String,
    },
    #[serde(rename = "hook")]
    Hook {
        argv: Vec<String>,
        duration_ms: u64,
        exit_code: Option<i32>,
        hook: String,
        outcome: String,
        result: String,
        stderr: String,
        stdout: String,
        trigger: String,
    },
    #[serde(other)]
    Other,
}

// ---- sharing ----

/// One sharing change on one GPU (`setting`: `compute_mode` or `timeslice`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharingStep {
    pub from: String,
    pub gpu: u32,
    pub setting: String,
    pub to: String,
    pub uuid: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event")]
pub enum Sharing {
    #[serde(rename = "apply.start")]
    ApplyStart {
        steps: Vec<SharingStep>,
        trigger: String,
    },
    #[serde(rename = "apply.step")]
    ApplyStep {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        from: String,
        gpu: u32,
        outcome: String,
        setting: String,
        to: String,
        trigger: String,
        uuid: String,
    },
    #[serde(rename = "apply.end")]
    ApplyEnd {
        applied: usize,
        consistent: bool,
        error: Option<String>,
        not_read: usize,
        ok: bool,
        result: String,
        rollback_failed: usize,
        rolled_back: usize,
        trigger: String,
    },
    /// The decision to signal a process over its memory limit, before the signal.
    #[serde(rename = "memory_guard.decision")]
    MemoryGuardDecision {
        gpu: u32,
        limit_bytes: u64,
        pid: u32,
        process: String,
        signal: String,
        used_bytes: u64,
        uuid: String,
    },
    #[serde(rename = "memory_guard.signal")]
    MemoryGuardSignal {
        detail: String,
        dry_run: bool,
        gpu: u32,
        limit_bytes: u64,
        over_since: String,
        pid: u32,
        process: String,
        result: String,
        signal: String,
        used_bytes: u64,
        uuid: String,
    },
    #[serde(other)]
    Other,
}

// ---- reclaim ----

/// A process holding an idle GPU, as reclaim records it (and hands it to hooks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReclaimProcess {
    pub memory_bytes: u64,
    pub name: Option<String>,
    pub pid: u32,
    pub pod_uid: Option<String>,
    pub slurm_job: Option<String>,
    pub start_time: Option<u64>,
    pub systemd_unit: Option<String>,
    pub user: Option<String>,
}

/// A container allocated the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReclaimPod {
    pub container: String,
    pub namespace: String,
    pub pod: String,
    pub replica: Option<String>,
}

/// An idle unit (a GPU or a MIG GPU instance) as reclaim records it and as its hooks read it
/// on stdin (there without `trigger`). Read leniently (a missing field is its default): the
/// hourly count needs only the time and `dry_run`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReclaimUnit {
    pub dry_run: bool,
    pub gpu: u32,
    pub gpu_instance: Option<u32>,
    pub held_memory_bytes: u64,
    pub idle_since: Option<String>,
    pub pods: Vec<ReclaimPod>,
    pub processes: Vec<ReclaimProcess>,
    /// `report`, `warn` or `reclaim`.
    pub step: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    pub uuid: String,
}

/// What one signalled process became.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalledProcess {
    pub gone: bool,
    pub pid: u32,
    pub sigkill: Option<String>,
    pub sigterm: String,
    pub start_time: Option<u64>,
}

/// The outcome of a warn or reclaim step: a hook's (`outcome`, output, duration) or the
/// signals' (`processes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReclaimOutcome {
    /// `hook`, `warn` or `signal`.
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    pub gpu: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<Vec<SignalledProcess>>,
    pub result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    pub trigger: String,
    pub uuid: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event")]
pub enum Reclaim {
    #[serde(rename = "idle_detected")]
    IdleDetected(ReclaimUnit),
    #[serde(rename = "allocated_unused")]
    AllocatedUnused(ReclaimUnit),
    #[serde(rename = "idle_cleared")]
    IdleCleared {
        gpu: u32,
        gpu_instance: Option<u32>,
        reason: String,
        trigger: String,
        uuid: String,
    },
    #[serde(rename = "rate_limited")]
    RateLimited {
        gpu: u32,
        gpu_instance: Option<u32>,
        max_reclaims_per_hour: u32,
        trigger: String,
        uuid: String,
    },
    /// The decision to warn, before the hook runs.
    #[serde(rename = "warn")]
    Warn(ReclaimUnit),
    /// The decision to reclaim, before anything is signalled or run: what the hourly count
    /// is rebuilt from.
    #[serde(rename = "reclaim")]
    Reclaim(ReclaimUnit),
    #[serde(rename = "warn.result")]
    WarnResult(ReclaimOutcome),
    /// The outcome of the reclaim hook (`action = "hook"`).
    #[serde(rename = "hook.result")]
    HookResult(ReclaimOutcome),
    /// The outcome of the reclaim signals (`action = "signal"`).
    #[serde(rename = "reclaim.result")]
    ReclaimResult(ReclaimOutcome),
    #[serde(other)]
    Other,
}

// ---- remediation ----

/// The alert's status, as Alertmanager spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertStatus {
    Firing,
    Resolved,
}

/// A GPU as a record names it: the alert's `gpu` label, or (in a built-in action's outcome)
/// the index of the GPU acted on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GpuRef {
    Index(u32),
    Label(String),
}

/// A remediation decision about one alert (and one route, unless `no_route`). What the rails
/// need (`decision`, `fingerprint`, `status`) is required; the rest is read leniently, as
/// older agents wrote less.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    #[serde(default)]
    pub alertname: String,
    /// `run`, `dry_run`, `skip` or `no_route`.
    pub decision: String,
    pub fingerprint: String,
    #[serde(default)]
    pub gpu: Option<String>,
    /// Written since `gpu_key` was added; older decisions are keyed by `gpu_uuid`, then `gpu`.
    #[serde(default)]
    pub gpu_key: Option<String>,
    #[serde(default)]
    pub gpu_uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<Vec<String>>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Why a route was skipped: `null` for a decision to act; absent for `no_route`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub reason: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_id: Option<String>,
    #[serde(default)]
    pub source: String,
    #[serde(rename = "startsAt", default)]
    pub starts_at: String,
    pub status: AlertStatus,
    #[serde(default)]
    pub trigger: String,
}

/// A step of a route (a hook or a built-in action) about to run, or not run in a dry run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookStep {
    /// The built-in action (`signal_processes`, `power_limit`, `fence`); none for a hook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    pub alertname: String,
    /// The hook's command; none for a built-in action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    pub fingerprint: String,
    pub gpu: Option<String>,
    pub hook: String,
    pub route: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    pub status: AlertStatus,
    pub trigger: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watts: Option<u32>,
}

/// A process a built-in action signalled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessOutcome {
    pub outcome: String,
    pub pid: u32,
}

/// What a hook or a built-in action did: the fields its kind has (see [`HookEnd`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepDetails {
    pub compute_mode: Option<String>,
    pub error: Option<String>,
    /// A hook's outcome (`exit 0`, `timeout`, …).
    pub outcome: Option<String>,
    pub power_limit_watts: Option<f64>,
    pub processes: Option<Vec<ProcessOutcome>>,
    /// The limit asked for by `power_limit` (`None` inside: back to the default).
    pub requested_watts: Option<Option<u32>>,
    pub signal: Option<String>,
    pub skipped: Option<String>,
    pub stderr: Option<String>,
    pub stdout: Option<String>,
    pub uuid: Option<String>,
}

/// A step of a route after it ran: the alert, the step's result, and what its kind reports
/// ([`StepDetails`]: absent fields are not written).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HookEnd {
    pub alertname: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_mode: Option<String>,
    pub duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub fingerprint: String,
    /// The alert's `gpu` label, or the index of the GPU a signal action acted on.
    pub gpu: Option<GpuRef>,
    pub hook: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_watts: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<Vec<ProcessOutcome>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub requested_watts: Option<Option<u32>>,
    pub result: String,
    pub route: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    pub status: AlertStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    pub trigger: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

impl HookEnd {
    /// Takes what the step reports into the record.
    pub fn with(mut self, d: StepDetails) -> HookEnd {
        self.compute_mode = d.compute_mode;
        self.error = d.error;
        self.outcome = d.outcome;
        self.power_limit_watts = d.power_limit_watts;
        self.processes = d.processes;
        self.requested_watts = d.requested_watts;
        self.signal = d.signal;
        self.skipped = d.skipped;
        self.stderr = d.stderr;
        self.stdout = d.stdout;
        self.uuid = d.uuid;
        self
    }
}

/// A field that may be absent (`None`), `null` (`Some(None)`) or a value: with `default`, a
/// present field, `null` included, is `Some`.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event")]
pub enum Remediation {
    /// A batch from Alertmanager, before any of its alerts is decided.
    #[serde(rename = "webhook.received")]
    WebhookReceived {
        alerts: usize,
        firing: usize,
        resolved: usize,
        source: String,
        trigger: String,
    },
    /// What the rails are rebuilt from.
    #[serde(rename = "decision")]
    Decision(Decision),
    #[serde(rename = "hook.dry_run")]
    HookDryRun(HookStep),
    #[serde(rename = "hook.start")]
    HookStart(HookStep),
    #[serde(rename = "hook.end")]
    HookEnd(HookEnd),
    #[serde(other)]
    Other,
}

// ---- slurm ----

/// A drain or resume of this node, before `scontrol update`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeChange {
    pub node: String,
    /// The reason set (a drain); none for a resume.
    pub reason: Option<String>,
    pub reason_before: String,
    pub state_before: String,
    pub trigger: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event")]
pub enum Slurm {
    #[serde(rename = "drain")]
    Drain(NodeChange),
    #[serde(rename = "resume")]
    Resume(NodeChange),
    #[serde(other)]
    Other,
}

#[cfg(test)]
#[path = "event_tests.rs"]
mod tests;
