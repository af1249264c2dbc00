//! MIG inside the daemon: converge to the configured `[mig] layout` at start (before the poller
//! runs, so the agent is not ready until the layout is in place) and on SIGHUP, and apply
//! layouts asked for through `POST /api/v1/mig/apply`. One apply at a time, in a blocking
//! thread, on an NVML session of its own opened at the first apply and kept. Reads for `GET /api/v1/mig` come from the published snapshot, never from here.
//!
//! Each apply holds the node lock and writes an intent record (`mig-apply.lock`,
//! `mig-apply.intent`, beside the audit log: [`super::intent`]) before its first change and
//! removes the record when the layout is settled (applied, or rolled back): a record found at
//! start means an apply was killed half-way. An API apply that finds another applier (the CLI)
//! is refused (`busy`, 409); the start-time and reload applies wait for it, bounded.

use std::path::PathBuf;
use std::sync::Mutex;

use serde::Serialize;

use super::apply::{self, ApplyError, Outcome, PendingReset, Request};
use super::config::MigConfig;
pub use super::intent::{intent_path, read_intent, with_intent, Interrupted};
use super::plan::Plan;
use crate::audit::AuditLog;
use crate::config::Config;
use crate::gpu::Session;

/// How an apply through the daemon ended: typed until an edge renders it (the HTTP handler
/// picks its status code from it; its name, [`MigOutcome::name`], is the one rendering).
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
            MigOutcome::AuditFailed => "audit_failed",
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

/// What an apply through the daemon reports.
#[derive(Debug, Serialize)]
pub struct Report {
    pub layout: String,
    /// `nothing_to_do`, `dry_run`, `applied`, `pending_reset`, `infeasible`, `refused`,
    /// `busy` (another applier holds the node lock), `failed`, `bad_request`.
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

impl Report {
    fn bad(layout: &str, outcome: MigOutcome, error: String) -> Report {
        Report {
            layout: layout.to_string(),
            outcome,
            plan: None,
            steps: 0,
            pending: Vec::new(),
            error: Some(error),
            restored: None,
        }
    }

    /// Whether the layout is in place (or nothing was asked to change).
    pub fn ok(&self) -> bool {
        matches!(
            self.outcome,
            MigOutcome::NothingToDo | MigOutcome::DryRun | MigOutcome::Applied
        )
    }
}

/// The daemon's MIG applier.
pub struct MigService {
    nvml_lib: Mutex<String>,
    audit_file: Mutex<PathBuf>,
    config: Mutex<MigConfig>,
    /// Held for the whole of an apply: one at a time. Holds the NVML session once one was
    /// opened, with the library it was opened from: kept for the daemon's life, so applies do
    /// not pay an `nvmlInit` each and the library is never unloaded between them.
    running: Mutex<Option<(String, Session)>>,
    /// The poller's control, once it runs: told after every apply that changed the node, so
    /// that its next poll (at once) reads the MIG layout instead of waiting for the slow tier.
    waker: Mutex<Option<std::sync::mpsc::Sender<crate::poller::Control>>>,
}

impl MigService {
    pub fn new(cfg: &Config) -> Self {
        MigService {
            nvml_lib: Mutex::new(cfg.nvml_lib.clone()),
            audit_file: Mutex::new(cfg.audit_file.clone()),
            config: Mutex::new(cfg.mig.clone()),
            running: Mutex::new(None),
            waker: Mutex::new(None),
        }
    }

    /// Where to say that the node changed: the poller's control (set once it runs).
    pub fn set_waker(&self, control: std::sync::mpsc::Sender<crate::poller::Control>) {
        *lock(&self.waker) = Some(control);
    }

    /// Takes a reloaded configuration (SIGHUP).
    pub fn reconfigure(&self, cfg: &Config) {
        *lock(&self.nvml_lib) = cfg.nvml_lib.clone();
        *lock(&self.audit_file) = cfg.audit_file.clone();
        *lock(&self.config) = cfg.mig.clone();
    }

    /// The layout to converge to, if one is configured.
    pub fn configured_layout(&self) -> Option<String> {
        lock(&self.config).layout.clone()
    }

