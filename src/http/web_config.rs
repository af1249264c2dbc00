//! Serving a web configuration (`config/web.rs` reads and checks the file, in the format of
//! the Prometheus exporter-toolkit's `--web.config.file`): basic authentication and the
//! configured response headers, as a middleware.
//!
//! Basic authentication covers every path but the probes (`/livez`, `/readyz`, `/health`,
//! `/health/gpus...`), which the kubelet and load balancers call without credentials. Requests
//! under `/api/v1/` may instead carry the API's bearer token (docs/http.md). What gpu-steward
//! cannot do as exporter-toolkit does is refused with the reason rather than ignored: TLS 1.0
//! and 1.1, Go cipher-suite and curve names (rustls offers only modern suites), client
//! certificates accepted without verification, and HTTP/2.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::extract::Request;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use tokio::sync::Semaphore;

use super::api::{self, ApiConfig};
use crate::config::web::{self, WebSettings};

/// What the server does with a web configuration.
#[derive(Clone)]
pub struct WebConfig {
    pub path: PathBuf,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub auth: Arc<WebAuth>,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("path", &self.path)
            .field("tls", &self.tls.is_some())
            .field("basic_auth_users", &self.auth.users.len())
            .finish()
    }
}

impl WebConfig {
    /// A one-line summary for `check-config` and the start log.
    pub fn describe(&self) -> String {
        web::describe(self.tls.is_some(), self.auth.users.len())
    }
}

impl From<WebSettings> for WebConfig {
    fn from(s: WebSettings) -> WebConfig {
        WebConfig {
            path: s.path,
            tls: s.tls,
            auth: Arc::new(WebAuth::new(s.users, s.headers)),
        }
    }
}

/// Reads and checks the file ([`web::load`]): every error names the file, and YAML errors the
/// line and column.
pub fn load(path: &Path) -> Result<WebConfig, String> {
    web::load(path).map(WebConfig::from)
}

/// [`load`] on text already read ([`web::parse`]).
pub fn parse(path: &Path, text: &str) -> Result<WebConfig, String> {
    web::parse(path, text).map(WebConfig::from)
}

/// Basic authentication and the configured response headers.
pub struct WebAuth {
    users: BTreeMap<String, String>,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// Credentials that verified, by a keyed digest: bcrypt costs tens of milliseconds on
    /// purpose, and Prometheus sends the same credentials every scrape. Cleared when full.
    verified: Mutex<HashSet<[u8; 32]>>,
    /// A random key for those digests, so that the set says nothing outside this process.
    key: [u8; 32],
    /// One bcrypt at a time: a client guessing passwords costs at most one core.
    bcrypt: Semaphore,
}

const VERIFIED_CAP: usize = 256;

impl WebAuth {
    fn new(users: BTreeMap<String, String>, headers: Vec<(HeaderName, HeaderValue)>) -> WebAuth {
        let mut key = [0u8; 32];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key);
        WebAuth {
            users,
            headers,
            verified: Mutex::new(HashSet::new()),
            key,
            bcrypt: Semaphore::new(1),
        }
    }

    /// No basic auth and no headers: nothing to do per request.
    pub fn is_noop(&self) -> bool {
        self.users.is_empty() && self.headers.is_empty()
    }

    fn digest(&self, user: &str, password: &str) -> [u8; 32] {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.key);
        let mut ctx = ring::hmac::Context::with_key(&key);
        ctx.update(user.as_bytes());
        ctx.update(b"\0");
        ctx.update(password.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    async fn check(&self, user: &str, password: &str) -> bool {
        let digest = self.digest(user, password);
        if self
            .verified
            .lock()
            .map(|v| v.contains(&digest))
            .unwrap_or(false)
        {
            return true;
        }
        // An unknown user costs a bcrypt too, so that timing does not tell which users exist.
        const DUMMY: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DSmpppmD4G6J8Khr8k2XS";
        let hash = self.users.get(user).cloned();
        let known = hash.is_some();
        let hash = hash.unwrap_or_else(|| DUMMY.to_string());
        let Ok(_permit) = self.bcrypt.acquire().await else {
            return false;
        };
        let password = password.to_string();
        let ok = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(false)
            && known;
        if ok {
            if let Ok(mut v) = self.verified.lock() {
                if v.len() >= VERIFIED_CAP {
                    v.clear();
                }
                v.insert(digest);
            }
        }
        ok
    }
}

