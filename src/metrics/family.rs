//! Metric families written straight into the Prometheus text format 0.0.4, so that each
//! collector reads as a list of series.
//!
//! Written by hand rather than through the `prometheus` crate's protobuf structs: those
//! allocate a `String` per label name and value and a struct per series, and building and
//! encoding them was two thirds of the agent's own CPU per poll (0.7 + 0.4 ms of 1.6 ms on
//! the 8-GPU demo node, measured on the 2-core development machine). The format is small:
//! `# HELP` (backslash and newline escaped), `# TYPE`, then one line per series with label
//! values escaped (backslash, double quote, newline) and Go's spelling of special floats.

use std::collections::HashSet;
use std::fmt::Write;
use std::sync::Arc;

use bytes::Bytes;

use crate::publication::{LabelSets, Page, SeriesAt};

/// The suffixes of a histogram's series.
const HISTOGRAM: [&str; 3] = ["_bucket", "_sum", "_count"];

/// Whether `labelled` names the family `name` (a histogram by any of its series' names).
fn wanted(labelled: &HashSet<String>, name: &str, histogram: bool) -> bool {
    if labelled.is_empty() {
        return false;
    }
    if histogram {
        // Few series; three short strings.
        return HISTOGRAM
            .iter()
            .any(|s| labelled.contains(&format!("{name}{s}")));
    }
    labelled.contains(name)
}

/// One metric family under construction.
#[derive(Clone)]
pub struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    /// The series lines written so far.
    lines: String,
    /// Where each series stands in `lines`, and its value: the page's index (what the rules
    /// read instead of parsing the text back).
    index: Vec<SeriesAt>,
    /// Each series' label pairs as given, unescaped (set `i` is the `i`-th series): kept on
    /// the page when the rules select the family's name ([`Families::push`]).
    labels: LabelSets,
}

impl Family {
    pub fn gauge(name: &'static str, help: &'static str) -> Self {
        Self::new(name, help, false)
    }

    pub fn counter(name: &'static str, help: &'static str) -> Self {
        Self::new(name, help, true)
    }

    /// A counter family when `counter`, else a gauge family (for table-driven collectors).
    pub fn new(name: &'static str, help: &'static str, counter: bool) -> Self {
        Self::of_kind(name, help, if counter { "counter" } else { "gauge" })
    }

    /// A histogram family: its series are added with [`Family::add_suffixed`].
    pub fn histogram(name: &'static str, help: &'static str) -> Self {
        Self::of_kind(name, help, "histogram")
    }

