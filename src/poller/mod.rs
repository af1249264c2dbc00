//! The poller: the one task that talks to NVML.
//!
//! It runs on a dedicated blocking thread (NVML calls block, sometimes for long), polls every GPU
//! each interval, renders the page once, and publishes an immutable [`Published`] through a
//! `tokio::sync::watch` channel. Scrapes, health checks and every actor only read what was
//! published; the poller calls none of them and imports none of them.
//!
//! It must never exit on an NVML failure: a missing library or driver is retried with backoff, a
//! lost GPU is reported while the others keep reporting, and a changed device count triggers a
//! re-enumeration. Only `Control::Shutdown` (or the control channel closing) stops it.
//!
//! A poll is five stages with one owner each:
//!
//! 1. **observe** ([`observe`]): the NVML session, one worker thread per GPU ([`worker`]) that
//!    owns its device's NVML state and reads it by tiers of cost ([`schedule`]), and the XID
//!    watcher. GPUs are read in parallel; a hung one does not hold the others.
//! 2. **enrich** ([`enrich`]): per-board accumulations ([`boards`]: XID and dropped-process
//!    counts, by UUID), procfs attribution, kubelet pods, the sharing status. The result is a
//!    [`Snapshot`].
//! 3. **judge**: the pure health evaluator, with the findings actors made (reclaim's
//!    `idle_held`, from the publication before), and the journal of its changes.
//! 4. **render**: every family, once, with the actors' collectors ([`metrics::Collector`]).
//! 5. **publish**: one `Arc<Published>` on the watch channel.

mod boards;
mod enrich;
mod observe;
mod pool;
mod schedule;
mod worker;

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use crate::config::ProcessesConfig;
use crate::health::{self, Evaluator, ExtraFindings, HealthConfig, Journal, NodeHealth};
use crate::kubernetes::KubeletFeed;
use crate::metrics::{self, Collector, RenderConfig};
use crate::publication::Published;
use crate::snapshot::{Feed, NvmlStatus, SharingStatus, Snapshot};
use crate::AgentCounters;

use enrich::Enricher;
use observe::{backoff, Observer};

/// What the poller needs to know; replaced as a whole on reload.
#[derive(Debug, Clone, PartialEq)]
pub struct PollerConfig {
    /// Path or name of `libnvidia-ml.so.1`.
    pub nvml_lib: String,
    /// The publication rate, and the cadence of the fast tier of reads.
    pub interval: Duration,
    /// The cadence of the slow tier (0.16 ms or slow-moving reads); at most every poll.
    pub slow_interval: Duration,
    /// The cadence of the expensive tier (reads of milliseconds); at most every poll.
    pub expensive_interval: Duration,
    /// The GPM window: profiling samples are taken this far apart; never shorter than
    /// `interval` (the configuration refuses it).
    pub profiling_interval: Duration,
    pub render: RenderConfig,
    pub health: HealthConfig,
    pub processes: ProcessesConfig,
    /// The kubelet client's latest mapping, when `[kubernetes] enabled`.
    pub kubelet: Option<KubeletFeed>,
    /// The sharing subsystem's latest status, when `[sharing]` configures anything.
    pub sharing: Option<Feed<SharingStatus>>,
}

/// What the actors hand the poller once, at start: their series and their findings.
#[derive(Default)]
pub struct FromActors {
    /// Collected into every page, after the poller's own families.
    pub collectors: Vec<Arc<dyn Collector>>,
    /// The reclaim actor's latest findings, added to each judgement.
    pub findings: Option<watch::Receiver<ExtraFindings>>,
}

/// Messages to the poller thread.
#[derive(Debug)]
pub enum Control {
    /// Boxed: the config is large and reloads are rare.
    Reconfigure(Box<PollerConfig>),
    Shutdown,
    /// Poll now: the XID watcher saw an event, and health must not wait for the next tick.
    Wake,
    /// The node was changed (a MIG apply): poll now, and read every GPU's slow tier (the MIG
    /// layout, the compute mode) in that poll, so that the page shows the change within a poll.
    Changed,
}

/// The least time between the starts of two polls when XIDs wake the poller: an XID storm
/// costs at most one poll per this, and a single XID is published within it plus a poll.
const MIN_WAKE_GAP: Duration = Duration::from_millis(50);

/// Handle to the running poller thread.
pub struct PollerHandle {
    pub control: Sender<Control>,
    thread: Option<JoinHandle<()>>,
}

