//! The HTTP surface: an axum router over the latest published snapshot.
//!
//! Handlers only read what the poller published; none of them calls NVML, so a wedged driver
//! can never hang a scrape or a probe. Unknown paths answer 404 and wrong methods 405, both with
//! a reason; the server keeps serving whatever a client sends.

mod admission;
pub mod ahead;
mod alertmanager;
pub mod api;
mod connection;
mod events;
mod fast;
#[cfg(any(test, feature = "fixture"))]
#[doc(hidden)]
pub mod fixture;
mod health;
mod metered;
mod mig;
mod prior_knowledge;
mod reclaim;
pub mod sendfile;
pub mod server;
mod sharing;
pub mod unix;
pub mod web_config;

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::watch;

use crate::metrics::CONTENT_TYPE;
use crate::poller::Published;

/// What every handler can read, behind one `Arc`: a request clones one pointer rather than
/// every field.
#[derive(Clone)]
pub struct AppState(Arc<AppFields>);

impl std::ops::Deref for AppState {
    type Target = AppFields;

    fn deref(&self) -> &AppFields {
        &self.0
    }
}

/// The fields of [`AppState`].
pub struct AppFields {
    pub published: watch::Receiver<Arc<Published>>,
    /// `[api]`: whether routes that change the node are on, and where their token is.
    pub api: Arc<api::ApiConfig>,
    /// MIG layouts applied through `POST /api/v1/mig/apply`; `None` in tests that need none.
    pub mig: Option<Arc<crate::mig::service::MigService>>,
    /// The sharing subsystem (`/api/v1/sharing`); `None` in router tests.
    pub sharing: Option<Arc<crate::sharing::Sharing>>,
    /// Alert states and evaluation failures of the local rules, when rules are loaded.
    pub rules: Option<Arc<crate::rules::RuleMetrics>>,
    /// The remediation dispatcher (`POST /api/v1/alertmanager` feeds it; its hook metrics).
    pub remediation: Option<crate::remediation::Handle>,
    /// When gzip scrapers come, to compress the page before they do (see `ahead`).
    pub ahead: Arc<ahead::Ahead>,
}

impl AppState {
    pub fn new(fields: AppFields) -> AppState {
        AppState(Arc::new(fields))
    }

    /// The newest publication (an `Arc` clone; the lock is held only for the clone).
    pub fn latest(&self) -> Arc<Published> {
        self.published.borrow().clone()
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(landing))
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(health::readyz))
        .route("/health", get(health::health))
        .route("/health/gpus", get(health::gpus))
        .route("/health/gpus/{gpu}", get(health::gpu))
        .route("/api/v1/events", get(events::events))
        .route("/api/v1/mig", get(mig::state))
        .merge(api::mutating(
            Router::new().route("/api/v1/mig/apply", axum::routing::post(mig::apply)),
        ))
        .route("/api/v1/reclaim", get(reclaim::reclaim))
        .route("/api/v1/sharing", get(sharing::show))
        .merge(api::mutating(Router::new().route(
            "/api/v1/sharing/apply",
            axum::routing::post(sharing::apply),
        )))
        .merge(api::mutating(Router::new().route(
            "/api/v1/alertmanager",
            axum::routing::post(alertmanager::receive),
        )))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::Extension(state.api.clone()))
        .with_state(state)
}

/// Puts the web config's basic auth and response headers in front of a finished router (the
/// API's configuration is handed down again, outside, because the guard may accept its token).
pub fn protect(
    router: Router,
    auth: Option<Arc<web_config::WebAuth>>,
    api: Arc<api::ApiConfig>,
) -> Router {
    match auth {
        Some(auth) if !auth.is_noop() => router
            .layer(axum::middleware::from_fn(web_config::guard))
            .layer(axum::Extension(auth))
            .layer(axum::Extension(api)),
        _ => router,
    }
}

async fn metrics(State(state): State<AppState>, request: axum::extract::Request) -> Response {
    // The request itself rather than a `HeaderMap` extractor, which would clone the headers.
    let headers = request.headers();
    let gzip = accepts_gzip(
        headers
            .get_all(header::ACCEPT_ENCODING)
            .iter()
            .map(HeaderValue::as_bytes),
    );
    let origin = request.extensions().get::<Origin>();
    // HEAD sends no body: nothing to offer.
    let hints = origin
        .and_then(|o| o.hints.as_ref())
        .filter(|_| request.method() == axum::http::Method::GET);
    let peer = origin.and_then(|o| o.peer);
    let (parts, gzip) = scrape(&state, gzip, hints, peer).await;
    let mut response = (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE)),
            (header::VARY, HeaderValue::from_static("Accept-Encoding")),
        ],
        axum::body::Body::new(Parts::new(parts)),
    )
        .into_response();
    if gzip {
        response
            .headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    response
}

/// What the `/metrics` handler learns of the connection a request came on, as one request
/// extension: where the page may be offered to be sent from a file (plain TCP only), and the
/// address it came from, for `ahead` (`None` on a Unix socket).
#[derive(Debug, Clone, Default)]
pub(crate) struct Origin {
    pub hints: Option<sendfile::Hints>,
    pub peer: ahead::Peer,
}

