//! `gpu_steward_hook_runs_total{hook,result}` and `gpu_steward_hook_duration_seconds{hook}`,
//! pushed as families when the page is rendered (a few series; they change only when
//! hooks run).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the duration histogram, in seconds: hooks take from milliseconds (a label
/// write) to minutes (a drain).
const BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0];

#[derive(Debug, Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Debug, Default)]
pub struct HookMetrics {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    runs: BTreeMap<(String, &'static str), u64>,
    durations: BTreeMap<String, Histogram>,
}

impl crate::metrics::Collector for HookMetrics {
    fn collect(&self, out: &mut crate::metrics::Families) {
        self.render(out);
    }
}

impl HookMetrics {
    /// Counts one run of `hook` ending in `result`; `duration` only for runs that ran.
    pub fn observe(&self, hook: &str, result: &'static str, duration: Option<Duration>) {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        *m.runs.entry((hook.to_string(), result)).or_default() += 1;
        if let Some(d) = duration {
            let h = m.durations.entry(hook.to_string()).or_default();
            let s = d.as_secs_f64();
            for (i, b) in BUCKETS.iter().enumerate() {
                if s <= *b {
                    h.counts[i] += 1;
                }
            }
            h.count += 1;
            h.sum += s;
        }
    }

    /// Creates the series of `hook` at 0 so that rates work from the first run.
    pub fn declare(&self, hook: &str) {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for r in [
            "success",
            "failure",
            "timeout",
            "error",
            "dry_run",
            crate::audit::AUDIT_FAILED,
        ] {
            m.runs.entry((hook.to_string(), r)).or_default();
        }
        m.durations.entry(hook.to_string()).or_default();
    }

    pub fn render(&self, out: &mut crate::metrics::Families) {
        use crate::metrics::Family;
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if m.runs.is_empty() {
            return;
        }
        let mut runs = Family::counter(
            "gpu_steward_hook_runs_total",
            "Remediation hook runs by result (success, failure, timeout, error, dry_run, audit_failed: not run because its audit record could not be written).",
        );
        for ((hook, result), n) in &m.runs {
            runs.add(&[("hook", hook.as_str()), ("result", result)], *n as f64);
        }
        out.push(runs);
        let mut durations = Family::histogram(
            "gpu_steward_hook_duration_seconds",
            "Wall time of remediation hook runs.",
        );
        for (hook, h) in &m.durations {
            let hook = hook.as_str();
            for (i, b) in BUCKETS.iter().enumerate() {
                let le = b.to_string();
                durations.add_suffixed(
                    "_bucket",
                    &[("hook", hook), ("le", le.as_str())],
                    h.counts[i] as f64,
                );
            }
            durations.add_suffixed("_bucket", &[("hook", hook), ("le", "+Inf")], h.count as f64);
            durations.add_suffixed("_sum", &[("hook", hook)], h.sum);
            durations.add_suffixed("_count", &[("hook", hook)], h.count as f64);
        }
        out.push(durations);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_a_cumulative_histogram() {
        let m = HookMetrics::default();
        m.declare("cordon");
        m.observe("cordon", "success", Some(Duration::from_millis(70)));
        m.observe("cordon", "timeout", Some(Duration::from_secs(31)));
        let mut families = crate::metrics::Families::default();
        m.render(&mut families);
        let out = families.encode();
        assert!(out.contains("gpu_steward_hook_runs_total{hook=\"cordon\",result=\"success\"} 1\n"));
        assert!(out.contains("gpu_steward_hook_runs_total{hook=\"cordon\",result=\"error\"} 0\n"));
        assert!(out
            .contains("gpu_steward_hook_duration_seconds_bucket{hook=\"cordon\",le=\"0.05\"} 0\n"));
        assert!(out
            .contains("gpu_steward_hook_duration_seconds_bucket{hook=\"cordon\",le=\"0.1\"} 1\n"));
        assert!(
            out.contains("gpu_steward_hook_duration_seconds_bucket{hook=\"cordon\",le=\"60\"} 2\n")
        );
        assert!(out.contains("gpu_steward_hook_duration_seconds_count{hook=\"cordon\"} 2\n"));
    }
}
