//! The dispatcher: one task that takes alerts (from the local rules and from Alertmanager's
//! webhook), matches them to routes, asks the rails, audits every decision, and starts the
//! route's hooks, one action at a time per GPU.
//!
//! Decisions are taken in arrival order on this one task, so two copies of an alert arriving
//! together cannot both pass the idempotence check; hooks run on blocking threads so that a slow
//! hook holds only its GPU, never the dispatcher.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::json;
use tokio::sync::{mpsc, watch};

use crate::audit::AuditLog;
use crate::exec::{self, CommandSpec};

use super::alert::Alert;
use super::config::{RemediationConfig, Route};
use super::metrics::HookMetrics;
use super::rails::{gpu_key, Decision, Rails};

/// Where an alert came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The agent's own rules.
    Rules,
    /// `POST /api/v1/alertmanager`.
    Alertmanager,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Rules => "rules",
            Source::Alertmanager => "alertmanager",
        }
    }
}

#[derive(Debug)]
pub struct Notice {
    pub alert: Alert,
    pub source: Source,
}

/// Alerts waiting for a decision; beyond this the webhook answers 503 (Alertmanager retries).
const QUEUE: usize = 1024;

/// The way in: cheap to clone, shared by the rules task and the HTTP handler.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Notice>,
    pub metrics: Arc<HookMetrics>,
}

impl Handle {
    /// Queues `alerts`; `Err` with how many did not fit.
    pub fn submit(&self, alerts: Vec<Alert>, source: Source) -> Result<(), usize> {
        let total = alerts.len();
        for (i, alert) in alerts.into_iter().enumerate() {
            if self.tx.try_send(Notice { alert, source }).is_err() {
                return Err(total - i);
            }
        }
        Ok(())
    }
}

/// Starts the dispatcher; it stops when `stop` turns true.
pub fn spawn(
    config: RemediationConfig,
    audit: Option<AuditLog>,
    mut stop: watch::Receiver<bool>,
) -> Handle {
    let (tx, mut rx) = mpsc::channel(QUEUE);
    let metrics = Arc::new(HookMetrics::default());
    for h in &config.hooks {
        metrics.declare(&h.name);
    }
    let handle = Handle {
        tx,
        metrics: metrics.clone(),
    };
    let runner = Arc::new(Runner {
        config,
        audit,
        metrics,
        gpu_locks: Mutex::new(HashMap::new()),
    });
    tokio::spawn(async move {
        let mut rails = Rails::default();
        loop {
            tokio::select! {
                n = rx.recv() => match n {
                    Some(n) => runner.clone().dispatch(&mut rails, n),
                    None => break,
                },
                _ = stop.changed() => break,
            }
        }
    });
    handle
}

struct Runner {
    config: RemediationConfig,
    audit: Option<AuditLog>,
    metrics: Arc<HookMetrics>,
    /// One lock per GPU key: actions on a GPU run one at a time, in decision order.
    gpu_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Runner {
    fn dispatch(self: Arc<Self>, rails: &mut Rails, n: Notice) {
        let a = &n.alert;
        let now = SystemTime::now();
        let matched: Vec<(usize, &Route)> = self
            .config
            .routes
            .iter()
            .enumerate()
            .filter(|(_, r)| r.matchers.iter().all(|m| m.matches(&a.labels)))
            .collect();
        let base = json!({
            "source": n.source.as_str(),
            "alertname": a.name(),
            "status": a.status.as_str(),
            "fingerprint": a.fingerprint,
            "gpu": a.gpu(),
            "gpu_uuid": a.gpu_uuid(),
            "labels": a.labels,
            "startsAt": a.starts_at,
        });
        if matched.is_empty() {
            if !self.config.routes.is_empty() {
                self.audit("decision", merge(&base, json!({"decision": "no_route"})));
            }
            return;
        }
        for (index, route) in matched {
            let decision = rails.decide(
                index,
                route,
                a,
                self.config.dry_run,
                self.config.max_actions_per_hour,
                now,
            );
            let (word, reason) = match decision {
                Decision::Run => ("run", None),
                Decision::DryRun => ("dry_run", None),
                Decision::Skip(r) => ("skip", Some(r)),
            };
            let recorded = self.audit(
                "decision",
                merge(
                    &base,
                    json!({
                        "route": index,
                        "hooks": route.hooks,
                        "decision": word,
                        "reason": reason.map(|r| r.as_str()),
                    }),
                ),
            );
            tracing::info!(
                alertname = a.name(),
                status = a.status.as_str(),
                gpu = a.gpu().unwrap_or(""),
                fingerprint = %a.fingerprint,
                route = index,
                decision = word,
                reason = reason.map_or("", |r| r.as_str()),
                "remediation decision"
            );
            if reason.is_some() {
                continue;
            }
            if !recorded {
                tracing::error!(
                    alertname = a.name(),
                    "not running hooks: the decision could not be written to the audit log"
                );
                continue;
            }
            let hooks: Vec<CommandSpec> = route
                .hooks
                .iter()
                .filter_map(|h| self.config.hooks.iter().find(|s| &s.name == h).cloned())
                .collect();
            let runner = self.clone();
            let alert = a.clone();
            let dry = decision == Decision::DryRun;
            tokio::spawn(async move { runner.run_hooks(index, hooks, alert, dry).await });
        }
    }

    /// Writes an audit record; false when it could not be written (hooks then do not run).
    fn audit(&self, event: &str, fields: serde_json::Value) -> bool {
        match &self.audit {
            None => true,
            Some(log) => match log.record("remediation", event, fields) {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(error = %e, file = %log.path().display(), "audit log write failed");
                    false
                }
            },
        }
    }

