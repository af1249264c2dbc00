//! The NVSentinel actor: turns each publication into the events of what changed, queues them
//! (at most [`QUEUE_CAPACITY`], the oldest dropped and counted), and sends them in order, one
//! call per poll's batch. A failed send keeps the queue and is retried with backoff (1 s
//! doubling to 30 s); the first send that works after a failure, and the first after the start,
//! is followed by the current state of every GPU with an active condition (NVSentinel
//! deduplicates).
//!
//! Must not: hold a publication while sending, or wait on the connector longer than
//! [`CALL_TIMEOUT`] (connect and call together): a connector that hangs costs one timeout per
//! retry, never the poller.

use std::collections::VecDeque;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;

use super::proto::ProcessingStrategy;
use super::proto::{self, Empty, HealthEvents};
use super::{changes, current, Seen, Stamp, CALL_TIMEOUT, MAX_BATCH, QUEUE_CAPACITY};
use crate::publication::Published;
use crate::snapshot::NvmlStatus;

const COMPONENT: &str = "nvsentinel";

/// The actor's series, on the page while `[nvsentinel] socket` is set.
#[derive(Debug, Default)]
pub struct NvsentinelMetrics {
    inner: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    sent: u64,
    dropped: u64,
    failures: u64,
    queued: usize,
    up: bool,
}

impl crate::metrics::Collector for NvsentinelMetrics {
    fn collect(&self, out: &mut crate::metrics::Families) {
        use crate::metrics::Family;
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for (name, help, counter, value) in [
            (
                "gpu_steward_nvsentinel_events_sent_total",
                "Health events the NVSentinel platform connector accepted.",
                true,
                m.sent as f64,
            ),
            (
                "gpu_steward_nvsentinel_events_dropped_total",
                "Health events dropped, oldest first, because the queue was full while the connector was down.",
                true,
                m.dropped as f64,
            ),
            (
                "gpu_steward_nvsentinel_send_failures_total",
                "Calls to the platform connector that failed or timed out (retried).",
                true,
                m.failures as f64,
            ),
            (
                "gpu_steward_nvsentinel_queued_events",
                "Health events waiting to be sent.",
                false,
                m.queued as f64,
            ),
            (
                "gpu_steward_nvsentinel_up",
                "1 when the last call to the platform connector worked.",
                false,
                crate::metrics::flag(m.up),
            ),
        ] {
            let mut f = Family::new(name, help, counter);
            f.add::<&str>(&[], value);
            out.push(f);
        }
    }
}

