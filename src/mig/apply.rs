//! The applier: observe → plan → (refuse or) apply → verify, with hooks, an audit record per
//! change and a way back.
//!
//! - Nothing happens when the plan is empty: applying the current layout again makes no
//!   create or destroy call at all.
//! - GPUs with processes in instances the plan removes (or on a GPU whose MIG mode changes)
//!   are refused unless `force`; a dry run says so too (it fails where the apply would). `force`
//!   only makes the apply try: the driver still answers `IN_USE` to destroying an instance
//!   with processes in it (the step fails and the apply is undone) and leaves a MIG mode
//!   change pending until the GPU is reset (nvml.h: `nvmlGpuInstanceDestroy`,
//!   `nvmlDeviceSetMigMode` activationStatus).
//! - Hooks `pre-apply` (a failure aborts before any change), `post-apply` and `on-failure` run
//!   through `exec::run` with a timeout, the plan as JSON on stdin and `GPU_STEWARD_MIG_LAYOUT`
//!   in their environment.
//! - Every change is journalled with what undoes it. When a step fails (or the result does not
//!   match the plan) the journal is undone in reverse on every GPU changed so far: created
//!   instances destroyed, destroyed ones re-created at their placements, a mode change reverted.
//! - A MIG mode change the driver leaves pending (processes, a passthrough VM) runs the
//!   configured reset command, if any, and otherwise is reported as needing a GPU reset; that
//!   GPU stops there (its mode request stays) and the others go on.

use std::collections::HashMap;

use super::plan::{plan, GpuPlan, Infeasible, Plan, Step};
use crate::audit::event::Mig;
pub use crate::audit::mig::PendingReset;
use crate::audit::{AuditLog, Event};
use crate::config::mig::MigConfig;
use crate::config::mig_layout::Layout;
use crate::exec::{self, CommandSpec};
use crate::gpu::{MigCallError, MigControl};
use crate::snapshot::mig::MigGpu;

/// What an apply asks for.
pub struct Request<'a> {
    pub layout_name: &'a str,
    pub layout: &'a Layout,
    pub dry_run: bool,
    pub force: bool,
    /// Who asked, on every audit record of the apply: `cli`, `api`, `start` or `sighup`.
    pub trigger: &'a str,
}

/// How an apply ended.
#[derive(Debug)]
pub enum Outcome {
    /// The plan was empty.
    NothingToDo(Plan),
    /// `dry_run`: the plan, unapplied, and why the real apply would be refused (processes in
    /// the way and no `force`), if it would.
    DryRun { plan: Plan, refused: Option<String> },
    /// Applied (steps made), possibly with GPUs waiting for a reset.
    Applied {
        plan: Plan,
        steps: usize,
        pending: Vec<PendingReset>,
        warnings: Vec<String>,
    },
}

/// Why an apply did not happen or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// Bad input: nothing changed (exit 2).
    #[error("{0}")]
    Infeasible(#[from] Infeasible),
    /// Refused or aborted before any change (exit 1).
    #[error("{0}")]
    Refused(String),
    /// The decision record could not be written to the audit log: nothing was changed (exit 1;
    /// 503 from the API, as the cause is the node's disk, not the request).
    #[error("{0}; nothing was changed")]
    Audit(String),
    /// Another applier holds the node lock (the message names it): nothing changed (exit 1;
    /// 409 from the API).
    #[error("{0}")]
    Busy(String),
    /// A step failed; the found layout was restored, or `left` says what is left (exit 1).
    #[error("{reason}; {restored}")]
    Failed {
        reason: String,
        restored: String,
        /// Whether every change was undone.
        undone: bool,
        left: Option<Vec<MigGpu>>,
    },
}

impl ApplyError {
    pub fn exit_code(&self) -> u8 {
        match self {
            ApplyError::Infeasible(_) => 2,
            _ => 1,
        }
    }
}

/// Reads every GPU.
pub fn observe(ctl: &MigControl) -> Result<Vec<MigGpu>, MigCallError> {
    (0..ctl.device_count()?).map(|i| ctl.read(i)).collect()
}

/// How the asker forces an apply, in its own words: the API takes `"force": true`, the command
/// line `--force`; an apply at start or on reload has no such switch.
fn force_hint(trigger: &str) -> &'static str {
    match trigger {
        "api" => "\"force\": true",
        "cli" => "--force",
        _ => "an apply with --force (or \"force\": true through the API)",
    }
}