    fn of_kind(name: &'static str, help: &'static str, kind: &'static str) -> Self {
        Family {
            name,
            help,
            kind,
            lines: String::new(),
            index: Vec::new(),
            labels: LabelSets::default(),
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Adds one series. Labels are written in the order given.
    pub fn add<S: AsRef<str>>(&mut self, labels: &[(&str, S)], value: f64) {
        self.add_suffixed("", labels, value);
    }

    /// Adds one series named the family's name followed by `suffix` (a histogram's `_bucket`,
    /// `_sum` and `_count`).
    pub fn add_suffixed<S: AsRef<str>>(
        &mut self,
        suffix: &'static str,
        labels: &[(&str, S)],
        value: f64,
    ) {
        let set = self.labels.push(labels);
        let out = &mut self.lines;
        let start = out.len();
        out.push_str(self.name);
        out.push_str(suffix);
        for (i, (k, v)) in labels.iter().enumerate() {
            out.push(if i == 0 { '{' } else { ',' });
            out.push_str(k);
            out.push_str("=\"");
            escape(out, v.as_ref(), true);
            out.push('"');
        }
        if !labels.is_empty() {
            out.push('}');
        }
        let name_end = start + self.name.len() + suffix.len();
        if let Some(at) = SeriesAt::new(start, name_end, out.len(), value) {
            self.index.push(at.labelled(set));
        }
        out.push(' ');
        write_value(out, value);
        out.push('\n');
    }

    /// Adds a series only when the value is known: absent stays absent, never a made-up 0.
    pub fn add_opt<S: AsRef<str>, V: Into<f64>>(&mut self, labels: &[(&str, S)], value: Option<V>) {
        if let Some(v) = value {
            self.add(labels, v.into());
        }
    }
}

/// The families of one render, in output order, and the index of their series.
#[derive(Default)]
pub struct Families {
    text: String,
    /// Every series written, where it stands in `text` (the page is never scanned for it).
    index: Vec<SeriesAt>,
    /// Metric names whose series keep their label pairs (the names the rules select).
    labelled: Arc<HashSet<String>>,
    /// Those label pairs.
    labels: LabelSets,
}

impl Families {
    /// Families that keep the label pairs of the series named in `labelled`.
    pub fn labelled(labelled: Arc<HashSet<String>>) -> Self {
        Families {
            labelled,
            ..Families::default()
        }
    }

    /// Whether the series of `family` keep their labels.
    fn keeps_labels(&self, family: &Family) -> bool {
        wanted(&self.labelled, family.name, family.kind == "histogram")
    }

    /// Writes `family` out unless it has no series (the text format has no empty families).
    pub fn push(&mut self, family: Family) {
        if family.lines.is_empty() {
            return;
        }
        let out = &mut self.text;
        if out.is_empty() {
            out.reserve(64 * 1024);
        }
        out.push_str("# HELP ");
        out.push_str(family.name);
        out.push(' ');
        escape(out, family.help, false);
        out.push_str("\n# TYPE ");
        out.push_str(family.name);
        out.push(' ');
        out.push_str(family.kind);
        out.push('\n');
        let base = out.len();
        out.push_str(&family.lines);
        let first = if self.keeps_labels(&family) {
            self.labels.append(&family.labels)
        } else {
            None
        };
        self.index.extend(
            family
                .index
                .into_iter()
                .filter_map(|at| Some(at.shifted(base)?.labels_from(first))),
        );
    }

    /// Series pushed so far.
    pub fn series(&self) -> usize {
        self.index.len()
    }

    /// Everything, in the Prometheus text format 0.0.4.
    pub fn encode(self) -> String {
        self.text
    }

    /// The page: the text, the index of its series and the label pairs kept.
    pub fn into_page(self) -> Page {
        Page::indexed(Bytes::from(self.text.into_bytes()), self.index, self.labels)
    }
}

/// Escapes as the text format requires: `\` and newline always, `"` in label values.
fn escape(out: &mut String, s: &str, quote: bool) {
    // Label values are mostly plain: a vectorised scan, then one copy.
    if memchr::memchr3(b'\\', b'\n', b'"', s.as_bytes()).is_none() {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

fn write_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        // Most values are whole (bytes, counts, MHz): integer formatting is far cheaper.
        let _ = write!(out, "{}", v as i64);
    } else {
        // `Display` of f64 is the shortest string that reads back to the same value.
        let _ = write!(out, "{v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_text_format_with_escapes() {
        let mut f = Family::gauge("x_ratio", "A \\ help\nline.");
        f.add(&[("gpu", "0"), ("name", "a \"b\"\\c\nd")], 0.5);
        f.add::<&str>(&[], 1e21);
        f.add_opt::<&str, f64>(&[], None);
        let mut c = Family::counter("y_total", "Y.");
        c.add(&[("k", "v")], f64::INFINITY);
        let empty = Family::gauge("z", "Z.");
        let mut all = Families::default();
        all.push(f);
        all.push(empty);
        all.push(c);
        assert_eq!(
            all.encode(),
            "# HELP x_ratio A \\\\ help\\nline.\n# TYPE x_ratio gauge\n\
             x_ratio{gpu=\"0\",name=\"a \\\"b\\\"\\\\c\\nd\"} 0.5\n\
             x_ratio 1000000000000000000000\n\
             # HELP y_total Y.\n# TYPE y_total counter\ny_total{k=\"v\"} +Inf\n"
        );
    }

    /// The index the renderer writes is what a reader of the text finds: the same series, in
    /// the same places, with the values a scraper parses (one NaN, no negative zero); and the
    /// label pairs kept are the ones given, for the names asked for only.
    #[test]
    fn the_index_is_what_a_reader_of_the_text_finds() {
        let mut f = Family::gauge("x_ratio", "X.");
        f.add(&[("gpu", "0"), ("name", "a \"b}\" c\\d\ne")], 0.25);
        f.add(&[("gpu", "1")], -0.0);
        f.add(&[("gpu", "2")], f64::from_bits(0x7ff0_0000_0000_0002));
        f.add::<&str>(&[], 12_345_678.0);
        let mut c = Family::counter("y_total", "Y.");
        c.add(&[("k", "v")], f64::NEG_INFINITY);
        c.add(&[("k", "w")], 1e21);
        let mut h = Family::histogram("z_seconds", "Z.");
        h.add_suffixed("_bucket", &[("le", "+Inf")], 3.0);
        h.add_suffixed::<&str>("_count", &[], 3.0);
        let kept = ["x_ratio", "z_seconds_count"].map(String::from);
        let mut all = Families::labelled(Arc::new(kept.into_iter().collect()));
        all.push(f);
        all.push(c);
        all.push(h);
        let page = all.into_page();
        let text = std::str::from_utf8(&page.text).expect("utf-8").to_string();
        let read = Page::from_text(&text);
        assert_eq!(page.series, 8);
        let bits = |p: &Page| {
            p.samples()
                .map(|s| (s.name.to_string(), s.series.to_string(), s.value.to_bits()))
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&page), bits(&read));
        assert_eq!(bits(&page)[1].2, 0.0f64.to_bits(), "-0 is written 0");
        assert_eq!(bits(&page)[2].2, f64::NAN.to_bits(), "one NaN");
        assert_eq!(
            bits(&page)[0].1,
            "x_ratio{gpu=\"0\",name=\"a \\\"b}\\\" c\\\\d\\ne\"}"
        );
        assert_eq!(bits(&page)[6].0, "z_seconds_bucket");
        let labels: Vec<Option<Vec<(&str, &str)>>> = page
            .samples()
            .map(|s| s.labels.map(|l| l.collect()))
            .collect();
        assert_eq!(
            labels,
            vec![
                Some(vec![("gpu", "0"), ("name", "a \"b}\" c\\d\ne")]),
                Some(vec![("gpu", "1")]),
                Some(vec![("gpu", "2")]),
                Some(vec![]),
                None,
                None,
                Some(vec![("le", "+Inf")]),
                Some(vec![]),
            ]
        );
        assert!(
            read.samples().all(|s| s.labels.is_none()),
            "text is not read back"
        );
    }

    /// The page keeps the pairs of the wanted names only, whether a family was built during
    /// the render or before it (the reclaim actor's, posted for later pages), and a page that
    /// wants none keeps none.
    #[test]
    fn a_page_keeps_the_pairs_of_the_wanted_names_only() {
        let mut posted = Family::gauge("p", "P.");
        posted.add(&[("k", "v")], 1.0);
        let kept: Arc<HashSet<String>> = Arc::new(["a", "p"].map(String::from).into());
        let build = || {
            let mut a = Family::gauge("a", "A.");
            a.add(&[("g", "0")], 1.0);
            let mut b = Family::gauge("b", "B.");
            b.add(&[("g", "1")], 1.0);
            (a, b)
        };
        let pairs = |page: &Page| -> Vec<Option<Vec<(String, String)>>> {
            page.samples()
                .map(|s| {
                    s.labels
                        .map(|l| l.map(|(k, v)| (k.to_string(), v.to_string())).collect())
                })
                .collect()
        };
        let (a, b) = build();
        let mut all = Families::labelled(kept);
        all.push(a);
        all.push(b);
        all.push(posted.clone());
        let page = all.into_page();
        let pair = |k: &str, v: &str| Some(vec![(k.to_string(), v.to_string())]);
        assert_eq!(pairs(&page), vec![pair("g", "0"), None, pair("k", "v")]);
        assert_eq!(
            page.label_sets().len(),
            2,
            "the sets of `a` and `p`, none of `b`"
        );

        let (a, b) = build();
        let mut none = Families::labelled(Arc::default());
        none.push(a);
        none.push(b);
        none.push(posted);
        let page = none.into_page();
        assert_eq!(pairs(&page), vec![None, None, None]);
        assert!(page.label_sets().is_empty());
    }
}