impl NvsentinelMetrics {
    fn update(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// Starts the actor for `socket`; `node` is the `nodeName` of every event.
pub fn spawn(
    socket: PathBuf,
    strategy: ProcessingStrategy,
    node: String,
    published: watch::Receiver<Arc<Published>>,
    stop: watch::Receiver<bool>,
) -> Arc<NvsentinelMetrics> {
    tracing::info!(socket = %socket.display(), node = %node, "nvsentinel: health events to the platform connector");
    let metrics = Arc::new(NvsentinelMetrics::default());
    tokio::spawn(run(
        socket,
        strategy,
        node,
        published,
        stop,
        metrics.clone(),
    ));
    metrics
}

/// A bounded queue that drops its oldest; returns how many were dropped.
fn push(queue: &mut VecDeque<proto::HealthEvent>, events: Vec<proto::HealthEvent>) -> u64 {
    let mut dropped = 0;
    for e in events {
        if queue.len() == QUEUE_CAPACITY {
            queue.pop_front();
            dropped += 1;
        }
        queue.push_back(e);
    }
    dropped
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.saturating_sub(1).min(5)).min(Duration::from_secs(30))
}

async fn run(
    socket: PathBuf,
    strategy: ProcessingStrategy,
    node: String,
    mut published: watch::Receiver<Arc<Published>>,
    mut stop: watch::Receiver<bool>,
    metrics: Arc<NvsentinelMetrics>,
) {
    let mut queue = VecDeque::new();
    let mut last: Option<Seen> = None;
    // Set at the start and after a failure: the next working send is followed by the state.
    let mut resend = true;
    let mut attempt = 0u32;
    let mut retry_at: Option<Instant> = None;
    loop {
        {
            let p = published.borrow_and_update();
            if p.snapshot.nvml == NvmlStatus::Up && !p.snapshot.gpus.is_empty() {
                let now = Seen::of(&p.health, &p.snapshot);
                let stamp = Stamp {
                    node: &node,
                    at: SystemTime::now(),
                    strategy,
                };
                let events = match &last {
                    Some(before) => changes(before, &now, &stamp),
                    // The first verdicts: what is active is sent once the connector answers.
                    None => Vec::new(),
                };
                let dropped = push(&mut queue, events);
                metrics.update(|m| m.dropped += dropped);
                last = Some(now);
            }
        }
        let due = retry_at.is_none_or(|t| Instant::now() >= t);
        let has_state = last.is_some();
        if due && has_state && (!queue.is_empty() || resend) {
            let n = queue.len().min(MAX_BATCH);
            let batch: Vec<_> = queue.iter().take(n).cloned().collect();
            match send(&socket, batch).await {
                Ok(()) => {
                    queue.drain(..n);
                    attempt = 0;
                    retry_at = None;
                    metrics.update(|m| {
                        m.sent += n as u64;
                        m.up = true;
                    });
                    if std::mem::take(&mut resend) {
                        if let Some(now) = &last {
                            let stamp = Stamp {
                                node: &node,
                                at: SystemTime::now(),
                                strategy,
                            };
                            let dropped = push(&mut queue, current(now, &stamp));
                            metrics.update(|m| m.dropped += dropped);
                        }
                    }
                    crate::warnings::set(COMPONENT, None);
                }
                Err(e) => {
                    attempt += 1;
                    let wait = backoff(attempt);
                    retry_at = Some(Instant::now() + wait);
                    resend = true;
                    metrics.update(|m| {
                        m.failures += 1;
                        m.up = false;
                    });
                    tracing::warn!(socket = %socket.display(), queued = queue.len(), attempt, retry_in = ?wait, "nvsentinel: {e}");
                    crate::warnings::set(COMPONENT, Some(format!("nvsentinel: {e}")));
                }
            }
            metrics.update(|m| m.queued = queue.len());
            if retry_at.is_none() && (!queue.is_empty() || resend) {
                continue;
            }
        }
        metrics.update(|m| m.queued = queue.len());
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

/// One call with `events` (possibly none: a probe after a failure), within [`CALL_TIMEOUT`].
async fn send(socket: &Path, events: Vec<proto::HealthEvent>) -> Result<(), String> {
    match std::fs::metadata(socket) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(format!(
                "'{}' is not a socket; set [nvsentinel] socket to the platform connector's \
                 socket (e.g. '/var/run/nvsentinel/platform-connector.sock')",
                socket.display()
            ))
        }
        Err(e) => {
            return Err(format!(
                "cannot reach the platform connector at '{}' ({e}); is NVSentinel running on this node?",
                socket.display()
            ))
        }
        Ok(_) => {}
    }
    let request = HealthEvents { version: 1, events };
    let call = async {
        let channel = crate::grpc::connect(socket, None)
            .await
            .map_err(|e| format!("cannot connect to '{}': {e}", socket.display()))?;
        crate::grpc::call::<HealthEvents, Empty>(channel, proto::METHOD, request, Some(4096))
            .await
            .map(drop)
            .map_err(|e| {
                format!(
                    "the platform connector at '{}' refused the events: {e}",
                    socket.display()
                )
            })
    };
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "the platform connector at '{}' did not answer within {}; events stay queued",
            socket.display(),
            humantime::format_duration(CALL_TIMEOUT)
        )),
    }
}
