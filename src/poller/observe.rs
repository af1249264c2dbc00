//! The observe stage: what NVML says about the node, and nothing else.
//!
//! It owns the NVML session (opened with backoff while the library or driver is missing), one
//! worker thread per GPU (`pool`, `worker`), and the session's XID watcher. Each poll it asks
//! every idle worker for a reading, waits for this poll's answers at most
//! `min(REPLY_WAIT, interval)`, and hands on what it has: a GPU whose worker is still busy
//! keeps its previous reading, and once it has been busy for `stall_after` it is reported
//! unreadable (its NVML calls hang), while the other GPUs keep being read.
//!
//! Workers follow the session: a new session gets new workers (what a device lacks is learned
//! again), which presume the identity their index had while the GPU count is unchanged; a
//! changed device count keeps the workers of the indices that remain and asks them to check
//! that their index still names the same board.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::pool::{self, Pool};
use super::schedule::Cadence;
use super::worker::Observed;
use super::PollerConfig;
use crate::gpu::{CallLog, Session, XidEvent, XidWatcher};
use crate::snapshot::{
    CallStat, DriverInfo, GpuIdentity, NvmlCode, NvmlStatus, SourceStatus, Topology,
};

/// The longest a poll waits for its workers before publishing what it has.
const REPLY_WAIT: Duration = Duration::from_secs(1);

/// What one poll observed.
pub(super) struct Observation {
    pub taken_at: SystemTime,
    pub nvml: NvmlStatus,
    pub driver: Option<DriverInfo>,
    /// One per GPU index that has answered at least once (or is known stuck).
    pub gpus: Vec<(u32, Observed)>,
    /// `nvmlDeviceGetCount_v2`, when NVML answered it.
    pub gpu_count: Option<u32>,
    /// XIDs received since the previous poll.
    pub xids: Vec<XidEvent>,
    pub sources: BTreeMap<&'static str, SourceStatus>,
    pub duration: Duration,
    /// How many GPUs ran their slow tier in this poll.
    pub slow_gpus: usize,
    pub nvml_errors: BTreeMap<(&'static str, NvmlCode), u64>,
    pub nvml_init_errors: BTreeMap<NvmlCode, u64>,
    pub nvml_calls: BTreeMap<&'static str, CallStat>,
    /// How the readable GPUs connect; read again when that set changes.
    pub topology: Option<Arc<Topology>>,
}

pub(super) struct Observer {
    session: Option<Session>,
    /// Stopped before `session` is dropped: see `shutdown`.
    watcher: Option<XidWatcher>,
    xid_tx: Sender<XidEvent>,
    xid_rx: Receiver<XidEvent>,
    /// Asks the poller for a poll at once (an XID arrived).
    wake: Option<Sender<super::Control>>,
    pool: Pool,
    /// What each index was in the session that ended, for the next one's workers.
    presumed: Vec<Option<Arc<GpuIdentity>>>,
    /// The observer's own calls (device count, driver version).
    log: CallLog,
    nvml: NvmlStatus,
    driver: Option<DriverInfo>,
    nvml_errors: BTreeMap<(&'static str, NvmlCode), u64>,
    init_errors: BTreeMap<NvmlCode, u64>,
    calls: BTreeMap<&'static str, CallStat>,
    system: Option<SourceStatus>,
    /// The topology last read, for the GPUs (index, UUID) it was read for.
    topology: Option<Arc<Topology>>,
    /// The node was changed (a MIG or sharing apply): the next poll reads the slow tier (MIG
    /// layout, compute mode) of every GPU, instead of waiting for its turn.
    changed: bool,
}

impl Observer {
    /// `wake`: where to ask for a poll at once when an XID arrives.
    pub fn new(wake: Option<Sender<super::Control>>) -> Self {
        let (xid_tx, xid_rx) = mpsc::channel();
        Observer {
            wake,
            session: None,
            watcher: None,
            xid_tx,
            xid_rx,
            pool: Pool::new(),
            presumed: Vec::new(),
            log: CallLog::default(),
            nvml: NvmlStatus::Starting,
            driver: None,
            nvml_errors: BTreeMap::new(),
            init_errors: BTreeMap::new(),
            calls: BTreeMap::new(),
            system: None,
            topology: None,
            changed: false,
        }
    }

    /// Says that the node was changed: the next poll reads every GPU's slow tier.
    pub fn node_changed(&mut self) {
        self.changed = true;
    }

    pub fn nvml(&self) -> &NvmlStatus {
        &self.nvml
    }

