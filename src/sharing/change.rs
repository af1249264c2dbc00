//! A sharing apply as a change: observe → diff → apply on the owner's NVML session, each step
//! recorded by [`crate::sharing::apply`] through the owner's audit writer.
//!
//! Must not: change anything when the audit log cannot be opened (a dry run may go on: it
//! changes nothing and records nothing), or without the node lock: the CLI's apply and the
//! daemon's (and a MIG apply) never change the GPUs at once.

use super::apply::{self, Report};
use std::time::Duration;

use crate::changes::{Acting, Change, OnWait};
use crate::config::sharing::SharingConfig;

/// How long an apply waits for the node lock when another apply holds it (the API waits for
/// none: it answers 409 at once): the MIG applies' wait.
pub const LOCK_WAIT: Duration = crate::mig::intent::LOCK_WAIT;

/// Make the node's compute modes and time-slices what `config` says.
pub struct SharingApply {
    pub config: SharingConfig,
    pub dry_run: bool,
    /// Who asked, on every audit record: `start`, `sighup`, `api`, `cli`.
    pub trigger: &'static str,
    /// How long to wait for another applier's node lock.
    pub wait: Duration,
    /// Told once, with the holder's pid when known, when the wait starts.
    pub on_wait: OnWait,
}

impl SharingApply {
    /// An apply by the daemon: the API answers at once (busy), the start and a reload wait for
    /// another applier, saying so in the log.
    pub fn daemon(config: SharingConfig, dry_run: bool, trigger: &'static str) -> Self {
        SharingApply {
            config,
            dry_run,
            trigger,
            wait: if trigger == "api" {
                Duration::ZERO
            } else {
                LOCK_WAIT
            },
            on_wait: Box::new(move |pid| {
                tracing::warn!(pid = ?pid, trigger, "sharing: waiting for another apply to release the node lock (at most {} s)", LOCK_WAIT.as_secs());
            }),
        }
    }
}

impl Change for SharingApply {
    const LANE: crate::changes::Lane = crate::changes::Lane::Sharing;
    type Outcome = Report;

    fn act(self, node: &Acting<'_>) -> Report {
        let (trigger, dry_run) = (self.trigger, self.dry_run);
        // A dry run records nothing, so it opens (or creates) no audit log.
        let audit = if dry_run {
            None
        } else {
            match node.audit_log() {
                Ok(a) => Some(a),
                Err(e) => {
                    return Report::audit_failed(
                        trigger,
                        false,
                        format!("{e}; nothing was changed"),
                    )
                }
            }
        };
        // A dry run changes nothing, so it waits for nobody.
        let _lock = if dry_run {
            None
        } else {
            match node.node_lock(self.wait, self.on_wait) {
                Ok(l) => Some(l),
                Err(e) => return Report::busy(trigger, e),
            }
        };
        let nvml = match node.nvml() {
            Ok(n) => n,
            Err(e) => return Report::failed(trigger, dry_run, e),
        };
        apply::run(
            &self.config,
            nvml.session(),
            audit.as_ref(),
            dry_run,
            trigger,
        )
    }

    /// Whatever was changed (made, or made and undone) shows at the next poll.
    fn touched(report: &Report) -> bool {
        !report.dry_run && !report.steps.is_empty()
    }
}
