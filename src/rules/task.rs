//! Runs the [`Engine`] after every publication: ingests the page's series, evaluates the
//! rules, publishes the alert counts, logs each state change once, and hands alerts that
//! started firing or were resolved to the remediation dispatcher.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::publication::Published;
use crate::remediation::{Handle, Source};

use super::{Engine, RuleMetrics, RuleSet, Step};

/// Starts the rules task; it stops when `stop` turns true.
pub fn spawn(
    set: Arc<RuleSet>,
    interval: Duration,
    mut published: watch::Receiver<Arc<Published>>,
    metrics: Arc<RuleMetrics>,
    remediation: Handle,
    mut stop: watch::Receiver<bool>,
) {
    let mut engine = Engine::new(set.clone(), interval);
    tracing::info!(
        rules = set.rule_count(),
        files = set.files().count(),
        series_names = set.needs.names.len(),
        samples_per_series = engine.history().capacity(),
        history = %humantime::format_duration(set.needs.longest),
        "alert rules loaded; each selected series keeps at most samples_per_series samples of 16 bytes"
    );
    *metrics.alerts.lock().unwrap_or_else(|p| p.into_inner()) = engine.counts();
    tokio::spawn(async move {
        let mut last_taken = None;
        let mut logged_memory = false;
        // The last failure per rule, so that a failing rule logs once per new reason.
        let mut failing: HashMap<String, String> = HashMap::new();
        loop {
            tokio::select! {
                changed = published.changed() => if changed.is_err() { break },
                _ = stop.changed() => break,
            }
            let p = published.borrow_and_update().clone();
            if last_taken == Some(p.snapshot.taken_at) {
                continue;
            }
            last_taken = Some(p.snapshot.taken_at);
            // Evaluating takes a millisecond or more on a big node: on a blocking
            // thread, so that the HTTP workers never wait for it.
            let (e, step, us) = match tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                let step = engine.step(&p.page, p.snapshot.taken_at);
                let us = started.elapsed().as_micros() as u64;
                (engine, step, us)
            })
            .await
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "rule evaluation panicked; rules stopped");
                    break;
                }
            };
            engine = e;
            tracing::debug!(us, changed = step.changed.len(), "rules evaluated");
            if !logged_memory && engine.history().series_count() > 0 {
                logged_memory = true;
                let h = engine.history();
                tracing::info!(
                    series = h.series_count(),
                    bytes = h.sample_bytes(),
                    "rules history allocated (grows only with new series)"
                );
            }
            failing = report(step, &engine, &metrics, failing, &remediation);
        }
    });
}

/// Publishes one step's outcome: the alert counts and failures as series, each new failure
/// reason and each state change logged once, and the alerts that changed handed to the
/// remediation routes. Returns the failing rules, by reason, for the next step.
fn report(
    step: Step,
    engine: &Engine,
    metrics: &RuleMetrics,
    failing: HashMap<String, String>,
    remediation: &Handle,
) -> HashMap<String, String> {
    *metrics.alerts.lock().unwrap_or_else(|p| p.into_inner()) = engine.counts();
    metrics
        .evaluation_failures
        .fetch_add(step.failures.len() as u64, Ordering::Relaxed);
    let mut now_failing = HashMap::new();
    for (rule, reason) in step.failures {
        if failing.get(&rule) != Some(&reason) {
            tracing::warn!(rule = %rule, reason = %reason, "rule evaluation failed");
        }
        now_failing.insert(rule, reason);
    }
    for a in &step.changed {
        tracing::info!(
            alertname = a.name(),
            status = a.status.as_str(),
            gpu = a.gpu().unwrap_or(""),
            fingerprint = %a.fingerprint,
            "alert {}", a.status.as_str()
        );
    }
    if !step.changed.is_empty() {
        if let Err(e) = remediation.submit(step.changed, Source::Rules) {
            tracing::error!(error = %e, "alerts dropped");
        }
    }
    now_failing
}
