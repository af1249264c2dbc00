//! The observe stage: what NVML says about the node, and nothing else.
//!
//! It owns the NVML session (opened with backoff while the library or driver is missing), one
//! worker thread per GPU (see `worker`), and the session's XID watcher. Each poll it asks
//! every idle worker for a reading, waits for the answers at most `REPLY_WAIT`, and hands on
//! what it has: a GPU whose worker is still busy keeps its previous reading, and once its
//! request is older than `stall_after` it is reported unreadable (its NVML calls hang), while
//! the other GPUs keep being read.
//!
//! Workers follow the session: a new session gets new workers (what a device lacks is learned
//! again); a changed device count keeps the workers of the indices that remain and asks them to
//! check that their index still names the same board.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use super::schedule::Cadence;
use super::worker::{Job, Observed, Reply, Worker};
use super::PollerConfig;
use crate::gpu::{CallLog, Session, XidEvent, XidWatcher};
use crate::snapshot::{
    CallStat, DriverInfo, GpuIdentity, GpuStatus, NvmlCode, NvmlStatus, SourceStatus,
};

/// The longest a poll waits for its workers before publishing what it has.
const REPLY_WAIT: Duration = Duration::from_secs(1);

/// What one poll observed.
pub(super) struct Observation {
    pub taken_at: SystemTime,
    pub nvml: NvmlStatus,
    pub driver: Option<DriverInfo>,
    /// One per GPU index.
    pub gpus: Vec<(u32, Observed)>,
    /// XIDs received since the previous poll.
    pub xids: Vec<XidEvent>,
    pub sources: BTreeMap<&'static str, SourceStatus>,
    pub duration: Duration,
    /// How many GPUs ran their slow tier in this poll.
    pub slow_gpus: usize,
    pub nvml_errors: BTreeMap<(&'static str, NvmlCode), u64>,
    pub nvml_init_errors: BTreeMap<NvmlCode, u64>,
    pub nvml_calls: BTreeMap<&'static str, CallStat>,
}

struct WorkerHandle {
    jobs: Sender<Job>,
    thread: Option<JoinHandle<()>>,
    /// The request not answered yet: its sequence number and when it was sent.
    outstanding: Option<(u64, Instant)>,
    /// The last answer.
    latest: Option<Observed>,
    /// Check the board at the next poll (the enumeration changed).
    verify: bool,
}

pub(super) struct Observer {
    session: Option<Session>,
    /// Stopped before `session` is dropped: see `shutdown`.
    watcher: Option<XidWatcher>,
    xid_tx: Sender<XidEvent>,
    xid_rx: Receiver<XidEvent>,
    replies_tx: Sender<Reply>,
    replies_rx: Receiver<Reply>,
    workers: Vec<WorkerHandle>,
    /// The observer's own calls (device count, driver version).
    log: CallLog,
    nvml: NvmlStatus,
    driver: Option<DriverInfo>,
    seq: u64,
    nvml_errors: BTreeMap<(&'static str, NvmlCode), u64>,
    init_errors: BTreeMap<NvmlCode, u64>,
    calls: BTreeMap<&'static str, CallStat>,
    system: Option<SourceStatus>,
}

impl Observer {
    pub fn new() -> Self {
        let (xid_tx, xid_rx) = mpsc::channel();
        let (replies_tx, replies_rx) = mpsc::channel();
        Observer {
            session: None,
            watcher: None,
            xid_tx,
            xid_rx,
            replies_tx,
            replies_rx,
            workers: Vec::new(),
            log: CallLog::default(),
            nvml: NvmlStatus::Starting,
            driver: None,
            seq: 0,
            nvml_errors: BTreeMap::new(),
            init_errors: BTreeMap::new(),
            calls: BTreeMap::new(),
            system: None,
        }
    }

    pub fn nvml(&self) -> &NvmlStatus {
        &self.nvml
    }