/// Why an apply without `force` is refused: the processes in the way, per GPU.
pub fn blocked(plan: &Plan, trigger: &str) -> Option<String> {
    let blocked: Vec<String> = plan
        .gpus
        .iter()
        .filter(|g| !g.steps.is_empty() && !g.blocking_pids.is_empty())
        .map(|g| {
            let pids: Vec<String> = g.blocking_pids.iter().map(u32::to_string).collect();
            format!("GPU {} ({}): pid {}", g.index, g.uuid, pids.join(", "))
        })
        .collect();
    (!blocked.is_empty()).then(|| {
        format!(
            "processes run in instances the layout removes or on GPUs whose MIG mode changes \
             ({}); stop them and apply again ({} only tries anyway: the driver refuses to \
             destroy an instance in use, and a MIG mode change waits for a GPU reset)",
            blocked.join("; "),
            force_hint(trigger)
        )
    })
}

/// One done change and how to undo it.
#[derive(Debug, Clone)]
enum Done {
    Mode {
        enable: bool,
    },
    GiCreated {
        gi: u32,
    },
    CiCreated {
        gi: u32,
        ci: u32,
    },
    GiDestroyed {
        gi: u32,
        profile_id: u32,
        start: u32,
        size: u32,
    },
    CiDestroyed {
        gi: u32,
        profile_id: u32,
        start: u32,
        size: u32,
    },
}

impl std::fmt::Display for Done {
    /// The undo in words, for the audit log and the report.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Done::Mode { enable } => write!(
                f,
                "set MIG mode back to {}",
                if *enable { "disabled" } else { "enabled" }
            ),
            Done::GiCreated { gi } => write!(f, "destroy created GPU instance {gi}"),
            Done::CiCreated { gi, ci } => {
                write!(
                    f,
                    "destroy created compute instance {ci} of GPU instance {gi}"
                )
            }
            Done::GiDestroyed {
                gi,
                profile_id,
                start,
                size,
            } => write!(
                f,
                "re-create destroyed GPU instance {gi} (profile {profile_id}, placement \
                 {start}+{size})"
            ),
            Done::CiDestroyed {
                gi,
                profile_id,
                start,
                size,
            } => write!(
                f,
                "re-create destroyed compute instance of GPU instance {gi} (profile \
                 {profile_id}, placement {start}+{size})"
            ),
        }
    }
}

struct Run<'a> {
    ctl: &'a MigControl,
    cfg: &'a MigConfig,
    audit: Option<&'a AuditLog>,
    layout: &'a str,
    trigger: &'a str,
    /// Per GPU index, what was done, in order.
    journal: Vec<(u32, String, Vec<Done>)>,
    steps: usize,
}

