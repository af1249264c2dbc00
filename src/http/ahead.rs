//! Compressing the page ahead of the gzip scrapes that will ask for it.
//!
//! A gzip scrape of a publication that nobody has compressed yet compresses the whole page while
//! the scraper waits (1.3 ms for the 880 KB page of a 16-GPU node with 112 MIG instances on this
//! project's 2-core VM). Prometheus scrapes at a fixed interval, usually longer than the poll
//! interval, so nearly every gzip scrape was such a first one. Compressing every publication as
//! it appears would take that wait away at up to interval/poll times the CPU (15× at a 15 s
//! scrape and a 1 s poll).
//!
//! Instead the agent learns when each scraper comes. [`Clock`] keeps, per peer address, the time
//! of its last gzip scrape and its period, trusted once two gaps in a row agree. When a
//! publication appears, [`watch`] compresses it at once if some trusted scraper is due before the
//! next one. A scraper on schedule then finds its page compressed, and the agent compresses
//! about as often as before, only earlier. A scraper off schedule (or a new one) compresses on
//! its scrape as before: a wrong guess costs one compression, never an answer.
//! `gpu_steward_scrape_compressions_total{trigger}` counts both.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::AgentCounters;

/// Scrapers tracked at once: Prometheus pairs, an agent or two, a curl loop. A new one past this
/// replaces the one heard from longest ago.
const MAX_SCRAPERS: usize = 16;

/// Gaps shorter than this are not a period (a retry, or two scrapers behind one address).
const MIN_PERIOD: Duration = Duration::from_millis(50);

/// A scraper silent for this many periods is forgotten.
const FORGET_AFTER_PERIODS: u32 = 4;

/// Who asked: the peer's address, or `None` (a Unix socket).
pub type Peer = Option<IpAddr>;

#[derive(Debug, Clone, Copy)]
struct Scraper {
    peer: Peer,
    last: Instant,
    /// The last gap, waiting for the next one to confirm it.
    gap: Option<Duration>,
    /// The period, once two gaps in a row agreed.
    period: Option<Duration>,
}

/// How far a gap may stray from the period and still be the same schedule: a tenth of it, at
/// least 20 ms (a scraper's own timer and the network).
fn tolerance(period: Duration) -> Duration {
    (period / 10).max(Duration::from_millis(20))
}

fn agree(a: Duration, b: Duration) -> bool {
    a.abs_diff(b) <= tolerance(a.max(b))
}

/// When gzip scrapes came, per peer, and when the next ones are due.
#[derive(Debug, Default)]
pub struct Clock {
    scrapers: Vec<Scraper>,
}

impl Clock {
    /// Notes a gzip scrape by `peer` at `now`.
    pub fn record(&mut self, peer: Peer, now: Instant) {
        let Some(s) = self.scrapers.iter_mut().find(|s| s.peer == peer) else {
            if self.scrapers.len() >= MAX_SCRAPERS {
                if let Some(oldest) = self.scrapers.iter().map(|s| s.last).min() {
                    self.scrapers.retain(|s| s.last != oldest);
                }
            }
            self.scrapers.push(Scraper {
                peer,
                last: now,
                gap: None,
                period: None,
            });
            return;
        };
        let gap = now.saturating_duration_since(s.last);
        if gap < MIN_PERIOD {
            return;
        }
        s.last = now;
        s.period = match (s.period, s.gap) {
            // On schedule: follow its drift slowly.
            (Some(p), _) if agree(p, gap) => Some((p * 3 + gap) / 4),
            // Scrapes missed (a failed or skipped one): still the same schedule.
            (Some(p), _) if missed(p, gap) => Some(p),
            // Two gaps in a row agree: a schedule.
            (_, Some(g)) if agree(g, gap) => Some((g + gap) / 2),
            _ => None,
        };
        s.gap = Some(gap);
    }

