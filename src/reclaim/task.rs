//! The reclaim actor: it receives every publication, runs the [`Stage`] on its snapshot on a
//! blocking thread, and hands on what it found: the view for `/api/v1/reclaim`, the health
//! findings (`idle_held`, `allocated_unused`) that the poller adds to its next judgement, and
//! its series for the next page.
//!
//! It owns everything reclaim keeps across polls (through the stage) and its settings; a reload
//! sends new settings, which the stage takes between two runs. When the publications end (the
//! poller has stopped, after the daemon's stop signal), it writes the accounting state one last
//! time and stops: so its last run sees the poller's last publication.
//!
//! Must not: run on the poller's thread, or be called by it.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::stage::{Settings, Stage, View};
use crate::health::ExtraFindings;
use crate::metrics::Posted;
use crate::publication::Published;

/// The running reclaim actor.
pub struct Reclaim {
    /// The view of its latest run; `None` before its first.
    pub view: watch::Receiver<Option<Arc<View>>>,
    /// Its series, for the poller's page.
    pub series: Arc<Posted>,
    /// Its findings, for the poller's judgement.
    pub findings: watch::Receiver<ExtraFindings>,
    /// The job reports it folds each publication into (`/api/v1/jobs`).
    pub jobs: crate::reclaim::jobs::Shared,
    settings: watch::Sender<Settings>,
    task: JoinHandle<()>,
}

impl Reclaim {
    /// Hands the actor new settings (after a reload); unchanged settings change nothing.
    pub fn reconfigure(&self, settings: Settings) {
        self.settings.send_if_modified(|current| {
            let changed = *current != settings;
            *current = settings;
            changed
        });
    }

    /// Waits (at most `limit`) until the actor's first run is posted: its series and findings
    /// are then in the poller's first page and judgement.
    pub async fn started(&self, limit: std::time::Duration) {
        let mut view = self.view.clone();
        let _ = tokio::time::timeout(limit, view.wait_for(Option::is_some)).await;
    }

    /// Waits until the actor has written its last state and stopped.
    pub async fn stopped(self) {
        let _ = self.task.await;
    }
}

/// Starts the actor on the runtime it is called from.
pub fn spawn(
    settings: Settings,
    owner: Arc<crate::changes::Owner>,
    mut published: watch::Receiver<Arc<Published>>,
) -> Reclaim {
    let (view_tx, view) = watch::channel(None);
    let (findings_tx, findings) = watch::channel(ExtraFindings::default());
    let jobs = crate::reclaim::jobs::Shared::default();
    let store = crate::reclaim::jobs::Store::new(jobs.clone(), settings.jobs_dir.clone());
    let (settings_tx, mut settings_rx) = watch::channel(settings);
    let series = Arc::new(Posted::default());
    let posted = series.clone();
    let task = tokio::spawn(async move {
        let mut current = settings_rx.borrow_and_update().clone();
        let s = current.clone();
        // Loading the accounting state and the job reports reads files: off the async workers.
        let loaded = tokio::task::spawn_blocking(move || {
            if s.accounting.enabled {
                store.load();
            }
            (Stage::new(&s, owner), store)
        });
        let Ok((mut stage, mut store)) = loaded.await else {
            tracing::error!("the reclaim stage failed to start; reclaim and accounting are off");
            return;
        };
        let mut last_taken: Option<SystemTime> = None;
        // The first run is on the publication in the channel now (before the poller's first):
        // accounting restored from the state file is in the first page the poller renders.
        let mut first = true;
        loop {
            if first {
                first = false;
            } else {
                tokio::select! {
                    changed = published.changed() => if changed.is_err() { break },
                    changed = settings_rx.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        current = settings_rx.borrow_and_update().clone();
                        let s = current.clone();
                        match tokio::task::spawn_blocking(move || { stage.reconfigure(&s); stage }).await {
                            Ok(s) => stage = s,
                            Err(_) => return,
                        }
                        continue;
                    }
                }
            }
            let p = published.borrow_and_update().clone();
            if last_taken == Some(p.snapshot.taken_at) {
                continue;
            }
            last_taken = Some(p.snapshot.taken_at);
            let s = current.clone();
            let run = tokio::task::spawn_blocking(move || {
                let (view, found) = stage.observe(&p.snapshot, &s);
                let families = super::metrics::render(&view, &p.snapshot);
                if s.accounting.enabled {
                    store.observe(&p, &view.acts, s.accounting.persist_every);
                }
                (stage, store, view, found, families)
            });
            let Ok((s, j, view, found, families)) = run.await else {
                tracing::error!("the reclaim stage panicked; reclaim and accounting stopped");
                return;
            };
            stage = s;
            store = j;
            posted.post(families);
            view_tx.send_replace(Some(view));
            findings_tx.send_replace(Arc::new(found));
        }
        let _ = tokio::task::spawn_blocking(move || {
            stage.shutdown(&current);
            if current.accounting.enabled {
                store.persist(current.accounting.persist_every, true);
            }
        })
        .await;
    });
    Reclaim {
        view,
        series,
        findings,
        jobs,
        settings: settings_tx,
        task,
    }
}