impl Run<'_> {
    /// Writes a record; `Err` (naming the file) when it could not be written. Records after
    /// the run ended (its outcome, rollbacks) are best effort: the failure is counted and
    /// shown in `/health` by the audit log itself.
    fn audit(&self, event: impl FnOnce(String) -> Mig) -> Result<(), String> {
        match self.audit {
            Some(a) => a
                .record(&Event::Mig(event(self.trigger.to_string())))
                .map_err(|e| format!("cannot write the audit record: {e}")),
            None => Ok(()),
        }
    }

    fn hook(&self, name: &str, plan: &Plan) -> Option<Result<(), String>> {
        let spec: &CommandSpec = self.cfg.hook(name)?;
        let input = serde_json::to_vec(plan).unwrap_or_default();
        let env = [(
            "GPU_STEWARD_MIG_LAYOUT".to_string(),
            self.layout.to_string(),
        )];
        let out = exec::run(spec, &input, &env);
        let exit_code = match out.outcome {
            exec::Outcome::Exited(c) => Some(c),
            _ => None,
        };
        let _ = self.audit(|trigger| Mig::Hook {
            argv: spec.argv.clone(),
            duration_ms: out.duration.as_millis() as u64,
            exit_code,
            hook: name.to_string(),
            outcome: out.outcome.to_string(),
            result: out.outcome.result_label().to_string(),
            stderr: out.stderr.clone(),
            stdout: out.stdout.clone(),
            trigger,
        });
        Some(if out.outcome.success() {
            Ok(())
        } else {
            Err(format!(
                "hook '{name}' ({}) {}: {}",
                spec.argv.join(" "),
                out.outcome,
                out.stderr.trim()
            ))
        })
    }

    /// Makes one step on GPU `g`, journalling what it did.
    fn step(&mut self, g: &GpuPlan, step: &Step, done: &mut Vec<Done>) -> Result<(), String> {
        let ctl = self.ctl;
        let i = g.index;
        let res: Result<(), MigCallError> = match step {
            Step::SetMigMode { enable } => ctl.set_mode(i, *enable).map(|_| {
                done.push(Done::Mode { enable: *enable });
            }),
            Step::DestroyComputeInstance {
                gpu_instance_id,
                compute_instance_id,
                profile_id,
                start,
                size,
            } => ctl
                .destroy_compute_instance(i, *gpu_instance_id, *compute_instance_id)
                .map(|()| {
                    done.push(Done::CiDestroyed {
                        gi: *gpu_instance_id,
                        profile_id: *profile_id,
                        start: *start,
                        size: *size,
                    })
                }),
            Step::DestroyGpuInstance {
                gpu_instance_id,
                profile_id,
                start,
                size,
                ..
            } => ctl.destroy_gpu_instance(i, *gpu_instance_id).map(|()| {
                done.push(Done::GiDestroyed {
                    gi: *gpu_instance_id,
                    profile_id: *profile_id,
                    start: *start,
                    size: *size,
                })
            }),
            Step::CreateComputeInstance {
                gpu_instance_id,
                profile_id,
                start,
                size,
            } => ctl
                .create_compute_instance(i, *gpu_instance_id, *profile_id, *start, *size)
                .map(|ci| {
                    done.push(Done::CiCreated {
                        gi: *gpu_instance_id,
                        ci,
                    })
                }),
            Step::CreateInstance {
                profile_id,
                start,
                size,
                ci_profile_id,
                ci_size,
                ..
            } => ctl
                .create_gpu_instance(i, *profile_id, *start, *size)
                .and_then(|gi| {
                    done.push(Done::GiCreated { gi });
                    let ci = ctl.create_compute_instance(i, gi, *ci_profile_id, 0, *ci_size)?;
                    done.push(Done::CiCreated { gi, ci });
                    Ok(())
                }),
        };
        self.steps += 1;
        let result = match &res {
            Ok(()) => "success".to_string(),
            Err(e) => e.to_string(),
        };
        let recorded = self.audit(|trigger| Mig::Step {
            gpu: i,
            layout: self.layout.to_string(),
            result,
            step: step.clone(),
            trigger,
            uuid: g.uuid.clone(),
        });
        res.map_err(|e| format!("GPU {i} ({}): {step}: {e}", g.uuid))?;
        tracing::info!(gpu = i, uuid = %g.uuid, layout = self.layout, trigger = self.trigger, "MIG change made: {step}");
        // The disk filled up during the run: stop here, and put back what was found.
        recorded.map_err(|e| format!("GPU {i} ({}): after {step}: {e}", g.uuid))
    }

    /// Undoes every journal in reverse; the problems met, if any.
    fn rollback(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        let journal = std::mem::take(&mut self.journal);
        for (index, uuid, done) in journal.into_iter().rev() {
            // Re-created GPU instances get new ids: map old ids to them.
            let mut ids: HashMap<u32, u32> = HashMap::new();
            for d in done.into_iter().rev() {
                let id = |gi: u32| *ids.get(&gi).unwrap_or(&gi);
                let res = match &d {
                    Done::Mode { enable } => self.ctl.set_mode(index, !enable).map(|_| ()),
                    Done::GiCreated { gi } => self.ctl.destroy_gpu_instance(index, id(*gi)),
                    Done::CiCreated { gi, ci } => {
                        self.ctl.destroy_compute_instance(index, id(*gi), *ci)
                    }
                    Done::GiDestroyed {
                        gi,
                        profile_id,
                        start,
                        size,
                    } => self
                        .ctl
                        .create_gpu_instance(index, *profile_id, *start, *size)
                        .map(|new| {
                            ids.insert(*gi, new);
                        }),
                    Done::CiDestroyed {
                        gi,
                        profile_id,
                        start,
                        size,
                    } => self
                        .ctl
                        .create_compute_instance(index, id(*gi), *profile_id, *start, *size)
                        .map(|_| ()),
                };
                let result = match &res {
                    Ok(()) => "success".to_string(),
                    Err(e) => e.to_string(),
                };
                let _ = self.audit(|trigger| Mig::Rollback {
                    gpu: index,
                    result,
                    trigger,
                    undo: d.to_string(),
                    uuid: uuid.clone(),
                });
                if res.is_ok() {
                    tracing::info!(gpu = index, uuid = %uuid, "MIG change undone: {d}");
                }
                if let Err(e) = res {
                    problems.push(format!("GPU {index}: {d}: {e}"));
                }
            }
        }
        problems
    }
}