    /// Whether some scraper with a schedule is due between `from` and `until`, widened by its
    /// tolerance on both sides (a scrape a little early still finds the previous publication).
    /// Forgets scrapers silent for several periods.
    pub fn due(&mut self, from: Instant, until: Instant) -> bool {
        self.scrapers.retain(|s| {
            let keep_for = s.period.unwrap_or(Duration::from_secs(60)) * FORGET_AFTER_PERIODS;
            from.saturating_duration_since(s.last) <= keep_for
        });
        self.scrapers.iter().any(|s| {
            let Some(period) = s.period else {
                return false;
            };
            let slack = tolerance(period);
            // The first expected scrape not already long past `from`.
            let earliest = from.checked_sub(slack).unwrap_or(from);
            let mut next = s.last + period;
            if next < earliest {
                let behind = earliest.duration_since(next).as_nanos();
                let periods = behind.div_ceil(period.as_nanos().max(1));
                next += period * u32::try_from(periods).unwrap_or(u32::MAX);
            }
            next <= until + slack
        })
    }

    #[cfg(test)]
    fn period(&self, peer: Peer) -> Option<Duration> {
        self.scrapers.iter().find(|s| s.peer == peer)?.period
    }
}

/// A gap of two to four periods, each within tolerance.
fn missed(period: Duration, gap: Duration) -> bool {
    (2..=4).any(|k| agree(period * k, gap))
}

/// The clock shared by the scrape handlers and the task that compresses ahead, with the counts
/// it reports.
#[derive(Debug)]
pub struct Ahead {
    clock: Mutex<Clock>,
    counters: Arc<AgentCounters>,
}

impl Ahead {
    pub fn new(counters: Arc<AgentCounters>) -> Ahead {
        Ahead {
            clock: Mutex::new(Clock::default()),
            counters,
        }
    }

    /// Notes a gzip scrape, and whether it had to compress the page itself.
    pub fn scraped(&self, peer: Peer, compressed_here: bool) {
        if compressed_here {
            self.counters.gzip_on_scrape.fetch_add(1, Ordering::Relaxed);
        }
        let now = Instant::now();
        self.clock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .record(peer, now);
    }

    fn due(&self, from: Instant, until: Instant) -> bool {
        self.clock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .due(from, until)
    }
}

