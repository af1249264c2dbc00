//! The OTLP actor: every `[otlp] interval` it maps the latest publication (the one `/metrics`
//! serves) to a request and queues it (at most [`QUEUE_CAPACITY`] exports; the oldest go
//! first, their points counted); the queue is sent in order, one export at a time, each in a
//! task of its own within `[otlp] timeout`. A retryable failure keeps the export and waits
//! (exponential backoff from 1 s to 60 s with jitter, or the collector's `Retry-After`); a final one
//! drops it (counted). After [`WARN_AFTER_FAILURES`] intervals that end with the collector
//! failing, `/health` carries an agent warning until an export works again. At the stop, the
//! newest publication not yet taken is queued and the queue sent in order once more, each
//! export tried once, all within [`FLUSH_BUDGET`] (the OpenTelemetry SDKs' shutdown flush): the
//! last interval is not lost with the agent.
//!
//! Must not: hold a publication across an await, or make the poller wait: the poller only
//! publishes into a `watch` channel, which this task reads when it wants.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::send::{self, Accepted, Failure, Target};
use super::{points, request, Origin};
use crate::config::otlp::{QUEUE_CAPACITY, WARN_AFTER_FAILURES};
use crate::publication::Published;

const COMPONENT: &str = "otlp";
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How long the flush at the stop may take, from the stop (at most `[otlp] timeout` per
/// export): inside the agent's stop budget, beside the MIG change budget.
pub const FLUSH_BUDGET: Duration = Duration::from_secs(3);

/// The actor's series, on the page while the exporter is on.
#[derive(Debug, Default)]
pub struct OtlpMetrics {
    inner: Mutex<Counts>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    exports: u64,
    failures: u64,
    dropped: u64,
    last_success: f64,
    queued: usize,
}

impl crate::metrics::Collector for OtlpMetrics {
    fn collect(&self, out: &mut crate::metrics::Families) {
        use crate::metrics::Family;
        let m = *self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for (name, help, counter, value) in [
            (
                "gpu_steward_otlp_exports_total",
                "OTLP exports the collector accepted.",
                true,
                m.exports as f64,
            ),
            (
                "gpu_steward_otlp_failures_total",
                "OTLP exports that failed (retryable ones are retried).",
                true,
                m.failures as f64,
            ),
            (
                "gpu_steward_otlp_points_dropped_total",
                "Data points never delivered: dropped from the full queue (oldest first) or refused for good by the collector.",
                true,
                m.dropped as f64,
            ),
            (
                "gpu_steward_otlp_last_success_timestamp_seconds",
                "When the collector last accepted an export (0: never).",
                false,
                m.last_success,
            ),
            (
                "gpu_steward_otlp_queued_exports",
                "OTLP exports waiting to be sent.",
                false,
                m.queued as f64,
            ),
        ] {
            let mut f = Family::new(name, help, counter);
            f.add::<&str>(&[], value);
            out.push(f);
        }
    }
}

impl OtlpMetrics {
    fn update(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// Starts the exporter; an unusable TLS setting is reported and nothing is started. The task
/// ends after its flush at the stop: the stop waits for it (at most [`FLUSH_BUDGET`]).
pub fn spawn(
    config: &super::OtlpConfig,
    origin: Origin,
    published: watch::Receiver<Arc<Published>>,
    stop: watch::Receiver<bool>,
) -> Result<(Arc<OtlpMetrics>, tokio::task::JoinHandle<()>), String> {
    let target = Target::new(config)?;
    tracing::info!(
        endpoint = %config.endpoint,
        protocol = config.protocol.as_str(),
        interval = %humantime::format_duration(config.interval),
        "otlp: metrics to the collector"
    );
    let metrics = Arc::new(OtlpMetrics::default());
    let task = tokio::spawn(run(
        target,
        origin,
        config.interval,
        published,
        stop,
        metrics.clone(),
    ));
    Ok((metrics, task))
}

struct Queued {
    request: Arc<ExportMetricsServiceRequest>,
    points: u64,
}

/// Adds an export, dropping the oldest when full; returns the points dropped.
fn push(queue: &mut VecDeque<Queued>, q: Queued) -> u64 {
    let mut dropped = 0;
    while queue.len() >= QUEUE_CAPACITY {
        if let Some(old) = queue.pop_front() {
            dropped += old.points;
        }
    }
    queue.push_back(q);
    dropped
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.saturating_sub(1).min(6)).min(MAX_BACKOFF)
}

/// The backoff with jitter, as the specification asks (protocol/exporter.md, "Retry"): a wait
/// drawn between half and all of [`backoff`], so that agents that lost the same collector do
/// not come back in step.
fn jittered(attempt: u32) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // A per-call random key (std's hasher seeds): no generator crate for one number.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let fraction = 0.5 + (r % 1000) as f64 / 2000.0;
    backoff(attempt).mul_f64(fraction)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

async fn run(
    target: Target,
    origin: Origin,
    interval: Duration,
    mut published: watch::Receiver<Arc<Published>>,
    mut stop: watch::Receiver<bool>,
    metrics: Arc<OtlpMetrics>,
) {
    let mut queue: VecDeque<Queued> = VecDeque::new();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let (done_tx, mut done) = mpsc::channel::<Result<Accepted, Failure>>(1);
    let mut inflight: Option<tokio::task::JoinHandle<()>> = None;
    let mut retry_at: Option<Instant> = None;
    let mut attempt = 0u32;
    let mut failing = false;
    let mut failed_intervals = 0u32;
    let mut last_taken: Option<SystemTime> = None;
    loop {
        if inflight.is_none() && retry_at.is_none_or(|t| Instant::now() >= t) {
            if let Some(front) = queue.front() {
                let (t, r, tx) = (target.clone(), front.request.clone(), done_tx.clone());
                retry_at = None;
                inflight = Some(tokio::spawn(async move {
                    let _ = tx.send(send::export(&t, &r).await).await;
                }));
            }
        }
        metrics.update(|m| m.queued = queue.len());
        let retry = async {
            match retry_at {
                Some(t) if inflight.is_none() => tokio::time::sleep_until(t).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tick.tick() => {
                if failing {
                    failed_intervals += 1;
                    if failed_intervals == WARN_AFTER_FAILURES {
                        crate::warnings::set(COMPONENT, Some(format!(
                            "otlp: {failed_intervals} export intervals failed in a row; \
                             {} exports queued for {}", queue.len(), target.uri
                        )));
                    }
                }
                let dropped = enqueue(&published, &origin, &mut queue, &mut last_taken);
                metrics.update(|m| m.dropped += dropped);
            }
            changed = published.changed() => {
                if changed.is_err() {
                    return;
                }
                // The first export goes as soon as NVML has answered, not an interval later.
                if last_taken.is_none() {
                    let dropped = enqueue(&published, &origin, &mut queue, &mut last_taken);
                    metrics.update(|m| m.dropped += dropped);
                }
            }
            Some(result) = done.recv() => {
                inflight = None;
                match result {
                    Ok(accepted) => {
                        queue.pop_front();
                        attempt = 0;
                        failing = false;
                        failed_intervals = 0;
                        metrics.update(|m| {
                            m.exports += 1;
                            m.last_success = unix_now();
                        });
                        if accepted.rejected != 0 || !accepted.message.is_empty() {
                            tracing::warn!(
                                rejected_points = accepted.rejected,
                                "otlp: the collector accepted the export in part: {}",
                                accepted.message
                            );
                        }
                        crate::warnings::set(COMPONENT, None);
                    }
                    Err(Failure::Final(reason)) => {
                        let lost = queue.pop_front().map_or(0, |q| q.points);
                        failing = true;
                        metrics.update(|m| {
                            m.failures += 1;
                            m.dropped += lost;
                        });
                        tracing::warn!(endpoint = %target.uri, points = lost, "otlp: export dropped: {reason}");
                    }
                    Err(Failure::Retryable { reason, retry_after }) => {
                        attempt += 1;
                        failing = true;
                        let wait = retry_after.unwrap_or_else(|| jittered(attempt));
                        retry_at = Some(Instant::now() + wait);
                        metrics.update(|m| m.failures += 1);
                        tracing::warn!(
                            endpoint = %target.uri, queued = queue.len(), attempt,
                            retry_in = ?wait, "otlp: export failed: {reason}"
                        );
                    }
                }
            }
            _ = retry => {}
            _ = stop.changed() => {
                let deadline = Instant::now() + FLUSH_BUDGET;
                let dropped = enqueue(&published, &origin, &mut queue, &mut last_taken);
                metrics.update(|m| m.dropped += dropped);
                let (sent, left) = flush(&target, &mut queue, inflight.take(), &mut done, deadline).await;
                metrics.update(|m| {
                    m.exports += sent;
                    m.dropped += left;
                });
                match left {
                    0 => tracing::info!(endpoint = %target.uri, exports = sent, "otlp: flushed at the stop"),
                    _ => tracing::warn!(endpoint = %target.uri, exports = sent, points_lost = left, "otlp: not everything was sent by the stop"),
                }
                return;
            }
        }
    }
}

/// At the stop: the export in flight finishes (or, failed, is tried once more), then the rest
/// of the queue in order, one try each, until `deadline`. The exports that went, and the
/// points of those that did not.
async fn flush(
    target: &Target,
    queue: &mut VecDeque<Queued>,
    inflight: Option<tokio::task::JoinHandle<()>>,
    done: &mut mpsc::Receiver<Result<Accepted, Failure>>,
    deadline: Instant,
) -> (u64, u64) {
    let mut sent = 0;
    if let Some(h) = inflight {
        match tokio::time::timeout_at(deadline, done.recv()).await {
            Ok(Some(Ok(_))) => {
                queue.pop_front();
                sent += 1;
            }
            // Failed: tried once more below.
            Ok(_) => {}
            Err(_) => h.abort(),
        }
    }
    while let Some(front) = queue.front() {
        match tokio::time::timeout_at(deadline, send::export(target, &front.request)).await {
            Ok(Ok(_)) => {
                queue.pop_front();
                sent += 1;
            }
            Ok(Err(Failure::Final(_))) => {
                queue.pop_front();
            }
            Ok(Err(Failure::Retryable { .. })) | Err(_) => break,
        }
    }
    (sent, queue.iter().map(|q| q.points).sum())
}

/// Maps the latest publication, unless it is the one exported last (a poller that has not
/// published since: the same points again would only repeat their timestamps).
fn enqueue(
    published: &watch::Receiver<Arc<Published>>,
    origin: &Origin,
    queue: &mut VecDeque<Queued>,
    last_taken: &mut Option<SystemTime>,
) -> u64 {
    let p = published.borrow().clone();
    if *last_taken == Some(p.snapshot.taken_at) {
        return 0;
    }
    let Some(r) = request(&p, origin) else {
        return 0;
    };
    *last_taken = Some(p.snapshot.taken_at);
    let points = points(&r);
    push(
        queue,
        Queued {
            request: Arc::new(r),
            points,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_keeps_the_newest_and_counts_the_points_it_drops() {
        let mut q = VecDeque::new();
        let mut dropped = 0;
        for i in 0..(QUEUE_CAPACITY as u64 + 3) {
            dropped += push(
                &mut q,
                Queued {
                    request: Arc::new(ExportMetricsServiceRequest::default()),
                    points: 10 + i,
                },
            );
        }
        assert_eq!(q.len(), QUEUE_CAPACITY);
        assert_eq!(dropped, 10 + 11 + 12);
        assert_eq!(q.front().map(|f| f.points), Some(13));
    }

    #[test]
    fn backoff_doubles_to_a_minute_with_jitter() {
        let waits: Vec<u64> = (1..=9).map(|a| backoff(a).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        let draws: Vec<Duration> = (0..50).map(|_| jittered(4)).collect();
        assert!(draws
            .iter()
            .all(|d| *d >= Duration::from_secs(4) && *d <= Duration::from_secs(8)));
        assert!(draws.iter().any(|d| *d != draws[0]), "not all the same");
    }
}
