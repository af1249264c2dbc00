//! A MIG apply as a change: the layout by name (from the owner's `[mig]` layouts) or given
//! (the CLI's `--mig-config`), under the node lock and its intent record, on the owner's NVML
//! session, every step audited by [`crate::mig::apply`]. The typed result is rendered by the
//! edge: the API through [`MigReport`], the CLI through its own text.
//!
//! Must not: apply without the node lock (another process may be applying), or open an NVML
//! session or the audit log of its own.

use std::time::Duration;

use serde::Serialize;

use super::{Acting, Change, Lane};
use crate::audit::event::Mig as AuditMig;
use crate::audit::Event;
use crate::config::mig_layout::Layout;
use crate::mig::apply::{self, ApplyError, Outcome, PendingReset, Request};
use crate::mig::intent::{with_intent, Interrupted, LOCK_WAIT};
use crate::mig::plan::Plan;

/// Says for whom an apply waits (the node lock's holder's pid, when known).
pub type OnWait = Box<dyn FnOnce(Option<u32>) + Send>;

/// Says, at the edge (the CLI's terminal), that an apply found the intent record of one that
/// was killed half-way; the log and the audit log say it in any case.
pub type OnFound = Box<dyn FnOnce(&Interrupted) + Send>;

/// Apply a MIG layout.
pub struct MigApply {
    pub layout_name: String,
    /// The layout itself; `None`: the owner's configured layout of that name.
    pub layout: Option<Layout>,
    pub dry_run: bool,
    pub force: bool,
    /// Who asked, on every audit record: `api`, `cli`, `start`, `sighup`.
    pub trigger: &'static str,
    /// How long to wait for another applier's node lock: none for the API (it answers 409),
    /// [`LOCK_WAIT`] for the others, as an operator would.
    pub wait: Duration,
    pub on_wait: OnWait,
    pub on_found: OnFound,
}

impl MigApply {
    /// An apply of a configured layout by the daemon: the API answers at once (busy), the
    /// start and a reload wait for another applier.
    pub fn configured(layout: &str, dry_run: bool, force: bool, trigger: &'static str) -> Self {
        let name = layout.to_string();
        MigApply {
            layout_name: layout.to_string(),
            layout: None,
            dry_run,
            force,
            trigger,
            wait: if trigger == "api" {
                Duration::ZERO
            } else {
                LOCK_WAIT
            },
            on_wait: Box::new(move |pid| {
                tracing::warn!(pid = ?pid, layout = %name, trigger, "waiting for the MIG apply of another process (at most {} s)", LOCK_WAIT.as_secs());
            }),
            // The daemon's log line is the one below, in `act`.
            on_found: Box::new(|_| {}),
        }
    }
}

/// Why a MIG apply did not start, or how it ended badly.
#[derive(Debug, thiserror::Error)]
pub enum MigFailed {
    /// The layout is not defined (a bad request: nothing changed).
    #[error("{0}")]
    UnknownLayout(String),
    #[error("{0}")]
    Apply(#[from] ApplyError),
}

impl Change for MigApply {
    const LANE: Lane = Lane::Mig;
    type Outcome = Result<Outcome, MigFailed>;

    fn act(self, node: &Acting<'_>) -> Self::Outcome {
        let setup = node.setup();
        let layout = match self.layout {
            Some(l) => l,
            None => {
                let layouts = setup.mig.all_layouts();
                let Some(l) = layouts.get(&self.layout_name) else {
                    let known: Vec<&str> = layouts.keys().map(String::as_str).collect();
                    return Err(MigFailed::UnknownLayout(format!(
                        "layout '{}' is not defined; known layouts: {}",
                        self.layout_name,
                        if known.is_empty() {
                            "none".into()
                        } else {
                            known.join(", ")
                        }
                    )));
                };
                l.clone()
            }
        };
        let audit = if self.dry_run {
            None
        } else {
            Some(node.audit_log().map_err(|e| {
                ApplyError::Audit(format!(
                    "{e}; every MIG change is audited (set [audit] file)"
                ))
            })?)
        };
        let req = Request {
            layout_name: &self.layout_name,
            layout: &layout,
            dry_run: self.dry_run,
            force: self.force,
            trigger: self.trigger,
        };
        let run = || {
            let nvml = node.nvml().map_err(ApplyError::Refused)?;
            apply::apply(&nvml.session().mig(), &setup.mig, audit.as_ref(), &req)
        };
        if self.dry_run {
            return Ok(run()?);
        }
        // Applies in this process wait for each other here (the API's too: two API applies
        // take turns); the node lock then keeps other processes (`gpu-steward mig apply`) out,
        // or names the one that holds it. Waiting here holds one of the MIG lane's few
        // threads, never more.
        let _turn = node.mig_turn();
        let (name, trigger, on_found) = (&self.layout_name, self.trigger, self.on_found);
        let found = |l: &Interrupted| {
            tracing::warn!(layout = %l.layout, pid = l.pid, started = l.started, trigger, "a MIG apply was killed half-way and left its intent record: the GPUs may be half-made; applying '{name}' over it, the record is kept until the node is in a known layout");
            on_found(l);
            let record = Event::Mig(AuditMig::IntentFound {
                earlier: l.earlier.clone(),
                layout: l.layout.clone(),
                pid: l.pid,
                started: l.started,
                trigger: trigger.to_string(),
            });
            match &audit {
                Some(a) => a.record(&record).map_err(|e| {
                    ApplyError::Audit(format!(
                        "cannot write the audit record of the interrupted apply's intent \
                         record: {e}; nothing was changed"
                    ))
                }),
                None => Ok(()),
            }
        };
        Ok(with_intent(
            &setup.audit_file,
            &self.layout_name,
            self.wait,
            self.on_wait,
            found,
            run,
        )?)
    }