    pub fn observe(&mut self, config: &PollerConfig) -> Observation {
        let started = Instant::now();
        let taken_at = SystemTime::now();
        let mut slow_gpus = 0;
        let mut gpu_count = None;
        if let Some(session) = self.ensure_session(config, taken_at) {
            match session.device_count(&mut self.log) {
                Ok(count) => {
                    gpu_count = Some(count);
                    self.enumerate(&session, count as usize);
                    slow_gpus = self.poll_workers(config, started);
                    self.register_xids(&session);
                }
                Err(code) => {
                    // The driver went away under us (unloaded, reset): start over with backoff.
                    self.shutdown();
                    self.mark_down(
                        format!("NVML stopped answering: nvmlDeviceGetCount_v2 failed with {code}"),
                        code,
                        taken_at,
                    );
                }
            }
        }
        let xids = self.drain_xids();
        self.account_system();
        let up = self.session.is_some();
        let stall_after = (config.interval * 3).max(Duration::from_secs(5));
        let gpus = if up {
            self.pool.observed(stall_after)
        } else {
            Vec::new()
        };
        let mut sources = BTreeMap::new();
        if up {
            sources = self.sources(&gpus);
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
        if up {
            self.refresh_topology();
        } else {
            self.topology = None;
        }
        Observation {
            topology: self.topology.clone(),
            taken_at,
            nvml: self.nvml.clone(),
            driver: self.driver.clone(),
            gpus,
            gpu_count: gpu_count.filter(|_| up),
            xids,
            sources,
            duration: started.elapsed(),
            slow_gpus,
            nvml_errors: self.nvml_errors.clone(),
            nvml_init_errors: self.init_errors.clone(),
            nvml_calls: self.calls.clone(),
        }
    }

    /// Reads the topology again when the readable GPUs (index and UUID) are not those it was
    /// read for: at start, and when a GPU comes, goes or is replaced.
    fn refresh_topology(&mut self) {
        let Some(session) = self.session.clone() else {
            return;
        };
        let gpus: Vec<(u32, String)> = self
            .pool
            .readable()
            .map(|(i, id)| (i, id.uuid.clone()))
            .collect();
        let same = self.topology.as_ref().is_some_and(|t| {
            t.gpus.len() == gpus.len()
                && t.gpus
                    .iter()
                    .zip(&gpus)
                    .all(|(g, (i, u))| g.index == *i && &g.uuid == u)
        });
        if same || gpus.is_empty() {
            return;
        }
        let t = session.topology(&gpus, &mut self.log);
        tracing::info!(
            gpus = gpus.len(),
            nvlink_pairs = t
                .pairs
                .iter()
                .filter(|p| p.link == crate::snapshot::Link::Nvlink)
                .count(),
            "read the GPU topology"
        );
        self.topology = Some(Arc::new(t));
    }

    /// Asks the idle workers for a reading and waits for this poll's answers. Returns how many
    /// GPUs ran a timed tier.
    fn poll_workers(&mut self, config: &PollerConfig, started: Instant) -> usize {
        let cadence = Cadence {
            changed: std::mem::take(&mut self.changed),
            interval: config.interval,
            slow_interval: config.slow_interval,
            expensive_interval: config.expensive_interval,
            profiling_interval: config.profiling_interval,
            index: 0,
            gpus: 0,
        };
        let deadline = started + REPLY_WAIT.min(config.interval);
        let (timed, tally) = self.pool.poll(started, deadline, cadence);
        pool::count(tally, &mut self.nvml_errors, &mut self.calls);
        timed
    }

    /// Makes the workers match `count` GPUs; the first enumeration of a session presumes the
    /// previous session's identities only if the count is unchanged (else an index may name
    /// another board).
    fn enumerate(&mut self, session: &Session, count: usize) {
        if count == self.pool.len() {
            return;
        }
        if self.pool.len() > 0 {
            tracing::warn!(
                from = self.pool.len(),
                to = count,
                "GPU count changed, re-enumerating"
            );
        }
        let presumed = std::mem::take(&mut self.presumed);
        let presumed = if presumed.len() == count {
            presumed
        } else {
            Vec::new()
        };
        self.pool.resize(session, count, &presumed);
    }

    /// Counts the watcher's events into what it hands on; errors are counted here.
    fn drain_xids(&mut self) -> Vec<XidEvent> {
        let mut xids = Vec::new();
        while let Ok(event) = self.xid_rx.try_recv() {
            match event {
                XidEvent::Error { function, code } => {
                    *self.nvml_errors.entry((function, code)).or_default() += 1;
                }
                xid => xids.push(xid),
            }
        }
        xids
    }

    /// Starts the session's XID watcher, and asks it to register every reachable GPU it has not
    /// settled yet (a GPU added, or reachable again). A GPU that became lost stays registered:
    /// the set still delivers its last XID (79).
    fn register_xids(&mut self, session: &Session) {
        let watcher = self.watcher.get_or_insert_with(|| {
            let wake = self.wake.clone();
            session.watch_xids(
                self.xid_tx.clone(),
                Box::new(move || {
                    if let Some(w) = &wake {
                        let _ = w.send(super::Control::Wake);
                    }
                }),
            )
        });
        if watcher.busy() {
            return;
        }
        let settled = watcher.coverage().settled;
        let missing: Vec<u32> = self
            .pool
            .readable()
            .filter(|(_, id)| !settled.contains(&id.uuid))
            .map(|(i, _)| i)
            .collect();
        if !missing.is_empty() {
            watcher.register(missing);
        }
    }

    /// Per source over the GPUs published: the time of the last run of each GPU's reads on the
    /// poll's path, and whether all of them succeeded.
    fn sources(&self, gpus: &[(u32, Observed)]) -> BTreeMap<&'static str, SourceStatus> {
        let mut out: BTreeMap<&'static str, SourceStatus> = BTreeMap::new();
        let per_gpu = gpus.iter().flat_map(|(_, g)| g.sources.iter().copied());
        let system = self.system.map(|s| ("system", s));
        for (source, s) in per_gpu.chain(system) {
            let e = out.entry(source).or_insert(SourceStatus {
                duration: Duration::ZERO,
                success: true,
            });
            e.duration += s.duration;
            e.success &= s.success;
        }
        out
    }

