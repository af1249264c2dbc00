//! Apply: observe the node (NVML and `nvidia-smi compute-policy -l`), diff against the
//! configuration ([`super::plan`]), change what differs, and audit every step.
//!
//! A step that fails stops the run and undoes the steps this run already made, newest first,
//! so the node is left as it was found; the report says so, or names the settings that could
//! not be put back. A setting that could not be read is left as it is and reported; the
//! settings that could be read are still applied, and the report says exactly which. After
//! any change the node is observed again and each step checked against what it claims, before
//! the closing audit record, so the report, its JSON and the audit log say the same thing.
//! Every record goes to the audit log before and after the change; without a writable audit
//! log nothing is changed. A dry run observes and plans, and changes nothing.

use std::time::SystemTime;

use serde::Serialize;

use super::plan::{self, Change, ObservedGpu, Plan, Skipped, Step};
use super::timeslice;
use crate::audit::event::{Sharing, SharingStep};
use crate::audit::{AuditLog, Event};
use crate::config::sharing::SharingConfig;
use crate::gpu::Session;

/// Something that can change one setting of one GPU, and read the node back.
pub trait Node {
    fn set(&mut self, gpu: u32, uuid: &str, change: Change) -> Result<(), String>;
    /// Every GPU as it is now (the same reads as before the apply).
    fn observe(&mut self) -> Result<Vec<ObservedGpu>, String>;
}

/// The real node: compute mode through NVML, time-slice through nvidia-smi.
pub struct NvmlNode<'a> {
    pub session: &'a Session,
    pub config: &'a SharingConfig,
}

impl Node for NvmlNode<'_> {
    fn set(&mut self, gpu: u32, uuid: &str, change: Change) -> Result<(), String> {
        match change {
            Change::ComputeMode { to, .. } => self
                .session
                .set_compute_mode(gpu, to)
                .map_err(|e| format!("nvmlDeviceSetComputeMode answered {}", e.code())),
            Change::Timeslice { to, .. } => timeslice::set(
                &self.config.nvidia_smi,
                self.config.nvidia_smi_timeout,
                uuid,
                to,
            ),
        }
    }

    fn observe(&mut self) -> Result<Vec<ObservedGpu>, String> {
        observe(self.session, self.config)
    }
}

/// What happened to one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Dry run: it would be made.
    Planned,
    Applied,
    Failed,
    /// Made, then undone because a later step failed.
    RolledBack,
    /// Made, and could not be undone: the node differs from both the old and new state.
    RollbackFailed,
    /// Not tried because an earlier step failed.
    NotRun,
}

impl Outcome {
    /// The outcome's name, as the report and the audit log spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Planned => "planned",
            Outcome::Applied => "applied",
            Outcome::Failed => "failed",
            Outcome::RolledBack => "rolled_back",
            Outcome::RollbackFailed => "rollback_failed",
            Outcome::NotRun => "not_run",
        }
    }
}

/// A step as the audit log records it.
fn recorded(step: &Step) -> SharingStep {
    let (from, to) = change_ends(step.change);
    SharingStep {
        from,
        gpu: step.gpu,
        setting: step.change.setting().to_string(),
        to,
        uuid: step.uuid.clone(),
    }
}