    pub fn observe(&mut self, config: &PollerConfig) -> Observation {
        let started = Instant::now();
        let taken_at = SystemTime::now();
        let mut slow_gpus = 0;
        if let Some(session) = self.ensure_session(config, taken_at) {
            match session.device_count(&mut self.log) {
                Ok(count) => {
                    self.enumerate(&session, count);
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
        let mut sources = if up { self.sources() } else { BTreeMap::new() };
        if up {
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
        let stall_after = (config.interval * 3).max(Duration::from_secs(5));
        let gpus = self
            .workers
            .iter()
            .enumerate()
            .filter(|_| up)
            .filter_map(|(i, w)| Some((i as u32, stalled(w, stall_after)?)))
            .collect();
        Observation {
            taken_at,
            nvml: self.nvml.clone(),
            driver: self.driver.clone(),
            gpus,
            xids,
            sources,
            duration: started.elapsed(),
            slow_gpus,
            nvml_errors: self.nvml_errors.clone(),
            nvml_init_errors: self.init_errors.clone(),
            nvml_calls: self.calls.clone(),
        }
    }

    /// Sends a job to every idle worker and collects answers until all came or the wait is
    /// over. Returns how many GPUs ran their slow tier.
    fn poll_workers(&mut self, config: &PollerConfig, started: Instant) -> usize {
        self.seq += 1;
        let gpus = self.workers.len() as u32;
        for (index, w) in self.workers.iter_mut().enumerate() {
            if w.outstanding.is_some() {
                continue;
            }
            let job = Job::Poll {
                seq: self.seq,
                now: started,
                cadence: Cadence {
                    interval: config.interval,
                    slow_interval: config.slow_interval,
                    expensive_interval: config.expensive_interval,
                    index: index as u32,
                    gpus,
                },
                verify: std::mem::take(&mut w.verify),
            };
            if w.jobs.send(job).is_ok() {
                w.outstanding = Some((self.seq, started));
            }
        }
        let deadline = started + REPLY_WAIT.min(config.interval);
        let mut slow = 0;
        while self.workers.iter().any(|w| w.outstanding.is_some()) {
            let wait = deadline.saturating_duration_since(Instant::now());
            let reply = match self.replies_rx.recv_timeout(wait) {
                Ok(r) => r,
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => break,
            };
            slow += usize::from(reply.seq == self.seq && reply.gpu.slow);
            self.accept(reply);
        }
        slow
    }

    /// Takes a worker's answer (possibly to an earlier poll, from a worker that was slow).
    fn accept(&mut self, reply: Reply) {
        let Some(w) = self.workers.get_mut(reply.index as usize) else {
            return;
        };
        if w.outstanding.is_none_or(|(seq, _)| seq != reply.seq) {
            return; // an answer from a worker that was replaced meanwhile
        }
        w.outstanding = None;
        let mut gpu = reply.gpu;
        for (function, code) in gpu.errors.drain(..) {
            *self.nvml_errors.entry((function, code)).or_default() += 1;
        }
        for (function, n, time) in gpu.costs.drain(..) {
            self.calls.entry(function).or_default().add(n, time);
        }
        w.latest = Some(gpu);
    }

    /// Makes the workers match `count` GPUs.
    fn enumerate(&mut self, session: &Session, count: u32) {
        let count = count as usize;
        if count == self.workers.len() {
            return;
        }
        if !self.workers.is_empty() {
            tracing::warn!(
                from = self.workers.len(),
                to = count,
                "GPU count changed, re-enumerating"
            );
        }
        for w in self.workers.drain(count.min(self.workers.len())..) {
            stop(w);
        }
        for w in &mut self.workers {
            w.verify = true;
        }
        while self.workers.len() < count {
            let index = self.workers.len() as u32;
            let w = self.spawn(session, index, None);
            self.workers.push(w);
        }
    }

    fn spawn(
        &self,
        session: &Session,
        index: u32,
        presumed: Option<Arc<GpuIdentity>>,
    ) -> WorkerHandle {
        let (jobs, rx) = mpsc::channel();
        let worker = Worker::new(session.reader(index), presumed);
        let replies = self.replies_tx.clone();
        let thread = std::thread::Builder::new()
            .name(format!("gpu-{index}"))
            .spawn(move || worker.run(rx, replies))
            .map_err(|e| tracing::error!(gpu = index, error = %e, "cannot start the GPU's worker thread"))
            .ok();
        WorkerHandle {
            jobs,
            thread,
            outstanding: None,
            latest: None,
            verify: false,
        }
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
        let watcher = self
            .watcher
            .get_or_insert_with(|| session.watch_xids(self.xid_tx.clone()));
        if watcher.busy() {
            return;
        }
        let settled = watcher.coverage().settled;
        let missing: Vec<u32> = self
            .workers
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                let g = w.latest.as_ref()?;
                let id = g.identity.as_ref()?;
                (g.status == GpuStatus::Up && !settled.contains(&id.uuid)).then_some(i as u32)
            })
            .collect();
        if !missing.is_empty() {
            watcher.register(missing);
        }
    }

    /// Per source over all GPUs: the time of the last run of each GPU's reads, and whether all
    /// of them succeeded.
    fn sources(&self) -> BTreeMap<&'static str, SourceStatus> {
        let mut out: BTreeMap<&'static str, SourceStatus> = BTreeMap::new();
        let per_gpu = self
            .workers
            .iter()
            .filter_map(|w| w.latest.as_ref())
            .flat_map(|g| g.sources.iter().copied());
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
        for (function, code) in errors {
            *self.nvml_errors.entry((function, code)).or_default() += 1;
        }
        for (function, (n, time)) in costs {
            self.calls.entry(function).or_default().add(n, time);
        }
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
                // Indices may name other boards in a new session: new workers, which keep the
                // identity the old ones knew until they can read their own.
                let presumed: Vec<Option<Arc<GpuIdentity>>> = self
                    .workers
                    .drain(..)
                    .map(|w| {
                        let id = w.latest.as_ref().and_then(|g| g.identity.clone());
                        stop(w);
                        id
                    })
                    .collect();
                for (index, id) in presumed.into_iter().enumerate() {
                    let mut w = self.spawn(&session, index as u32, id);
                    w.verify = true;
                    self.workers.push(w);
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
    /// by UUID at the next poll. What the workers knew of each index is kept until the next
    /// session starts, for GPUs that cannot say who they are there.
    pub fn shutdown(&mut self) {
        self.watcher = None;
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = w.jobs.send(Job::Stop);
                if w.outstanding.is_none() {
                    let _ = t.join();
                }
            }
        }
        self.session = None;
        self.driver = None;
    }
}

/// What to publish for a worker: its last answer, or unreadable once its request is older
/// than `stall_after` (an NVML call on that GPU hangs).
fn stalled(w: &WorkerHandle, stall_after: Duration) -> Option<Observed> {
    let mut gpu = w.latest.clone();
    if let Some((_, since)) = w.outstanding {
        let waited = since.elapsed();
        if waited >= stall_after {
            let g = gpu.get_or_insert_with(|| Observed {
                identity: None,
                status: GpuStatus::Up,
                reading: Default::default(),
                failed_calls: 0,
                errors: Vec::new(),
                costs: Vec::new(),
                sources: Vec::new(),
                slow: false,
            });
            g.status = GpuStatus::Unreadable(format!(
                "NVML has not answered a read of this GPU for {}s (a hung driver call); the \
                 other GPUs are still read",
                waited.as_secs()
            ));
            g.reading = Default::default();
        }
    }
    gpu
}

fn stop(mut w: WorkerHandle) {
    let _ = w.jobs.send(Job::Stop);
    if let Some(t) = w.thread.take() {
        if w.outstanding.is_none() {
            let _ = t.join();
        }
    }
}

/// Backoff between NVML initialisation attempts: 1 s doubling to 30 s.
pub(super) fn backoff(attempts: u32) -> Duration {
    let secs = 1u64 << attempts.saturating_sub(1).min(5);
    Duration::from_secs(secs.min(30))
}
