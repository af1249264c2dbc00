//! Prometheus alerting rules evaluated on the node, over the agent's own series.
//!
//! The same rule files serve Prometheus and the agent: [`file`] loads them (YAML; errors with
//! `FILE:LINE:COLUMN`, the rule and the construct; `limits` bounds an expression's size and
//! depth before it is parsed), [`check`] admits the supported subset of
//! PromQL, [`history`] keeps each selected series in a bounded ring buffer at poll resolution,
//! [`eval`] evaluates an expression at one instant (over the plain values of [`sample`]), and
//! [`alerts`] keeps the pending → firing → resolved states exactly as Prometheus does.
//! [`Engine::step`] is the pure decision: one publication in, the alerts that changed state out.
//! [`task`] runs it after every poll and hands those alerts to the remediation routes.
//!
//! It must not call NVML or block a scrape: it reads the page the poller published, through
//! the page's index of its series (never parsing the text back).

pub mod alerts;
mod binary;
pub mod check;
pub mod eval;
pub mod file;
mod functions;
pub mod history;
mod limits;
mod printf;
pub mod sample;
pub mod served;
pub(crate) mod set;
pub mod task;
pub mod template;

#[cfg(test)]
mod promtool;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::publication::Page;
use crate::remediation::alert::Alert;

use alerts::RuleState;
use history::History;

/// The largest rule file read (docs/configuration.md): thousands of rules, each expression at
/// most [`limits::MAX_EXPR_BYTES`].
pub const MAX_RULE_FILE: u64 = 16 << 20;

pub use set::RuleSet;

/// Counters and gauges of the rules, collected into the page at each poll.
#[derive(Debug, Default)]
pub struct RuleMetrics {
    pub evaluation_failures: AtomicU64,
    /// (alertname, pending, firing) per rule name, replaced after each step.
    pub alerts: Mutex<Vec<(String, usize, usize)>>,
}

impl crate::metrics::Collector for RuleMetrics {
    fn collect(&self, out: &mut crate::metrics::Families) {
        self.render(out);
    }
}

impl RuleMetrics {
    pub fn render(&self, out: &mut crate::metrics::Families) {
        use crate::metrics::Family;
        let alerts = self
            .alerts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut f = Family::gauge(
            "gpu_steward_alerts",
            "Alerts of the agent's own rules, by state (pending, firing).",
        );
        for (name, pending, firing) in &alerts {
            f.add(
                &[("alertname", name.as_str()), ("state", "pending")],
                *pending as f64,
            );
            f.add(
                &[("alertname", name.as_str()), ("state", "firing")],
                *firing as f64,
            );
        }
        out.push(f);
        let mut f = Family::counter(
            "gpu_steward_rule_evaluation_failures_total",
            "Rule evaluations that failed (e.g. many-to-many matching).",
        );
        f.add::<&str>(&[], self.evaluation_failures.load(Ordering::Relaxed) as f64);
        out.push(f);
    }
}

/// The rules' state between publications.
pub struct Engine {
    set: Arc<RuleSet>,
    history: History,
    /// Per group, per rule.
    states: Vec<Vec<RuleState>>,
    last_eval: Vec<Option<SystemTime>>,
}

/// What one step produced.
#[derive(Debug, Default)]
pub struct Step {
    /// Alerts that started firing or were resolved.
    pub changed: Vec<Alert>,
    /// Failed evaluations: (rule origin and name, reason).
    pub failures: Vec<(String, String)>,
}

impl Engine {
    pub fn new(set: Arc<RuleSet>, interval: Duration) -> Self {
        let history = History::new(set.needs.names.clone(), set.needs.longest, interval);
        Engine {
            states: set
                .groups
                .iter()
                .map(|g| g.rules.iter().map(|_| RuleState::default()).collect())
                .collect(),
            last_eval: vec![None; set.groups.len()],
            set,
            history,
        }
    }

    pub fn history(&self) -> &History {
        &self.history
    }

    /// Ingests one publication's `page` taken at `ts` and evaluates every group due.
    pub fn step(&mut self, page: &Page, ts: SystemTime) -> Step {
        self.history.ingest(page, millis(ts));
        self.evaluate(ts)
    }

    /// Evaluates every group that is due at `ts` over the history as it is.
    pub fn evaluate(&mut self, ts: SystemTime) -> Step {
        let mut step = Step::default();
        let ts_ms = millis(ts);
        for (gi, group) in self.set.groups.iter().enumerate() {
            if let (Some(every), Some(last)) = (group.interval, self.last_eval[gi]) {
                if ts.duration_since(last).unwrap_or_default() < every {
                    continue;
                }
            }
            self.last_eval[gi] = Some(ts);
            for (ri, rule) in group.rules.iter().enumerate() {
                let result = match eval::evaluate(&rule.expr, &self.history, ts_ms) {
                    Ok(eval::Value::Vector(v)) => Ok(v),
                    // As Prometheus's EngineQueryFunc: a scalar is one element without labels.
                    Ok(eval::Value::Scalar(v)) => Ok(vec![sample::Sample {
                        labels: Arc::new(Vec::new()),
                        value: v,
                    }]),
                    Err(e) => Err(e),
                };
                match result.and_then(|r| self.states[gi][ri].update(rule, &r, ts)) {
                    Ok(changed) => step.changed.extend(changed),
                    Err(e) => step
                        .failures
                        .push((format!("{} ({})", rule.name, rule.origin), e)),
                }
            }
        }
        step
    }

    /// (alertname, pending, firing), summed over rules of the same name, sorted.
    pub fn counts(&self) -> Vec<(String, usize, usize)> {
        let mut out: Vec<(String, usize, usize)> = Vec::new();
        for (g, states) in self.set.groups.iter().zip(&self.states) {
            for (rule, state) in g.rules.iter().zip(states) {
                let (p, f) = state.counts();
                match out.iter_mut().find(|(n, _, _)| *n == rule.name) {
                    Some(e) => {
                        e.1 += p;
                        e.2 += f;
                    }
                    None => out.push((rule.name.clone(), p, f)),
                }
            }
        }
        out.sort();
        out
    }

    /// The state of the rule named `name` (the first of that name), for tests.
    pub fn rule_state(&self, name: &str) -> Option<&RuleState> {
        self.set
            .groups
            .iter()
            .zip(&self.states)
            .flat_map(|(g, s)| g.rules.iter().zip(s))
            .find(|(r, _)| r.name == name)
            .map(|(_, s)| s)
    }

    /// Adds one sample directly (tests feed synthetic series this way).
    #[cfg(test)]
    pub fn history_mut(&mut self) -> &mut History {
        &mut self.history
    }
}

pub fn millis(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
