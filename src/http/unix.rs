//! The HTTP API on a Unix socket (`[api] socket`): the same routes as TCP, for local tools and
//! for nodes where the API should not be on the network at all. Every request carries the
//! peer's uid from SO_PEERCRED (see `api::SocketPeer`). Connections are few and local: a cap of
//! 64 at once, at most 8 of them per user, and hyper's header timeout. Root and the agent's own
//! user are not held to the per-user budget and have 8 more slots of their own, so that no other
//! user's idle connections can lock the operator out.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::api::SocketPeer;

const MAX_CONNECTIONS: usize = 64;
/// Connections one user other than root and the agent's own may hold at once.
const PER_UID: usize = 8;
/// Slots beyond [`MAX_CONNECTIONS`] that only root and the agent's own user may take.
const RESERVED: usize = 8;

/// Who holds how many connections; [`Slot`]s give theirs back when dropped.
#[derive(Default)]
struct Slots {
    state: std::sync::Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    shared: usize,
    reserved: usize,
    by_uid: std::collections::HashMap<u32, usize>,
}

/// One admitted connection.
struct Slot {
    slots: Arc<Slots>,
    uid: u32,
    reserved: bool,
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A slot for `uid`, if its budget and the pools allow one.
    fn admit(self: &Arc<Self>, uid: u32, privileged: bool) -> Option<Slot> {
        let mut s = self.lock();
        let held = s.by_uid.get(&uid).copied().unwrap_or(0);
        let reserved = if s.shared < MAX_CONNECTIONS && (privileged || held < PER_UID) {
            s.shared += 1;
            false
        } else if privileged && s.reserved < RESERVED {
            s.reserved += 1;
            true
        } else {
            return None;
        };
        *s.by_uid.entry(uid).or_default() += 1;
        Some(Slot {
            slots: self.clone(),
            uid,
            reserved,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.slots.lock();
        if self.reserved {
            s.reserved = s.reserved.saturating_sub(1);
        } else {
            s.shared = s.shared.saturating_sub(1);
        }
        if let Some(n) = s.by_uid.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.by_uid.remove(&self.uid);
            }
        }
    }
}

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
    let slots = Arc::new(Slots::default());
    let own = nix::unistd::geteuid().as_raw();
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let Ok(cred) = stream.peer_cred() else { continue };
                let uid = cred.uid();
                let Some(permit) = slots.admit(uid, uid == 0 || uid == own) else {
                    continue; // dropped: the client sees the connection closed
                };
                let peer = SocketPeer { uid };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_user_cannot_take_every_slot_and_root_keeps_its_own() {
        let slots = Arc::new(Slots::default());
        let mine: Vec<Slot> = (0..PER_UID)
            .filter_map(|_| slots.admit(1000, false))
            .collect();
        assert_eq!(mine.len(), PER_UID);
        assert!(
            slots.admit(1000, false).is_none(),
            "over the per-user budget"
        );
        // Many users fill the shared pool; root still gets in, up to its reserve.
        let others: Vec<Slot> = (0..MAX_CONNECTIONS)
            .filter_map(|i| slots.admit(2000 + (i / PER_UID) as u32, false))
            .collect();
        assert_eq!(others.len() + mine.len(), MAX_CONNECTIONS);
        let root: Vec<Slot> = (0..RESERVED).filter_map(|_| slots.admit(0, true)).collect();
        assert_eq!(root.len(), RESERVED);
        assert!(slots.admit(0, true).is_none());
        drop(mine);
        assert!(slots.admit(1000, false).is_some(), "slots come back");
    }
}
