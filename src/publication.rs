//! What the poller publishes each interval, and everything downstream reads: the snapshot, its
//! health, the health journal and the page rendered from them, with the index of its series.
//!
//! Plain data at the bottom of the house: the poller produces it, and the actors (HTTP, rules,
//! remediation, reclaim, the sharing guard and the device plugin) receive it through a
//! `tokio::sync::watch` channel without importing the poller. Must not: import anything that
//! acts, or change after it is published (only the page's gzip copy is made once, on demand).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;

use crate::health::{Journal, NodeHealth};
use crate::snapshot::Snapshot;

/// One poll's publication. Immutable once sent.
#[derive(Debug)]
pub struct Published {
    pub snapshot: Arc<Snapshot>,
    /// Per-GPU verdicts computed from `snapshot` (and the ones before it).
    pub health: Arc<NodeHealth>,
    /// The health event journal: the same `Arc` in every publication. The poller appends once
    /// per poll; readers hold the lock only to copy entries out, so they never stall a poll.
    pub journal: Arc<Mutex<Journal>>,
    /// The exposition of this publication, every family in it (see `metrics::render`).
    pub page: Page,
    /// The poll interval in force when this was published (readiness uses it).
    pub interval: Duration,
}

/// One rendered exposition, served as it is: the page is rendered once per poll, and every
/// scrape of this publication gets the same bytes.
#[derive(Debug)]
pub struct Page {
    /// Prometheus text format 0.0.4. Shared by reference with every scrape: serving copies no
    /// body.
    pub text: Bytes,
    /// Series (sample lines) on the page, counted while it was rendered.
    pub series: usize,
    /// Where each series stands in `text`, and its value, as the renderer wrote it: what the
    /// rules read instead of parsing the text back. 24 bytes per series (three `u32` offsets,
    /// a label set's number and the `f64`), pushed as the series is written: no allocation per
    /// series.
    index: Vec<SeriesAt>,
    /// The label pairs, as given to the renderer (unescaped), of the series whose metric name
    /// the rules select (`RenderConfig::labelled`): the rules read them, never the text.
    labels: LabelSets,
    /// `text` gzipped, made by the first scrape that asks for gzip and shared by the others.
    /// Polls outnumber scrapes (a 1-5 s poll against a 15-30 s scrape), so compressing every
    /// publication up front would mostly compress pages nobody fetches.
    gzip: OnceLock<Bytes>,
}

/// One series of a page: the byte range of its `name{labels}` in the text, where the name ends,
/// and its value (as a scraper reads it back: one NaN, no negative zero).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeriesAt {
    start: u32,
    name_end: u32,
    end: u32,
    /// Its label set in the page's [`LabelSets`], or [`NO_LABELS`] where none was kept.
    labels: u32,
    value: f64,
}

/// A series whose labels were not kept (a metric name no rule selects, or text written by hand).
const NO_LABELS: u32 = u32::MAX;

impl SeriesAt {
    /// The series at `start..end` of the text whose name ends at `name_end`; `None` past 4 GiB
    /// (a page is bounded far below).
    pub(crate) fn new(start: usize, name_end: usize, end: usize, value: f64) -> Option<SeriesAt> {
        Some(SeriesAt {
            start: u32::try_from(start).ok()?,
            name_end: u32::try_from(name_end).ok()?,
            end: u32::try_from(end).ok()?,
            labels: NO_LABELS,
            value: as_read_back(value),
        })
    }

    /// The same series with the label set `set` (its number in the page's [`LabelSets`]), or
    /// none.
    pub(crate) fn labelled(self, set: Option<u32>) -> SeriesAt {
        SeriesAt {
            labels: set.unwrap_or(NO_LABELS),
            ..self
        }
    }

    /// The same series with its label set counted from `first` (a family's sets appended to
    /// the page's), or without labels when its family's were not kept.
    pub(crate) fn labels_from(self, first: Option<u32>) -> SeriesAt {
        let set = match first {
            Some(f) if self.labels != NO_LABELS => f.checked_add(self.labels),
            _ => None,
        };
        self.labelled(set)
    }

    /// The same series `by` bytes further into the text (a family copied into the page).
    pub(crate) fn shifted(self, by: usize) -> Option<SeriesAt> {
        let by = u32::try_from(by).ok()?;
        Some(SeriesAt {
            start: self.start.checked_add(by)?,
            name_end: self.name_end.checked_add(by)?,
            end: self.end.checked_add(by)?,
            labels: self.labels,
            value: self.value,
        })
    }
}

/// Label sets kept flat, so that keeping one costs no allocation of its own: the keys and
/// values (unescaped) one after the other in `text`, where each ends in `ends` (key, value,
/// key, ...), and where each set's pairs end in `ends` (`sets`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSets {
    text: String,
    ends: Vec<u32>,
    sets: Vec<u32>,
}