/// Compresses each publication as it appears when a gzip scraper is due before the next one,
/// expected as far after it as the last one came before (`poll` for the first: the poll
/// interval can change on reload). Runs until the sender is gone.
pub async fn watch(
    mut published: watch::Receiver<Arc<super::Published>>,
    ahead: Arc<Ahead>,
    poll: Duration,
) {
    let mut last: Option<Instant> = None;
    while published.changed().await.is_ok() {
        let p = published.borrow_and_update().clone();
        let now = Instant::now();
        let gap = last.map_or(poll, |last| now.duration_since(last));
        last = Some(now);
        if p.metrics.gzip_ready() || !ahead.due(now, now + gap) {
            continue;
        }
        // Off the async workers, as a scrape would: probes are never held up by it.
        let counters = ahead.counters.clone();
        let done = tokio::task::spawn_blocking(move || {
            if p.metrics.compress() {
                counters.gzip_ahead.fetch_add(1, Ordering::Relaxed);
            }
        });
        let _ = done.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_schedule_needs_two_gaps_that_agree() {
        let t0 = Instant::now();
        let mut c = Clock::default();
        let p = Some(IpAddr::from([10, 0, 0, 1]));
        c.record(p, t0);
        assert_eq!(c.period(p), None);
        c.record(p, t0 + 15 * S);
        assert_eq!(c.period(p), None, "one gap is not a schedule");
        assert!(!c.due(t0 + 29 * S, t0 + 31 * S));
        c.record(p, t0 + 30 * S + ms(100));
        assert_eq!(c.period(p), Some(ms(15_050)));
        // Next due at ~45.15 s.
        assert!(c.due(t0 + 45 * S, t0 + 46 * S));
        assert!(!c.due(t0 + 40 * S, t0 + 41 * S));
        // Past it by more than the tolerance: the next is a period on.
        assert!(!c.due(t0 + ms(47_500), t0 + 48 * S));
    }

    #[test]
    fn gaps_that_disagree_are_no_schedule() {
        let t0 = Instant::now();
        let mut c = Clock::default();
        let p = Some(IpAddr::from([10, 0, 0, 1]));
        for at in [0, 1000, 7000, 8000, 20_000] {
            c.record(p, t0 + ms(at));
        }
        assert_eq!(c.period(p), None);
        assert!(!c.due(t0 + ms(20_000), t0 + ms(60_000)));
    }

    #[test]
    fn a_scrape_within_the_tolerance_is_due() {
        let t0 = Instant::now();
        let mut c = Clock::default();
        let p = None;
        for k in 0..3 {
            c.record(p, t0 + 2 * S * k);
        }
        assert_eq!(c.period(p), Some(2 * S));
        // Due at 6 s; a publication at 6.1 s still covers a scrape running 0.1 s late ...
        assert!(c.due(t0 + ms(6100), t0 + ms(7100)));
        // ... and one at 5.9 s a scrape 0.1 s early.
        assert!(c.due(t0 + ms(4900), t0 + ms(5900)));
        // Not one 0.4 s late: the next, at 8 s, falls after this window.
        assert!(!c.due(t0 + ms(6400), t0 + ms(7400)));
    }

    #[test]
    fn missed_scrapes_keep_the_schedule_and_a_silent_scraper_is_forgotten() {
        let t0 = Instant::now();
        let mut c = Clock::default();
        let p = Some(IpAddr::from([10, 0, 0, 2]));
        for at in [0, 10, 20, 40] {
            c.record(p, t0 + S * at);
        }
        assert_eq!(c.period(p), Some(10 * S), "one scrape missed");
        // Due at 50, 60, ... ; a window around 70 s finds it.
        assert!(c.due(t0 + ms(69_500), t0 + ms(70_500)));
        // Four periods of silence: forgotten.
        assert!(!c.due(t0 + 81 * S, t0 + 91 * S));
        assert_eq!(c.scrapers.len(), 0);
    }

    #[test]
    fn scrapers_are_told_apart_by_peer() {
        let t0 = Instant::now();
        let mut c = Clock::default();
        let (a, b) = (
            Some(IpAddr::from([10, 0, 0, 1])),
            Some(IpAddr::from([10, 0, 0, 2])),
        );
        // An HA pair at the same 15 s interval, 5 s apart: interleaved, each on schedule.
        for k in 0..3 {
            c.record(a, t0 + 15 * S * k);
            c.record(b, t0 + 15 * S * k + 5 * S);
        }
        assert_eq!(c.period(a), Some(15 * S));
        assert_eq!(c.period(b), Some(15 * S));
        assert!(c.due(t0 + ms(44_500), t0 + ms(45_500)));
        assert!(c.due(t0 + ms(49_500), t0 + ms(50_500)));
        assert!(!c.due(t0 + ms(52_000), t0 + ms(53_000)));
    }

    #[test]
    fn the_table_is_bounded() {
        let t0 = Instant::now();
        let mut c = Clock::default();
        for i in 0..100u8 {
            c.record(Some(IpAddr::from([10, 0, 1, i])), t0 + ms(u64::from(i)));
        }
        assert_eq!(c.scrapers.len(), MAX_SCRAPERS);
        assert!(
            c.scrapers.iter().all(|s| s.last >= t0 + ms(84)),
            "the newest kept"
        );
    }

    #[test]
    fn a_retry_is_not_a_gap() {
        let t0 = Instant::now();
        let mut c = Clock::default();
        for at in [0, 5000, 5010, 10_000, 15_000] {
            c.record(None, t0 + ms(at));
        }
        assert_eq!(c.period(None), Some(5 * S));
    }
}
