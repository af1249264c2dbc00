//! The accept loop: HTTP/1.1 connections served by hyper with the limits a daemon on an open
//! port needs, which `axum::serve` does not set (it configures no timer, so hyper's header-read
//! timeout never fires and an idle client holds its connection forever):
//!
//! - a first-byte timeout (2 s, or `header_timeout` if shorter) for connections that send
//!   nothing, then `header_timeout` for the rest of the request head, and again between
//!   keep-alive requests;
//! - a cap on request heads: 64 KiB for the request line and headers together, 100 headers;
//!   larger get 431 from hyper;
//! - a cap on requests being served at once (`max_connections`): beyond it a client gets a 503
//!   with the reason; `/livez` and `/readyz` are always served (see `connection`);
//! - an open-connection budget taken from the descriptor limit, in which an idle connection
//!   gives way to a newcomer (see `admission`), so that no number of idle or slow clients can
//!   starve Prometheus or the probes;
//! - HTTP/2 with prior knowledge answered with HTTP/2's own "HTTP/1.1 required" (see
//!   `prior_knowledge`);
//! - graceful shutdown: stop accepting, close at once the connections that asked nothing, let
//!   the responses in flight finish within the drain time.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioTimer;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::admission::{Admit, Registry};
use super::connection::{self, Shared};

/// Largest request head (request line and headers) accepted; hyper answers 431 beyond.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long a new connection may stay silent. Real clients (Prometheus, the kubelet, curl) send
/// their request with the handshake's last packet; 2 s covers a lost segment's retransmission.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(2);

/// Descriptors kept for everything but connections: NVML's device files, the kubelet socket,
/// configuration and scenario reads, logs.
const RESERVED_FDS: u64 = 128;

/// Most connections open at once, whatever the descriptor limit: a silent one costs about
/// 1.2 KiB, one that hyper serves about 15 KiB, plus its head.
const MAX_OPEN: usize = 1024;
const MIN_OPEN: usize = 16;

/// Bytes of unfinished request heads over all connections: real heads are a few hundred bytes,
/// so this is a thousand clients' worth while 1024 heads of 64 KiB would be 64 MiB.
const HEAD_BUDGET: usize = 8 * 1024 * 1024;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Requests served at once; `/livez` and `/readyz` are not counted.
    pub max_connections: usize,
    pub header_timeout: Duration,
    /// How long in-flight requests get to finish at shutdown.
    pub drain: Duration,
}

/// Limits the server derives rather than reads from the configuration.
#[derive(Debug, Clone, Copy)]
pub(super) struct Derived {
    pub open_budget: usize,
    pub head_budget: usize,
    pub first_byte: Duration,
}

impl Derived {
    fn new(limits: &Limits) -> Derived {
        let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(1024, |(soft, _hard)| soft);
        Derived {
            open_budget: open_budget(soft),
            head_budget: HEAD_BUDGET,
            first_byte: FIRST_BYTE_TIMEOUT.min(limits.header_timeout),
        }
    }
}

/// The open-connection budget for a soft descriptor limit of `nofile`.
fn open_budget(nofile: u64) -> usize {
    let usable = usize::try_from(nofile.saturating_sub(RESERVED_FDS)).unwrap_or(MAX_OPEN);
    usable.clamp(MIN_OPEN, MAX_OPEN)
}

/// Serves `app` on `listener` (over TLS when `tls` is given) until `stop` turns true, then
/// drains.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    tls: Option<Arc<rustls::ServerConfig>>,
    stop: watch::Receiver<bool>,
) {
    let derived = Derived::new(&limits);
    tracing::debug!(open_budget = derived.open_budget, "connection limits");
    serve_with(listener, app, limits, derived, tls, stop).await;
}

pub(super) async fn serve_with(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    derived: Derived,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        // A client may shut down its side once its request is sent (`nc -N`, some HTTP/1.0
        // tools): without this hyper may drop the request unanswered when it reads that EOF
        // before the response is written (found by fuzzing).
        .half_close(true)
        .max_buf_size(MAX_HEAD_BYTES)
        // Exact, unlike `max_buf_size` alone: a head that arrives whole in one read is measured too.
        .max_header_size(MAX_HEAD_BYTES);
    let shared = Arc::new(Shared {
        router: app,
        builder,
        requests: Arc::new(Semaphore::new(limits.max_connections)),
        max_requests: limits.max_connections,
        first_byte: derived.first_byte,
        tls: tls.map(tokio_rustls::TlsAcceptor::from),
        header_timeout: limits.header_timeout,
    });
    let registry = Registry::new(derived.open_budget, derived.head_budget);
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                admit(&registry, stream, peer.ip(), &shared, &mut tasks);
            }
            // Reap finished connections so that the set holds only open ones.
            Some(_) = tasks.join_next() => {}
            // The guard `wait_for` returns must not live across an await: drop it at once.
            _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
        }
    }
    drop(listener);
    registry.shutdown();
    let drained = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.drain, drained).await.is_err() {
        tracing::warn!(
            open = tasks.len(),
            "connections still open after {:?}; closing them",
            limits.drain
        );
    }
    // Dropping the set aborts whatever is left.
}

fn admit(
    registry: &Arc<Registry>,
    stream: TcpStream,
    peer: IpAddr,
    shared: &Arc<Shared>,
    tasks: &mut JoinSet<()>,
) {
    match registry.admit(peer) {
        Admit::Open { ticket, evicted } => {
            if let Some(busiest) = evicted {
                tracing::warn!(
                    budget = registry.budget(),
                    busiest = %busiest,
                    "open-connection budget spent: closing the oldest idle connections of the \
                     busiest peer to make room; see docs/http.md"
                );
            }
            let _ = stream.set_nodelay(true);
            tasks.spawn(connection::serve(stream, ticket, shared.clone()));
        }
        Admit::Full => refuse(stream, registry),
    }
}

/// Answers a connection the budget cannot take (every open one is serving a request) with a
/// 503 and closes it, without a task: this only happens under a flood, where a task each would
/// be one more thing to flood. A fresh socket's send buffer takes the few bytes at once.
fn refuse(stream: TcpStream, registry: &Registry) {
    let open = registry.counts().0;
    let body = format!("too many connections ({open} open, all busy); retry later\n");
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n{body}",
        body.len()
    );
    // Read what already arrived, so that the close is a FIN rather than a reset that could
    // discard the answer before the client reads it.
    let mut sink = [0u8; 4096];
    while matches!(stream.try_read(&mut sink), Ok(n) if n > 0) {}
    let _ = stream.try_write(response.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_budget_follows_the_descriptor_limit_within_bounds() {
        assert_eq!(open_budget(1024), 896, "systemd's default soft limit");
        assert_eq!(open_budget(1 << 20), MAX_OPEN);
        assert_eq!(open_budget(100), MIN_OPEN);
        assert_eq!(open_budget(u64::MAX), MAX_OPEN);
    }
}
