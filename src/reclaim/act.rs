//! Carrying out the ladder's decisions: audit records, hooks, signals. The only part of
//! `reclaim` that changes the node.
//!
//! Each warn or reclaim runs on a thread of its own so that a hook's timeout or a signal's
//! grace never holds the poller. Safety rules, all enforced here:
//!
//! - only the [`ProcessIdentity`] (pid and start time) recorded when the process was seen
//!   holding the GPU is ever signalled, and `procs::signal_verified` re-reads the start time
//!   immediately before each `kill(2)`: a pid now naming another process is left alone;
//! - a zombie is gone: it is never signalled again and counts as reclaimed;
//! - in dry run nothing is executed: the decision is audited and counted as `dry_run`;
//! - the decision record is written before anything is executed, by the owner of changes
//!   ([`crate::changes`], which then lends the act its turn and records the outcome): when it
//!   cannot be written nothing is (counted as `audit_failed`), and the caller hands the step
//!   back to the ladder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::idle::{Holder, UnitState, UnitStatus};
use crate::audit::event::{
    Reclaim, ReclaimOutcome, ReclaimPod, ReclaimProcess, ReclaimUnit, SignalledProcess,
};
use crate::audit::AUDIT_FAILED;
use crate::changes::{Begun, Done, Owner};
use crate::config::reclaim::{ActionKind, HookCommand, ReclaimConfig};
use crate::exec::{self, CommandSpec};
use crate::procs::{self, ProcessIdentity, SignalResult};

/// `gpu_steward_reclaim_actions_total{action,result}`.
pub type ActionCounts = Arc<Mutex<BTreeMap<(&'static str, &'static str), u64>>>;

/// How often a signalled process is looked at during the grace period.
const CHECK_EVERY: Duration = Duration::from_millis(50);
/// How long a SIGKILLed process gets to disappear before it counts as surviving.
const AFTER_KILL: Duration = Duration::from_secs(2);

/// Carries out decisions; cheap to clone into the threads it starts.
#[derive(Clone, Debug)]
pub struct Actor {
    pub procfs: PathBuf,
    /// The owner of changes, while the audit log can be written (`None`: dry run is forced).
    pub owner: Option<Arc<Owner>>,
    pub counts: ActionCounts,
}

