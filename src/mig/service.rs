//! MIG inside the daemon: converge to the configured `[mig] layout` at start (before the poller
//! runs, so the agent is not ready until the layout is in place) and on SIGHUP, and apply
//! layouts asked for through `POST /api/v1/mig/apply`. One apply at a time, in a blocking
//! thread, on an NVML session of its own opened at the first apply and kept. Reads for `GET /api/v1/mig` come from the published snapshot, never from here.
//!
//! Each apply writes an intent record (`mig-apply.intent`, beside the audit log) before its
//! first change and removes it when the layout is settled (applied, or rolled back): a record
//! found at start means an apply was killed half-way.

use std::path::PathBuf;
use std::sync::Mutex;

use serde::Serialize;

use super::apply::{self, ApplyError, Outcome, PendingReset, Request};
use super::config::MigConfig;
use super::plan::Plan;
use crate::audit::AuditLog;
use crate::config::Config;
use crate::gpu::Session;

/// What an apply through the daemon reports.
#[derive(Debug, Serialize)]
pub struct Report {
    pub layout: String,
    /// `nothing_to_do`, `dry_run`, `applied`, `pending_reset`, `infeasible`, `refused`,
    /// `failed`, `bad_request`.
    pub outcome: &'static str,
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
    fn bad(layout: &str, outcome: &'static str, error: String) -> Report {
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
        matches!(self.outcome, "nothing_to_do" | "dry_run" | "applied")
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
}

impl MigService {
    pub fn new(cfg: &Config) -> Self {
        MigService {
            nvml_lib: Mutex::new(cfg.nvml_lib.clone()),
            audit_file: Mutex::new(cfg.audit_file.clone()),
            config: Mutex::new(cfg.mig.clone()),
            running: Mutex::new(None),
        }
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
            Err(e) => return Report::bad(layout, "bad_request", e),
        };
        let Some(chosen) = layouts.get(layout) else {
            let known: Vec<&str> = layouts.keys().map(String::as_str).collect();
            return Report::bad(
                layout,
                "bad_request",
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
                        "audit_failed",
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
                Err(e) => return Report::bad(layout, "refused", e.reason),
            }
        }
        let Some((_, session)) = cached.as_ref() else {
            return Report::bad(layout, "refused", "no NVML session".into());
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
            with_intent(&lock(&self.audit_file).clone(), layout, run)
        };
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

/// An apply that left its intent record behind.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, Serialize)]
pub struct Interrupted {
    pub layout: String,
    pub pid: u32,
    /// Seconds since the Unix epoch.
    pub started: u64,
}

/// Runs `apply` (a real one, not a dry run) with its intent record written before: the record
/// outlives a kill -9 (or power loss) in the middle of the apply, so that the next start knows
/// the layout may be half-made. It is removed once the apply has settled (done, or rolled
/// back), and kept when the rollback failed too: the node is not in a known layout. For the
/// daemon's applies and `gpu-steward mig apply` alike.
pub fn with_intent(
    audit_file: &std::path::Path,
    layout: &str,
    apply: impl FnOnce() -> Result<Outcome, ApplyError>,
) -> Result<Outcome, ApplyError> {
    let path = intent_path(audit_file);
    if let Err(e) = write_intent(&path, layout) {
        tracing::warn!(file = %path.display(), error = %e, "cannot write the MIG apply intent record");
    }
    let r = apply();
    if !matches!(r, Err(ApplyError::Failed { undone: false, .. })) {
        let _ = std::fs::remove_file(&path);
    }
    r
}

/// `mig-apply.intent` beside the audit log, in the agent's state directory.
pub fn intent_path(audit_file: &std::path::Path) -> PathBuf {
    audit_file
        .parent()
        .unwrap_or_else(|| std::path::Path::new("."))
        .join("mig-apply.intent")
}

fn write_intent(path: &std::path::Path, layout: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let record = Interrupted {
        layout: layout.to_string(),
        pid: std::process::id(),
        started,
    };
    let mut f = std::fs::File::create(path)?;
    f.write_all(
        serde_json::to_string(&record)
            .unwrap_or_default()
            .as_bytes(),
    )?;
    f.sync_all()
}

/// The record at `path`; an unreadable one still says that an apply was interrupted.
pub fn read_intent(path: &std::path::Path) -> Option<Interrupted> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(serde_json::from_str(&text).unwrap_or(Interrupted {
        layout: "(unreadable intent record)".into(),
        pid: 0,
        started: 0,
    }))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn report(layout: &str, r: Result<Outcome, ApplyError>) -> Report {
    let mut rep = Report::bad(layout, "applied", String::new());
    rep.error = None;
    match r {
        Ok(Outcome::NothingToDo(p)) => {
            rep.outcome = "nothing_to_do";
            rep.plan = Some(p);
        }
        Ok(Outcome::DryRun { plan, refused }) => {
            // A dry run answers as the apply would: refused (409) where processes are in the way.
            rep.outcome = if refused.is_some() {
                "refused"
            } else {
                "dry_run"
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
                "applied"
            } else {
                "pending_reset"
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
                ApplyError::Infeasible(_) => "infeasible",
                ApplyError::Refused(_) => "refused",
                ApplyError::Audit(_) => "audit_failed",
                ApplyError::Failed { undone, .. } => {
                    rep.restored = Some(*undone);
                    "failed"
                }
            };
            rep.error = Some(e.to_string());
        }
    }
    rep
}
