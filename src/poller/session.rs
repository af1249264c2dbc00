//! NVML session lifecycle of the poller: open the library (retrying with backoff while it is
//! missing), mark NVML down with the reason operators need, and shut it down in the right order
//! (the XID watcher before the session, so no thread uses NVML after shutdown).

use std::time::{Duration, SystemTime};

use super::Poller;
use crate::gpu::{CallLog, Session};
use crate::snapshot::NvmlStatus;

/// Backoff between NVML initialisation attempts: 1 s doubling to 30 s.
pub(super) fn backoff(attempts: u32) -> Duration {
    let secs = 1u64 << attempts.saturating_sub(1).min(5);
    Duration::from_secs(secs.min(30))
}

impl Poller {
    pub(super) fn ensure_session(&mut self, log: &mut CallLog, now: SystemTime) -> Option<Session> {
        if let Some(s) = &self.session {
            return Some(s.clone());
        }
        match Session::open(&self.config.nvml_lib) {
            Ok(session) => {
                log.begin("system");
                let driver = session.driver_info(log);
                tracing::info!(
                    library = %self.config.nvml_lib,
                    driver = %driver.driver_version,
                    "NVML initialised"
                );
                self.driver = Some(driver);
                self.nvml = NvmlStatus::Up;
                // Indices may name other boards in a new session; what boards accumulated stays.
                self.gpus.reenumerate(0);
                self.session = Some(session.clone());
                Some(session)
            }
            Err(e) => {
                *self.init_errors.entry(e.code.clone()).or_default() += 1;
                self.mark_down(e.reason, e.code, now);
                None
            }
        }
    }

    pub(super) fn mark_down(&mut self, reason: String, error: String, now: SystemTime) {
        let (since, attempts) = match &self.nvml {
            NvmlStatus::Down {
                since, attempts, ..
            } => (*since, attempts + 1),
            _ => (now, 1),
        };
        if attempts == 1 || matches!(&self.nvml, NvmlStatus::Down { reason: r, .. } if *r != reason)
        {
            tracing::error!(%reason, retry_in = ?backoff(attempts), "NVML unavailable; serving without GPU data and retrying");
        }
        self.nvml = NvmlStatus::Down {
            reason,
            error,
            since,
            attempts,
        };
    }

    /// Stops the XID watcher before the session so that no thread uses NVML after shutdown.
    /// Events it queued stay in the channel and are counted by UUID at the next poll.
    pub(super) fn shutdown_nvml(&mut self) {
        self.watcher = None;
        self.session = None;
        self.driver = None;
    }
}
