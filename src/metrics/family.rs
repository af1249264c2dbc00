//! A thin builder over the `prometheus` crate's metric-family protos, so that each collector
//! reads as a list of series and the text encoding (escaping, format) is the crate's, not ours.

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

/// One metric family under construction.
pub struct Family {
    mf: MetricFamily,
}

impl Family {
    pub fn gauge(name: &str, help: &str) -> Self {
        Self::of_kind(name, help, MetricType::GAUGE)
    }

    pub fn counter(name: &str, help: &str) -> Self {
        Self::of_kind(name, help, MetricType::COUNTER)
    }

    /// A counter family when `counter`, else a gauge family (for table-driven collectors).
    pub fn new(name: &str, help: &str, counter: bool) -> Self {
        let kind = if counter {
            MetricType::COUNTER
        } else {
            MetricType::GAUGE
        };
        Self::of_kind(name, help, kind)
    }

    fn of_kind(name: &str, help: &str, kind: MetricType) -> Self {
        let mut mf = MetricFamily::default();
        mf.set_name(name.to_string());
        mf.set_help(help.to_string());
        mf.set_field_type(kind);
        Family { mf }
    }

    /// Adds one series. Labels are written in the order given.
    pub fn add<S: AsRef<str>>(&mut self, labels: &[(&str, S)], value: f64) {
        let mut m = Metric::default();
        m.set_label(
            labels
                .iter()
                .map(|(k, v)| {
                    let mut l = LabelPair::default();
                    l.set_name(k.to_string());
                    l.set_value(v.as_ref().to_string());
                    l
                })
                .collect(),
        );
        if self.mf.get_field_type() == MetricType::COUNTER {
            let mut c = Counter::default();
            c.set_value(value);
            m.set_counter(c);
        } else {
            let mut g = Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        }
        self.mf.mut_metric().push(m);
    }

    /// Adds a series only when the value is known: absent stays absent, never a made-up 0.
    pub fn add_opt<S: AsRef<str>, V: Into<f64>>(&mut self, labels: &[(&str, S)], value: Option<V>) {
        if let Some(v) = value {
            self.add(labels, v.into());
        }
    }
}

/// The families of one render, in output order.
#[derive(Default)]
pub struct Families {
    families: Vec<MetricFamily>,
}

impl Families {
    /// Keeps `family` unless it has no series (the text format has no empty families).
    pub fn push(&mut self, family: Family) {
        if !family.mf.get_metric().is_empty() {
            self.families.push(family.mf);
        }
    }

    /// Encodes everything in the Prometheus text format 0.0.4.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(64 * 1024);
        if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&self.families, &mut out) {
            // Only reachable with an empty or unnamed family, which `push` prevents.
            tracing::error!(error = %e, "metrics encoding failed");
        }
        out
    }
}
