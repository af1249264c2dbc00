//! Call counting for `NVML_SIM_STATS`: every export bumps its counter; the JSON file
//! `{ "nvmlDeviceGetPowerUsage": 1234, ... }` is rewritten atomically (temporary file, then
//! rename) at most once a second while calls are made, and at the final `nvmlShutdown`. The
//! file is never written on the hot path more often than that.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Stats {
    counts: BTreeMap<&'static str, u64>,
    last_flush: Option<Instant>,
    dirty: bool,
}

static STATS: Mutex<Stats> = Mutex::new(Stats {
    counts: BTreeMap::new(),
    last_flush: None,
    dirty: false,
});

const FLUSH_EVERY: Duration = Duration::from_secs(1);

fn lock() -> std::sync::MutexGuard<'static, Stats> {
    STATS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// Writes the stats file if `NVML_SIM_STATS` is set and either `force` or a second has passed
/// since the last write. Errors are reported once per call on stderr and otherwise ignored:
/// statistics must never change what the simulated driver answers.
pub fn maybe_flush(force: bool) {
    let Some(path) = std::env::var_os("NVML_SIM_STATS") else {
        return;
    };
    let mut s = lock();
    let due = s.last_flush.is_none_or(|t| t.elapsed() >= FLUSH_EVERY);
    if !(s.dirty && (force || due)) {
        return;
    }
    s.last_flush = Some(Instant::now());
    s.dirty = false;
    let json = match serde_json::to_string_pretty(&s.counts) {
        Ok(j) => j,
        Err(e) => return eprintln!("nvml-sim: cannot encode call statistics: {e}"),
    };
    let path = std::path::PathBuf::from(path);
    let mut tmp = path.clone().into_os_string();
    tmp.push(format!(".tmp.{}", std::process::id()));
    if let Err(e) = std::fs::write(&tmp, json).and_then(|()| std::fs::rename(&tmp, &path)) {
        eprintln!(
            "nvml-sim: cannot write call statistics to '{}': {e}",
            path.display()
        );
    }
}
