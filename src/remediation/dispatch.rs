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

use tokio::sync::{mpsc, watch};

use crate::audit::event::{
    AlertStatus, Decision as RecordedDecision, GpuRef, HookEnd, HookStep, Remediation, StepDetails,
};
use crate::changes::{Acting, Done, Owner};
use crate::exec::{self, CommandSpec};
use crate::publication::Published;

use super::alert::{Alert, Status};
use super::metrics::HookMetrics;
use super::rails::{gpu_key, Decision, Handled, Rails};
use crate::config::remediation::{Action, ActionKind, RemediationConfig, Route};

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
            // The same word as `trigger`: one name for one way in.
            Source::Alertmanager => "webhook",
        }
    }

    /// The audit records' `trigger`, in the vocabulary every component uses.
    fn trigger(self) -> &'static str {
        match self {
            Source::Rules => "rules",
            Source::Alertmanager => "webhook",
        }
    }
}

#[derive(Debug)]
pub struct Notice {
    pub alert: Alert,
    pub source: Source,
}

/// Alerts waiting for a decision. A batch that does not fit whole is refused whole: 503 from
/// the webhook while the queue is busy (Alertmanager retries), 413 when it is bigger than the
/// queue itself (it never could fit, and Alertmanager does not retry a 4xx).
pub const QUEUE: usize = 1024;

/// Why a batch was not queued; none of its alerts were.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "a batch of {alerts} alerts is more than the remediation queue holds ({limit}); \
         none were accepted: lower max_alerts in Alertmanager's webhook_config"
    )]
    TooLarge { alerts: usize, limit: usize },
    #[error(
        "remediation queue full: none of the {alerts} alerts were accepted ({free} of {limit} \
         places free); retry later"
    )]
    Full {
        alerts: usize,
        free: usize,
        limit: usize,
    },
    /// The batch's receipt could not be written to the audit log (a full disk, a read-only
    /// file system): nothing it asks for could be recorded, so none of it is taken.
    #[error(
        "the audit log cannot be written ({reason}): none of the {alerts} alerts were \
         accepted; retry when it can"
    )]
    Unrecorded { alerts: usize, reason: String },
}

/// The way in: cheap to clone, shared by the rules task and the HTTP handler.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Notice>,
    pub metrics: Arc<HookMetrics>,
    /// Who records a webhook batch's receipt before it is queued (the owner of changes;
    /// `None` while no route is configured: nothing would be decided).
    recorder: Option<Arc<Owner>>,
}

impl Handle {
    /// Queues all of `alerts`, or none of them: a retried batch is then never decided twice,
    /// nor its tail left behind. An empty batch is accepted.
    pub fn submit(&self, alerts: Vec<Alert>, source: Source) -> Result<(), Refused> {
        let n = alerts.len();
        if n == 0 {
            return Ok(());
        }
        if n > QUEUE {
            return Err(Refused::TooLarge {
                alerts: n,
                limit: QUEUE,
            });
        }
        let permits = self.tx.try_reserve_many(n).map_err(|_| Refused::Full {
            alerts: n,
            free: self.tx.capacity(),
            limit: QUEUE,
        })?;
        // A batch from Alertmanager is recorded before it is taken: when the audit log cannot
        // be written (its decisions could not be either), the sender hears it now, with a 503
        // it retries, instead of a 202 for alerts that would then all be refused unrecorded.
        // Blocks for one fsync: called off the async workers.
        if let (Source::Alertmanager, Some(owner)) = (source, &self.recorder) {
            let firing = alerts
                .iter()
                .filter(|a| a.status == super::alert::Status::Firing)
                .count();
            let receipt = Remediation::WebhookReceived {
                alerts: n,
                firing,
                resolved: n - firing,
                source: source.as_str().into(),
                trigger: source.trigger().into(),
            };
            if let Err(e) = owner.record(receipt) {
                return Err(Refused::Unrecorded {
                    alerts: n,
                    reason: e.to_string(),
                });
            }
        }
        for (permit, alert) in permits.zip(alerts) {
            permit.send(Notice { alert, source });
        }
        Ok(())
    }
}