impl Actor {
    pub fn count(&self, action: &'static str, result: &'static str) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((action, result))
            .or_default() += 1;
    }

    /// Appends to the audit log; false when the record could not be written (the audit log
    /// counts the failure and logs the first of a run of them; nothing may be executed then).
    /// Every record says what started it: the reclaim ladder (`"trigger": "reclaim"`).
    pub fn audit(&self, event: Reclaim) -> bool {
        match &self.owner {
            Some(owner) => owner.record(event).is_ok(),
            None => true,
        }
    }

    /// Records a decision through the owner; the right to act on it. Without an owner (the
    /// audit log cannot be written, so this is a forced dry run) there is nothing to act on.
    fn begin(&self, event: Reclaim) -> Result<Option<Begun>, ()> {
        match &self.owner {
            Some(owner) => owner.begin(event).map(Some).map_err(|_| ()),
            None => Ok(None),
        }
    }

    /// The warn step: the hook, if one is configured, with the unit as JSON on stdin. False
    /// when its record could not be written: nothing was run.
    pub fn warn(&self, unit: &UnitStatus, targets: &[Holder], config: &ReclaimConfig) -> bool {
        let hook = config.warn.as_ref().and_then(|w| w.hook.clone());
        let doc = describe(unit, targets, "warn", config.dry_run);
        let Ok(begun) = self.begin(Reclaim::Warn(recorded(&doc))) else {
            self.count("warn", AUDIT_FAILED);
            return false;
        };
        tracing::warn!(gpu = unit.gpu, unit = %unit.key, pids = ?pids(targets), dry_run = config.dry_run, "idle GPU: warning its holders");
        match (hook, begun) {
            (None, _) => self.count("warn", "logged"),
            (Some(_), _) if config.dry_run => self.count("warn", "dry_run"),
            (Some(hook), Some(begun)) => {
                let me = self.clone();
                spawn("reclaim-warn", move || {
                    begun.act(|_| me.run_hook("warn", &hook, &doc));
                });
            }
            // No owner: reclaim is in a forced dry run (see `Stage`), so this is not reached.
            (Some(_), None) => self.count("warn", "dry_run"),
        }
        true
    }

    /// The reclaim step: signal the targets, or run the hook. False when its record could not
    /// be written: nothing was signalled or run.
    pub fn reclaim(&self, unit: &UnitStatus, targets: &[Holder], config: &ReclaimConfig) -> bool {
        let action = config.action.as_str();
        let doc = describe(unit, targets, "reclaim", config.dry_run);
        let Ok(begun) = self.begin(Reclaim::Reclaim(recorded(&doc))) else {
            self.count(action, AUDIT_FAILED);
            return false;
        };
        if config.dry_run {
            tracing::info!(gpu = unit.gpu, unit = %unit.key, pids = ?pids(targets), action, dry_run = true, "idle GPU: would reclaim (dry run)");
        } else {
            tracing::warn!(gpu = unit.gpu, unit = %unit.key, pids = ?pids(targets), action, dry_run = false, "idle GPU: reclaiming");
        }
        let begun = match begun {
            Some(b) if !config.dry_run => b,
            _ => {
                self.count(action, "dry_run");
                return true;
            }
        };
        let me = self.clone();
        match (config.action, config.hook.clone()) {
            (ActionKind::Hook, Some(hook)) => spawn("reclaim-hook", move || {
                begun.act(|_| me.run_hook("hook", &hook, &doc));
            }),
            (ActionKind::Hook, None) => self.count("hook", "error"),
            (ActionKind::Signal, _) => {
                let who: Vec<ProcessIdentity> = identities(targets);
                let grace = config.grace;
                spawn("reclaim-signal", move || {
                    begun.act(|_| {
                        let report = terminate(&me.procfs, &who, grace);
                        let result = if report.iter().all(|r| r.gone) {
                            "success"
                        } else {
                            "failure"
                        };
                        me.count("signal", result);
                        let after = ReclaimOutcome {
                            action: "signal".into(),
                            duration_ms: None,
                            gpu: doc.gpu,
                            outcome: None,
                            processes: Some(report.iter().map(PidReport::recorded).collect()),
                            result: result.into(),
                            stderr: None,
                            stdout: None,
                            trigger: TRIGGER.into(),
                            uuid: doc.uuid.clone(),
                        };
                        Done {
                            value: (),
                            after: Some(Reclaim::ReclaimResult(after).into()),
                            touched: true,
                        }
                    });
                });
            }
        }
        true
    }

    /// Runs a hook with the unit on stdin; its outcome, for the owner to record.
    fn run_hook(&self, step: &'static str, hook: &HookCommand, doc: &ReclaimUnit) -> Done<()> {
        let spec = CommandSpec {
            name: format!("reclaim.{step}"),
            argv: hook.command.clone(),
            timeout: hook.timeout,
        };
        let stdin = serde_json::to_vec(doc).unwrap_or_default();
        let out = exec::run(&spec, &stdin, &[]);
        let result = out.outcome.result_label();
        self.count(step, result);
        if !out.outcome.success() {
            tracing::error!(hook = %spec.name, outcome = %out.outcome, stderr = %out.stderr.trim(), "reclaim hook failed");
        }
        let after = ReclaimOutcome {
            action: step.into(),
            duration_ms: Some(out.duration.as_millis() as u64),
            gpu: doc.gpu,
            outcome: Some(out.outcome.to_string()),
            processes: None,
            result: result.into(),
            stderr: Some(out.stderr),
            stdout: Some(out.stdout),
            trigger: TRIGGER.into(),
            uuid: doc.uuid.clone(),
        };
        let after = match step {
            "warn" => Reclaim::WarnResult(after),
            _ => Reclaim::HookResult(after),
        };
        Done {
            value: (),
            after: Some(after.into()),
            touched: true,
        }
    }
}

/// What starts every reclaim record: the reclaim ladder.
pub const TRIGGER: &str = "reclaim";

