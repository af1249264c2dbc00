//! When a GPU's slow and expensive tiers are due. Pure: time comes in as an argument.
//!
//! Each timed tier runs every `slow_interval` / `expensive_interval`, rounded to whole polls.
//! GPUs are staggered across the period (GPU `i` of `n` is offset by `i * polls / n` polls), so
//! that an eight-GPU node does not pay every GPU's milliseconds of energy and
//! process-utilization reads in the same poll: the cost is spread flat, and no single poll
//! carries it all. Everything is read at the first poll, and again at the first poll after a
//! GPU comes back.
//!
//! The profiling (GPM) tier is timed the same way, every `profiling_interval`: a GPM sample is
//! taken at each due poll, so the due polls are the edges of the profiling window and the
//! metrics between two of them are the average over it (nvml.h: GPM metrics are computed
//! "between two samples"). `nvmlGpmMetricsGet` costs 1.0-1.45 ms of CPU per call whatever the
//! window, so a wider window costs proportionally less and answers the same average.

use std::time::{Duration, Instant};

/// The timed tiers of one GPU.
#[derive(Debug, Default, Clone)]
pub(super) struct Schedule {
    slow: Timer,
    expensive: Timer,
    profiling: Timer,
}

/// Where one GPU stands among the GPUs polled and how often each tier runs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cadence {
    pub interval: Duration,
    pub slow_interval: Duration,
    pub expensive_interval: Duration,
    /// The GPM window; the configuration keeps it at least `interval`.
    pub profiling_interval: Duration,
    pub index: u32,
    pub gpus: u32,
    /// The node was just changed (a MIG or sharing apply): the slow tier, where the MIG layout
    /// and the compute mode are read, runs now, off its schedule (which stays as it was).
    pub changed: bool,
}

/// Which timed tiers run in a poll.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Due {
    pub slow: bool,
    pub expensive: bool,
    /// A GPM sample is due: the edge of a profiling window.
    pub profiling: bool,
}

impl Schedule {
    /// Which tiers run in the poll at `now`; those that do are scheduled again.
    pub fn due(&mut self, now: Instant, c: Cadence) -> Due {
        Due {
            slow: self.slow.due(now, c, c.slow_interval) || c.changed,
            expensive: self.expensive.due(now, c, c.expensive_interval),
            profiling: self.profiling.due(now, c, c.profiling_interval),
        }
    }

    /// Makes everything due at the next poll (a GPU back from lost, another board at the index).
    pub fn reset(&mut self) {
        *self = Schedule::default();
    }
}

#[derive(Debug, Default, Clone)]
struct Timer {
    next: Option<Instant>,
}

