//! XID intake of the poller: what the watcher thread reports is counted into the board whose
//! UUID it carries, and GPUs that become reachable are registered on the session's one event set.

use super::Poller;
use crate::gpu::{Session, XidEvent};
use crate::snapshot::{GpuSnapshot, GpuStatus};

impl Poller {
    /// Counts the watcher's events into the board they carry the UUID of (not an index: a
    /// queued event may predate a re-enumeration or a new session).
    pub(super) fn drain_xids(&mut self) {
        while let Ok(event) = self.xid_rx.try_recv() {
            match event {
                XidEvent::Xid {
                    uuid: Some(uuid),
                    index,
                    xid,
                    at,
                } => {
                    tracing::warn!(gpu = ?index, %uuid, xid, "XID event");
                    self.gpus.record_xid(&uuid, xid, at);
                }
                XidEvent::Xid {
                    uuid: None, xid, ..
                } => {
                    tracing::warn!(
                        xid,
                        "XID event from a GPU that cannot be identified; not counted"
                    );
                }
                XidEvent::Error { function, code } => self.count_error(function, &code),
            }
        }
    }

    /// Starts the session's XID watcher, and asks it to register every reachable GPU it has not
    /// settled yet (a GPU added, or reachable again). A GPU that became lost stays registered:
    /// the set still delivers its last XID (79).
    pub(super) fn register_xids(&mut self, session: &Session, gpus: &[GpuSnapshot]) {
        let watcher = self
            .watcher
            .get_or_insert_with(|| session.watch_xids(self.xid_tx.clone()));
        if watcher.busy() {
            return;
        }
        let settled = watcher.coverage().settled;
        let missing: Vec<u32> = gpus
            .iter()
            .filter(|g| g.status == GpuStatus::Up)
            .filter(|g| {
                g.identity
                    .as_ref()
                    .is_some_and(|i| !settled.contains(&i.uuid))
            })
            .map(|g| g.index)
            .collect();
        if !missing.is_empty() {
            watcher.register(missing);
        }
    }
}