    /// Applies `layout` (blocking: call from `spawn_blocking`).
    /// Applies `layout`; `trigger` (`api`, `start`, `sighup`) goes on every audit record.
    pub fn apply(&self, layout: &str, dry_run: bool, force: bool, trigger: &str) -> Report {
        let mut cached = lock(&self.running);
        let cfg = lock(&self.config).clone();
        let layouts = match cfg.all_layouts() {
            Ok(l) => l,
            Err(e) => return Report::bad(layout, MigOutcome::BadRequest, e),
        };
        let Some(chosen) = layouts.get(layout) else {
            let known: Vec<&str> = layouts.keys().map(String::as_str).collect();
            return Report::bad(
                layout,
                MigOutcome::BadRequest,
                format!(
                    "layout '{layout}' is not defined; known layouts: {}",
                    known.join(", ")
                ),
            );
        };
        let audit = if dry_run {
            None
        } else {
            let path = lock(&self.audit_file).clone();
            match AuditLog::open(&path) {
                Ok(a) => Some(a),
                Err(e) => {
                    return Report::bad(
                        layout,
                        MigOutcome::AuditFailed,
                        format!(
                            "cannot open the audit log '{}': {e}; nothing was changed",
                            path.display()
                        ),
                    )
                }
            }
        };
        let lib = lock(&self.nvml_lib).clone();
        if cached.as_ref().is_none_or(|(l, _)| *l != lib) {
            match Session::open(&lib) {
                Ok(s) => *cached = Some((lib, s)),
                Err(e) => return Report::bad(layout, MigOutcome::Refused, e.reason),
            }
        }
        let Some((_, session)) = cached.as_ref() else {
            return Report::bad(layout, MigOutcome::Refused, "no NVML session".into());
        };
        let req = Request {
            layout_name: layout,
            layout: chosen,
            dry_run,
            force,
            trigger,
        };
        let run = || apply::apply(&session.mig(), &cfg, audit.as_ref(), &req);
        let r = if dry_run {
            run()
        } else {
            // The API answers at once (409, naming the holder); the configured layout waits
            // for a `gpu-steward mig apply` in progress, as an operator would.
            let wait = if trigger == "api" {
                std::time::Duration::ZERO
            } else {
                super::intent::LOCK_WAIT
            };
            let on_wait = |pid: Option<u32>| {
                tracing::warn!(pid = ?pid, layout, trigger, "waiting for the MIG apply of another process (at most {} s)", super::intent::LOCK_WAIT.as_secs());
            };
            with_intent(&lock(&self.audit_file).clone(), layout, wait, on_wait, run)
        };
        // Whatever changed (applied, or made and rolled back) shows at the next poll, now.
        let changed = match &r {
            Ok(Outcome::Applied { steps, .. }) => *steps > 0,
            Err(ApplyError::Failed { .. }) => true,
            _ => false,
        };
        if changed {
            if let Some(w) = lock(&self.waker).as_ref() {
                let _ = w.send(crate::poller::Control::Changed);
            }
        }
        report(layout, r)
    }

    /// Whether an apply is running now (the stop waits for it, within its budget).
    pub fn busy(&self) -> bool {
        matches!(
            self.running.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        )
    }

    /// The layout of an apply that started and never finished (the agent was killed during
    /// it), from its intent record.
    pub fn interrupted(&self) -> Option<Interrupted> {
        read_intent(&intent_path(&lock(&self.audit_file)))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn report(layout: &str, r: Result<Outcome, ApplyError>) -> Report {
    let mut rep = Report::bad(layout, MigOutcome::Applied, String::new());
    rep.error = None;
    match r {
        Ok(Outcome::NothingToDo(p)) => {
            rep.outcome = MigOutcome::NothingToDo;
            rep.plan = Some(p);
        }
        Ok(Outcome::DryRun { plan, refused }) => {
            // A dry run answers as the apply would: refused (409) where processes are in the way.
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
                ApplyError::Infeasible(_) => MigOutcome::Infeasible,
                ApplyError::Refused(_) => MigOutcome::Refused,
                ApplyError::Audit(_) => MigOutcome::AuditFailed,
                ApplyError::Busy(_) => MigOutcome::Busy,
                ApplyError::Failed { undone, .. } => {
                    rep.restored = Some(*undone);
                    MigOutcome::Failed
                }
            };
            rep.error = Some(e.to_string());
        }
    }
    rep
}
