//! The Slurm actor: reads each publication, decides whether the node should be drained (a GPU
//! fails) or resumed (none fails), and hands that to [`super::drain::Drainer`] on a blocking
//! thread. A failed call is retried with backoff (1 s doubling to 30 s) until it works or the
//! decision changes; each failure is logged, counted and shown as a `/health` agent warning.
//!
//! Must not: run on the poller's thread or hold a publication while `scontrol` runs, or act on
//! a publication without GPU verdicts (the start, NVML down): no decision is taken then, so a
//! drain made before a restart is kept until the GPUs are judged again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::drain::{Done, Drainer, Request};
use super::scontrol::Scontrol;
use super::{failing_reason, SlurmConfig, CALL_TIMEOUT};
use crate::changes::Owner;
use crate::publication::Published;
use crate::slurm::change::SlurmChange;
use crate::snapshot::NvmlStatus;

/// The `/health` agent warning's component.
const COMPONENT: &str = "slurm";

/// The series of the Slurm actor, rendered into the page while `[slurm] drain` is on.
#[derive(Debug, Default)]
pub struct SlurmMetrics {
    inner: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    /// Handled requests by (request, result).
    requests: BTreeMap<(&'static str, &'static str), u64>,
    /// 1 while the node is drained by the agent (as last seen).
    holding: bool,
    /// Whether the last call worked.
    up: bool,
}

impl SlurmMetrics {
    fn count(&self, request: &'static str, result: &'static str) {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        *m.requests.entry((request, result)).or_default() += 1;
        m.up = !matches!(result, "failure" | "timeout" | "error");
    }

    fn hold(&self, holding: bool) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).holding = holding;
    }
}

impl crate::metrics::Collector for SlurmMetrics {
    fn collect(&self, out: &mut crate::metrics::Families) {
        use crate::metrics::{flag, Family};
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut requests = Family::counter(
            "gpu_steward_slurm_requests_total",
            "Slurm drain and resume requests handled, by result (changed, unchanged, not_ours: an admin's drain kept, failure, timeout, error: scontrol could not be started, audit_failed).",
        );
        for request in ["drain", "resume"] {
            for result in RESULTS {
                let n = m.requests.get(&(request, result)).copied().unwrap_or(0);
                requests.add(&[("request", request), ("result", result)], n as f64);
            }
        }
        out.push(requests);
        let mut held = Family::gauge(
            "gpu_steward_slurm_drain_held",
            "1 while this node is drained by gpu-steward in Slurm.",
        );
        held.add::<&str>(&[], flag(m.holding));
        out.push(held);
        let mut up = Family::gauge(
            "gpu_steward_slurm_up",
            "1 when the last scontrol call worked.",
        );
        up.add::<&str>(&[], flag(m.up));
        out.push(up);
    }
}

const RESULTS: [&str; 7] = [
    "changed",
    "unchanged",
    "not_ours",
    "failure",
    "timeout",
    "error",
    crate::audit::AUDIT_FAILED,
];

/// Starts the actor; its series are returned for the page.
pub fn spawn(
    config: &SlurmConfig,
    owner: Arc<Owner>,
    published: watch::Receiver<Arc<Published>>,
    stop: watch::Receiver<bool>,
) -> Arc<SlurmMetrics> {
    if let Err(e) = owner.audit_ready() {
        let text = format!("{e}: Slurm drains and resumes are refused; fix [audit] file");
        tracing::error!("{text}");
        crate::warnings::set(COMPONENT, Some(text));
    }
    let node = match config.node() {
        Ok(n) => n,
        Err(e) => {
            // Never a hostlist: a drain would reach every node it names.
            let text = format!("{e}: Slurm drains and resumes are off");
            tracing::error!("slurm: {text}");
            crate::warnings::set(COMPONENT, Some(text));
            return Arc::new(SlurmMetrics {
                inner: Mutex::new(Counts::default()),
            });
        }
    };
    let drainer = Drainer {
        scontrol: Scontrol {
            program: config.scontrol.clone(),
            timeout: CALL_TIMEOUT,
        },
        node,
    };
    tracing::info!(node = %drainer.node, scontrol = %drainer.scontrol.program, "slurm: draining this node when a GPU fails");
    let metrics = Arc::new(SlurmMetrics {
        inner: Mutex::new(Counts {
            up: true,
            ..Counts::default()
        }),
    });
    tokio::spawn(run(owner, drainer, published, stop, metrics.clone()));
    metrics
}

