//! The HTTP API on a Unix socket (`[api] socket`): the same routes as TCP, for local tools and
//! for nodes where the API should not be on the network at all. Every request carries the
//! peer's uid from SO_PEERCRED (see `api::SocketPeer`). Connections are few and local: a cap of
//! 64 at once and hyper's header timeout are the only limits.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::UnixListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::api::SocketPeer;

const MAX_CONNECTIONS: usize = 64;

/// Binds `path` with `mode`: a stale socket left by a crash is replaced, a live one (another
/// agent answers on it) or anything that is not a socket is an error naming the path.
pub fn bind(path: &Path, mode: u32) -> io::Result<UnixListener> {
    let named =
        |e: io::Error| io::Error::new(e.kind(), format!("API socket {}: {e}", path.display()));
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(named(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "another process answers on it; is a second agent running?",
                )));
            }
            std::fs::remove_file(path).map_err(named)?;
        }
        Ok(_) => {
            return Err(named(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "exists and is not a socket; remove it or pick another [api] socket",
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(named(e)),
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(named)?;
    }
    let listener = UnixListener::bind(path).map_err(named)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(named)?;
    Ok(listener)
}

/// Serves `app` on `listener` until `stop`, then removes the socket file.
pub async fn serve(
    listener: UnixListener,
    path: PathBuf,
    app: Router,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(super::server::MAX_HEAD_BYTES);
    let builder = Arc::new(builder);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    continue; // dropped: the client sees the connection closed
                };
                let Ok(cred) = stream.peer_cred() else { continue };
                let peer = SocketPeer { uid: cred.uid() };
                let service = TowerToHyperService::new(app.clone().layer(axum::Extension(peer)));
                let builder = builder.clone();
                tasks.spawn(async move {
                    let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                    drop(permit);
                });
            }
            Some(_) = tasks.join_next() => {}
            _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
        }
    }
    drop(listener);
    let _ = std::fs::remove_file(&path);
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
}
