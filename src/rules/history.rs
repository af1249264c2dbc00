//! The local history the rules evaluate over: the agent's own series, one sample per
//! publication, in bounded ring buffers.
//!
//! Fed from each publication's page through its index (`publication::Page::samples`: where
//! the renderer wrote each series, and its value), so that a rule sees exactly the series a
//! Prometheus scraping this agent would see, minus the `instance` and `job` labels a scrape
//! adds, and the text is never parsed back. Only metric names that some rule selects are kept;
//! a series of any other family costs one name comparison.
//!
//! Memory: each sample is 16 bytes (an `i64` millisecond timestamp and an `f64`); a series keeps
//! at most `capacity` samples, where `capacity` covers the longest range plus offset any rule
//! reads, plus Prometheus's 5-minute lookback, at the poll interval (see [`History::capacity_for`]).
//! E.g. a 10-minute range at a 5 s poll is 182 samples (2.9 KiB) per selected series; the shipped
//! rules on an 8-GPU node select about 400 series (~1.2 MiB). Labels are stored once per series,
//! taken from the page's label pairs (kept for the names the rules select) when a series is new.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::publication::Page;

/// The bit pattern Prometheus uses as its staleness marker (`value.StaleNaN`): a series that
/// disappears from a publication gets one, so that instant selectors stop returning it at once
/// instead of for the 5-minute lookback.
const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// Prometheus's default lookback for instant vector selectors.
pub const LOOKBACK_MS: i64 = 5 * 60 * 1000;

/// Samples a new series has room for before its deque grows.
const INITIAL_SAMPLES: usize = 64;

pub fn stale_nan() -> f64 {
    f64::from_bits(STALE_NAN_BITS)
}

pub fn is_stale(v: f64) -> bool {
    v.to_bits() == STALE_NAN_BITS
}

/// A series' labels, sorted by name, `__name__` included.
pub type Labels = Arc<Vec<(String, String)>>;

/// One series' samples, oldest first.
#[derive(Debug)]
pub struct Series {
    pub labels: Labels,
    pub samples: VecDeque<(i64, f64)>,
    /// The ingest that last saw it (to mark the others stale without a set of keys).
    seen: u64,
}

/// All selected series of the agent.
#[derive(Debug)]
pub struct History {
    /// Metric names some rule selects; every other series is skipped.
    wanted: HashSet<String>,
    /// Keyed by the series exactly as rendered (`name{labels}`): the renderer writes labels in a
    /// fixed order, so a lookup needs no parsing and no allocation.
    series: HashMap<String, Series>,
    capacity: usize,
    /// How long a series that disappeared stays readable by range functions.
    retention_ms: i64,
    /// Ingests so far; a series whose `seen` is older missed the latest one.
    epoch: u64,
}

impl History {
    /// Keeps the series named in `wanted` long enough for `longest` (the longest range plus
    /// offset a rule reads) plus the 5-minute lookback, at one sample per `interval`.
    pub fn new(wanted: HashSet<String>, longest: Duration, interval: Duration) -> Self {
        let span = longest + Duration::from_millis(LOOKBACK_MS as u64);
        History {
            wanted,
            series: HashMap::new(),
            capacity: Self::capacity_for(longest, interval),
            retention_ms: span.as_millis() as i64,
            epoch: 0,
        }
    }