impl Run<'_> {
    /// Makes the plan's steps, GPU by GPU, until one fails or a stop is asked for: the GPUs
    /// whose mode change waits for a reset, and why it stopped (nothing: every step was made).
    fn execute(&mut self, plan: &Plan) -> (Vec<PendingReset>, Option<String>) {
        let mut pending = Vec::new();
        let mut failure = None;
        'gpus: for g in plan.gpus.iter().filter(|g| !g.steps.is_empty()) {
            let mut done = Vec::new();
            for step in &g.steps {
                // A stop (SIGTERM) ends the apply between two steps, and what was done is undone:
                // the rollback fits the stop budget, a half-made layout would not (crate::shutdown).
                if crate::shutdown::requested() {
                    failure = Some(
                        "a stop was asked for (a signal): the apply stopped before its next step"
                            .into(),
                    );
                    self.journal.push((g.index, g.uuid.clone(), done));
                    break 'gpus;
                }
                let r = self.step(g, step, &mut done);
                if let Err(e) = r {
                    failure = Some(e);
                    self.journal.push((g.index, g.uuid.clone(), done));
                    break 'gpus;
                }
                if let Step::SetMigMode { enable } = step {
                    match settle_mode(self.ctl, self.cfg, g, *enable) {
                        Ok(None) => {}
                        Ok(Some(p)) => {
                            let _ = self.audit(|trigger| Mig::ModePending {
                                blocking_pids: p.blocking_pids.clone(),
                                enable: p.enable,
                                index: p.index,
                                status: p.status.clone(),
                                trigger,
                                uuid: p.uuid.clone(),
                            });
                            pending.push(p);
                            // The mode request stays; nothing else can happen on this GPU now.
                            done.clear();
                            break;
                        }
                        Err(e) => {
                            failure = Some(e);
                            self.journal.push((g.index, g.uuid.clone(), done));
                            break 'gpus;
                        }
                    }
                }
            }
            self.journal.push((g.index, g.uuid.clone(), done));
        }
        (pending, failure)
    }
}

/// Observes, plans and applies `req` (see the module comment).
pub fn apply(
    ctl: &MigControl,
    cfg: &MigConfig,
    audit: Option<&AuditLog>,
    req: &Request,
) -> Result<Outcome, ApplyError> {
    let found =
        observe(ctl).map_err(|e| ApplyError::Refused(format!("cannot read MIG state: {e}")))?;
    let plan = plan(&found, req.layout)?;
    if plan.is_noop() {
        return Ok(Outcome::NothingToDo(plan));
    }
    let refused = if req.force {
        None
    } else {
        blocked(&plan, req.trigger)
    };
    if req.dry_run {
        return Ok(Outcome::DryRun { plan, refused });
    }
    if let Some(reason) = refused {
        // A refusal is a decision too: recorded (best effort: nothing was changed either way).
        let refused = Mig::ApplyRefused {
            layout: req.layout_name.to_string(),
            reason: reason.clone(),
            trigger: req.trigger.to_string(),
        };
        if let Some(a) = audit {
            if let Err(e) = a.record(&Event::Mig(refused)) {
                tracing::warn!(error = %e, "cannot record the refused MIG apply");
            }
        }
        return Err(ApplyError::Refused(reason));
    }
    let mut run = Run {
        ctl,
        cfg,
        audit,
        layout: req.layout_name,
        trigger: req.trigger,
        journal: Vec::new(),
        steps: 0,
    };
    // The decision record comes first: without it, nothing is changed.
    run.audit(|trigger| Mig::ApplyStart {
        force: req.force,
        layout: req.layout_name.to_string(),
        plan: plan.clone(),
        trigger,
    })
    .map_err(ApplyError::Audit)?;
    if let Some(Err(e)) = run.hook("pre-apply", &plan) {
        let _ = run.audit(|trigger| Mig::ApplyAborted {
            layout: req.layout_name.to_string(),
            reason: e.clone(),
            trigger,
        });
        let _ = run.hook("on-failure", &plan);
        return Err(ApplyError::Refused(format!("{e}; nothing was changed")));
    }
    let (pending, mut failure) = run.execute(&plan);
    if failure.is_none() {
        failure = verify(ctl, req.layout, &pending).err();
    }
    if let Some(reason) = failure {
        let problems = run.rollback();
        let _ = run.hook("on-failure", &plan);
        let (restored, left) = if problems.is_empty() {
            ("the layout found before was restored".to_string(), None)
        } else {
            (
                format!(
                    "restoring the found layout failed too: {}",
                    problems.join("; ")
                ),
                observe(ctl).ok(),
            )
        };
        let _ = run.audit(|trigger| Mig::ApplyFailed {
            layout: req.layout_name.to_string(),
            problems: problems.clone(),
            reason: reason.clone(),
            restored: problems.is_empty(),
            trigger,
        });
        return Err(ApplyError::Failed {
            reason,
            restored,
            undone: problems.is_empty(),
            left,
        });
    }
    let mut warnings = Vec::new();
    if let Some(Err(e)) = run.hook("post-apply", &plan) {
        warnings.push(e);
    }
    let _ = run.audit(|trigger| Mig::ApplyDone {
        layout: req.layout_name.to_string(),
        pending: pending.clone(),
        steps: run.steps,
        trigger,
    });
    Ok(Outcome::Applied {
        steps: run.steps,
        plan,
        pending,
        warnings,
    })
}