/// 1 s doubling to 30 s.
fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.saturating_sub(1).min(5)).min(Duration::from_secs(30))
}

fn name(r: &Request) -> &'static str {
    match r {
        Request::Drain { .. } => "drain",
        Request::Resume => "resume",
    }
}

async fn run(
    owner: Arc<Owner>,
    drainer: Drainer,
    mut published: watch::Receiver<Arc<Published>>,
    mut stop: watch::Receiver<bool>,
    metrics: Arc<SlurmMetrics>,
) {
    // The last request carried out (its kind decides: a second failing GPU does not re-drain).
    let mut applied: Option<&'static str> = None;
    let mut want: Option<Request> = None;
    let mut attempt = 0u32;
    let mut retry_at: Option<Instant> = None;
    // The kind of the request that failed last: the backoff holds back only its retries, a
    // new decision (the GPU recovered meanwhile) is tried at once.
    let mut failed: Option<&'static str> = None;
    loop {
        {
            let p = published.borrow_and_update();
            if p.snapshot.nvml == NvmlStatus::Up && !p.snapshot.gpus.is_empty() {
                want = Some(match failing_reason(&p.health) {
                    Some(reason) => Request::Drain { reason },
                    None => Request::Resume,
                });
            }
        }
        if let Some(request) = want.clone().filter(|w| Some(name(w)) != applied) {
            if failed != Some(name(&request)) || retry_at.is_none_or(|t| Instant::now() >= t) {
                let change = SlurmChange {
                    drainer: drainer.clone(),
                    request: request.clone(),
                    trigger: "gpu verdict",
                };
                match owner.call(change).await {
                    Some(Ok(done)) => {
                        report_done(&drainer.node, &request, &done, &metrics);
                        applied = Some(name(&request));
                        attempt = 0;
                        retry_at = None;
                        failed = None;
                        crate::warnings::set(COMPONENT, None);
                    }
                    Some(Err(e)) => {
                        attempt += 1;
                        let wait = backoff(attempt);
                        retry_at = Some(Instant::now() + wait);
                        failed = Some(name(&request));
                        metrics.count(name(&request), e.result());
                        tracing::warn!(node = %drainer.node, request = name(&request), attempt, retry_in = ?wait, "slurm: {e}");
                        crate::warnings::set(
                            COMPONENT,
                            Some(format!(
                                "slurm {} of node '{}' failed: {e}",
                                name(&request),
                                drainer.node
                            )),
                        );
                    }
                    None => tracing::error!("slurm: the scontrol task failed"),
                }
            }
        }
        let retry = async {
            match retry_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = published.changed() => if changed.is_err() { return },
            _ = retry => {}
            _ = stop.changed() => return,
        }
    }
}

fn report_done(node: &str, request: &Request, done: &Done, metrics: &SlurmMetrics) {
    let what = name(request);
    match (done, request) {
        (Done::Changed, Request::Drain { reason }) => {
            tracing::warn!(node, reason = %reason, "slurm: node drained");
            metrics.count(what, "changed");
            metrics.hold(true);
        }
        (Done::Changed, Request::Resume) => {
            tracing::info!(
                node,
                "slurm: node resumed (every GPU passes or warns again)"
            );
            metrics.count(what, "changed");
            metrics.hold(false);
        }
        (Done::AlreadyThere, _) => {
            metrics.count(what, "unchanged");
            metrics.hold(matches!(request, Request::Drain { .. }));
        }
        (Done::NotOurs { reason }, _) => {
            tracing::info!(node, reason = %reason, request = what, "slurm: the node is drained by someone else; their state and reason are kept");
            metrics.count(what, "not_ours");
            metrics.hold(false);
        }
    }
}
