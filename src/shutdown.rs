//! The stop budget, and the one process-wide "a stop was asked for" flag that blocking code
//! (a MIG apply between its steps, a running hook) reads.
//!
//! The async tasks stop through their `watch` handle (`app.rs`); this flag is for the code that
//! runs on blocking threads and cannot select on one. It is set once, by the signal loop, and
//! never cleared. It must not be used to decide anything but "finish or roll back now, and start
//! nothing new".
//!
//! # The budget
//!
//! systemd sends SIGTERM and, `TimeoutStopSec` later, SIGKILL (systemd/gpu-steward.service). A
//! SIGKILL in the middle of a MIG change leaves GPU instances without compute instances, so the
//! whole stop must fit well inside that timeout:
//!
//! - a MIG apply in flight stops before its next step and rolls back what it did, and gets
//!   [`CHANGE_BUDGET`] for that;
//! - a hook still running gets [`HOOK_GRACE`] from the stop, then its whole process group is
//!   killed; no hook starts after the stop;
//! - the HTTP servers drain for half a second and the poller stops within its current call;
//! - the OTLP exporter flushes within its 3 s (`otlp::task::FLUSH_BUDGET`), beside the rest.
//!
//! [`STOP_BUDGET`] is the sum with margin, and `TimeoutStopSec` is set above it with more margin
//! (`tests::the_unit_gives_the_stop_budget_a_margin` keeps the two together).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a MIG change in flight gets, after the stop, to finish its step and roll back.
pub const CHANGE_BUDGET: Duration = Duration::from_secs(10);

/// How long a hook still running at the stop may go on before its process group is killed.
pub const HOOK_GRACE: Duration = Duration::from_secs(3);

/// The longest a stop takes, from SIGTERM to exit: the change budget (hooks run inside it or
/// beside it), the servers' drain and the poller's stop, with margin.
pub const STOP_BUDGET: Duration = Duration::from_secs(13);

/// The unit's `TimeoutStopSec`, in seconds: the budget and a margin for a loaded machine.
pub const UNIT_TIMEOUT_STOP_SEC: u64 = 20;

static REQUESTED: AtomicBool = AtomicBool::new(false);
static AT: OnceLock<Instant> = OnceLock::new();

/// Says that the agent is stopping (idempotent; the first call's time counts).
pub fn request() {
    let _ = AT.set(Instant::now());
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// When the stop was asked for; `None` before any stop.
fn stopped_at() -> Option<Instant> {
    if !requested() {
        return None;
    }
    AT.get().copied()
}

/// When a MIG change in flight must have finished or rolled back: [`CHANGE_BUDGET`] after the
/// stop, one deadline for every wait on it (the start-time apply's and the stop's own), so that
/// waiting twice cannot double it; `None` before any stop.
pub fn change_deadline() -> Option<Instant> {
    stopped_at().map(|t| t + CHANGE_BUDGET)
}

/// How long the last wait of the stop (the runtime's, for blocking work such as a hung NVML
/// call) may take: at most `most`, and never past [`STOP_BUDGET`] from the stop less `margin`
/// (the process still has to exit). `most` when no stop was asked for.
pub fn last_wait(most: Duration, margin: Duration) -> Duration {
    last_wait_after(stopped_at(), Instant::now(), most, margin)
}

/// [`last_wait`] for a stop at `at` (none: `most`), seen at `now`.
fn last_wait_after(
    at: Option<Instant>,
    now: Instant,
    most: Duration,
    margin: Duration,
) -> Duration {
    let Some(at) = at else {
        return most;
    };
    let left = STOP_BUDGET
        .saturating_sub(margin)
        .saturating_sub(now.saturating_duration_since(at));
    left.min(most)
}

/// When a running hook is killed: [`HOOK_GRACE`] after the stop; `None` before any stop.
pub fn hook_deadline() -> Option<Instant> {
    if !requested() {
        return None;
    }
    AT.get().map(|t| *t + HOOK_GRACE)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The process-wide stop flag is never set here: other unit tests of this binary run
    // programs, which a stopping agent refuses to start (exec.rs).
    #[test]
    fn every_wait_after_the_stop_shares_one_deadline_inside_the_budget() {
        let most = Duration::from_secs(60);
        assert_eq!(
            last_wait_after(None, Instant::now(), most, Duration::from_secs(1)),
            most,
            "no stop asked for: the wait is what was asked"
        );
        let at = Instant::now();
        // Right after the stop: the budget less the margin.
        let w = last_wait_after(Some(at), at, most, Duration::from_secs(1));
        assert_eq!(w, STOP_BUDGET - Duration::from_secs(1));
        // Past the change budget, the last wait gets what is left of the stop budget.
        let later = at + CHANGE_BUDGET;
        let w = last_wait_after(Some(at), later, most, Duration::from_secs(1));
        assert_eq!(w, STOP_BUDGET - Duration::from_secs(1) - CHANGE_BUDGET);
        assert!(
            last_wait_after(Some(at), at, Duration::from_millis(5), Duration::ZERO)
                <= Duration::from_millis(5)
        );
        // Past the budget: no wait at all.
        let w = last_wait_after(Some(at), at + STOP_BUDGET, most, Duration::ZERO);
        assert_eq!(w, Duration::ZERO);
    }

    #[test]
    fn the_unit_gives_the_stop_budget_a_margin() {
        assert!(CHANGE_BUDGET + Duration::from_secs(1) <= STOP_BUDGET);
        assert!(HOOK_GRACE <= CHANGE_BUDGET);
        let unit = include_str!("../systemd/gpu-steward.service");
        let line = format!("TimeoutStopSec={UNIT_TIMEOUT_STOP_SEC}s");
        assert!(
            unit.lines().any(|l| l.trim() == line),
            "systemd/gpu-steward.service must say {line}"
        );
        assert!(STOP_BUDGET + Duration::from_secs(5) <= Duration::from_secs(UNIT_TIMEOUT_STOP_SEC));
    }
}
