//! The poller: the one task that talks to NVML.
//!
//! It runs on a dedicated blocking thread (NVML calls block, sometimes for long), polls every GPU
//! each interval, renders the metrics once, and publishes an immutable `Published` through a
//! `tokio::sync::watch` channel. Scrapes and health checks only read what was published.
//!
//! It must never exit on an NVML failure: a missing library or driver is retried with backoff, a
//! lost GPU is reported while the others keep reporting, and a changed device count triggers a
//! re-enumeration. Only `Control::Shutdown` (or the control channel closing) stops it.
//!
//! Per-GPU state lives in [`state`]: per index for one enumeration, per UUID for what
//! accumulates (XID and dropped-process counts), which survives re-enumeration and NVML
//! re-initialisation. One XID watcher (one event set) serves each NVML session; GPUs that become
//! reachable are registered on it, never by replacing it.

mod session;
mod state;
mod xids;

use session::backoff;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use crate::attribution::{self, ProcTable, ProcessesConfig};
use crate::gpu::{CallLog, Session, XidEvent, XidWatcher};
use crate::health::{self, Evaluator, HealthConfig, Journal, NodeHealth};
use crate::kubernetes::{KubeletFeed, KubeletStatus};
use crate::metrics::{self, RenderConfig, Rendered};
use crate::snapshot::{GpuReading, GpuSnapshot, GpuStatus, NvmlStatus, Snapshot, SourceStatus};
use crate::AgentCounters;

/// What the poller needs to know; replaced as a whole on reload.
#[derive(Debug, Clone, PartialEq)]
pub struct PollerConfig {
    /// Path or name of `libnvidia-ml.so.1`.
    pub nvml_lib: String,
    pub interval: Duration,
    pub render: RenderConfig,
    pub health: HealthConfig,
    pub processes: ProcessesConfig,
    /// The kubelet client's latest mapping, when `[kubernetes] enabled`.
    pub kubelet: Option<KubeletFeed>,
}

/// Messages to the poller thread.
#[derive(Debug)]
pub enum Control {
    /// Boxed: the config is large and reloads are rare.
    Reconfigure(Box<PollerConfig>),
    Shutdown,
}

