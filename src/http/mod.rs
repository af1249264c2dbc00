//! The HTTP surface: an axum router over the latest published snapshot.
//!
//! Handlers only read what the poller published; none of them calls NVML, so a wedged driver
//! can never hang a scrape or a probe. Unknown paths answer 404 and wrong methods 405, both with
//! a reason; the server keeps serving whatever a client sends.

mod admission;
mod alertmanager;
pub mod api;
mod connection;
mod events;
#[cfg(any(test, feature = "fixture"))]
#[doc(hidden)]
pub mod fixture;
mod gpus;
mod health;
mod jobs;
mod metered;
mod mig;
mod prior_knowledge;
mod reclaim;
pub mod server;
mod sharing;
mod topology;
pub mod unix;
pub mod web_config;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::watch;

use crate::metrics::CONTENT_TYPE;
use crate::publication::Published;

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
    /// The owner of changes: MIG layouts applied through `POST /api/v1/mig/apply`; `None` in
    /// tests that need none.
    pub changes: Option<Arc<crate::changes::Owner>>,
    /// The sharing subsystem (`/api/v1/sharing`); `None` in router tests.
    pub sharing: Option<Arc<crate::sharing::Sharing>>,
    /// The remediation dispatcher (`POST /api/v1/alertmanager` feeds it).
    pub remediation: Option<crate::remediation::Handle>,
    /// The reclaim actor's latest view (`/api/v1/reclaim`); `None` when it has not run yet or
    /// in router tests.
    pub reclaim: Option<watch::Receiver<Option<Arc<crate::reclaim::View>>>>,
    /// The job reports (`/api/v1/jobs/...`); `None` in router tests.
    pub jobs: Option<crate::reclaim::jobs::Shared>,
    /// The audit log this agent writes (fixed at start): `/api/v1/events` names it, so that
    /// `gpu-steward status` on the same machine reads this agent's changes (the demo's
    /// throwaway one, not the node's). `None` in router tests.
    pub audit_file: Option<std::path::PathBuf>,
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
        .route("/api/v1/gpus", get(gpus::gpus))
        .route("/api/v1/mig", get(mig::state))
        .merge(api::mutating(
            Router::new().route("/api/v1/mig/apply", axum::routing::post(mig::apply)),
        ))
        .route("/api/v1/reclaim", get(reclaim::reclaim))
        .route("/api/v1/jobs/slurm/{id}", get(jobs::slurm))
        .route("/api/v1/jobs/pod/{namespace}/{name}", get(jobs::pod))
        .route("/api/v1/jobs/unit/{unit}", get(jobs::unit))
        .route("/api/v1/jobs/user/{user}", get(jobs::user))
        .route("/api/v1/sharing", get(sharing::show))
        .route("/api/v1/topology", get(topology::topology))
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

/// The newest publication's page, as it was rendered: gzipped when the scraper accepts it (the
/// first gzip scrape of a publication compresses it, off the async workers so that probes on the
/// same runtime are never held up; the others share that copy).
async fn metrics(State(state): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    let gzip = accepts_gzip(
        headers
            .get_all(header::ACCEPT_ENCODING)
            .iter()
            .map(HeaderValue::as_bytes),
    );
    let published = state.latest();
    let body = if !gzip {
        None
    } else if published.page.gzip_ready() {
        Some(published.page.gzip())
    } else {
        let p = published.clone();
        tokio::task::spawn_blocking(move || p.page.gzip())
            .await
            .ok()
    };
    let mut response = (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE)),
            (header::VARY, HeaderValue::from_static("Accept-Encoding")),
        ],
        body.clone().unwrap_or_else(|| published.page.text.clone()),
    )
        .into_response();
    if body.is_some() {
        response
            .headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    response
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
         <li><a href=\"/api/v1/gpus\">/api/v1/gpus</a>: each GPU as plain data (identity, health, telemetry, processes)</li>\
         <li><a href=\"/api/v1/mig\">/api/v1/mig</a>: MIG mode and instances per GPU</li>\
         <li><a href=\"/api/v1/topology\">/api/v1/topology</a>: how the GPUs connect (NVLink, PCIe)</li>\
         <li><a href=\"/api/v1/reclaim\">/api/v1/reclaim</a>: idle-GPU candidates and what happens when</li>\
         <li>/api/v1/jobs/slurm/{{id}} (also <code>pod/{{namespace}}/{{name}}</code>, <code>unit/{{unit}}</code>, <code>user/{{user}}</code>): what a job used of its GPUs</li>\
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
mod server_tests;
#[cfg(test)]
mod tests;
