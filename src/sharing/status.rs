//! The sharing status published for metrics: the sending handle the actors of `sharing/` (the
//! applier's service, the device plugin, the memory guard) write through, and the receiving
//! end the poller reads. Below those actors so that they share it without importing one
//! another; it must not import any of them.

use std::sync::Arc;

use tokio::sync::watch;

use crate::snapshot::SharingStatus;

/// The writing end: each actor holds a clone and changes only its own fields.
#[derive(Debug, Clone)]
pub struct StatusSink(watch::Sender<Arc<SharingStatus>>);

impl StatusSink {
    /// A sink publishing the default (empty) status.
    pub fn new() -> Self {
        StatusSink(watch::channel(Arc::new(SharingStatus::default())).0)
    }

    /// Changes the published status.
    pub fn update(&self, f: impl FnOnce(&mut SharingStatus)) {
        self.0.send_modify(|s| f(Arc::make_mut(s)));
    }

    /// The status as last published.
    pub fn latest(&self) -> Arc<SharingStatus> {
        self.0.borrow().clone()
    }

    /// A receiving end for the poller.
    pub fn feed(&self) -> SharingFeed {
        crate::snapshot::Feed(self.0.subscribe())
    }
}

impl Default for StatusSink {
    fn default() -> Self {
        Self::new()
    }
}

/// The receiving end of the status channel, comparable so that `PollerConfig` stays `Eq`.
pub type SharingFeed = crate::snapshot::Feed<SharingStatus>;
