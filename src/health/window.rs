//! A cumulative counter watched over a sliding window: how much it grew and over how long.
//! What the rate conditions share (`pcie_replay_rate`, `ecc_sbe_rate`).

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

/// (time, count) samples of one counter, the oldest kept being the newest at least `window`
/// old.
#[derive(Debug, Default)]
pub struct CounterWindow {
    samples: VecDeque<(SystemTime, u64)>,
}

impl CounterWindow {
    /// Adds `count` read at `now` and returns (growth, span) over the window once the samples
    /// cover it; `None` before. A count below the last one (the counter restarted: a driver
    /// reload or a GPU reset) starts the window over.
    pub fn observe(
        &mut self,
        now: SystemTime,
        count: u64,
        window: Duration,
    ) -> Option<(u64, Duration)> {
        if self.samples.back().is_some_and(|(_, c)| *c > count) {
            self.samples.clear();
        }
        self.samples.push_back((now, count));
        let old = |t: &SystemTime| now.duration_since(*t).unwrap_or_default() >= window;
        while self.samples.len() > 2 && self.samples.get(1).is_some_and(|(t, _)| old(t)) {
            self.samples.pop_front();
        }
        let (start, base) = *self.samples.front()?;
        let span = now.duration_since(start).unwrap_or_default();
        (old(&start) && !span.is_zero()).then_some((count - base, span))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_over_the_window_once_it_is_covered_and_anew_after_a_restart() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let window = Duration::from_secs(60);
        let mut w = CounterWindow::default();
        assert_eq!(w.observe(at(0), 100, window), None);
        assert_eq!(w.observe(at(30), 130, window), None, "not covered yet");
        assert_eq!(
            w.observe(at(60), 160, window),
            Some((60, Duration::from_secs(60)))
        );
        // The sample at 30 s is the newest one at least a window old at 95 s.
        assert_eq!(
            w.observe(at(95), 200, window),
            Some((70, Duration::from_secs(65)))
        );
        assert_eq!(w.observe(at(100), 5, window), None, "restarted: over again");
        assert_eq!(
            w.observe(at(160), 65, window),
            Some((60, Duration::from_secs(60)))
        );
    }
}