    fn account_system(&mut self) {
        let (errors, costs) = self.log.take();
        let tally = pool::Tally {
            errors,
            costs: costs.into_iter().map(|(f, (n, t))| (f, n, t)).collect(),
        };
        pool::count(tally, &mut self.nvml_errors, &mut self.calls);
    }

    fn ensure_session(&mut self, config: &PollerConfig, now: SystemTime) -> Option<Session> {
        if let Some(s) = &self.session {
            return Some(s.clone());
        }
        let started = Instant::now();
        match Session::open(&config.nvml_lib) {
            Ok(session) => {
                self.log.begin_read();
                let driver = session.driver_info(&mut self.log);
                self.system = Some(SourceStatus {
                    duration: started.elapsed(),
                    success: self.log.read_succeeded(),
                });
                tracing::info!(
                    library = %config.nvml_lib,
                    driver = %driver.driver_version,
                    "NVML initialised"
                );
                self.driver = Some(driver);
                self.nvml = NvmlStatus::Up;
                // Indices may name other boards in a new session: new workers, which presume
                // the identity the old ones knew (see `enumerate`) until they can read their own.
                let presumed = self.pool.stop_all();
                if !presumed.is_empty() {
                    self.presumed = presumed;
                }
                self.session = Some(session.clone());
                Some(session)
            }
            Err(e) => {
                *self.init_errors.entry(e.code).or_default() += 1;
                self.mark_down(e.reason, e.code, now);
                None
            }
        }
    }

    fn mark_down(&mut self, reason: String, error: NvmlCode, now: SystemTime) {
        let (since, attempts) = match &self.nvml {
            NvmlStatus::Down {
                since, attempts, ..
            } => (*since, attempts + 1),
            _ => (now, 1),
        };
        if attempts == 1 || matches!(&self.nvml, NvmlStatus::Down { reason: r, .. } if *r != reason)
        {
            tracing::error!(%reason, retry_in = ?backoff(attempts), "NVML unavailable; serving without GPU data and retrying");
        }
        self.nvml = NvmlStatus::Down {
            reason,
            error,
            since,
            attempts,
        };
    }

    /// Stops the XID watcher and the workers before the session goes, so that no thread uses
    /// NVML after shutdown. A worker stuck in an NVML call is left to finish on its own: it
    /// holds the library until then. XIDs already queued stay in the channel and are counted
    /// by UUID at the next poll. What the workers knew of each index is kept for the next
    /// session, for GPUs that cannot say who they are there.
    pub fn shutdown(&mut self) {
        self.watcher = None;
        let presumed = self.pool.stop_all();
        if !presumed.is_empty() {
            self.presumed = presumed;
        }
        self.session = None;
        self.driver = None;
    }
}

/// Backoff between NVML initialisation attempts: 1 s doubling to 30 s.
pub(super) fn backoff(attempts: u32) -> Duration {
    let secs = 1u64 << attempts.saturating_sub(1).min(5);
    Duration::from_secs(secs.min(30))
}
