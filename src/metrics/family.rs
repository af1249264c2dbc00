//! Metric families written straight into the Prometheus text format 0.0.4, so that each
//! collector reads as a list of series.
//!
//! Written by hand rather than through the `prometheus` crate's protobuf structs: those
//! allocate a `String` per label name and value and a struct per series, and building and
//! encoding them was two thirds of the agent's own CPU per poll (0.7 + 0.4 ms of 1.6 ms on
//! the 8-GPU demo node, measured on the 2-core development machine). The format is small:
//! `# HELP` (backslash and newline escaped), `# TYPE`, then one line per series with label
//! values escaped (backslash, double quote, newline) and Go's spelling of special floats.

use std::fmt::Write;

use crate::publication::{index_lines, SeriesAt};

/// One metric family under construction.
pub struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    /// The series lines written so far.
    lines: String,
    /// Where each series stands in `lines`, and its value: the page's index (what the rules
    /// read instead of parsing the text back).
    index: Vec<SeriesAt>,
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
        Family {
            name,
            help,
            kind: if counter { "counter" } else { "gauge" },
            lines: String::new(),
            index: Vec::new(),
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Adds one series. Labels are written in the order given.
    pub fn add<S: AsRef<str>>(&mut self, labels: &[(&str, S)], value: f64) {
        let out = &mut self.lines;
        let start = out.len();
        out.push_str(self.name);
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
        if let Some(at) = SeriesAt::new(start, start + self.name.len(), out.len(), value) {
            self.index.push(at);
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
}

impl Families {
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
        self.index
            .extend(family.index.into_iter().filter_map(|at| at.shifted(base)));
    }

    /// Appends complete families that `write` puts in the text format by hand (the actors'
    /// collectors), indexing their sample lines: they are a few, and the renderer's own
    /// families are never read back.
    pub fn push_text(&mut self, write: impl FnOnce(&mut String)) {
        let at = self.text.len();
        write(&mut self.text);
        index_lines(&self.text[at..], at, &mut self.index);
    }

    /// Series pushed so far.
    pub fn series(&self) -> usize {
        self.index.len()
    }

    /// Everything, in the Prometheus text format 0.0.4.
    pub fn encode(self) -> String {
        self.text
    }

    /// The text and the index of its series: what a [`crate::publication::Page`] is made of.
    pub fn into_parts(self) -> (String, Vec<SeriesAt>) {
        (self.text, self.index)
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
    /// the same places, with the values a scraper parses (one NaN, no negative zero).
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
        let mut all = Families::default();
        all.push(f);
        all.push(c);
        all.push_text(|out| out.push_str("# TYPE z gauge\nz{a=\"1\"} 3.5\n"));
        let (text, index) = all.into_parts();
        let mut read = Vec::new();
        index_lines(&text, 0, &mut read);
        assert_eq!(index.len(), 7);
        let bits = |v: &[SeriesAt]| {
            let page =
                crate::publication::Page::indexed(bytes::Bytes::from(text.clone()), v.to_vec());
            page.samples()
                .map(|s| (s.name.to_string(), s.series.to_string(), s.value.to_bits()))
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&index), bits(&read));
        assert_eq!(bits(&index)[1].2, 0.0f64.to_bits(), "-0 is written 0");
        assert_eq!(bits(&index)[2].2, f64::NAN.to_bits(), "one NaN");
        assert_eq!(
            bits(&index)[0].1,
            "x_ratio{gpu=\"0\",name=\"a \\\"b}\\\" c\\\\d\\ne\"}"
        );
    }
}