/// What built-in actions read: the newest snapshot and where procfs is (they write to GPUs
/// through the owner of changes' NVML session).
pub struct Node {
    pub published: watch::Receiver<Arc<Published>>,
    pub procfs: std::path::PathBuf,
}

/// Starts the dispatcher; it stops when `stop` turns true.
pub fn spawn(
    config: RemediationConfig,
    owner: Arc<Owner>,
    node: Option<Node>,
    mut stop: watch::Receiver<bool>,
) -> Handle {
    let (tx, mut rx) = mpsc::channel(QUEUE);
    let metrics = Arc::new(HookMetrics::default());
    for name in config
        .hooks
        .iter()
        .map(|h| &h.name)
        .chain(config.actions.iter().map(|a| &a.name))
    {
        metrics.declare(name);
    }
    // No route, no decision: nothing to record (and a webhook is taken without a receipt).
    let recording = !config.routes.is_empty();
    let handle = Handle {
        tx,
        metrics: metrics.clone(),
        recorder: recording.then(|| owner.clone()),
    };
    let runner = Arc::new(Runner {
        config,
        owner,
        node,
        metrics,
        gpu_locks: Mutex::new(HashMap::new()),
    });
    let replay_from = recording.then(|| runner.owner.setup().audit_file);
    let dry_run = runner.config.dry_run;
    let routes = runner.config.routes.clone();
    tokio::spawn(async move {
        // What was decided before this start (a restart, a crash loop) still holds. Read off
        // the runtime's threads and before the first decision: alerts wait in the queue
        // meanwhile, and the start is not held up (a week of decisions can take seconds).
        let mut rails = match replay_from {
            None => Rails::default(),
            Some(path) => tokio::task::spawn_blocking(move || {
                super::replay::rails(&path, &routes, dry_run, SystemTime::now())
            })
            .await
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "rebuilding the remediation rails failed: they start empty");
                Rails::default()
            }),
        };
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

/// One step of a route: a hook or a built-in action.
#[derive(Clone)]
enum Step {
    Hook(CommandSpec),
    Action(Action),
}

impl Step {
    fn name(&self) -> &str {
        match self {
            Step::Hook(h) => &h.name,
            Step::Action(a) => &a.name,
        }
    }

    /// The step's record (`hook.start`, `hook.dry_run`) about `alert`.
    fn describe(&self, route: usize, alert: &Alert, trigger: &str) -> HookStep {
        let mut r = HookStep {
            action: None,
            alertname: alert.name().into(),
            argv: None,
            fingerprint: alert.fingerprint.clone(),
            gpu: alert.gpu().map(str::to_string),
            hook: self.name().into(),
            route: route as u64,
            signal: None,
            status: recorded_status(alert.status),
            trigger: trigger.into(),
            watts: None,
        };
        match self {
            Step::Hook(h) => r.argv = Some(h.argv.clone()),
            // The action as the config names it, not the Rust enum (`SignalProcesses(SIGTERM)`).
            Step::Action(a) => match a.kind {
                ActionKind::SignalProcesses(sig) => {
                    r.action = Some("signal_processes".into());
                    r.signal = Some(sig.as_str().into());
                }
                ActionKind::PowerLimit(watts) => {
                    r.action = Some("power_limit".into());
                    r.watts = Some(watts);
                }
                ActionKind::Fence => r.action = Some("fence".into()),
            },
        }
        r
    }
}