/// The unit as its record carries it: with the trigger (hooks read it without).
pub fn recorded(unit: &ReclaimUnit) -> ReclaimUnit {
    ReclaimUnit {
        trigger: Some(TRIGGER.into()),
        ..unit.clone()
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) {
    if let Err(e) = std::thread::Builder::new().name(name.into()).spawn(f) {
        tracing::error!(error = %e, "cannot start the {name} thread");
    }
}

fn pids(targets: &[Holder]) -> Vec<u32> {
    targets.iter().map(|h| h.pid).collect()
}

/// The identities recorded when the holders were observed (holders without one are gone).
pub fn identities(targets: &[Holder]) -> Vec<ProcessIdentity> {
    targets
        .iter()
        .filter_map(|h| {
            Some(ProcessIdentity {
                pid: h.pid,
                start_time: h.start_time?,
            })
        })
        .collect()
}

/// What became of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidReport {
    pub who: ProcessIdentity,
    pub term: SignalResult,
    pub kill: Option<SignalResult>,
    /// Gone (exited, or a zombie) or replaced (the process we saw is gone) at the end.
    pub gone: bool,
}

impl PidReport {
    fn recorded(&self) -> SignalledProcess {
        SignalledProcess {
            gone: self.gone,
            pid: self.who.pid,
            sigkill: self.kill.as_ref().map(|k| k.label().to_string()),
            sigterm: self.term.label().to_string(),
            start_time: Some(self.who.start_time),
        }
    }
}

/// SIGTERM to each, SIGKILL after `grace` to those still alive; blocking. Once the agent is
/// stopping, the grace ends and no SIGKILL is sent: the result says who was left alive.
pub fn terminate(procfs: &Path, who: &[ProcessIdentity], grace: Duration) -> Vec<PidReport> {
    let mut reports: Vec<PidReport> = who
        .iter()
        .map(|w| PidReport {
            who: *w,
            term: procs::signal_verified(procfs, w, Signal::SIGTERM),
            kill: None,
            gone: false,
        })
        .collect();
    let alive = |r: &PidReport| r.term == SignalResult::Sent && procs::is_alive(procfs, &r.who);
    wait_until(grace, || !reports.iter().any(alive));
    // The agent is stopping: no new signal (the grace was cut short, and a SIGKILL decided
    // before it would land after the stop); the result says what was left alive.
    let stopping = crate::shutdown::requested();
    for r in &mut reports {
        if alive(r) && !stopping {
            r.kill = Some(procs::signal_verified(procfs, &r.who, Signal::SIGKILL));
        }
    }
    wait_until(AFTER_KILL, || {
        !reports
            .iter()
            .any(|r| r.kill == Some(SignalResult::Sent) && procs::is_alive(procfs, &r.who))
    });
    for r in &mut reports {
        // Failed leaves the process as it was; anything else means the process we saw is
        // no more, or it is checked once more here.
        r.gone = !procs::is_alive(procfs, &r.who);
    }
    reports
}

/// Waits until `done`, for at most `limit`, and no longer once the agent is stopping.
fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() && Instant::now() < deadline && !crate::shutdown::requested() {
        std::thread::sleep(CHECK_EVERY);
    }
}

/// The unit as hooks read it on stdin and the audit log records it (there with its trigger,
/// [`recorded`]).
pub fn describe(unit: &UnitStatus, targets: &[Holder], step: &str, dry_run: bool) -> ReclaimUnit {
    let since = match unit.state {
        UnitState::Idle { since } | UnitState::AllocatedUnused { since } => {
            Some(humantime::format_rfc3339_millis(since).to_string())
        }
        _ => None,
    };
    ReclaimUnit {
        dry_run,
        gpu: unit.gpu,
        gpu_instance: unit.key.gpu_instance,
        held_memory_bytes: unit.held_memory_bytes,
        idle_since: since,
        pods: unit
            .pods
            .iter()
            .map(|p| ReclaimPod {
                namespace: p.namespace.clone(),
                pod: p.pod.clone(),
                container: p.container.clone(),
                replica: p.replica.clone(),
            })
            .collect(),
        processes: targets
            .iter()
            .map(|h| ReclaimProcess {
                memory_bytes: h.memory_bytes,
                name: h.name.clone(),
                pid: h.pid,
                pod_uid: h.pod_uid.clone(),
                slurm_job: h.slurm_job.clone(),
                start_time: h.start_time,
                systemd_unit: h.systemd_unit.clone(),
                user: h.user.clone(),
            })
            .collect(),
        step: step.into(),
        trigger: None,
        uuid: unit.key.uuid.clone(),
    }
}

#[cfg(test)]
#[path = "act_tests.rs"]
mod tests;
