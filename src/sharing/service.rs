//! The sharing subsystem inside the daemon: applies at start, on SIGHUP and through the API,
//! one at a time, off the async workers (NVML and nvidia-smi block); keeps the last report;
//! and publishes [`SharingStatus`] for metrics through the [`StatusSink`] it shares with the
//! device plugin and the memory guard (it starts them; they do not import it).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use super::apply::{self, Report};
use super::settings::SharingConfig;
use super::status::{SharingFeed, StatusSink};
use crate::audit::AuditLog;
use crate::snapshot::SharingStatus;

/// What an apply runs against; replaced on reload.
#[derive(Debug, Clone)]
struct Current {
    config: SharingConfig,
    nvml_lib: String,
    audit_file: PathBuf,
}

/// The daemon's sharing handle (cheap to clone through `Arc`).
#[derive(Debug)]
pub struct Sharing {
    current: Mutex<Current>,
    /// Opened by the first apply that changes something (a node without `[sharing]` never
    /// creates the file); an apply that cannot open it changes nothing.
    audit: Mutex<Option<AuditLog>>,
    /// One apply at a time (start, SIGHUP and API may race).
    running: tokio::sync::Mutex<()>,
    last: Mutex<Option<Arc<Report>>>,
    status: StatusSink,
    /// The poller's control, told after an apply that changed the node so that its next poll
    /// starts at once and reads compute modes off the slow tier's schedule (set once it runs).
    waker: Mutex<Option<std::sync::mpsc::Sender<crate::poller::Control>>>,
}

impl Sharing {
    pub fn new(config: SharingConfig, nvml_lib: String, audit_file: PathBuf) -> Arc<Self> {
        Arc::new(Sharing {
            current: Mutex::new(Current {
                config,
                nvml_lib,
                audit_file,
            }),
            audit: Mutex::new(None),
            running: tokio::sync::Mutex::new(()),
            last: Mutex::new(None),
            status: StatusSink::new(),
            waker: Mutex::new(None),
        })
    }

    /// Where to say that the node changed: the poller's control (set once it runs).
    pub fn set_waker(&self, control: std::sync::mpsc::Sender<crate::poller::Control>) {
        *self.waker.lock().unwrap_or_else(PoisonError::into_inner) = Some(control);
    }

    pub fn feed(&self) -> SharingFeed {
        self.status.feed()
    }

    pub fn config(&self) -> SharingConfig {
        self.lock_current().config.clone()
    }

    fn lock_current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a reloaded configuration (applied by the next [`Sharing::apply`]).
    pub fn reconfigure(&self, config: SharingConfig, nvml_lib: String, audit_file: PathBuf) {
        let mut current = self.lock_current();
        if current.audit_file != audit_file {
            *self.audit.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
        *current = Current {
            config,
            nvml_lib,
            audit_file,
        };
    }

    fn audit_log(&self, path: &Path) -> Result<AuditLog, String> {
        let mut slot = self.audit.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(a) = slot.as_ref() {
            return Ok(a.clone());
        }
        let a = AuditLog::open(path).map_err(|e| e.to_string())?;
        *slot = Some(a.clone());
        Ok(a)
    }

    /// Starts what the configuration asks for: the device plugin, the memory guard, and the
    /// start apply. The first two run until `stop` turns true.
    pub fn start(
        self: &Arc<Self>,
        config: &crate::config::Config,
        published: watch::Receiver<Arc<crate::publication::Published>>,
        stop: watch::Receiver<bool>,
    ) {
        let c = &config.sharing;
        if c.device_plugin.enabled {
            super::plugin::spawn(c, published.clone(), self.status.clone(), stop.clone());
        }
        if let Some(ts) = c
            .time_slicing
            .as_ref()
            .filter(|t| t.resources.iter().any(|r| r.memory_per_replica.is_some()))
        {
            super::guard::spawn(
                ts.clone(),
                c.memory_guard.clone(),
                config.processes.procfs.clone(),
                config.audit_file.clone(),
                published,
                self.status.clone(),
                stop,
            );
        }
        if c.manages_node() {
            let s = self.clone();
            tokio::spawn(async move { s.apply("start", false).await });
        }
    }

    /// Follows a SIGHUP: takes the new settings and applies them (only what differs). The
    /// device plugin, the shared resources and the memory guard change only on restart.
    pub fn reload(self: &Arc<Self>, old: &crate::config::Config, new: &crate::config::Config) {
        let (o, n) = (&old.sharing, &new.sharing);
        if o.device_plugin != n.device_plugin
            || o.time_slicing != n.time_slicing
            || o.memory_guard != n.memory_guard
        {
            tracing::warn!("[sharing.device_plugin], the shared resources and [sharing.memory_guard] change only on restart");
        }
        self.reconfigure(n.clone(), new.nvml_lib.clone(), new.audit_file.clone());
        if n.manages_node() {
            let s = self.clone();
            tokio::spawn(async move { s.apply("sighup", false).await });
        }
    }

    /// Changes the published status.
    fn update_status(&self, f: impl FnOnce(&mut SharingStatus)) {
        self.status.update(f);
    }

    /// The status published to metrics.
    pub fn status(&self) -> Arc<SharingStatus> {
        self.status.latest()
    }

    pub fn last_report(&self) -> Option<Arc<Report>> {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Observe → diff → apply (or only plan, when `dry_run`), logged once with its outcome.
    pub async fn apply(self: &Arc<Self>, trigger: &'static str, dry_run: bool) -> Arc<Report> {
        let _one = self.running.lock().await;
        let me = self.clone();
        let report = tokio::task::spawn_blocking(move || {
            let Current {
                config,
                nvml_lib,
                audit_file,
            } = me.lock_current().clone();
            let audit = match me.audit_log(&audit_file) {
                Ok(a) => Some(a),
                Err(_) if dry_run => None,
                Err(e) => {
                    return apply::Report::audit_failed(
                        trigger,
                        dry_run,
                        format!("cannot open the audit log ({e}); nothing was changed"),
                    )
                }
            };
            apply::run(&config, &nvml_lib, audit.as_ref(), dry_run, trigger)
        })
        .await
        .unwrap_or_else(|e| {
            apply::Report::failed(trigger, dry_run, format!("the apply task failed: {e}"))
        });
        log(&report);
        // Whatever was changed (made, or made and undone) shows at the next poll, now.
        if !dry_run && !report.steps.is_empty() {
            if let Some(w) = self
                .waker
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
            {
                let _ = w.send(crate::poller::Control::Changed);
            }
        }
        if !dry_run {
            let result = if report.ok { "ok" } else { "failed" };
            self.update_status(|s| {
                *s.applies.entry((trigger.to_string(), result)).or_default() += 1;
            });
        }
        let report = Arc::new(report);
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(report.clone());
        report
    }
}

fn log(report: &Report) {
    let text = report.render_text();
    if report.ok && report.steps.is_empty() {
        tracing::info!(trigger = %report.trigger, "sharing: the node matches the configuration");
    } else if report.ok {
        tracing::info!(trigger = %report.trigger, "sharing: {}", text.trim_end());
    } else {
        tracing::error!(trigger = %report.trigger, consistent = report.consistent, "sharing: {}", text.trim_end());
    }
}
