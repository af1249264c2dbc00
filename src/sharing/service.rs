//! The sharing subsystem inside the daemon: applies at start, on SIGHUP and through the API,
//! one at a time, off the async workers (NVML and nvidia-smi block); keeps the last report;
//! and publishes [`SharingStatus`] for metrics through the [`StatusSink`] it shares with the
//! device plugin and the memory guard (it starts them; they do not import it).

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use super::apply::Report;
use super::status::{SharingFeed, StatusSink};
use crate::changes::Owner;
use crate::config::sharing::SharingConfig;
use crate::sharing::change::SharingApply;
use crate::snapshot::SharingStatus;

/// The daemon's sharing handle (cheap to clone through `Arc`).
#[derive(Debug)]
pub struct Sharing {
    /// What an apply runs against; replaced on reload.
    current: Mutex<SharingConfig>,
    /// The owner of changes: applies (and the memory guard's signals) go through it, which
    /// records them, lends its NVML session and wakes the poller after a change.
    owner: Arc<Owner>,
    /// One apply at a time (start, SIGHUP and API may race).
    running: tokio::sync::Mutex<()>,
    last: Mutex<Option<Arc<Report>>>,
    status: StatusSink,
}

impl Sharing {
    pub fn new(config: SharingConfig, owner: Arc<Owner>) -> Arc<Self> {
        Arc::new(Sharing {
            current: Mutex::new(config),
            owner,
            running: tokio::sync::Mutex::new(()),
            last: Mutex::new(None),
            status: StatusSink::new(),
        })
    }

    pub fn feed(&self) -> SharingFeed {
        self.status.feed()
    }

    pub fn config(&self) -> SharingConfig {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Takes a reloaded configuration (applied by the next [`Sharing::apply`]).
    pub fn reconfigure(&self, config: SharingConfig) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = config;
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
                self.owner.clone(),
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
        self.reconfigure(n.clone());
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
        let change = SharingApply::daemon(self.config(), dry_run, trigger);
        let report =
            self.owner.call(change).await.unwrap_or_else(|| {
                Report::failed(trigger, dry_run, "the apply task failed".into())
            });
        log(&report);
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