impl LabelSets {
    /// Adds a set of `pairs`, in the order given; its number, or `None` past 4 GiB.
    pub(crate) fn push<S: AsRef<str>>(&mut self, pairs: &[(&str, S)]) -> Option<u32> {
        let set = u32::try_from(self.sets.len()).ok()?;
        for (k, v) in pairs {
            self.text.push_str(k);
            self.ends.push(u32::try_from(self.text.len()).ok()?);
            self.text.push_str(v.as_ref());
            self.ends.push(u32::try_from(self.text.len()).ok()?);
        }
        self.sets.push(u32::try_from(self.ends.len()).ok()?);
        Some(set)
    }

    /// Appends every set of `other`; the number its first set gets here, or `None` past 4 GiB.
    pub(crate) fn append(&mut self, other: &LabelSets) -> Option<u32> {
        let first = u32::try_from(self.sets.len()).ok()?;
        let (text, ends) = (
            u32::try_from(self.text.len()).ok()?,
            u32::try_from(self.ends.len()).ok()?,
        );
        self.text.push_str(&other.text);
        for e in &other.ends {
            self.ends.push(e.checked_add(text)?);
        }
        for s in &other.sets {
            self.sets.push(s.checked_add(ends)?);
        }
        Some(first)
    }

    /// Sets kept.
    pub fn len(&self) -> usize {
        self.sets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// Bytes held (allocated capacity), for the memory statement of a publication.
    pub fn heap_bytes(&self) -> usize {
        self.text.capacity() + 4 * (self.ends.capacity() + self.sets.capacity())
    }

    /// The pairs of set `set`, in the order the renderer was given them.
    fn get(&self, set: u32) -> Option<Labels<'_>> {
        let i = set as usize;
        let end = *self.sets.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.sets[i - 1] as usize };
        Some(Labels {
            sets: self,
            next: start,
            end,
        })
    }

    fn str_at(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.text
            .get(start..self.ends[i] as usize)
            .unwrap_or_default()
    }
}

/// The label pairs of one series, as the renderer was given them: unescaped, in its order.
#[derive(Debug, Clone, Copy)]
pub struct Labels<'a> {
    sets: &'a LabelSets,
    next: usize,
    end: usize,
}

impl<'a> Iterator for Labels<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<(&'a str, &'a str)> {
        if self.next + 2 > self.end {
            return None;
        }
        let pair = (self.sets.str_at(self.next), self.sets.str_at(self.next + 1));
        self.next += 2;
        Some(pair)
    }
}

impl PartialEq for Labels<'_> {
    fn eq(&self, other: &Self) -> bool {
        Iterator::eq(*self, *other)
    }
}

/// The value a scraper parses from the text: every NaN reads back as the one `NaN`, and `-0`
/// is written `0`. The index gives the rules exactly what a scrape of the page would.
fn as_read_back(v: f64) -> f64 {
    if v.is_nan() {
        f64::NAN
    } else if v == 0.0 {
        0.0
    } else {
        v
    }
}

/// One series of a page, read from its index: no parsing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    /// The metric name.
    pub name: &'a str,
    /// `name{labels}` exactly as written (labels in the renderer's order, values escaped).
    pub series: &'a str,
    /// Its label pairs as the renderer was given them, where the page kept them (metric names
    /// the rules select); `None` elsewhere: never recovered from `series`.
    pub labels: Option<Labels<'a>>,
    pub value: f64,
}

impl Page {
    /// A page from text written by hand (tests, fuzzing): indexed by reading its lines.
    pub fn new(text: Bytes) -> Page {
        let mut index = Vec::new();
        if let Ok(t) = std::str::from_utf8(&text) {
            index_lines(t, 0, &mut index);
        }
        Page::indexed(text, index, LabelSets::default())
    }

    /// A page from text, as [`Page::new`].
    pub fn from_text(text: &str) -> Page {
        Page::new(Bytes::copy_from_slice(text.as_bytes()))
    }

    /// A page whose renderer indexed its series as it wrote them.
    pub(crate) fn indexed(text: Bytes, index: Vec<SeriesAt>, labels: LabelSets) -> Page {
        Page {
            text,
            series: index.len(),
            index,
            labels,
            gzip: OnceLock::new(),
        }
    }

    /// The label sets the page keeps (for the memory statement).
    pub fn label_sets(&self) -> &LabelSets {
        &self.labels
    }