impl Timer {
    fn due(&mut self, now: Instant, c: Cadence, every: Duration) -> bool {
        let period = {
            let polls = every.as_secs_f64() / c.interval.as_secs_f64().max(1e-3);
            (polls.round() as u32).max(1)
        };
        let every = c.interval * period;
        // A due time within half an interval counts as now: polls drift by their own duration.
        let horizon = now + c.interval / 2;
        match self.next {
            None => {
                let offset = c.index.min(c.gpus.saturating_sub(1)) * period / c.gpus.max(1);
                self.next = Some(now + c.interval * (period + offset));
                true
            }
            Some(next) if next <= horizon => {
                let mut next = next + every;
                while next <= horizon {
                    next += every;
                }
                self.next = Some(next);
                true
            }
            Some(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(index: u32, gpus: u32, interval_ms: u64, slow_ms: u64, polls: u32) -> Vec<u32> {
        let c = Cadence {
            changed: false,
            interval: Duration::from_millis(interval_ms),
            slow_interval: Duration::from_millis(slow_ms),
            expensive_interval: Duration::from_millis(slow_ms * 3),
            profiling_interval: Duration::from_millis(interval_ms),
            index,
            gpus,
        };
        let t0 = Instant::now();
        let mut s = Schedule::default();
        (0..polls)
            .filter(|&p| {
                // Polls run a little late, as real ones do.
                let jitter = Duration::from_micros(u64::from(p % 3) * 700);
                s.due(t0 + c.interval * p + jitter, c).slow
            })
            .collect()
    }

    #[test]
    fn a_change_to_the_node_makes_the_slow_tier_run_off_its_schedule() {
        let t0 = Instant::now();
        let c = Cadence {
            changed: false,
            interval: Duration::from_secs(1),
            slow_interval: Duration::from_secs(10),
            expensive_interval: Duration::from_secs(10),
            profiling_interval: Duration::from_secs(5),
            index: 0,
            gpus: 1,
        };
        let mut s = Schedule::default();
        assert!(s.due(t0, c).slow, "the first poll reads everything");
        let later = t0 + Duration::from_secs(2);
        assert!(!s.due(later, c).slow, "not due for 10 s");
        let changed = Cadence { changed: true, ..c };
        assert!(s.due(later, changed).slow, "a change reads it at once");
        assert!(
            !s.due(later + Duration::from_secs(1), c).slow,
            "its schedule unchanged"
        );
    }

    #[test]
    fn every_poll_when_slow_is_not_slower_than_the_interval() {
        for i in 0..8 {
            assert_eq!(run(i, 8, 1000, 1000, 5), vec![0, 1, 2, 3, 4]);
            assert_eq!(run(i, 8, 5000, 1000, 3), vec![0, 1, 2]);
        }
    }

    #[test]
    fn once_per_period_after_the_first_poll_staggered_by_gpu() {
        assert_eq!(run(0, 8, 1000, 10_000, 31), vec![0, 10, 20, 30]);
        assert_eq!(run(4, 8, 1000, 10_000, 31), vec![0, 15, 25]);
        assert_eq!(run(7, 8, 1000, 10_000, 31), vec![0, 18, 28]);
        // At the default 5 s interval and 10 s slow tier: half the GPUs each poll.
        assert_eq!(run(0, 8, 5000, 10_000, 7), vec![0, 2, 4, 6]);
        assert_eq!(run(5, 8, 5000, 10_000, 7), vec![0, 3, 5]);
    }

    #[test]
    fn at_most_one_gpu_in_eight_pays_the_slow_tier_in_a_steady_poll() {
        let due: Vec<Vec<u32>> = (0..8).map(|i| run(i, 8, 100, 10_000, 400)).collect();
        for poll in 1..400 {
            let n = due.iter().filter(|d| d.contains(&poll)).count();
            assert!(n <= 1, "poll {poll}: {n} GPUs");
        }
    }

    #[test]
    fn reset_makes_it_due_at_once() {
        let c = Cadence {
            changed: false,
            interval: Duration::from_secs(1),
            slow_interval: Duration::from_secs(10),
            expensive_interval: Duration::from_secs(30),
            profiling_interval: Duration::from_secs(5),
            index: 0,
            gpus: 1,
        };
        let t0 = Instant::now();
        let mut s = Schedule::default();
        let all = Due {
            slow: true,
            expensive: true,
            profiling: true,
        };
        assert_eq!(s.due(t0, c), all);
        assert_eq!(s.due(t0 + Duration::from_secs(1), c), Due::default());
        s.reset();
        assert_eq!(s.due(t0 + Duration::from_secs(2), c), all);
        let dues: Vec<Due> = (3..=33)
            .map(|t| s.due(t0 + Duration::from_secs(t), c))
            .collect();
        assert_eq!(dues.iter().filter(|d| d.slow).count(), 3, "at 12, 22, 32 s");
        assert_eq!(dues.iter().filter(|d| d.expensive).count(), 1, "at 32 s");
        let windows: Vec<u64> = (3..=33)
            .zip(&dues)
            .filter(|(_, d)| d.profiling)
            .map(|(t, _)| t)
            .collect();
        assert_eq!(
            windows,
            vec![7, 12, 17, 22, 27, 32],
            "a window of 5 s from 2 s"
        );
    }

    /// The polls at which a GPM sample is taken (the edges of the profiling windows).
    fn edges(index: u32, gpus: u32, interval_ms: u64, window_ms: u64, polls: u32) -> Vec<u32> {
        let c = Cadence {
            changed: false,
            interval: Duration::from_millis(interval_ms),
            slow_interval: Duration::from_secs(10),
            expensive_interval: Duration::from_secs(30),
            profiling_interval: Duration::from_millis(window_ms),
            index,
            gpus,
        };
        let t0 = Instant::now();
        let mut s = Schedule::default();
        (0..polls)
            .filter(|&p| {
                let jitter = Duration::from_micros(u64::from(p % 5) * 900);
                s.due(t0 + c.interval * p + jitter, c).profiling
            })
            .collect()
    }

    #[test]
    fn a_profiling_window_as_long_as_the_poll_samples_every_poll() {
        assert_eq!(edges(0, 1, 1000, 1000, 6), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(edges(3, 8, 100, 100, 4), vec![0, 1, 2, 3]);
    }

    #[test]
    fn profiling_samples_are_a_window_apart_whatever_the_poll() {
        // 5 s windows: every 50 polls at 100 ms, every 5 at 1 s, every poll at 5 s, after the
        // first sample (poll 0), which opens the first window.
        assert_eq!(edges(0, 1, 100, 5000, 201), vec![0, 50, 100, 150, 200]);
        assert_eq!(edges(0, 1, 1000, 5000, 21), vec![0, 5, 10, 15, 20]);
        assert_eq!(edges(0, 1, 5000, 5000, 4), vec![0, 1, 2, 3]);
        // A window that is not a whole number of polls is rounded to the nearest.
        assert_eq!(edges(0, 1, 2000, 5000, 8), vec![0, 3, 6]);
    }

    #[test]
    fn eight_gpus_take_their_profiling_samples_in_different_polls() {
        // 8×H100 at 100 ms with 5 s windows: each GPU samples once per 50 polls, and no poll
        // pays two GPUs' 1.3 ms nvmlGpmMetricsGet.
        let due: Vec<Vec<u32>> = (0..8).map(|i| edges(i, 8, 100, 5000, 500)).collect();
        for (i, d) in due.iter().enumerate() {
            let gaps: Vec<u32> = d.windows(2).skip(1).map(|w| w[1] - w[0]).collect();
            assert!(gaps.iter().all(|&g| g == 50), "GPU {i}: {d:?}");
            assert!((9..=10).contains(&d.len()), "GPU {i}: {d:?}");
        }
        for poll in 1..500 {
            let n = due.iter().filter(|d| d.contains(&poll)).count();
            assert!(n <= 1, "poll {poll}: {n} GPUs");
        }
    }
}