    /// Samples kept per series: `longest` plus the lookback at `interval`, plus two.
    pub fn capacity_for(longest: Duration, interval: Duration) -> usize {
        let span = longest + Duration::from_millis(LOOKBACK_MS as u64);
        let step = interval.max(Duration::from_millis(100));
        (span.as_millis() / step.as_millis()) as usize + 2
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// Bytes held by samples (allocated capacity), for the memory statement in the log.
    pub fn sample_bytes(&self) -> usize {
        self.series
            .values()
            .map(|s| s.samples.capacity() * std::mem::size_of::<(i64, f64)>())
            .sum()
    }

    /// Adds one publication's samples at `ts_ms`, read from the page's index: the value as
    /// written, the series as rendered; a new series takes its label pairs as the renderer was
    /// given them. A page without them for a wanted name (text written by hand) adds nothing
    /// for it: the text is never parsed back.
    pub fn ingest(&mut self, page: &Page, ts_ms: i64) {
        self.epoch += 1;
        let epoch = self.epoch;
        for sample in page.samples() {
            if !self.wanted.contains(sample.name) {
                continue;
            }
            let (key, value) = (sample.series, sample.value);
            let capacity = self.capacity;
            if let Some(s) = self.series.get_mut(key) {
                push(&mut s.samples, capacity, ts_ms, value);
                s.seen = epoch;
            } else {
                let Some(pairs) = sample.labels else {
                    continue;
                };
                let mut labels = Vec::with_capacity(8);
                labels.push(("__name__".to_string(), sample.name.to_string()));
                labels.extend(pairs.map(|(k, v)| (k.to_string(), v.to_string())));
                labels.sort();
                // Grown as samples arrive, not allocated for the whole window at once.
                let mut samples = VecDeque::with_capacity(capacity.min(INITIAL_SAMPLES));
                samples.push_back((ts_ms, value));
                self.series.insert(
                    key.to_string(),
                    Series {
                        labels: Arc::new(labels),
                        samples,
                        seen: epoch,
                    },
                );
            }
        }
        // Series that disappeared get a staleness marker; series whose newest sample has left
        // the window entirely are dropped.
        let oldest_useful = ts_ms - self.retention_ms;
        let capacity = self.capacity;
        self.series.retain(|_, s| {
            if s.seen != epoch {
                if let Some(&(_, last)) = s.samples.back() {
                    if !is_stale(last) {
                        push(&mut s.samples, capacity, ts_ms, stale_nan());
                    }
                }
            }
            s.samples
                .back()
                .is_some_and(|&(t, v)| !is_stale(v) || t > oldest_useful)
        });
    }

    /// Adds one sample of the series `labels` (sorted, `__name__` included) directly: how tests
    /// feed synthetic series, missing samples and staleness markers as promtool does.
    pub fn push_sample(&mut self, labels: Vec<(String, String)>, ts_ms: i64, value: f64) {
        let key = format!("{labels:?}");
        let capacity = self.capacity;
        let s = self.series.entry(key).or_insert_with(|| Series {
            labels: Arc::new(labels),
            samples: VecDeque::new(),
            seen: 0,
        });
        push(&mut s.samples, capacity, ts_ms, value);
    }

    pub fn iter(&self) -> impl Iterator<Item = &Series> {
        self.series.values()
    }
}

fn push(samples: &mut VecDeque<(i64, f64)>, capacity: usize, ts: i64, v: f64) {
    if samples.back().is_some_and(|&(t, _)| t >= ts) {
        return; // a publication seen twice, or a clock step back: keep time monotonic
    }
    if samples.len() == capacity {
        samples.pop_front();
    }
    samples.push_back((ts, v));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(names: &[&str]) -> HashSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// One series: its metric name, label pairs and value.
    type Written<'a> = (&'static str, &'a [(&'a str, &'a str)], f64);

    /// The page the renderer writes of `series`, keeping the labels of the names in `kept`.
    fn page(kept: &[&str], series: &[Written<'_>]) -> Page {
        let mut all = crate::metrics::Families::labelled(Arc::new(wanted(kept)));
        let mut i = 0;
        while i < series.len() {
            let mut f = crate::metrics::Family::gauge(series[i].0, "H.");
            while i < series.len() && series[i].0 == f.name() {
                f.add(series[i].1, series[i].2);
                i += 1;
            }
            all.push(f);
        }
        all.into_page()
    }

    #[test]
    fn takes_only_wanted_families_with_their_labels_as_given() {
        let mut h = History::new(wanted(&["a", "c"]), Duration::ZERO, Duration::from_secs(1));
        let odd = "x \"}\" y\nz\\w";
        let p = page(
            &["a", "c"],
            &[
                ("a", &[("gpu", "0"), ("n", odd)], 1.5),
                ("b", &[("gpu", "0")], 2.0),
                ("c", &[], 3.0),
                ("c", &[("k", "v")], f64::INFINITY),
            ],
        );
        // The page carries the value escaped; the history gets it as the renderer was given it.
        assert!(std::str::from_utf8(&p.text)
            .expect("utf-8")
            .contains("a{gpu=\"0\",n=\"x \\\"}\\\" y\\nz\\\\w\"} 1.5\n"));
        h.ingest(&p, 1000);
        assert_eq!(h.series_count(), 3);
        let a = h.iter().find(|s| s.labels[0].1 == "a").expect("a is kept");
        assert_eq!(
            *a.labels,
            vec![
                ("__name__".into(), "a".into()),
                ("gpu".into(), "0".into()),
                ("n".into(), odd.into())
            ]
        );
        assert_eq!(a.samples, VecDeque::from(vec![(1000, 1.5)]));
        let mut c: Vec<_> = h
            .iter()
            .filter(|s| s.labels[0].1 == "c")
            .map(|s| (s.labels.len(), s.samples[0].1))
            .collect();
        c.sort_by_key(|x| x.0);
        assert_eq!(c, vec![(1, 3.0), (2, f64::INFINITY)]);
    }

    /// A page that kept no labels for a wanted name (rendered before the name was wanted, or
    /// written by hand) adds nothing for it: its text is not read back. The next page that
    /// keeps them adds the series.
    #[test]
    fn a_wanted_series_without_labels_on_the_page_is_skipped_never_parsed() {
        let mut h = History::new(wanted(&["a"]), Duration::ZERO, Duration::from_secs(1));
        h.ingest(&Page::from_text("a{g=\"0\"} 1\n"), 1000);
        h.ingest(&page(&[], &[("a", &[("g", "0")], 1.0)]), 2000);
        assert_eq!(h.series_count(), 0);
        h.ingest(&page(&["a"], &[("a", &[("g", "0")], 1.0)]), 3000);
        assert_eq!(h.series_count(), 1);
        // Known from then on by its text: a page without labels still feeds it.
        h.ingest(&Page::from_text("a{g=\"0\"} 2\n"), 4000);
        let a = h.iter().next().expect("a");
        assert_eq!(a.samples, VecDeque::from(vec![(3000, 1.0), (4000, 2.0)]));
    }

    #[test]
    fn ring_buffer_is_bounded_and_disappearing_series_go_stale() {
        let mut h = History::new(wanted(&["a"]), Duration::ZERO, Duration::from_secs(1));
        h.capacity = 3;
        let both = || {
            page(
                &["a"],
                &[("a", &[("g", "0")], 1.0), ("a", &[("g", "1")], 2.0)],
            )
        };
        let one = || page(&["a"], &[("a", &[("g", "0")], 1.0)]);
        for t in 1..=5 {
            h.ingest(&both(), t * 1000);
        }
        h.ingest(&one(), 6000);
        for s in h.iter() {
            assert_eq!(s.samples.len(), 3);
            let (t, v) = *s.samples.back().expect("samples");
            assert_eq!(t, 6000);
            assert_eq!(is_stale(v), s.labels[1].1 == "1");
        }
        // A stale marker is written once, not once per publication.
        h.ingest(&one(), 7000);
        let gone = h.iter().find(|s| s.labels[1].1 == "1").expect("kept");
        assert_eq!(gone.samples.back().map(|s| s.0), Some(6000));
    }

    #[test]
    fn capacity_covers_range_and_lookback() {
        let c = History::capacity_for(Duration::from_secs(600), Duration::from_secs(5));
        assert_eq!(c, 180 + 2);
        let h = History::new(
            wanted(&[]),
            Duration::from_secs(600),
            Duration::from_secs(5),
        );
        assert_eq!((h.capacity(), h.retention_ms), (182, 900_000));
    }
}
