//! The threads changes run on: one small pool per kind of change ([`Lane`]), owned by the
//! owner of changes, so that a Slurm drain never waits behind a MIG apply stuck in the driver
//! or a sharing apply, and so that no kind of change can take the runtime's blocking pool (the
//! HTTP handlers' and the hooks' threads) from the others.
//!
//! Each lane starts a thread only when work is waiting and none of its threads is free, keeps at
//! most [`Lane::threads`] of them, and lets an idle one go after [`IDLE`]. Work beyond that
//! waits in the lane's queue, in order; what bounds the queue is the callers (one Slurm task,
//! one pending reload apply, the API's connection limit). A change that panics ends its caller's
//! wait with nothing (the thread survives it).
//!
//! Must not: run a change on the async runtime's threads, or start a thread per request.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::lock;

/// How long an idle lane thread waits for work before it ends.
pub const IDLE: Duration = Duration::from_secs(10);

/// The kind of a change, and the lane it runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// MIG applies (and dry runs). Applies wait for each other in the process (the MIG turn),
    /// each on one of the lane's threads; more wait in the lane's queue.
    Mig,
    /// Time-slicing / MPS sharing applies.
    Sharing,
    /// Slurm drains and resumes.
    Slurm,
}

impl Lane {
    /// The most threads the lane runs at once.
    pub const fn threads(self) -> usize {
        match self {
            // One apply at a time runs (the MIG turn); a few more for dry runs and the
            // applies waiting their turn.
            Lane::Mig => 4,
            Lane::Sharing => 2,
            Lane::Slurm => 2,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Lane::Mig => "change-mig",
            Lane::Sharing => "change-sharing",
            Lane::Slurm => "change-slurm",
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
}

/// One lane's threads and queue.
pub struct Pool {
    lane: Lane,
    state: Mutex<State>,
    work: Condvar,
}

impl Pool {
    pub fn new(lane: Lane) -> Arc<Pool> {
        Arc::new(Pool {
            lane,
            state: Mutex::new(State::default()),
            work: Condvar::new(),
        })
    }

    /// Runs `job` on one of the lane's threads, now or once one is free.
    pub fn submit(self: &Arc<Self>, job: Job) {
        let mut s = lock(&self.state);
        s.queue.push_back(job);
        if s.queue.len() <= s.idle {
            self.work.notify_one();
            return;
        }
        if s.threads >= self.lane.threads() {
            // Queued: the next thread to finish takes it.
            return;
        }
        s.threads += 1;
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(self.lane.name().into())
            .spawn(move || me.work());
        if let Err(e) = spawned {
            s.threads -= 1;
            // The job stays queued for a running thread, if any.
            tracing::error!(lane = self.lane.name(), threads = s.threads, error = %e, "cannot start a thread for a change");
        }
    }

    /// How many threads the lane runs now.
    pub fn threads(&self) -> usize {
        lock(&self.state).threads
    }

    fn work(self: Arc<Self>) {
        loop {
            let job = {
                let mut s = lock(&self.state);
                loop {
                    if let Some(j) = s.queue.pop_front() {
                        break j;
                    }
                    s.idle += 1;
                    let (guard, waited) = self
                        .work
                        .wait_timeout(s, IDLE)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    s = guard;
                    s.idle -= 1;
                    if waited.timed_out() && s.queue.is_empty() {
                        s.threads -= 1;
                        return;
                    }
                }
            };
            // A panicking change drops its caller's answer channel: the caller sees nothing.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        }
    }
}

/// The owner's lanes.
pub struct Lanes {
    mig: Arc<Pool>,
    sharing: Arc<Pool>,
    slurm: Arc<Pool>,
}

impl Default for Lanes {
    fn default() -> Lanes {
        Lanes {
            mig: Pool::new(Lane::Mig),
            sharing: Pool::new(Lane::Sharing),
            slurm: Pool::new(Lane::Slurm),
        }
    }
}

impl Lanes {
    pub fn of(&self, lane: Lane) -> &Arc<Pool> {
        match lane {
            Lane::Mig => &self.mig,
            Lane::Sharing => &self.sharing,
            Lane::Slurm => &self.slurm,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_lane_never_runs_more_threads_than_its_bound_and_a_stuck_lane_holds_no_other_back() {
        let lanes = Lanes::default();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release = Arc::new(Mutex::new(release_rx));
        let (done_tx, done_rx) = mpsc::channel::<usize>();
        // 50 MIG changes that hang until released.
        for i in 0..50 {
            let (release, done) = (release.clone(), done_tx.clone());
            lanes.of(Lane::Mig).submit(Box::new(move || {
                let _ = lock(&release).recv();
                let _ = done.send(i);
            }));
        }
        assert_eq!(lanes.of(Lane::Mig).threads(), Lane::Mig.threads());
        // A Slurm change runs meanwhile, on its own lane.
        let (slurm_tx, slurm_rx) = mpsc::channel();
        lanes
            .of(Lane::Slurm)
            .submit(Box::new(move || slurm_tx.send(()).expect("send")));
        slurm_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the drain does not wait behind MIG");
        // Released, every queued change runs, in the bounded threads.
        for _ in 0..50 {
            release_tx.send(()).expect("release");
        }
        let mut done: Vec<usize> = (0..50)
            .map(|_| done_rx.recv_timeout(Duration::from_secs(5)).expect("done"))
            .collect();
        done.sort_unstable();
        assert_eq!(done, (0..50).collect::<Vec<_>>());
        assert!(lanes.of(Lane::Mig).threads() <= Lane::Mig.threads());
    }

    #[test]
    fn a_panicking_change_leaves_its_thread_working() {
        let pool = Pool::new(Lane::Slurm);
        pool.submit(Box::new(|| panic!("a change panics")));
        let (tx, rx) = mpsc::channel();
        pool.submit(Box::new(move || tx.send(()).expect("send")));
        rx.recv_timeout(Duration::from_secs(5)).expect("runs");
        assert!(pool.threads() <= Lane::Slurm.threads());
    }
}