impl PollerHandle {
    /// Asks the poller to stop and waits for it (the NVML session is shut down on the way out).
    pub fn stop(mut self) {
        let _ = self.control.send(Control::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the poller thread.
pub fn spawn(
    config: PollerConfig,
    counters: Arc<AgentCounters>,
    journal: Arc<Mutex<Journal>>,
    actors: FromActors,
    out: watch::Sender<Arc<Published>>,
) -> std::io::Result<PollerHandle> {
    let (control, rx) = mpsc::channel();
    let thread = std::thread::Builder::new().name("poller".into()).spawn({
        let wake = control.clone();
        move || Poller::new(config, counters, journal, actors, wake).run(&rx, &out)
    })?;
    Ok(PollerHandle {
        control,
        thread: Some(thread),
    })
}

/// The poll loop: observe -> enrich -> judge -> render -> publish, each stage with one owner.
struct Poller {
    config: PollerConfig,
    counters: Arc<AgentCounters>,
    observer: Observer,
    enricher: Enricher,
    evaluator: Evaluator,
    actors: FromActors,
    journal: Arc<Mutex<Journal>>,
    polls: u64,
}

impl Poller {
    fn new(
        config: PollerConfig,
        counters: Arc<AgentCounters>,
        journal: Arc<Mutex<Journal>>,
        actors: FromActors,
        wake: Sender<Control>,
    ) -> Self {
        Poller {
            observer: Observer::new(Some(wake)),
            enricher: Enricher::new(&config),
            evaluator: Evaluator::new(config.health.clone()),
            actors,
            journal,
            config,
            counters,
            polls: 0,
        }
    }

    fn run(mut self, control: &Receiver<Control>, out: &watch::Sender<Arc<Published>>) {
        loop {
            let started = Instant::now();
            let observation = self.observer.observe(&self.config);
            let slow_gpus = observation.slow_gpus;
            self.polls += 1;
            let snapshot = Arc::new(self.enricher.enrich(observation, &self.config, self.polls));
            let health = Arc::new(self.judge(&snapshot));
            let page = metrics::render(
                &snapshot,
                &health,
                &self.config.render,
                &self.counters,
                &self.actors.collectors,
            );
            out.send_replace(Arc::new(Published {
                snapshot: snapshot.clone(),
                health,
                journal: self.journal.clone(),
                page,
                interval: self.config.interval,
            }));
            tracing::debug!(
                poll = self.polls,
                wall_us = snapshot.poll_duration.as_micros() as u64,
                total_us = started.elapsed().as_micros() as u64,
                slow_gpus,
                "poll complete"
            );
            let wait = match self.observer.nvml() {
                NvmlStatus::Down { attempts, .. } => backoff(*attempts),
                _ => self.config.interval.saturating_sub(started.elapsed()),
            };
            match control.recv_timeout(wait) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(Control::Reconfigure(config)) => self.reconfigure(*config),
                Ok(wake @ (Control::Wake | Control::Changed)) => {
                    if matches!(wake, Control::Changed) {
                        self.observer.node_changed();
                    }
                    // Events come in bursts: one poll for all that arrive within the gap.
                    let gap = MIN_WAKE_GAP.saturating_sub(started.elapsed());
                    if !gap.is_zero() {
                        std::thread::sleep(gap);
                    }
                    loop {
                        match control.try_recv() {
                            Ok(Control::Wake) => {}
                            Ok(Control::Changed) => self.observer.node_changed(),
                            Ok(Control::Reconfigure(config)) => self.reconfigure(*config),
                            Ok(Control::Shutdown) | Err(TryRecvError::Disconnected) => {
                                self.observer.shutdown();
                                return;
                            }
                            Err(TryRecvError::Empty) => break,
                        }
                    }
                }
                Ok(Control::Shutdown) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        self.observer.shutdown();
    }

    fn reconfigure(&mut self, config: PollerConfig) {
        if config.nvml_lib != self.config.nvml_lib {
            tracing::info!(library = %config.nvml_lib, "NVML library changed, reloading");
            self.observer.shutdown();
        }
        self.evaluator.set_config(config.health.clone());
        self.enricher.reconfigure(&config);
        self.config = config;
    }

    /// Judges the snapshot with the actors' findings, logs each condition change once and
    /// journals it.
    fn judge(&mut self, snapshot: &Snapshot) -> NodeHealth {
        let extra = match &self.actors.findings {
            Some(f) => f.borrow().clone(),
            None => ExtraFindings::default(),
        };
        let (health, events) = self
            .evaluator
            .evaluate_with(snapshot, &extra, SystemTime::now());
        if !events.is_empty() {
            events.iter().for_each(health::journal::log);
            self.journal
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .append(events);
        }
        health
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_thirty_seconds() {
        let secs: Vec<u64> = (1..=8).map(|a| backoff(a).as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