/// The body of a scrape of the newest publication, gzipped when `gzip` (and it could be),
/// with whether it is. With `hints` (a plain-TCP connection about to send the body), the page
/// is offered to be sent from its memfd, and it then comes last: the head and this scrape's
/// few lines go first in one segment with the page's start (families may come in any order).
/// Shared by the router's handler and the connection's own `GET /metrics` path (`fast`).
pub(super) async fn scrape(
    state: &AppState,
    gzip: bool,
    hints: Option<&sendfile::Hints>,
    peer: ahead::Peer,
) -> ([axum::body::Bytes; 2], bool) {
    let published = state.latest();
    let now = SystemTime::now();
    // Rules and hooks change between polls: rendered at scrape time (a few lines).
    let mut extra = String::new();
    if let Some(r) = &state.rules {
        r.render(&mut extra);
    }
    if let Some(r) = &state.remediation {
        r.metrics.render(&mut extra);
    }
    if gzip && !published.metrics.gzip_ready() {
        // The first gzip scrape of a publication that was not compressed ahead compresses it
        // (~0.4 ms for the 8-GPU page): off the async workers, so that probes on the same
        // runtime are never held up.
        let p = published.clone();
        let e = extra.clone();
        let compressing = tokio::task::spawn_blocking(move || {
            let here = p.metrics.compress();
            (p.metrics.gzip_parts_with(now, e.as_bytes()), here)
        });
        match compressing.await {
            Ok((parts, here)) => {
                state.ahead.scraped(peer, here);
                (parts, true)
            }
            Err(_) => (
                published.metrics.plain_parts_with(now, extra.as_bytes()),
                false,
            ),
        }
    } else if gzip {
        state.ahead.scraped(peer, false);
        (
            published.metrics.gzip_parts_with(now, extra.as_bytes()),
            true,
        )
    } else {
        let [page, tail] = published.metrics.plain_parts_with(now, extra.as_bytes());
        let offered = hints.and_then(|hints| {
            let file = published.metrics.plain_file()?;
            hints.offer(file);
            Some(())
        });
        match offered {
            Some(()) => ([tail, page], false),
            None => ([page, tail], false),
        }
    }
}

/// A body of a few shared buffers with an exact length: the page rendered once per poll goes
/// to the socket by reference (hyper writes the parts with one vectored write), never copied.
struct Parts {
    parts: std::collections::VecDeque<axum::body::Bytes>,
    remaining: u64,
}

impl Parts {
    fn new(parts: [axum::body::Bytes; 2]) -> Parts {
        let remaining = parts.iter().map(|p| p.len() as u64).sum();
        Parts {
            parts: parts.into_iter().filter(|p| !p.is_empty()).collect(),
            remaining,
        }
    }
}

impl http_body::Body for Parts {
    type Data = axum::body::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let next = self.parts.pop_front();
        if let Some(p) = &next {
            self.remaining -= p.len() as u64;
        }
        std::task::Poll::Ready(next.map(|p| Ok(http_body::Frame::data(p))))
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}

/// True when the `Accept-Encoding` values list gzip with a non-zero quality.
fn accepts_gzip<'a>(values: impl Iterator<Item = &'a [u8]>) -> bool {
    values
        // What `HeaderValue::to_str` accepts: visible ASCII and tabs.
        .filter(|v| v.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)))
        .filter_map(|v| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or("");
            let q_zero = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !q_zero
        })
}

async fn livez() -> &'static str {
    "ok\n"
}

async fn landing() -> Html<String> {
    Html(format!(
        "<!doctype html><html><head><title>gpu-steward</title></head><body>\
         <h1>gpu-steward {version}</h1><p>Node-local GPU agent.</p><ul>\
         <li><a href=\"/metrics\">/metrics</a>: Prometheus metrics (dcgm-exporter compatible and native)</li>\
         <li><a href=\"/health\">/health</a>: agent and per-GPU health (application/health+json)</li>\
         <li><a href=\"/health/gpus\">/health/gpus</a>: per-GPU health, 503 when a GPU fails</li>\
         <li><a href=\"/api/v1/events\">/api/v1/events</a>: health events, newest first (?since=)</li>\
         <li><a href=\"/api/v1/mig\">/api/v1/mig</a>: MIG mode and instances per GPU</li>\
         <li><a href=\"/api/v1/reclaim\">/api/v1/reclaim</a>: idle-GPU candidates and what happens when</li>\
         <li><a href=\"/readyz\">/readyz</a>: readiness</li>\
         <li><a href=\"/livez\">/livez</a>: liveness</li>\
         </ul></body></html>\n",
        version = env!("CARGO_PKG_VERSION")
    ))
}

async fn not_found(uri: Uri) -> (StatusCode, String) {
    (
        StatusCode::NOT_FOUND,
        format!(
            "not found: '{}'; the endpoints are listed at /\n",
            uri.path()
        ),
    )
}

async fn method_not_allowed() -> (StatusCode, &'static str) {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed: these endpoints are read-only, use GET\n",
    )
}

#[cfg(test)]
mod sendfile_tests;
#[cfg(test)]
mod server_tests;
#[cfg(test)]
mod tests;
