//! Alert states as Prometheus keeps them (`rules/alerting.go`, `AlertingRule.Eval`):
//! a new result element is *pending*; it *fires* once it has been active for `for`; when it
//! leaves the result a pending alert is dropped and a firing one is *resolved* (unless
//! `keep_firing_for` holds it), and a resolved alert is remembered for 15 minutes. Pure: time
//! is an argument.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use crate::remediation::alert::{fingerprint, rfc3339, Alert, Status, ZERO_TIME};

use super::file::Rule;
use super::sample::Sample;

/// How long a resolved alert is kept (Prometheus's `resolvedRetention`).
const RESOLVED_RETENTION: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Inactive,
    Pending,
    Firing,
}

#[derive(Debug, Clone)]
struct Active {
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    state: State,
    active_at: SystemTime,
    fired_at: Option<SystemTime>,
    resolved_at: Option<SystemTime>,
    keep_firing_since: Option<SystemTime>,
}

/// The alerts of one rule.
#[derive(Debug, Default)]
pub struct RuleState {
    active: HashMap<String, Active>,
}

impl RuleState {
    /// Folds one evaluation's result into the states; returns the alerts that started firing or
    /// were resolved at `ts`, as Alertmanager would receive them. `Err` when two elements end up
    /// with the same labels (as Prometheus, the evaluation is then a failure).
    pub fn update(
        &mut self,
        rule: &Rule,
        result: &[Sample],
        ts: SystemTime,
    ) -> Result<Vec<Alert>, String> {
        let mut current: HashMap<String, Active> = HashMap::with_capacity(result.len());
        for s in result {
            let series: Vec<(String, String)> = s
                .labels
                .iter()
                .filter(|(k, _)| k != "__name__")
                .cloned()
                .collect();
            let mut labels: BTreeMap<String, String> = series.iter().cloned().collect();
            for (k, t) in &rule.labels {
                labels.insert(k.clone(), t.expand(&series, s.value));
            }
            labels.insert("alertname".into(), rule.name.clone());
            let annotations = rule
                .annotations
                .iter()
                .map(|(k, t)| (k.clone(), t.expand(&series, s.value)))
                .collect();
            let fp = fingerprint(&labels);
            let new = Active {
                labels,
                annotations,
                state: State::Pending,
                active_at: ts,
                fired_at: None,
                resolved_at: None,
                keep_firing_since: None,
            };
            if current.insert(fp, new).is_some() {
                return Err(
                    "vector contains metrics with the same labelset after applying alert labels"
                        .into(),
                );
            }
        }
        for (fp, new) in current.iter() {
            match self.active.get_mut(fp) {
                Some(a) if a.state != State::Inactive => a.annotations = new.annotations.clone(),
                _ => {
                    self.active.insert(fp.clone(), new.clone());
                }
            }
        }
        let mut events = Vec::new();
        self.active.retain(|fp, a| {
            if !current.contains_key(fp) {
                let mut keep_firing = false;
                if a.state == State::Firing && !rule.keep_firing_for.is_zero() {
                    let since = *a.keep_firing_since.get_or_insert(ts);
                    keep_firing = elapsed(since, ts) < rule.keep_firing_for;
                }
                if a.state == State::Pending {
                    return false;
                }
                if a.resolved_at
                    .is_some_and(|r| elapsed(r, ts) > RESOLVED_RETENTION)
                {
                    return false;
                }
                if a.state != State::Inactive && !keep_firing {
                    a.state = State::Inactive;
                    a.resolved_at = Some(ts);
                    events.push(to_alert(fp, a));
                }
                if !keep_firing {
                    return true;
                }
            } else {
                a.keep_firing_since = None;
            }
            if a.state == State::Pending && elapsed(a.active_at, ts) >= rule.hold {
                a.state = State::Firing;
                a.fired_at = Some(ts);
                events.push(to_alert(fp, a));
            }
            true
        });
        Ok(events)
    }

    /// (pending, firing) counts.
    pub fn counts(&self) -> (usize, usize) {
        self.active
            .values()
            .fold((0, 0), |(p, f), a| match a.state {
                State::Pending => (p + 1, f),
                State::Firing => (p, f + 1),
                State::Inactive => (p, f),
            })
    }

    /// Labels and annotations of the firing alerts, sorted (promtool's view).
    #[cfg(test)]
    pub fn firing_with_annotations(
        &self,
    ) -> Vec<(BTreeMap<String, String>, BTreeMap<String, String>)> {
        let mut v: Vec<_> = self
            .active
            .values()
            .filter(|a| a.state == State::Firing)
            .map(|a| (a.labels.clone(), a.annotations.clone()))
            .collect();
        v.sort();
        v
    }

    /// The alerts in `state`, for tests and logs.
    pub fn alerts(&self, state: State) -> Vec<BTreeMap<String, String>> {
        let mut v: Vec<_> = self
            .active
            .values()
            .filter(|a| a.state == state)
            .map(|a| a.labels.clone())
            .collect();
        v.sort();
        v
    }
}

fn elapsed(since: SystemTime, now: SystemTime) -> Duration {
    now.duration_since(since).unwrap_or_default()
}

fn to_alert(fp: &str, a: &Active) -> Alert {
    let resolved = a.state == State::Inactive;
    Alert {
        status: if resolved {
            Status::Resolved
        } else {
            Status::Firing
        },
        labels: a.labels.clone(),
        annotations: a.annotations.clone(),
        starts_at: rfc3339(a.fired_at.unwrap_or(a.active_at)),
        ends_at: match a.resolved_at {
            Some(t) if resolved => rfc3339(t),
            _ => ZERO_TIME.to_string(),
        },
        generator_url: String::new(),
        fingerprint: fp.to_string(),
    }
}