/// What the poller publishes each interval: the snapshot, its health and its rendered metrics.
#[derive(Debug)]
pub struct Published {
    pub snapshot: Arc<Snapshot>,
    /// Per-GPU verdicts computed from `snapshot` (and the ones before it).
    pub health: Arc<NodeHealth>,
    /// The health event journal: the same `Arc` in every publication. The poller appends once
    /// per poll; readers hold the lock only to copy entries out, so they never stall a poll.
    pub journal: Arc<Mutex<Journal>>,
    pub metrics: Rendered,
    /// The poll interval in force when this was published (readiness uses it).
    pub interval: Duration,
}

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
    out: watch::Sender<Arc<Published>>,
) -> std::io::Result<PollerHandle> {
    let (control, rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("poller".into())
        .spawn(move || Poller::new(config, counters, journal).run(&rx, &out))?;
    Ok(PollerHandle {
        control,
        thread: Some(thread),
    })
}

struct Poller {
    config: PollerConfig,
    counters: Arc<AgentCounters>,
    evaluator: Evaluator,
    journal: Arc<Mutex<Journal>>,
    session: Option<Session>,
    /// Stopped before `session` is dropped: see `shutdown_nvml`.
    watcher: Option<XidWatcher>,
    xid_tx: Sender<XidEvent>,
    xid_rx: Receiver<XidEvent>,
    nvml: NvmlStatus,
    driver: Option<crate::snapshot::DriverInfo>,
    gpus: state::GpuStates,
    nvml_errors: BTreeMap<(&'static str, String), u64>,
    init_errors: BTreeMap<String, u64>,
    polls: u64,
    /// Process names and owners, cached by (pid, start time) across polls.
    procs: ProcTable,
}

impl Poller {
    fn new(
        config: PollerConfig,
        counters: Arc<AgentCounters>,
        journal: Arc<Mutex<Journal>>,
    ) -> Self {
        let (xid_tx, xid_rx) = mpsc::channel();
        Poller {
            procs: ProcTable::new(config.processes.procfs.clone()),
            evaluator: Evaluator::new(config.health.clone()),
            journal,
            config,
            counters,
            session: None,
            watcher: None,
            xid_tx,
            xid_rx,
            nvml: NvmlStatus::Starting,
            driver: None,
            gpus: state::GpuStates::default(),
            nvml_errors: BTreeMap::new(),
            init_errors: BTreeMap::new(),
            polls: 0,
        }
    }

    fn run(mut self, control: &Receiver<Control>, out: &watch::Sender<Arc<Published>>) {
        loop {
            let started = Instant::now();
            let snapshot = Arc::new(self.poll());
            let health = Arc::new(self.evaluate(&snapshot));
            let metrics = metrics::render(&snapshot, &health, &self.config.render, &self.counters);
            out.send_replace(Arc::new(Published {
                snapshot: snapshot.clone(),
                health,
                journal: self.journal.clone(),
                metrics,
                interval: self.config.interval,
            }));
            let wait = match &snapshot.nvml {
                NvmlStatus::Down { attempts, .. } => backoff(*attempts),
                _ => self.config.interval.saturating_sub(started.elapsed()),
            };
            match control.recv_timeout(wait) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(Control::Reconfigure(config)) => {
                    if config.nvml_lib != self.config.nvml_lib {
                        tracing::info!(library = %config.nvml_lib, "NVML library changed, reloading");
                        self.shutdown_nvml();
                    }
                    self.evaluator.set_config(config.health.clone());
                    if config.processes.procfs != self.procs.root() {
                        self.procs = ProcTable::new(config.processes.procfs.clone());
                    }
                    self.config = *config;
                }
                Ok(Control::Shutdown) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        self.shutdown_nvml();
    }

    /// Judges the snapshot, logs each condition change once and journals it.
    fn evaluate(&mut self, snapshot: &Snapshot) -> NodeHealth {
        let (health, events) = self.evaluator.evaluate(snapshot, SystemTime::now());
        if !events.is_empty() {
            events.iter().for_each(health::journal::log);
            self.journal
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .append(events);
        }
        health
    }

    fn poll(&mut self) -> Snapshot {
        let started = Instant::now();
        let taken_at = SystemTime::now();
        let mut log = CallLog::default();
        let session = match self.ensure_session(&mut log, taken_at) {
            Some(s) => s,
            None => return self.snapshot(taken_at, started, log, Vec::new()),
        };
        log.begin("identity");
        let count = match session.device_count() {
            Ok(n) => n,
            Err(code) => {
                // The driver went away under us (unloaded, reset): start over with backoff.
                self.count_error("nvmlDeviceGetCount_v2", &code);
                self.shutdown_nvml();
                self.mark_down(
                    format!("NVML stopped answering: nvmlDeviceGetCount_v2 failed with {code}"),
                    code,
                    taken_at,
                );
                return self.snapshot(taken_at, started, log, Vec::new());
            }
        };
        if count as usize != self.gpus.slots.len() {
            if !self.gpus.slots.is_empty() {
                tracing::warn!(
                    from = self.gpus.slots.len(),
                    to = count,
                    "GPU count changed, re-enumerating"
                );
            }
            // The session's event set stays: the GPUs still there remain registered on it.
            self.gpus.reenumerate(count);
        }
        self.drain_xids();
        let kubelet = self.config.kubelet.as_ref().map(KubeletFeed::latest);
        let mut seen = std::collections::HashSet::new();
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let mut g = self.poll_gpu(&session, index, &mut log);
            self.attribute(&mut g, kubelet.as_ref(), &mut seen);
            gpus.push(g);
        }
        self.procs.retain(&seen);
        self.gpus.end_poll(
            &gpus
                .iter()
                .filter_map(|g| g.identity.as_ref())
                .map(|i| i.uuid.as_str())
                .collect::<BTreeSet<_>>(),
        );
        self.register_xids(&session, &gpus);
        self.snapshot(taken_at, started, log, gpus)
    }

    fn poll_gpu(&mut self, session: &Session, index: u32, log: &mut CallLog) -> GpuSnapshot {
        let state = &mut self.gpus.slots[index as usize];
        let errors_before = log.errors.len();
        log.lost = false;
        let (status, reading) = match session.read_gpu(
            index,
            !state.identity_complete,
            &mut state.cursor,
            &mut state.gpm,
            log,
        ) {
            Ok((identity, reading)) => {
                if let Some(read) = identity {
                    state.identity_complete = read.complete;
                    state.identity = Some(Arc::new(read.merged(state.identity.as_deref())));
                }
                let status = if log.lost {
                    GpuStatus::Lost
                } else {
                    GpuStatus::Up
                };
                (status, reading)
            }
            Err(code) if code == "gpu_is_lost" => (GpuStatus::Lost, GpuReading::default()),
            Err(code) => (
                GpuStatus::Unreadable(format!("NVML cannot read this GPU: {code}")),
                GpuReading::default(),
            ),
        };
        log.end();
        if state.status.as_ref() != Some(&status) {
            let uuid = state.identity.as_ref().map_or("", |i| i.uuid.as_str());
            match &status {
                GpuStatus::Up if state.status.is_some() => {
                    tracing::info!(gpu = index, uuid, "GPU readable again")
                }
                GpuStatus::Up => {}
                GpuStatus::Lost => tracing::error!(
                    gpu = index,
                    uuid,
                    "GPU is lost (fallen off the bus or inaccessible)"
                ),
                GpuStatus::Unreadable(why) => {
                    tracing::error!(gpu = index, uuid, reason = %why, "GPU unreadable")
                }
            }
            state.status = Some(status.clone());
        }
        let failed_calls = (log.errors.len() - errors_before) as u32;
        let identity = state.identity.clone();
        let (xids, last_xid) = match &identity {
            Some(id) => {
                let board = self.gpus.board(&id.uuid);
                (board.xids.clone(), board.last_xid)
            }
            None => (BTreeMap::new(), None),
        };
        GpuSnapshot {
            index,
            identity,
            status,
            reading,
            failed_calls,
            xids,
            last_xid,
        }
    }

    /// Adds procfs facts to the GPU's processes (capped) and the kubelet's pods to the GPU.
    fn attribute(
        &mut self,
        g: &mut GpuSnapshot,
        kubelet: Option<&KubeletStatus>,
        seen: &mut std::collections::HashSet<u32>,
    ) {
        let dropped = attribution::attach(
            &mut g.reading,
            &mut self.procs,
            &self.config.processes,
            seen,
        );
        // Keyed by UUID like the XID counts; a GPU without identity has no readable processes.
        if let Some(id) = &g.identity {
            let board = self.gpus.board(&id.uuid);
            board.processes_dropped += dropped;
            g.reading.processes_dropped_total = board.processes_dropped;
        }
        if let Some(k) = kubelet {
            g.reading.pods = k.mapping.get(g.uuid()).cloned().unwrap_or_default();
        }
    }

    fn count_error(&mut self, function: &'static str, code: &str) {
        *self
            .nvml_errors
            .entry((function, code.to_string()))
            .or_default() += 1;
    }

    fn snapshot(
        &mut self,
        taken_at: SystemTime,
        started: Instant,
        mut log: CallLog,
        gpus: Vec<GpuSnapshot>,
    ) -> Snapshot {
        log.end();
        for (function, code) in std::mem::take(&mut log.errors) {
            self.count_error(function, &code);
        }
        self.polls += 1;
        let mut sources: BTreeMap<&'static str, SourceStatus> = log
            .sources
            .into_iter()
            .map(|(name, (duration, success))| (name, SourceStatus { duration, success }))
            .collect();
        if self.session.is_some() {
            // Only errors fail the source: GPUs that answer NOT_SUPPORTED have no XID stream,
            // as other unsupported calls have no value.
            let events_ok = self.watcher.as_ref().is_none_or(XidWatcher::healthy);
            sources.insert(
                "events",
                SourceStatus {
                    duration: Duration::ZERO,
                    success: events_ok,
                },
            );
        }
        Snapshot {
            taken_at,
            nvml: self.nvml.clone(),
            driver: self.driver.clone(),
            gpus,
            sources,
            poll_duration: started.elapsed(),
            nvml_errors: self.nvml_errors.clone(),
            nvml_init_errors: self.init_errors.clone(),
            polls: self.polls,
            kubernetes: self.config.kubelet.as_ref().map(KubeletFeed::latest),
        }
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
