//! A sharing apply as a change: observe → diff → apply on the owner's NVML session, each step
//! recorded by [`crate::sharing::apply`] through the owner's audit writer.
//!
//! Must not: change anything when the audit log cannot be opened (a dry run may go on: it
//! changes nothing and records nothing).

use super::{Acting, Change};
use crate::config::sharing::SharingConfig;
use crate::sharing::apply::{self, Report};

/// Make the node's compute modes and time-slices what `config` says.
#[derive(Debug, Clone)]
pub struct SharingApply {
    pub config: SharingConfig,
    pub dry_run: bool,
    /// Who asked, on every audit record: `start`, `sighup`, `api`, `cli`.
    pub trigger: &'static str,
}

impl Change for SharingApply {
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
