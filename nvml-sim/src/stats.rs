//! Call counting for `NVML_SIM_STATS`: every export bumps its counter; the JSON file
//! `{ "nvmlDeviceGetPowerUsage": 1234, ... }` is written at the 0 → 1 init, rewritten atomically
//! (temporary file, then rename) at most once a second while calls are made, and at the final
//! `nvmlShutdown`.
//!
//! The periodic rewrite runs on the simulator's own thread, `nvml-sim-stats`, never inside a
//! caller's NVML call: a real driver writes no statistics file, so the write must not land in
//! the CPU time of whichever call happened to come a second after the last one (it was most of
//! what the agent's XID waiter cost at a 5 s poll, [18/22]). A benchmark that measures the
//! agent's CPU leaves that thread out by its name. Counting itself stays on the caller's
//! thread: a map update under a lock, inside the call's priced time (`crate::cost`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

struct Stats {
    counts: BTreeMap<&'static str, u64>,
    dirty: bool,
    /// `NVML_SIM_STATS` as read at the 0 → 1 init; `None`: nothing is written.
    path: Option<PathBuf>,
}

static STATS: Mutex<Stats> = Mutex::new(Stats {
    counts: BTreeMap::new(),
    dirty: false,
    path: None,
});

/// The thread's stop flag and the condvar it sleeps on between writes.
type StopSignal = Arc<(Mutex<bool>, Condvar)>;

/// The running writer thread, if any.
static WRITER: Mutex<Option<(StopSignal, JoinHandle<()>)>> = Mutex::new(None);

/// Name of the writer thread, which CPU meters leave out of the agent's figures.
pub const THREAD_NAME: &str = "nvml-sim-stats";

const FLUSH_EVERY: Duration = Duration::from_secs(1);

fn lock() -> MutexGuard<'static, Stats> {
    STATS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts one call of `function`.
pub fn count(function: &'static str) {
    let mut s = lock();
    *s.counts.entry(function).or_insert(0) += 1;
    s.dirty = true;
}

/// The current count for `function` (for tests).
pub fn get(function: &str) -> u64 {
    lock().counts.get(function).copied().unwrap_or(0)
}

/// At the 0 → 1 init: reads `NVML_SIM_STATS`, writes the file once (so that it exists from the
/// init on) and starts the writer thread. Unset: nothing is written and no thread runs.
pub fn start() {
    stop_writer();
    let path = std::env::var_os("NVML_SIM_STATS").map(PathBuf::from);
    let on = path.is_some();
    lock().path = path;
    if !on {
        return;
    }
    flush(true);
    let signal: StopSignal = Arc::new((Mutex::new(false), Condvar::new()));
    let theirs = signal.clone();
    let spawned = std::thread::Builder::new()
        .name(THREAD_NAME.into())
        .spawn(move || write_every_second(&theirs));
    match spawned {
        Ok(thread) => {
            *WRITER.lock().unwrap_or_else(PoisonError::into_inner) = Some((signal, thread));
        }
        // Statistics never change what the simulated driver answers: the file is still written
        // at the final shutdown.
        Err(e) => eprintln!("nvml-sim: cannot start the call statistics thread: {e}"),
    }
}

/// At the final `nvmlShutdown`: stops the writer thread and writes the file a last time.
pub fn stop() {
    stop_writer();
    flush(true);
    lock().path = None;
}

fn stop_writer() {
    let writer = WRITER.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some((signal, thread)) = writer {
        let (stopped, wake) = &*signal;
        *stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        wake.notify_all();
        let _ = thread.join();
    }
}

fn write_every_second(signal: &StopSignal) {
    let (stopped, wake) = &**signal;
    let mut stop = stopped.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if *stop {
            return;
        }
        let (guard, _) = wake
            .wait_timeout(stop, FLUSH_EVERY)
            .unwrap_or_else(PoisonError::into_inner);
        stop = guard;
        if !*stop {
            flush(false);
        }
    }
}

/// Writes the stats file if a path is set and calls were counted since the last write (or
/// `force`). Errors are reported once per write on stderr and otherwise ignored: statistics must
/// never change what the simulated driver answers.
fn flush(force: bool) {
    let (json, path) = {
        let mut s = lock();
        let Some(path) = s.path.clone() else {
            return;
        };
        if !(s.dirty || force) {
            return;
        }
        s.dirty = false;
        match serde_json::to_string_pretty(&s.counts) {
            Ok(j) => (j, path),
            Err(e) => return eprintln!("nvml-sim: cannot encode call statistics: {e}"),
        }
    };
    // Written without the lock held, so that counting calls never waits for the disk.
    let mut tmp = path.clone().into_os_string();
    tmp.push(format!(".tmp.{}", std::process::id()));
    if let Err(e) = std::fs::write(&tmp, json).and_then(|()| std::fs::rename(&tmp, &path)) {
        eprintln!(
            "nvml-sim: cannot write call statistics to '{}': {e}",
            path.display()
        );
    }
}