    /// Whatever changed (applied, or made and rolled back) shows at the next poll.
    fn touched(outcome: &Self::Outcome) -> bool {
        match outcome {
            Ok(Outcome::Applied { steps, .. }) => *steps > 0,
            Err(MigFailed::Apply(ApplyError::Failed { .. })) => true,
            _ => false,
        }
    }
}

/// How an apply through the daemon ended, for the API's status code and JSON and the logs
/// (its name, [`MigOutcome::name`], is the one rendering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigOutcome {
    NothingToDo,
    DryRun,
    Applied,
    PendingReset,
    Infeasible,
    Refused,
    /// Another applier holds the node lock.
    Busy,
    AuditFailed,
    Failed,
    BadRequest,
}

impl MigOutcome {
    /// The outcome's name in the API's JSON and the logs.
    pub fn name(self) -> &'static str {
        match self {
            MigOutcome::NothingToDo => "nothing_to_do",
            MigOutcome::DryRun => "dry_run",
            MigOutcome::Applied => "applied",
            MigOutcome::PendingReset => "pending_reset",
            MigOutcome::Infeasible => "infeasible",
            MigOutcome::Refused => "refused",
            MigOutcome::Busy => "busy",
            MigOutcome::AuditFailed => super::AUDIT_FAILED,
            MigOutcome::Failed => "failed",
            MigOutcome::BadRequest => "bad_request",
        }
    }
}

impl std::fmt::Display for MigOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for MigOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// An apply's result as the API answers it and the daemon logs it.
#[derive(Debug, Serialize)]
pub struct MigReport {
    pub layout: String,
    pub outcome: MigOutcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    pub steps: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PendingReset>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// On `failed`: whether the found layout was restored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restored: Option<bool>,
}

impl MigReport {
    /// Renders the typed result of an apply of `layout`.
    pub fn new(layout: &str, r: Result<Outcome, MigFailed>) -> MigReport {
        let mut rep = MigReport {
            layout: layout.to_string(),
            outcome: MigOutcome::Applied,
            plan: None,
            steps: 0,
            pending: Vec::new(),
            error: None,
            restored: None,
        };
        match r {
            Ok(Outcome::NothingToDo(p)) => {
                rep.outcome = MigOutcome::NothingToDo;
                rep.plan = Some(p);
            }
            Ok(Outcome::DryRun { plan, refused }) => {
                // A dry run answers as the apply would: refused (409) where processes are in
                // the way.
                rep.outcome = if refused.is_some() {
                    MigOutcome::Refused
                } else {
                    MigOutcome::DryRun
                };
                rep.error = refused.map(|r| format!("dry run: the apply would be refused: {r}"));
                rep.plan = Some(plan);
            }
            Ok(Outcome::Applied {
                plan,
                steps,
                pending,
                warnings,
            }) => {
                rep.outcome = if pending.is_empty() {
                    MigOutcome::Applied
                } else {
                    MigOutcome::PendingReset
                };
                rep.plan = Some(plan);
                rep.steps = steps;
                rep.pending = pending;
                if !warnings.is_empty() {
                    rep.error = Some(warnings.join("; "));
                }
            }
            Err(e) => {
                rep.outcome = match &e {
                    MigFailed::UnknownLayout(_) => MigOutcome::BadRequest,
                    MigFailed::Apply(ApplyError::Infeasible(_)) => MigOutcome::Infeasible,
                    MigFailed::Apply(ApplyError::Refused(_)) => MigOutcome::Refused,
                    MigFailed::Apply(ApplyError::Audit(_)) => MigOutcome::AuditFailed,
                    MigFailed::Apply(ApplyError::Busy(_)) => MigOutcome::Busy,
                    MigFailed::Apply(ApplyError::Failed { undone, .. }) => {
                        rep.restored = Some(*undone);
                        MigOutcome::Failed
                    }
                };
                rep.error = Some(e.to_string());
            }
        }
        rep
    }

    /// Whether the layout is in place (or nothing was asked to change).
    pub fn ok(&self) -> bool {
        matches!(
            self.outcome,
            MigOutcome::NothingToDo | MigOutcome::DryRun | MigOutcome::Applied
        )
    }
}