fn change_ends(c: Change) -> (String, String) {
    match c {
        Change::ComputeMode { from, to } => (from.as_str().into(), to.as_str().into()),
        Change::Timeslice { from, to } => (from.as_str().into(), to.as_str().into()),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepResult {
    #[serde(flatten)]
    pub step: Step,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The result of one apply, as `sharing apply`, the API and the audit log show it.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `start`, `sighup`, `api` or `cli`.
    pub trigger: String,
    pub dry_run: bool,
    #[serde(serialize_with = "crate::health::rfc3339")]
    pub at: SystemTime,
    /// The node matches the configuration (or, on a dry run, the plan can be made).
    pub ok: bool,
    /// No step is left half-done: every change is either in place or undone.
    pub consistent: bool,
    pub observed: Vec<ObservedGpu>,
    /// The node observed again after changes were made (empty when nothing was changed).
    pub after: Vec<ObservedGpu>,
    pub steps: Vec<StepResult>,
    pub skipped: Vec<Skipped>,
    pub unchanged: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Nothing was changed because the decision could not be written to the audit log (the
    /// API answers 503: the node's disk, not the request, is at fault).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub audit_failed: bool,
    /// Nothing was changed because another apply (MIG or sharing, this process or another)
    /// held the node lock (the API answers 409, as for MIG).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub busy: bool,
}

impl Report {
    pub fn failed(trigger: &str, dry_run: bool, error: String) -> Report {
        Report {
            trigger: trigger.into(),
            dry_run,
            at: SystemTime::now(),
            ok: false,
            consistent: true,
            observed: Vec::new(),
            after: Vec::new(),
            steps: Vec::new(),
            skipped: Vec::new(),
            unchanged: 0,
            error: Some(error),
            audit_failed: false,
            busy: false,
        }
    }

    /// Refused: the decision could not be recorded.
    /// Refused because another apply holds the node lock; nothing was changed.
    pub fn busy(trigger: &str, error: String) -> Report {
        Report {
            busy: true,
            ..Report::failed(trigger, false, error)
        }
    }

    pub fn audit_failed(trigger: &str, dry_run: bool, error: String) -> Report {
        Report {
            audit_failed: true,
            ..Report::failed(trigger, dry_run, error)
        }
    }

    /// Lines for the command line and the log.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for g in &self.observed {
            let mode = g
                .compute_mode
                .as_ref()
                .map_or_else(|e| format!("unknown ({e})"), |m| m.as_str().to_string());
            let slice = g
                .timeslice
                .as_ref()
                .map_or_else(|_| "not read".to_string(), |t| t.as_str().to_string());
            out.push_str(&format!(
                "gpu {} {}: compute mode {mode}, time-slice {slice}{}\n",
                g.index,
                g.uuid,
                if g.mig_enabled { ", MIG enabled" } else { "" }
            ));
        }
        for s in &self.steps {
            out.push_str(&format!(
                "gpu {} {}: {} [{}]{}\n",
                s.step.gpu,
                s.step.uuid,
                s.step.change.describe(),
                s.outcome.as_str(),
                s.error
                    .as_ref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ));
        }
        for s in &self.skipped {
            let gpu = s
                .gpu
                .map_or(s.uuid.clone(), |g| format!("gpu {g} {}", s.uuid));
            out.push_str(&format!("{gpu}: {} not changed: {}\n", s.setting, s.reason));
        }
        if let Some(e) = &self.error {
            out.push_str(&format!("error: {e}\n"));
        }
        out.push_str(&self.verdict());
        out.push('\n');
        out
    }

    /// The last line: what this run did to the node, in words that match its steps.
    fn verdict(&self) -> String {
        let count = |o: Outcome| self.steps.iter().filter(|s| s.outcome == o).count();
        let unread = self.skipped.iter().filter(|s| s.error).count();
        let unread_note = if unread > 0 {
            format!("; {unread} setting(s) could not be read and are left as they are")
        } else {
            String::new()
        };
        if self.ok && self.steps.is_empty() {
            return "nothing to do: the node matches the configuration".into();
        }
        if self.dry_run {
            return match (self.ok, self.steps.len()) {
                (true, n) => format!("dry run: {n} change(s) planned"),
                (false, _) if self.observed.is_empty() => {
                    "dry run: the node could not be observed; nothing was changed".into()
                }
                (false, n) => {
                    format!("dry run: {n} change(s) planned{unread_note}; nothing was changed")
                }
            };
        }
        let applied = count(Outcome::Applied);
        if self.ok {
            return format!("applied {applied} change(s)");
        }
        if count(Outcome::RollbackFailed) > 0 {
            return "FAILED, and some changes could not be undone: see above".into();
        }
        if !self.consistent {
            return "FAILED: after the apply the node is not as the steps above say: see above"
                .into();
        }
        if count(Outcome::Failed) > 0 {
            return "FAILED; every change made was undone: the node was left as it was found"
                .into();
        }
        if applied > 0 {
            return format!("applied {applied} change(s){unread_note}: the node does not fully match the configuration");
        }
        format!("FAILED; nothing was changed{unread_note}")
    }
}

/// Runs the plan's steps on `node`; on the first failure undoes what was done, newest first.
/// Returns the results and whether every change is either in place or undone.
///
/// `audit` records each result and says whether it could: a change whose record cannot be
/// written counts as a failure (the changes stop, and what was done is undone), as does a stop
/// of the agent (`crate::shutdown`) between two steps.
pub fn execute(
    steps: &[Step],
    node: &mut dyn Node,
    mut audit: impl FnMut(&StepResult) -> bool,
) -> (Vec<StepResult>, bool) {
    let mut results: Vec<StepResult> = Vec::with_capacity(steps.len());
    let mut failed = false;
    for step in steps {
        if !failed && crate::shutdown::requested() {
            failed = true;
            results.push(StepResult {
                step: step.clone(),
                outcome: Outcome::NotRun,
                error: Some("the agent is stopping: not made, and what was made is undone".into()),
            });
            continue;
        }
        if failed {
            results.push(StepResult {
                step: step.clone(),
                outcome: Outcome::NotRun,
                error: None,
            });
            continue;
        }
        let mut r = match node.set(step.gpu, &step.uuid, step.change) {
            Ok(()) => {
                tracing::info!(gpu = step.gpu, uuid = %step.uuid, "sharing change made: {}", step.change.describe());
                StepResult {
                    step: step.clone(),
                    outcome: Outcome::Applied,
                    error: None,
                }
            }
            Err(e) => {
                failed = true;
                StepResult {
                    step: step.clone(),
                    outcome: Outcome::Failed,
                    error: Some(e),
                }
            }
        };
        if !audit(&r) && r.outcome == Outcome::Applied {
            failed = true;
            r.error = Some("made, but its audit record could not be written: undone".into());
        }
        results.push(r);
    }
    let mut consistent = true;
    if failed {
        for r in results
            .iter_mut()
            .rev()
            .filter(|r| r.outcome == Outcome::Applied)
        {
            match node.set(r.step.gpu, &r.step.uuid, r.step.change.inverse()) {
                Ok(()) => {
                    tracing::info!(gpu = r.step.gpu, uuid = %r.step.uuid, "sharing change undone: {}", r.step.change.inverse().describe());
                    r.outcome = Outcome::RolledBack;
                }
                Err(e) => {
                    consistent = false;
                    r.outcome = Outcome::RollbackFailed;
                    r.error = Some(format!("could not undo: {e}"));
                }
            }
            audit(r);
        }
    }
    (results, consistent)
}

/// Observes every GPU: NVML for the compute and MIG modes, and `nvidia-smi compute-policy -l`
/// when a time-slice is configured.
pub fn observe(session: &Session, config: &SharingConfig) -> Result<Vec<ObservedGpu>, String> {
    let gpus = session
        .compute_modes()
        .map_err(|c| format!("cannot list the GPUs: NVML answered {c}"))?;
    let wants_timeslice = config.node.timeslice.is_some()
        || config.gpus.iter().any(|o| o.settings.timeslice.is_some());
    let slices = if wants_timeslice {
        timeslice::observe(&config.nvidia_smi, config.nvidia_smi_timeout)
    } else {
        Err("not configured".to_string())
    };
    Ok(gpus
        .into_iter()
        .map(|g| ObservedGpu {
            index: g.index,
            uuid: g.uuid,
            mig_enabled: g.mig_enabled.unwrap_or(false),
            compute_mode: g.compute_mode.map_err(|c| format!("NVML answered {c}")),
            timeslice: match &slices {
                Ok(m) => m.get(&g.index).copied().ok_or_else(|| {
                    "nvidia-smi compute-policy -l does not list this GPU".to_string()
                }),
                Err(e) => Err(e.clone()),
            },
        })
        .collect())
}

/// Observe → diff → apply on `session` (the change owner's), auditing to `audit`.
pub fn run(
    config: &SharingConfig,
    session: &Session,
    audit: Option<&AuditLog>,
    dry_run: bool,
    trigger: &str,
) -> Report {
    let observed = match observe(session, config) {
        Ok(o) => o,
        Err(e) => return Report::failed(trigger, dry_run, e),
    };
    let plan = plan::plan(config, &observed);
    let mut node = NvmlNode { session, config };
    apply_plan(plan, observed, &mut node, audit, dry_run, trigger)
}

/// The value a setting must have after the run for `step` to be what its outcome says:
/// applied → the new value; undone, failed or not run → the old one. `None` when the outcome
/// itself says the node differs (an undo that failed).
fn expected(step: &StepResult) -> Option<(Change, bool)> {
    let to = match step.outcome {
        Outcome::Applied => true,
        Outcome::RolledBack | Outcome::Failed | Outcome::NotRun => false,
        Outcome::RollbackFailed | Outcome::Planned => return None,
    };
    Some((step.step.change, to))
}

/// Observes the node again after changes and checks every step against what its outcome
/// claims; a step whose GPU does not hold the claimed value makes the report inconsistent and
/// is named in the error. A run that cannot observe says so and claims nothing more.
fn verify(report: &mut Report, node: &mut dyn Node) {
    let after = match node.observe() {
        Ok(a) => a,
        Err(e) => {
            report
                .error
                .get_or_insert(format!("cannot observe the node after the apply: {e}"));
            return;
        }
    };
    let mut differ = Vec::new();
    for r in &report.steps {
        let Some((change, applied)) = expected(r) else {
            continue;
        };
        let Some(g) = after.iter().find(|g| g.uuid == r.step.uuid) else {
            differ.push(format!("gpu {} is gone", r.step.gpu));
            continue;
        };
        let holds = match change {
            Change::ComputeMode { from, to } => {
                g.compute_mode.as_ref().ok() == Some(if applied { &to } else { &from })
            }
            Change::Timeslice { from, to } => {
                g.timeslice.as_ref().ok() == Some(if applied { &to } else { &from })
            }
        };
        if !holds {
            differ.push(format!(
                "gpu {} {} was {} but reads otherwise",
                r.step.gpu,
                r.step.change.setting(),
                if applied {
                    "applied"
                } else {
                    "left or put back"
                }
            ));
        }
    }
    if !differ.is_empty() {
        report.ok = false;
        report.consistent = false;
        report.error = Some(format!(
            "after the apply the node differs from the steps: {}",
            differ.join(", ")
        ));
    }
    report.after = after;
}

/// Applies `plan` (made from `observed`) on `node`, with audit records around every change.
pub fn apply_plan(
    plan: Plan,
    observed: Vec<ObservedGpu>,
    node: &mut dyn Node,
    audit: Option<&AuditLog>,
    dry_run: bool,
    trigger: &str,
) -> Report {
    let observation_failed = plan.skipped.iter().any(|s| s.error);
    let mut report = Report {
        trigger: trigger.into(),
        dry_run,
        at: SystemTime::now(),
        ok: !observation_failed,
        consistent: true,
        observed,
        after: Vec::new(),
        steps: Vec::new(),
        skipped: plan.skipped,
        unchanged: plan.unchanged,
        error: None,
        audit_failed: false,
        busy: false,
    };
    if dry_run || plan.steps.is_empty() {
        report.steps = plan
            .steps
            .into_iter()
            .map(|step| StepResult {
                step,
                outcome: Outcome::Planned,
                error: None,
            })
            .collect();
        return report;
    }
    // Every record says what started the apply (`start`, `sighup`, `api`, `cli`).
    let record = |event: Sharing| match audit {
        Some(a) => a.record(&Event::Sharing(event)).map_err(|e| e.to_string()),
        None => Ok(()),
    };
    if let Err(e) = record(Sharing::ApplyStart {
        steps: plan.steps.iter().map(recorded).collect(),
        trigger: trigger.to_string(),
    }) {
        report.ok = false;
        report.audit_failed = true;
        report.error = Some(format!(
            "cannot write the audit log ({e}); nothing was changed"
        ));
        return report;
    }
    let (steps, consistent) = execute(&plan.steps, node, |r| {
        let (from, to) = change_ends(r.step.change);
        match record(Sharing::ApplyStep {
            error: r.error.clone(),
            from,
            gpu: r.step.gpu,
            outcome: r.outcome.as_str().to_string(),
            setting: r.step.change.setting().to_string(),
            to,
            trigger: trigger.to_string(),
            uuid: r.step.uuid.clone(),
        }) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, "cannot write the sharing audit record: stopping, and undoing what was done");
                false
            }
        }
    });
    report.consistent = consistent;
    if steps.iter().any(|s| s.outcome != Outcome::Applied) {
        report.ok = false;
    }
    report.steps = steps;
    verify(&mut report, node);
    let count = |o: Outcome| report.steps.iter().filter(|s| s.outcome == o).count();
    let _ = record(Sharing::ApplyEnd {
        applied: count(Outcome::Applied),
        consistent: report.consistent,
        error: report.error.clone(),
        not_read: report.skipped.iter().filter(|s| s.error).count(),
        ok: report.ok,
        result: report.verdict(),
        rolled_back: count(Outcome::RolledBack),
        rollback_failed: count(Outcome::RollbackFailed),
        trigger: trigger.to_string(),
    });
    report
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;