    /// Every series on the page, in page order.
    pub fn samples(&self) -> impl Iterator<Item = Sample<'_>> {
        self.index.iter().filter_map(|at| {
            let (start, name_end, end) = (at.start as usize, at.name_end as usize, at.end as usize);
            let series = std::str::from_utf8(self.text.get(start..end)?).ok()?;
            Some(Sample {
                name: series.get(..name_end.checked_sub(start)?)?,
                series,
                labels: self.labels.get(at.labels),
                value: at.value,
            })
        })
    }

    /// Whether the gzip copy exists already (a gzip scrape then only clones a pointer).
    pub fn gzip_ready(&self) -> bool {
        self.gzip.get().is_some()
    }

    /// The gzip copy of the page, compressed on first use (about 0.4 ms for the 8-GPU page).
    pub fn gzip(&self) -> Bytes {
        self.gzip.get_or_init(|| compress(&self.text)).clone()
    }
}

/// Indexes the sample lines of text in the format (`# ` lines and blank ones skipped; a line
/// that is no sample is left out), `base` being where `text` starts in the page. For series
/// written by hand (the actors' collectors, tests): the renderer's families index as they write.
pub(crate) fn index_lines(text: &str, base: usize, out: &mut Vec<SeriesAt>) {
    let mut at = base;
    for line in text.split_inclusive('\n') {
        let start = at;
        at += line.len();
        // As `str::lines`: a line ends at `\n` or `\r\n`.
        let line = match line.strip_suffix('\n') {
            Some(l) => l.strip_suffix('\r').unwrap_or(l),
            None => line,
        };
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let Some((key, value)) = split_value(line, name_end) else {
            continue;
        };
        let Some(value) = parse_value(value) else {
            continue;
        };
        if let Some(s) = SeriesAt::new(start, start + name_end, start + key.len(), value) {
            out.push(s);
        }
    }
}

/// Splits `name{labels} value` into the series part and the value (respecting quoted `}` and
/// spaces inside label values).
fn split_value(line: &str, name_end: usize) -> Option<(&str, &str)> {
    let bytes = line.as_bytes();
    let mut i = name_end;
    if bytes.get(i) == Some(&b'{') {
        let mut in_quotes = false;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' if in_quotes => i += 1,
                b'"' => in_quotes = !in_quotes,
                b'}' if !in_quotes => break,
                _ => {}
            }
            i += 1;
        }
        i += 1;
    }
    let key = line.get(..i)?;
    let rest = line.get(i..)?.trim_start();
    // A timestamp may follow the value; the agent writes none, but be lenient.
    let value = rest.split(' ').next()?;
    Some((key, value))
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

/// gzip at flate2's fastest level: the page is text of repeated label sets, which level 1
/// already shrinks about tenfold, and its cost is paid by a waiting scraper.
fn compress(text: &[u8]) -> Bytes {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(text.len() / 8 + 64),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(text);
    Bytes::from(gz.finish().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn the_gzip_copy_is_made_once_and_gives_back_the_page() {
        let text: Vec<u8> = (0..20_000u32)
            .flat_map(|i| format!("metric{{gpu=\"{}\"}} {}\n", i % 8, i).into_bytes())
            .collect();
        let page = Page::new(Bytes::from(text.clone()));
        assert!(!page.gzip_ready());
        let first = page.gzip();
        assert!(page.gzip_ready());
        assert_eq!(
            first.as_ptr(),
            page.gzip().as_ptr(),
            "shared, not recompressed"
        );
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&first[..])
            .read_to_end(&mut out)
            .expect("valid gzip");
        assert_eq!(out, text);
        assert!(first.len() < text.len() / 4, "really compressed");
    }

    #[test]
    fn a_series_costs_the_index_three_offsets_and_its_value() {
        assert_eq!(
            std::mem::size_of::<SeriesAt>(),
            4 * 4 + 8,
            "the label set's number fills what the f64's alignment left"
        );
    }

    #[test]
    fn hand_written_lines_are_indexed_as_a_scraper_reads_them() {
        let page = Page::from_text(
            "# HELP a A.\n# TYPE a gauge\na{k=\"x y\",q=\"}\"} 1.5\r\nb 2 1700000000000\nc{k=\"v\"} NaN\nnot a sample\n\nd -Inf",
        );
        let got: Vec<(&str, &str, f64)> = page
            .samples()
            .map(|s| (s.name, s.series, s.value))
            .collect();
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[0], ("a", "a{k=\"x y\",q=\"}\"}", 1.5));
        assert_eq!(
            got[1],
            ("b", "b", 2.0),
            "a timestamp after the value is ignored"
        );
        assert!(got[2].0 == "c" && got[2].2.is_nan());
        assert_eq!(got[3], ("d", "d", f64::NEG_INFINITY));
        assert_eq!(page.series, 4);
    }

    #[test]
    fn an_empty_page_compresses_to_a_valid_stream() {
        let page = Page::new(Bytes::new());
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&page.gzip()[..])
            .read_to_end(&mut out)
            .expect("valid gzip");
        assert!(out.is_empty());
    }
}
