//! One connection, from its first byte to its close, and the gate every request passes.
//!
//! A connection costs nothing but its socket and this task until its first byte arrives: hyper
//! (and its read buffer) is only set up then, and a connection that stays silent for the
//! first-byte timeout is closed. Requests take one of the `max_connections` permits when hyper
//! has parsed their head and give it back when their response is handed to the socket, so idle
//! or trickling connections never hold one. `/livez` and `/readyz` are answered without a permit:
//! a busy or attacked server still tells the kubelet it is alive and ready. Every request, over
//! plain TCP or TLS, is served by hyper and the router.
//!
//! Must not: call NVML or wait on anything but the socket and the registry.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use axum::Router;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

use super::admission::{Registry, Serving, Slot, Ticket, Wake};
use super::metered::Metered;
use super::prior_knowledge;

/// What every connection's task shares.
pub struct Shared {
    pub router: Router,
    pub builder: http1::Builder,
    /// `max_connections` permits: one per request being served, probes excepted.
    pub requests: Arc<Semaphore>,
    pub max_requests: usize,
    pub first_byte: Duration,
    /// TLS from the web config; the handshake must finish within the header timeout.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub header_timeout: Duration,
}

/// Paths answered without a permit: cheap (no body to render) and what the kubelet acts on.
fn is_probe(path: &str) -> bool {
    matches!(path, "/livez" | "/readyz")
}

/// Serves one accepted connection until it closes, is evicted, or the server shuts down.
pub async fn serve(stream: TcpStream, ticket: Ticket, shared: Arc<Shared>) {
    let slot = ticket.slot().clone();
    let registry = ticket.registry().clone();
    // `peek`, unlike `readable`, waits for real bytes (readiness can be a false positive) and
    // leaves them for hyper; the buffer is this task's few bytes, not hyper's.
    let mut first = [0u8; prior_knowledge::PEEK];
    let peeked = tokio::select! {
        peeked = tokio::time::timeout(shared.first_byte, stream.peek(&mut first)) => peeked,
        // Nothing asked yet: whether evicted or shutting down, closing loses no answer.
        _ = slot.woken(&registry) => return,
    };
    let n = match peeked {
        // Silent for the first-byte timeout, closed by the client, or a failed socket.
        Err(_) | Ok(Ok(0) | Err(_)) => return,
        Ok(Ok(n)) => n,
    };
    let gate = Gate {
        shared: shared.clone(),
        registry: registry.clone(),
        id: ticket.id(),
        peer: stream.peer_addr().ok().map(|a| a.ip()),
    };
    let Some(tls) = &shared.tls else {
        if prior_knowledge::is_preface(&first[..n]) {
            tokio::select! {
                _ = prior_knowledge::refuse(stream, Duration::from_secs(1)) => {}
                _ = slot.woken(&registry) => {}
            }
            return;
        }
        let stream = metered(stream, &shared, &registry, &slot);
        drive(stream, gate, &shared, &registry, &slot).await;
        return;
    };
    // A TLS connection opens with a handshake record (22); anything else is most likely plain
    // HTTP sent to the TLS port: say so in plain HTTP, as Go's servers do, rather than reset.
    if first[0] != 22 {
        tokio::select! {
            _ = plain_http_to_tls(stream) => {}
            _ = slot.woken(&registry) => {}
        }
        return;
    }
    let handshake = tokio::time::timeout(shared.header_timeout, tls.accept(stream));
    let stream = tokio::select! {
        done = handshake => match done {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => return,
        },
        _ = slot.woken(&registry) => return,
    };
    drive(
        metered(stream, &shared, &registry, &slot),
        gate,
        &shared,
        &registry,
        &slot,
    )
    .await;
}

/// `stream` with its reads counted against the head budget and its writes timed.
fn metered<S>(
    stream: S,
    shared: &Shared,
    registry: &Arc<Registry>,
    slot: &Arc<Slot>,
) -> Metered<S> {
    Metered::new(
        stream,
        registry.clone(),
        slot.clone(),
        shared.header_timeout,
    )
}

/// Serves HTTP/1.1 on an established stream (its reads already counted by `Metered`) until it
/// closes, is evicted, or shutdown drains it.
async fn drive<S>(
    stream: S,
    gate: Gate,
    shared: &Shared,
    registry: &Arc<Registry>,
    slot: &Arc<Slot>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // Boxed so that a connection still waiting for its first byte does not carry hyper's state.
    let mut conn = Box::pin(shared.builder.serve_connection(TokioIo::new(stream), gate));
    let wake = tokio::select! {
        ended = conn.as_mut() => {
            if let Err(e) = ended {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            return;
        }
        wake = slot.woken(registry) => wake,
    };
    if wake == Wake::Evicted || !slot.has_served() {
        return;
    }
    // Shutting down: hyper closes the connection now if it is idle between requests, or after
    // the response in flight; the server bounds the wait by its drain time.
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// The answer to plain HTTP on the TLS port.
async fn plain_http_to_tls(mut stream: TcpStream) {
    use tokio::io::AsyncWriteExt;
    let body = "this port speaks HTTPS; use https://\n";
    let response = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        stream.write_all(response.as_bytes()),
    )
    .await;
    let _ = stream.shutdown().await;
}

/// The hyper service of one connection: marks it serving, applies the request cap, routes.
#[derive(Clone)]
struct Gate {
    shared: Arc<Shared>,
    registry: Arc<Registry>,
    id: u64,
    /// The client's address, for the audit record of a change it asks for.
    peer: Option<std::net::IpAddr>,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Gate {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, mut req: Request<Incoming>) -> Answer {
        if let Some(ip) = self.peer {
            req.extensions_mut().insert(super::api::TcpPeer(ip));
        }
        let serving = self.registry.serving(self.id);
        let permit = if is_probe(req.uri().path()) {
            None
        } else {
            match self.shared.requests.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    let busy = too_busy(self.shared.max_requests);
                    return Box::pin(std::future::ready(Ok(held(busy, serving, None))));
                }
            }
        };
        let router = self.shared.router.clone();
        Box::pin(async move {
            let Ok(response) = router.oneshot(req).await;
            Ok(held(response, serving, permit))
        })
    }
}

/// The answer over the cap, with the reason and the key that sets it; the connection is closed
/// so that a client retrying in a loop gives its socket back.
fn too_busy(limit: usize) -> Response<Body> {
    let mut r = Response::new(Body::from(format!(
        "too many requests being served (max_connections = {limit}); retry later\n"
    )));
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Keeps the request counted (and its permit taken) until hyper drops the body, that is until
/// the whole response has been handed to the socket.
fn held(
    response: Response<Body>,
    serving: Serving,
    permit: Option<OwnedSemaphorePermit>,
) -> Response<Body> {
    response.map(|body| {
        Body::new(Held {
            body,
            _serving: serving,
            _permit: permit,
        })
    })
}

struct Held {
    body: Body,
    _serving: Serving,
    _permit: Option<OwnedSemaphorePermit>,
}

impl HttpBody for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