/// Paths the probes call, open whatever the web config says.
fn is_open(path: &str) -> bool {
    matches!(path, "/livez" | "/readyz" | "/health" | "/health/gpus")
        || path.starts_with("/health/gpus/")
}

/// The middleware: basic auth on everything but the probes, then the configured headers.
pub async fn guard(
    Extension(auth): Extension<Arc<WebAuth>>,
    api_config: Option<Extension<Arc<ApiConfig>>>,
    request: Request,
    next: Next,
) -> Response {
    if !auth.users.is_empty() && !is_open(request.uri().path()) {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .map(|(scheme, rest)| (scheme.to_ascii_lowercase(), rest.trim().to_string()));
        let allowed = match presented {
            Some((scheme, rest)) if scheme == "basic" => match decode_basic(&rest) {
                Some((user, password)) => auth.check(&user, &password).await,
                None => false,
            },
            // The API's own token also opens /api/v1 (one Authorization header cannot carry both).
            Some((scheme, rest)) if scheme == "bearer" => {
                request.uri().path().starts_with("/api/v1/")
                    && api_token_matches(api_config.map(|Extension(a)| a), &rest).await
            }
            _ => false,
        };
        if !allowed {
            let mut r = (StatusCode::UNAUTHORIZED, "authentication required\n").into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"gpu-steward\""),
            );
            return with_headers(r, &auth);
        }
    }
    let response = next.run(request).await;
    with_headers(response, &auth)
}

async fn api_token_matches(api: Option<Arc<ApiConfig>>, presented: &str) -> bool {
    let Some(api) = api.filter(|a| a.enabled) else {
        return false;
    };
    let file = api.token_file.clone();
    match tokio::task::spawn_blocking(move || api::load_token(&file)).await {
        Ok(Ok(token)) => api::constant_time_eq(presented.as_bytes(), &token),
        _ => false,
    }
}

fn with_headers(mut r: Response, auth: &WebAuth) -> Response {
    for (name, value) in &auth.headers {
        r.headers_mut().insert(name.clone(), value.clone());
    }
    r
}

/// `user:password` from the base64 of a Basic credential.
fn decode_basic(b64: &str) -> Option<(String, String)> {
    let bytes = base64_decode(b64)?;
    let text = String::from_utf8(bytes).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// Standard base64 with padding (RFC 4648 §4), as RFC 7617 uses.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.as_bytes();
    if s.len() % 4 != 0 || s.len() > 8192 {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for (i, chunk) in s.chunks(4).enumerate() {
        let last = i == s.len() / 4 - 1;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | value(c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_as_rfc_4648_says() {
        assert_eq!(base64_decode("").as_deref(), Some(&b""[..]));
        assert_eq!(base64_decode("Zg==").as_deref(), Some(&b"f"[..]));
        assert_eq!(base64_decode("Zm8=").as_deref(), Some(&b"fo"[..]));
        assert_eq!(base64_decode("Zm9v").as_deref(), Some(&b"foo"[..]));
        assert_eq!(
            base64_decode("cHJvbWV0aGV1czpzM2NyZXQ=").as_deref(),
            Some(&b"prometheus:s3cret"[..])
        );
        assert_eq!(base64_decode("Zg=a"), None);
        assert_eq!(base64_decode("Zg==Zg=="), None);
        assert_eq!(base64_decode("Z$=="), None);
        assert_eq!(base64_decode("Zg="), None);
    }

    #[test]
    fn an_empty_file_turns_nothing_on() {
        let c = parse(Path::new("w.yml"), "\n").expect("empty is valid");
        assert!(c.tls.is_none() && c.auth.is_noop());
        assert_eq!(c.describe(), "TLS off, basic auth off");
    }

    #[tokio::test]
    async fn a_verified_password_is_remembered_and_a_wrong_one_is_not() {
        let hash = bcrypt::hash("s3cret", 8).expect("hash");
        let c = parse(
            Path::new("w.yml"),
            &format!("basic_auth_users:\n  prometheus: \"{hash}\"\n"),
        )
        .expect("valid");
        assert!(c.auth.check("prometheus", "s3cret").await);
        assert_eq!(c.auth.verified.lock().expect("lock").len(), 1);
        assert!(!c.auth.check("prometheus", "s3cret ").await);
        assert!(!c.auth.check("nobody", "s3cret").await);
        assert_eq!(c.auth.verified.lock().expect("lock").len(), 1);
    }
}
