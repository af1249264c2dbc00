//! The mutating API (docs/http.md): routes that change the node are off unless `[api] enabled`,
//! and then need `Authorization: Bearer <token>` with the token from `[api] token_file`.
//!
//! The token file is read on every mutating request (they are rare), so a rotated token takes
//! effect at once, and a file that became readable by other users stops the API at once too.
//! While the API is off the routes answer 404; while the token file is unusable, 503 with the
//! reason (and the agent logs it); a missing or wrong token gets 401.
//!
//! With `[api] socket`, the same routes are also served on a Unix socket, where root and the
//! agent's own user (as the kernel reports the peer, SO_PEERCRED) need no token; other users who
//! may connect still need it. `[api] tcp = false` keeps the mutating routes off TCP entirely.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};

use super::AppState;
pub use crate::config::token::load_token;

/// `[api]` as the HTTP layer needs it.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    pub enabled: bool,
    pub token_file: PathBuf,
    /// false: mutating routes answer only on the Unix socket (`[api] tcp = false`).
    pub tcp: bool,
    /// Who records each admitted request, with its peer, before it is handled (the owner of
    /// changes, the one audit writer); `None`: not recorded (tests of the router alone).
    pub recorder: Option<Arc<crate::changes::Owner>>,
}

impl ApiConfig {
    pub fn disabled() -> Arc<ApiConfig> {
        Arc::new(ApiConfig {
            enabled: false,
            token_file: PathBuf::new(),
            tcp: true,
            recorder: None,
        })
    }
}

/// Put on every request that came over the API's Unix socket: who the kernel says connected.
#[derive(Debug, Clone, Copy)]
pub struct SocketPeer {
    pub uid: u32,
}

impl SocketPeer {
    /// Root and the agent's own user are trusted without a token: they could read it anyway.
    fn trusted(&self) -> bool {
        self.uid == 0 || self.uid == nix::unistd::geteuid().as_raw()
    }
}

/// The address of a TCP client, for the audit record of what it asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpPeer(pub std::net::IpAddr);

/// Records an admitted request (its peer, how it was let in, what it asks) before it is
/// handled, and refuses it with 503 when the record cannot be written: a change asked for
/// through the API is traced to who asked. The component's own records follow, with
/// `"trigger": "api"`.
async fn record_and_run(
    api: &ApiConfig,
    how: &'static str,
    request: Request,
    next: Next,
) -> Response {
    let Some(owner) = api.recorder.clone() else {
        return next.run(request).await;
    };
    let peer = match (
        request.extensions().get::<SocketPeer>(),
        request.extensions().get::<TcpPeer>(),
    ) {
        (Some(p), _) => format!("unix socket, uid {}", p.uid),
        (None, Some(TcpPeer(ip))) => ip.to_string(),
        (None, None) => "unknown".into(),
    };
    let event = crate::audit::event::Api::Request {
        auth: how.into(),
        method: request.method().as_str().into(),
        path: request.uri().path().into(),
        peer,
        trigger: "api".into(),
    };
    let written =
        tokio::task::spawn_blocking(move || owner.record(event).map_err(|e| e.to_string()))
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
    match written {
        Ok(()) => next.run(request).await,
        // The shape of the MIG and sharing answers' refusals: the node's disk is at fault.
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({
                "outcome": crate::audit::AUDIT_FAILED,
                "error": format!("cannot write the audit log: {e}; nothing was done, retry when it can"),
            })),
        )
            .into_response(),
    }
}

/// Compares without an early exit, so that the time taken says nothing of where the first
/// difference is (the length may show; the token's length is no secret worth keeping).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0xff);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// Wraps routes that change the node with the API's switch and its authentication. The
/// configuration comes from [`AppState::api`], which [`super::router`] hands down as an extension.
pub fn mutating(routes: Router<AppState>) -> Router<AppState> {
    routes.route_layer(middleware::from_fn(guard))
}

async fn guard(api: Option<Extension<Arc<ApiConfig>>>, request: Request, next: Next) -> Response {
    // No configuration handed down is a wiring mistake; fail closed.
    let Some(Extension(api)) = api else {
        return (StatusCode::NOT_FOUND, "the mutating API is off\n").into_response();
    };
    if !api.enabled {
        return (
            StatusCode::NOT_FOUND,
            "the mutating API is off; set [api] enabled = true and a token_file to use it\n",
        )
            .into_response();
    }
    let peer = request.extensions().get::<SocketPeer>().copied();
    match peer {
        Some(p) if p.trusted() => return record_and_run(&api, "socket_user", request, next).await,
        Some(_) => {}
        None if !api.tcp => {
            return (
                StatusCode::NOT_FOUND,
                "the mutating API is served on the Unix socket only ([api] tcp = false)\n",
            )
                .into_response()
        }
        None => {}
    }
    let file = api.token_file.clone();
    let token = match tokio::task::spawn_blocking(move || load_token(&file)).await {
        Ok(Ok(t)) => t,
        Ok(Err(reason)) => {
            tracing::error!("{reason}");
            return (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response();
        }
        Err(_) => {
            return (StatusCode::INTERNAL_SERVER_ERROR, "token check failed\n").into_response()
        }
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
    let reason = match presented {
        None => "this endpoint changes the node and needs `Authorization: Bearer <token>`\n",
        Some(p) if !constant_time_eq(p.as_bytes(), &token) => "wrong token\n",
        Some(_) => return record_and_run(&api, "token", request, next).await,
    };
    let mut response = (StatusCode::UNAUTHORIZED, reason).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"gpu-steward\""),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_only_when_identical() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(!constant_time_eq(b"x\xff", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
