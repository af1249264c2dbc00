//! The mutating API (CONTRACT §3): routes that change the node are off unless `[api] enabled`,
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

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};

use super::AppState;

/// The longest token file read; a token is a line of text, not a document.
const MAX_TOKEN_FILE: u64 = 4096;

/// `[api]` as the HTTP layer needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    pub enabled: bool,
    pub token_file: PathBuf,
    /// false: mutating routes answer only on the Unix socket (`[api] tcp = false`).
    pub tcp: bool,
}

impl ApiConfig {
    pub fn disabled() -> Arc<ApiConfig> {
        Arc::new(ApiConfig {
            enabled: false,
            token_file: PathBuf::new(),
            tcp: true,
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

/// Reads and checks the token file: readable by the agent alone (no permission for other users;
/// group read only for the agent's own group), one non-empty line.
pub fn load_token(path: &Path) -> Result<Vec<u8>, String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("API token file {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("API token file {} is not a file", path.display()));
    }
    // Whoever owns the file can rewrite the token (and its mode): only root and the agent's
    // own user may.
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(format!(
            "API token file {} is owned by uid {}, neither root nor the agent's user (uid \
             {euid}): that user could change the token; the API stays off until it is fixed \
             (chown root {} or chown the agent's user)",
            path.display(),
            meta.uid(),
            path.display()
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    // Group read is fine when the group is the agent's own (root:gpu-steward 0640, the packaged
    // layout); any other group or other-user permission lets someone else use the API.
    let own_group = meta.gid() == nix::unistd::getegid().as_raw();
    let group_ok = mode & 0o070 == 0 || (mode & 0o070 == 0o040 && own_group);
    if mode & 0o007 != 0 || !group_ok {
        return Err(format!(
            "API token file {} has mode {mode:03o}: other users may read it; the API stays off \
             until it is fixed (chmod 600 {}, or 640 with the agent's own group)",
            path.display(),
            path.display()
        ));
    }
    if meta.len() > MAX_TOKEN_FILE {
        return Err(format!(
            "API token file {} is {} bytes; a token is one line (at most {MAX_TOKEN_FILE} bytes)",
            path.display(),
            meta.len()
        ));
    }
    let text =
        std::fs::read(path).map_err(|e| format!("API token file {}: {e}", path.display()))?;
    let token = text.trim_ascii();
    if token.is_empty() {
        return Err(format!(
            "API token file {} is empty; write a random token into it, e.g. \
             `openssl rand -hex 32 > {}`",
            path.display(),
            path.display()
        ));
    }
    Ok(token.to_vec())
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
        Some(p) if p.trusted() => return next.run(request).await,
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
        Some(_) => return next.run(request).await,
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
    use std::fs;

    #[test]
    fn equal_only_when_identical() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(!constant_time_eq(b"x\xff", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn a_token_file_others_can_read_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        fs::write(&path, "s3cret\n").expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = load_token(&path).expect_err("world readable");
        assert!(e.contains("mode 644") && e.contains("chmod 600"), "{e}");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o660)).expect("chmod");
        assert!(load_token(&path)
            .expect_err("group writable")
            .contains("mode 660"));
        // Created by this process: its group is the agent's own, so group read is allowed.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).expect("chmod");
        assert_eq!(load_token(&path).expect("own group"), b"s3cret");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_eq!(load_token(&path).expect("ok"), b"s3cret");
        fs::write(&path, " \n").expect("write");
        assert!(load_token(&path).expect_err("empty").contains("empty"));
        let e = load_token(&dir.path().join("missing")).expect_err("missing");
        assert!(e.contains("missing"), "{e}");
    }

    #[test]
    fn a_token_file_owned_by_another_user_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        fs::write(&path, "s3cret\n").expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
        let other = nix::unistd::Uid::from_raw(nix::unistd::geteuid().as_raw().max(1) + 4242);
        match nix::unistd::chown(&path, Some(other), None) {
            Ok(()) => {}
            // Only root can give a file away; as another user the case cannot be made here.
            Err(nix::errno::Errno::EPERM) => return,
            Err(e) => panic!("chown: {e}"),
        }
        let e = load_token(&path).expect_err("owned by another user");
        assert!(e.contains("owned by uid") && e.contains("chown"), "{e}");
    }
}
