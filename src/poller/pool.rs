//! The per-GPU workers of one NVML session, as the observer sees them: which is busy and since
//! when, which answer is awaited, what each last said.
//!
//! A worker is sent a job only when it is idle (its reply *and* the background reads after it
//! are done), so a worker stuck in an NVML call is never sent more work, never waited for by a
//! later poll, and never joined without a limit: it is reported unreadable once it has been
//! busy for `stall_after`, and left behind at shutdown.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::schedule::Cadence;
use super::worker::{Busy, Job, Observed, Reply, Worker};
use crate::gpu::{InCall, Session};
use crate::snapshot::{CallStat, GpuIdentity, GpuStatus, NvmlCode, SourceStatus};

/// How long a stopped worker may take to finish before it is left behind.
const STOP_WAIT: Duration = Duration::from_millis(200);

struct Handle {
    jobs: Sender<Job>,
    thread: Option<JoinHandle<()>>,
    /// Since when the worker has been working on a job, and what it has told of its GPU.
    busy: Busy,
    /// The NVML call the worker is in.
    call: InCall,
    /// The job whose reply has not come yet.
    awaiting: Option<u64>,
    /// The last answer.
    latest: Option<Observed>,
    /// Who the GPU at this index was in the previous session, until it says who it is.
    presumed: Option<Arc<GpuIdentity>>,
    /// Check the board at the next job (the enumeration changed).
    verify: bool,
}