struct Runner {
    config: RemediationConfig,
    /// The owner of changes: records every decision, and carries out every step.
    owner: Arc<Owner>,
    node: Option<Node>,
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
        let base = RecordedDecision {
            alertname: a.name().into(),
            decision: "no_route".into(),
            fingerprint: a.fingerprint.clone(),
            gpu: a.gpu().map(str::to_string),
            gpu_key: Some(gpu_key(a)),
            gpu_uuid: a.gpu_uuid().map(str::to_string),
            hooks: None,
            labels: a.labels.clone(),
            reason: None,
            route: None,
            route_id: None,
            source: n.source.as_str().into(),
            starts_at: a.starts_at.clone(),
            status: recorded_status(a.status),
            trigger: n.source.trigger().into(),
        };
        if matched.is_empty() {
            if !self.config.routes.is_empty() {
                self.audit(Remediation::Decision(base));
            }
            return;
        }
        for (index, route) in matched {
            let decision = rails.decide(
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
            let recorded = self.audit(Remediation::Decision(RecordedDecision {
                decision: word.into(),
                hooks: Some(route.hooks.clone()),
                reason: Some(reason.map(|r| r.as_str().to_string())),
                route: Some(index as u64),
                route_id: Some(route.id.clone()),
                ..base.clone()
            }));
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
                // Not remembered either: when the alert comes again it is decided afresh.
                tracing::error!(
                    alertname = a.name(),
                    fingerprint = %a.fingerprint,
                    "not running hooks: the decision could not be written to the audit log"
                );
                for hook in &route.hooks {
                    self.metrics.observe(hook, crate::audit::AUDIT_FAILED, None);
                }
                continue;
            }
            rails.remember(Handled::of(route, a, now), now);
            let hooks: Vec<Step> = route
                .hooks
                .iter()
                .filter_map(|h| {
                    let hook = self.config.hooks.iter().find(|s| &s.name == h);
                    let action = self.config.actions.iter().find(|a| &a.name == h);
                    hook.cloned()
                        .map(Step::Hook)
                        .or_else(|| action.cloned().map(Step::Action))
                })
                .collect();
            let runner = self.clone();
            let alert = a.clone();
            let dry = decision == Decision::DryRun;
            let trigger = n.source.trigger();
            tokio::spawn(async move { runner.run_hooks(index, hooks, alert, dry, trigger).await });
        }
    }

    /// Writes an audit record; false when it could not be written (hooks then do not run).
    fn audit(&self, event: Remediation) -> bool {
        // Counted, and logged once per run of failures, by the audit log.
        self.owner.record(event).is_ok()
    }

    /// Waits for the GPU's turn, then runs the steps on a blocking thread. The whole run, its
    /// audit records included, lives on that thread: at shutdown a started hook finishes (up
    /// to its timeout) and its outcome is still recorded.
    async fn run_hooks(
        self: Arc<Self>,
        route: usize,
        steps: Vec<Step>,
        alert: Alert,
        dry: bool,
        trigger: &'static str,
    ) {
        let lock = self
            .gpu_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(gpu_key(&alert))
            .or_default()
            .clone();
        let turn = lock.lock_owned().await;
        let runner = self.clone();
        let ran = tokio::task::spawn_blocking(move || {
            let _one_at_a_time = turn;
            runner.run_steps(route, steps, &alert, dry, trigger);
        })
        .await;
        if let Err(e) = ran {
            tracing::error!(error = %e, "remediation run failed");
        }
    }

    fn run_steps(
        &self,
        route: usize,
        steps: Vec<Step>,
        alert: &Alert,
        dry: bool,
        trigger: &'static str,
    ) {
        for step in steps {
            let name = step.name().to_string();
            if dry {
                self.metrics.observe(&name, "dry_run", None);
                self.audit(Remediation::HookDryRun(
                    step.describe(route, alert, trigger),
                ));
                tracing::info!(hook = %name, alertname = alert.name(), "dry run: not run");
                continue;
            }
            let start = Remediation::HookStart(step.describe(route, alert, trigger));
            let Ok(begun) = self.owner.begin(start) else {
                // Not run, nor the steps after it: a route is a sequence.
                self.metrics
                    .observe(&name, crate::audit::AUDIT_FAILED, None);
                tracing::error!(hook = %name, alertname = alert.name(), "not running the hook: its start could not be written to the audit log");
                break;
            };
            begun.act(|node: &Acting<'_>| {
                let (result, duration, details, acted_on) = match &step {
                    Step::Hook(spec) => {
                        let (r, d, details) = self.run_hook(spec, alert);
                        (r, d, details, None)
                    }
                    Step::Action(action) => self.run_action(action, alert, node),
                };
                self.metrics.observe(&name, result, duration);
                let end = HookEnd {
                    alertname: alert.name().into(),
                    compute_mode: None,
                    duration_ms: duration.map(|d| d.as_millis() as u64),
                    error: None,
                    fingerprint: alert.fingerprint.clone(),
                    gpu: match acted_on {
                        Some(i) => Some(GpuRef::Index(i)),
                        None => alert.gpu().map(|g| GpuRef::Label(g.to_string())),
                    },
                    hook: name.clone(),
                    outcome: None,
                    power_limit_watts: None,
                    processes: None,
                    requested_watts: None,
                    result: result.into(),
                    route: route as u64,
                    signal: None,
                    skipped: None,
                    status: recorded_status(alert.status),
                    stderr: None,
                    stdout: None,
                    trigger: trigger.into(),
                    uuid: None,
                }
                .with(details);
                Done {
                    value: (),
                    after: Some(Remediation::HookEnd(end).into()),
                    // A hook may change anything; an action touches a GPU or its processes.
                    touched: result != "error",
                }
            });
        }
    }

    fn run_hook(
        &self,
        spec: &CommandSpec,
        alert: &Alert,
    ) -> (&'static str, Option<std::time::Duration>, StepDetails) {
        let stdin = serde_json::to_vec(alert).unwrap_or_default();
        let out = exec::run(spec, &stdin, &hook_env(alert));
        if out.outcome.success() {
            tracing::info!(hook = %spec.name, alertname = alert.name(), duration_ms = out.duration.as_millis() as u64, stdout = %out.stdout, stderr = %out.stderr, "hook succeeded");
        } else {
            tracing::warn!(hook = %spec.name, alertname = alert.name(), outcome = %out.outcome, stdout = %out.stdout, stderr = %out.stderr, "hook failed");
        }
        (
            out.outcome.result_label(),
            Some(out.duration),
            StepDetails {
                outcome: Some(out.outcome.to_string()),
                stderr: Some(out.stderr),
                stdout: Some(out.stdout),
                ..StepDetails::default()
            },
        )
    }

    fn run_action(
        &self,
        action: &Action,
        alert: &Alert,
        acting: &Acting<'_>,
    ) -> (
        &'static str,
        Option<std::time::Duration>,
        StepDetails,
        Option<u32>,
    ) {
        let Some(node) = &self.node else {
            let details = StepDetails {
                error: Some("no node state to act on".into()),
                ..StepDetails::default()
            };
            return ("error", None, details, None);
        };
        let snapshot = node.published.borrow().snapshot.clone();
        let out = super::actions::run(action.kind, alert, &snapshot, &node.procfs, acting);
        tracing::info!(action = %action.name, alertname = alert.name(), result = out.result, details = ?out.details, "built-in action done");
        (out.result, Some(out.duration), out.details, out.gpu)
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

/// The alert's status as the ledger spells it.
fn recorded_status(s: Status) -> AlertStatus {
    match s {
        Status::Firing => AlertStatus::Firing,
        Status::Resolved => AlertStatus::Resolved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remediation::alert::Status;

    fn alerts(n: usize) -> Vec<Alert> {
        (0..n)
            .map(|i| Alert {
                status: Status::Firing,
                labels: Default::default(),
                annotations: Default::default(),
                starts_at: String::new(),
                ends_at: String::new(),
                generator_url: String::new(),
                fingerprint: format!("f{i}"),
            })
            .collect()
    }

    #[test]
    fn a_batch_is_queued_whole_or_not_at_all() {
        let (tx, mut rx) = mpsc::channel(QUEUE);
        let h = Handle {
            tx,
            metrics: Arc::default(),
            recorder: None,
        };
        assert_eq!(
            h.submit(alerts(QUEUE + 1), Source::Alertmanager),
            Err(Refused::TooLarge {
                alerts: QUEUE + 1,
                limit: QUEUE
            })
        );
        h.submit(alerts(1000), Source::Alertmanager).expect("fits");
        let e = h
            .submit(alerts(100), Source::Alertmanager)
            .expect_err("does not fit");
        assert!(e.to_string().contains("none of the 100"), "{e}");
        let mut queued = 0;
        while rx.try_recv().is_ok() {
            queued += 1;
        }
        assert_eq!(queued, 1000, "a refused batch left part of itself behind");
        h.submit(alerts(QUEUE), Source::Alertmanager)
            .expect("a batch as big as the queue fits an empty queue");
    }
}