/// How long the mode may take to change after the reset command returned.
const RESET_SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

/// After a mode change: `None` when it is in effect; a pending reset otherwise (after the
/// configured reset command, if any, did not make it current).
fn settle_mode(
    ctl: &MigControl,
    cfg: &MigConfig,
    g: &GpuPlan,
    enable: bool,
) -> Result<Option<PendingReset>, String> {
    let read = || {
        ctl.read(g.index)
            .map_err(|e| format!("GPU {}: {e}", g.index))
    };
    let read_mode = || read().map(|m| m.mig);
    let gpu = read()?;
    if gpu.mig.is_some_and(|m| m.current == enable) {
        return Ok(None);
    }
    // The driver's activation status is IN_USE while processes hold the GPU, RESET_REQUIRED
    // where only a reset applies it (a passthrough VM).
    let mut status = if g.blocking_pids.is_empty() {
        "reset_required".to_string()
    } else {
        "in_use".to_string()
    };
    if let Some(reset) = &cfg.reset {
        let argv = reset
            .argv
            .iter()
            .map(|a| {
                a.replace("{index}", &g.index.to_string())
                    .replace("{uuid}", &g.uuid)
                    .replace("{pci_bus_id}", &gpu.pci_bus_id)
            })
            .collect();
        let spec = CommandSpec {
            argv,
            ..reset.clone()
        };
        let out = exec::run(&spec, b"", &[]);
        if !out.outcome.success() {
            status = format!(
                "reset command failed ({}): {}",
                out.outcome.result_label(),
                out.stderr.trim()
            );
        }
        // The driver settles after a reset; give it a moment before calling it pending.
        let deadline = std::time::Instant::now() + RESET_SETTLE;
        loop {
            if read_mode()?.is_some_and(|m| m.current == enable) {
                return Ok(None);
            }
            if std::time::Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    Ok(Some(PendingReset {
        index: g.index,
        uuid: g.uuid.clone(),
        enable,
        status,
        blocking_pids: g.blocking_pids.clone(),
    }))
}

/// Reads the node again: every GPU not waiting for a reset must now need no change.
fn verify(ctl: &MigControl, layout: &Layout, pending: &[PendingReset]) -> Result<(), String> {
    let now = observe(ctl).map_err(|e| format!("cannot read the result: {e}"))?;
    let again = plan(&now, layout).map_err(|e| format!("the result cannot be planned: {e}"))?;
    for g in &again.gpus {
        if !g.steps.is_empty() && !pending.iter().any(|p| p.index == g.index) {
            return Err(format!(
                "GPU {} ({}) does not match the layout after applying: {} step(s) still needed",
                g.index,
                g.uuid,
                g.steps.len()
            ));
        }
    }
    Ok(())
}