/// What the answers added to the agent's counters.
#[derive(Default)]
pub(super) struct Tally {
    pub errors: Vec<(&'static str, NvmlCode)>,
    pub costs: Vec<(&'static str, u64, Duration)>,
}

pub(super) struct Pool {
    handles: Vec<Handle>,
    replies_tx: Sender<Reply>,
    replies_rx: Receiver<Reply>,
    seq: u64,
}

impl Pool {
    pub fn new() -> Self {
        let (replies_tx, replies_rx) = mpsc::channel();
        Pool {
            handles: Vec::new(),
            replies_tx,
            replies_rx,
            seq: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Makes the pool match `count` GPUs of `session`. Workers of the indices that remain are
    /// kept (they check their board at their next job); new indices get new workers, which
    /// presume the identity `presumed` gives for their index.
    pub fn resize(
        &mut self,
        session: &Session,
        count: usize,
        presumed: &[Option<Arc<GpuIdentity>>],
    ) {
        for h in self.handles.drain(count.min(self.handles.len())..) {
            stop(h);
        }
        for h in &mut self.handles {
            h.verify = true;
        }
        while self.handles.len() < count {
            let index = self.handles.len();
            let presumed = presumed.get(index).cloned().flatten();
            let h = self.spawn(session, index as u32, presumed);
            self.handles.push(h);
        }
    }

    /// Stops every worker (those stuck in NVML are left behind) and returns what each index
    /// was last known to be.
    pub fn stop_all(&mut self) -> Vec<Option<Arc<GpuIdentity>>> {
        self.handles
            .drain(..)
            .map(|h| {
                let id = identity(&h);
                stop(h);
                id
            })
            .collect()
    }

    /// One poll: takes late answers, sends a job to every idle worker and waits for their
    /// answers until `deadline`. Returns how many ran a timed tier, and what to count.
    pub fn poll(&mut self, now: Instant, deadline: Instant, cadence: Cadence) -> (usize, Tally) {
        let mut tally = Tally::default();
        while let Ok(reply) = self.replies_rx.try_recv() {
            self.accept(reply, &mut tally);
        }
        self.seq += 1;
        let gpus = self.handles.len() as u32;
        for (index, h) in self.handles.iter_mut().enumerate() {
            let mut busy = h.busy.lock().unwrap_or_else(PoisonError::into_inner);
            if busy.since.is_some() {
                continue;
            }
            let job = Job::Poll {
                seq: self.seq,
                now,
                cadence: Cadence {
                    index: index as u32,
                    gpus,
                    ..cadence
                },
                verify: h.verify,
            };
            if h.jobs.send(job).is_ok() {
                busy.since = Some(now);
                h.awaiting = Some(self.seq);
                h.verify = false;
            }
        }
        let mut timed = 0;
        let seq = self.seq;
        while self.handles.iter().any(|h| h.awaiting == Some(seq)) {
            let wait = deadline.saturating_duration_since(Instant::now());
            match self.replies_rx.recv_timeout(wait) {
                Ok(reply) => {
                    timed += usize::from(reply.seq == seq && reply.gpu.slow);
                    self.accept(reply, &mut tally);
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        (timed, tally)
    }

    /// Takes a worker's answer, to this poll or (from a worker that was slow) an earlier one.
    /// What it counted is counted even when the answer itself is stale.
    fn accept(&mut self, mut reply: Reply, tally: &mut Tally) {
        tally.errors.append(&mut reply.gpu.errors);
        tally.costs.append(&mut reply.gpu.costs);
        let Some(h) = self.handles.get_mut(reply.index as usize) else {
            return;
        };
        if h.awaiting != Some(reply.seq) {
            return; // from a worker replaced meanwhile
        }
        h.awaiting = None;
        h.presumed = None;
        h.latest = Some(reply.gpu);
    }

    /// What to publish per index: each worker's last answer, or unreadable once it has been
    /// busy for `stall_after` (an NVML call on that GPU hangs). A GPU that cannot say who it is
    /// keeps a presumed identity only while no other index reads that board.
    pub fn observed(&self, stall_after: Duration) -> Vec<(u32, Observed)> {
        let mut out: Vec<(u32, Observed)> = self
            .handles
            .iter()
            .enumerate()
            .filter_map(|(i, h)| Some((i as u32, stalled(h, stall_after)?)))
            .collect();
        let readable: Vec<String> = out
            .iter()
            .filter(|(_, g)| g.status == GpuStatus::Up)
            .filter_map(|(_, g)| g.identity.as_ref().map(|i| i.uuid.clone()))
            .collect();
        for (_, g) in out.iter_mut().filter(|(_, g)| g.status != GpuStatus::Up) {
            if g.identity
                .as_ref()
                .is_some_and(|i| readable.contains(&i.uuid))
            {
                g.identity = None;
            }
        }
        out
    }

    /// Indices whose last answer was a readable GPU with this identity.
    pub fn readable(&self) -> impl Iterator<Item = (u32, &GpuIdentity)> {
        self.handles.iter().enumerate().filter_map(|(i, h)| {
            let g = h.latest.as_ref()?;
            let id = g.identity.as_deref()?;
            (g.status == GpuStatus::Up).then_some((i as u32, id))
        })
    }

    fn spawn(&self, session: &Session, index: u32, presumed: Option<Arc<GpuIdentity>>) -> Handle {
        let (jobs, rx) = mpsc::channel();
        let busy: Busy = Arc::default();
        let reader = session.reader(index);
        let call = reader.in_call();
        let worker = Worker::new(reader, presumed.clone(), busy.clone());
        let replies = self.replies_tx.clone();
        let thread = std::thread::Builder::new()
            .name(format!("gpu-{index}"))
            .spawn(move || worker.run(rx, replies))
            .map_err(|e| {
                tracing::error!(gpu = index, error = %e, "cannot start the GPU's worker thread")
            })
            .ok();
        Handle {
            jobs,
            thread,
            busy,
            call,
            awaiting: None,
            latest: None,
            presumed,
            verify: false,
        }
    }
}

/// Who the GPU is: what its worker read last (in the poll it hangs in, too), else its last
/// answer's, else what an earlier enumeration found at this index.
fn identity(h: &Handle) -> Option<Arc<GpuIdentity>> {
    let told = h
        .busy
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .identity
        .clone();
    told.or_else(|| h.latest.as_ref().and_then(|g| g.identity.clone()))
        .or_else(|| h.presumed.clone())
}

fn stalled(h: &Handle, stall_after: Duration) -> Option<Observed> {
    let since = h.busy.lock().unwrap_or_else(PoisonError::into_inner).since;
    let waited = since.map(|s| s.elapsed()).filter(|w| *w >= stall_after);
    let Some(waited) = waited.or_else(|| h.thread.is_none().then_some(Duration::ZERO)) else {
        return h.latest.clone();
    };
    let mut g = h.latest.clone().unwrap_or_else(|| Observed::unknown(None));
    g.identity = identity(h);
    let call = *h.call.lock().unwrap_or_else(PoisonError::into_inner);
    g.status = GpuStatus::Unreadable(match (&h.thread, call) {
        (Some(_), Some((function, at))) => format!(
            "NVML has not answered {function} on this GPU for {}s (a hung driver call); the \
             other GPUs are still read",
            at.elapsed().as_secs()
        ),
        (Some(_), None) => format!(
            "NVML has not answered a read of this GPU for {}s (a hung driver call); the other \
             GPUs are still read",
            waited.as_secs()
        ),
        (None, _) => "the agent could not start a thread to read this GPU".to_string(),
    });
    g.reading = Default::default();
    g.sources = vec![(
        "identity",
        SourceStatus {
            duration: Duration::ZERO,
            success: false,
        },
    )];
    Some(g)
}

/// Asks the worker to stop and waits a little for it; one stuck in an NVML call is left to
/// finish on its own (it holds the library until then).
fn stop(mut h: Handle) {
    let _ = h.jobs.send(Job::Stop);
    let Some(thread) = h.thread.take() else {
        return;
    };
    let deadline = Instant::now() + STOP_WAIT;
    while !thread.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    if thread.is_finished() {
        let _ = thread.join();
    } else {
        tracing::warn!(
            thread = thread.thread().name().unwrap_or("gpu"),
            "a GPU worker is stuck in an NVML call; leaving it behind"
        );
    }
}

/// Adds a tally to the agent's cumulative counters.
pub(super) fn count(
    tally: Tally,
    errors: &mut std::collections::BTreeMap<(&'static str, NvmlCode), u64>,
    calls: &mut std::collections::BTreeMap<&'static str, CallStat>,
) {
    for (function, code) in tally.errors {
        *errors.entry((function, code)).or_default() += 1;
    }
    for (function, n, time) in tally.costs {
        calls.entry(function).or_default().add(n, time);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(latest: Option<Observed>, busy_for: Option<Duration>) -> Handle {
        let (jobs, _) = mpsc::channel();
        let since = busy_for.and_then(|d| Instant::now().checked_sub(d));
        Handle {
            jobs,
            thread: std::thread::Builder::new().spawn(|| {}).ok(),
            busy: Arc::new(std::sync::Mutex::new(super::super::worker::Progress {
                since,
                identity: None,
            })),
            call: InCall::default(),
            awaiting: None,
            latest,
            presumed: None,
            verify: false,
        }
    }

    fn gpu(uuid: &str, status: GpuStatus) -> Observed {
        let mut g = Observed::unknown(Some(Arc::new(GpuIdentity {
            uuid: uuid.into(),
            ..GpuIdentity::default()
        })));
        g.status = status;
        g
    }

    fn pool(handles: Vec<Handle>) -> Pool {
        let mut p = Pool::new();
        p.handles = handles;
        p
    }

    #[test]
    fn a_presumed_identity_that_another_index_reads_is_dropped() {
        let p = pool(vec![
            handle(Some(gpu("GPU-a", GpuStatus::Up)), None),
            handle(Some(gpu("GPU-a", GpuStatus::Lost)), None),
            handle(Some(gpu("GPU-b", GpuStatus::Lost)), None),
        ]);
        let seen = p.observed(Duration::from_secs(5));
        let uuids: Vec<Option<&str>> = seen
            .iter()
            .map(|(_, g)| g.identity.as_ref().map(|i| i.uuid.as_str()))
            .collect();
        assert_eq!(uuids, vec![Some("GPU-a"), None, Some("GPU-b")]);
    }

    #[test]
    fn a_worker_busy_past_stall_after_is_unreadable_and_keeps_its_identity() {
        let mut stuck = handle(None, Some(Duration::from_secs(10)));
        stuck.presumed = Some(Arc::new(GpuIdentity {
            uuid: "GPU-c".into(),
            ..GpuIdentity::default()
        }));
        let p = pool(vec![
            stuck,
            handle(Some(gpu("GPU-d", GpuStatus::Up)), Some(Duration::ZERO)),
            handle(None, Some(Duration::ZERO)),
        ]);
        let seen = p.observed(Duration::from_secs(5));
        assert_eq!(
            seen.len(),
            2,
            "one that has not answered yet is not published"
        );
        let (index, g) = &seen[0];
        assert_eq!(*index, 0);
        assert!(
            matches!(&g.status, GpuStatus::Unreadable(why) if why.contains("has not answered"))
        );
        assert_eq!(g.identity.as_ref().map(|i| i.uuid.as_str()), Some("GPU-c"));
        assert_eq!(g.sources[0].0, "identity");
        assert!(!g.sources[0].1.success);
        assert_eq!(seen[1].1.status, GpuStatus::Up, "busy, but not for long");
    }

    #[test]
    fn a_gpu_hung_in_its_first_poll_keeps_the_uuid_it_told_and_names_the_call() {
        // The worker read the identity, then hung in a call: no answer has come yet.
        let stuck = handle(None, Some(Duration::from_secs(12)));
        stuck.busy.lock().expect("lock").identity = Some(Arc::new(GpuIdentity {
            uuid: "GPU-e".into(),
            ..GpuIdentity::default()
        }));
        let called = Instant::now().checked_sub(Duration::from_secs(11));
        *stuck.call.lock().expect("lock") = called.map(|at| ("nvmlDeviceGetPowerUsage", at));
        let seen = pool(vec![stuck]).observed(Duration::from_secs(5));
        let (_, g) = &seen[0];
        assert_eq!(g.identity.as_ref().map(|i| i.uuid.as_str()), Some("GPU-e"));
        let GpuStatus::Unreadable(why) = &g.status else {
            panic!("{:?}", g.status)
        };
        assert!(
            why.starts_with("NVML has not answered nvmlDeviceGetPowerUsage on this GPU for 11s"),
            "{why}"
        );
    }
}