    async fn run_hooks(&self, route: usize, hooks: Vec<CommandSpec>, alert: Alert, dry: bool) {
        let key = gpu_key(&alert);
        let lock = self
            .gpu_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        let _one_at_a_time = lock.lock().await;
        let stdin = serde_json::to_vec(&alert).unwrap_or_default();
        let env = hook_env(&alert);
        let base = json!({
            "route": route,
            "alertname": alert.name(),
            "status": alert.status.as_str(),
            "fingerprint": alert.fingerprint,
            "gpu": alert.gpu(),
        });
        for spec in hooks {
            if dry {
                self.metrics.observe(&spec.name, "dry_run", None);
                self.audit(
                    "hook.dry_run",
                    merge(&base, json!({"hook": spec.name, "argv": spec.argv})),
                );
                tracing::info!(hook = %spec.name, alertname = alert.name(), "dry run: hook not run");
                continue;
            }
            if !self.audit(
                "hook.start",
                merge(&base, json!({"hook": spec.name, "argv": spec.argv})),
            ) {
                continue;
            }
            let (spec2, stdin2, env2) = (spec.clone(), stdin.clone(), env.clone());
            let out = match tokio::task::spawn_blocking(move || exec::run(&spec2, &stdin2, &env2))
                .await
            {
                Ok(out) => out,
                Err(e) => {
                    tracing::error!(hook = %spec.name, error = %e, "hook runner failed");
                    self.metrics.observe(&spec.name, "error", None);
                    continue;
                }
            };
            let result = out.outcome.result_label();
            self.metrics.observe(&spec.name, result, Some(out.duration));
            self.audit(
                "hook.end",
                merge(
                    &base,
                    json!({
                        "hook": spec.name,
                        "result": result,
                        "outcome": out.outcome.to_string(),
                        "duration_ms": out.duration.as_millis() as u64,
                        "stdout": out.stdout,
                        "stderr": out.stderr,
                    }),
                ),
            );
            if out.outcome.success() {
                tracing::info!(hook = %spec.name, alertname = alert.name(), duration_ms = out.duration.as_millis() as u64, stdout = %out.stdout, stderr = %out.stderr, "hook succeeded");
            } else {
                tracing::warn!(hook = %spec.name, alertname = alert.name(), outcome = %out.outcome, stdout = %out.stdout, stderr = %out.stderr, "hook failed");
            }
        }
    }
}

/// The hook's environment: what a script needs without parsing JSON. Values are data (no
/// shell reads them); a NUL, which no environment can hold, is dropped.
fn hook_env(a: &Alert) -> Vec<(String, String)> {
    let clean = |s: &str| s.replace('\0', "");
    vec![
        ("GPU_STEWARD_ALERT_NAME".into(), clean(a.name())),
        ("GPU_STEWARD_ALERT_STATUS".into(), a.status.as_str().into()),
        ("GPU_STEWARD_GPU".into(), clean(a.gpu().unwrap_or(""))),
        (
            "GPU_STEWARD_GPU_UUID".into(),
            clean(a.gpu_uuid().unwrap_or("")),
        ),
        (
            "GPU_STEWARD_ALERT_FINGERPRINT".into(),
            clean(&a.fingerprint),
        ),
    ]
}

fn merge(base: &serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    let mut out = base.clone();
    if let (Some(o), serde_json::Value::Object(e)) = (out.as_object_mut(), extra) {
        o.extend(e);
    }
    out
}
