//! Apply: observe the node (NVML and `nvidia-smi compute-policy -l`), diff against the
//! configuration ([`super::plan`]), change what differs, and audit every step.
//!
//! A step that fails stops the run and undoes the steps this run already made, newest first,
//! so the node is left as it was found; the report says so, or names the settings that could
//! not be put back. Every record goes to the audit log before and after the change; without a
//! writable audit log nothing is changed. A dry run observes and plans, and changes nothing.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::json;

use super::plan::{self, Change, ObservedGpu, Plan, Skipped, Step};
use super::settings::SharingConfig;
use super::timeslice;
use crate::audit::AuditLog;
use crate::gpu::Session;

/// Something that can change one setting of one GPU.
pub trait Node {
    fn set(&mut self, gpu: u32, uuid: &str, change: Change) -> Result<(), String>;
}

/// The real node: compute mode through NVML, time-slice through nvidia-smi.
pub struct NvmlNode<'a> {
    pub session: &'a Session,
    pub nvidia_smi: PathBuf,
    pub timeout: Duration,
}

impl Node for NvmlNode<'_> {
    fn set(&mut self, gpu: u32, uuid: &str, change: Change) -> Result<(), String> {
        match change {
            Change::ComputeMode { to, .. } => self
                .session
                .set_compute_mode(gpu, to)
                .map_err(|e| format!("nvmlDeviceSetComputeMode answered {}", e.code())),
            Change::Timeslice { to, .. } => {
                timeslice::set(&self.nvidia_smi, self.timeout, uuid, to)
            }
        }
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
        }
    }

    /// Refused: the decision could not be recorded.
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
                serde_json::to_value(s.outcome)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
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
        let verdict = match (self.ok, self.dry_run, self.steps.is_empty()) {
            (true, _, true) => "nothing to do: the node matches the configuration".to_string(),
            (true, true, false) => format!("dry run: {} change(s) planned", self.steps.len()),
            (true, false, false) => format!("applied {} change(s)", self.steps.len()),
            (false, _, _) if !self.consistent => {
                "FAILED, and some changes could not be undone: see above".to_string()
            }
            (false, _, _) => "FAILED; the node was left as it was found".to_string(),
        };
        out.push_str(&verdict);
        out.push('\n');
        out
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
            Ok(()) => StepResult {
                step: step.clone(),
                outcome: Outcome::Applied,
                error: None,
            },
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
                Ok(()) => r.outcome = Outcome::RolledBack,
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

/// Observe → diff → apply against the NVML library `nvml_lib`, auditing to `audit`.
pub fn run(
    config: &SharingConfig,
    nvml_lib: &str,
    audit: Option<&AuditLog>,
    dry_run: bool,
    trigger: &str,
) -> Report {
    let session = match Session::open(nvml_lib) {
        Ok(s) => s,
        Err(e) => return Report::failed(trigger, dry_run, e.reason),
    };
    let observed = match observe(&session, config) {
        Ok(o) => o,
        Err(e) => return Report::failed(trigger, dry_run, e),
    };
    let plan = plan::plan(config, &observed);
    let mut node = NvmlNode {
        session: &session,
        nvidia_smi: config.nvidia_smi.clone(),
        timeout: config.nvidia_smi_timeout,
    };
    let mut report = apply_plan(plan, observed, &mut node, audit, dry_run, trigger);
    if report.steps.iter().any(|s| s.outcome != Outcome::Planned) {
        verify(&mut report, &session, config);
    }
    report
}

/// Observes the node again after changes: a run that reports success must leave the node
/// matching the configuration, and one that undid its changes must leave it as it was.
fn verify(report: &mut Report, session: &Session, config: &SharingConfig) {
    match observe(session, config) {
        Ok(after) => {
            let left = plan::plan(config, &after).steps;
            if report.ok && !left.is_empty() {
                report.ok = false;
                report.error = Some(format!(
                    "after the apply the node still differs: {}",
                    left.iter()
                        .map(|s| format!("gpu {} {}", s.gpu, s.change.describe()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if !report.ok && report.consistent {
                let same = |a: &ObservedGpu, b: &ObservedGpu| {
                    a.compute_mode == b.compute_mode && a.timeslice == b.timeslice
                };
                let restored = after.len() == report.observed.len()
                    && after.iter().zip(&report.observed).all(|(a, b)| same(a, b));
                if !restored {
                    report.consistent = false;
                    report.error.get_or_insert_with(|| {
                        "after undoing, the node differs from what was found".into()
                    });
                }
            }
            report.after = after;
        }
        Err(e) => {
            report
                .error
                .get_or_insert(format!("cannot observe the node after the apply: {e}"));
        }
    }
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
    let record = |event: &str, fields: serde_json::Value| match audit {
        Some(a) => a
            .record("sharing", event, fields)
            .map_err(|e| e.to_string()),
        None => Ok(()),
    };
    if let Err(e) = record(
        "apply.start",
        json!({"trigger": trigger, "steps": &plan.steps}),
    ) {
        report.ok = false;
        report.audit_failed = true;
        report.error = Some(format!(
            "cannot write the audit log ({e}); nothing was changed"
        ));
        return report;
    }
    let (steps, consistent) = execute(&plan.steps, node, |r| {
        match record("apply.step", json!(r)) {
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
    let _ = record(
        "apply.end",
        json!({"trigger": trigger, "ok": report.ok, "consistent": consistent,
               "applied": report.steps.iter().filter(|s| s.outcome == Outcome::Applied).count()}),
    );
    report
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;
