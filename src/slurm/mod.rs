//! `[slurm]`: drain this node in Slurm when a GPU's verdict becomes fail, resume it when every
//! GPU passes or warns again, and only ever undo a drain the agent made itself.
//!
//! - [`scontrol`]: running `scontrol` (no shell, a timeout per call) and reading its answer;
//! - [`drain`]: the typed change (`Request::Drain{reason}`, `Request::Resume`) and its
//!   executor, which reads the node first, audits, then acts;
//! - [`task`]: the actor that turns publications into requests, off the poller's thread, with
//!   retries and backoff, and its series.
//!
//! Must not: block the poller (it only reads publications), change a node an admin drained
//! (the reason prefix [`REASON_PREFIX`] tells our drains apart), or act without its audit record.

pub mod drain;
pub mod scontrol;
pub mod task;

use std::time::Duration;

use serde::Deserialize;

use crate::health::{NodeHealth, Status};

/// Every reason the agent writes starts with this; only such drains are resumed.
pub const REASON_PREFIX: &str = "gpu-steward:";

/// The longest reason written, in bytes: slurmdbd keeps node reasons in a MySQL `tinytext`
/// column (`event_table.reason`, 255 bytes); slurmctld itself has no limit, so a longer reason
/// would be cut in the accounting history only.
pub const MAX_REASON_BYTES: usize = 255;

/// How long one `scontrol` call may take before its process group is killed: Slurm's default
/// `MessageTimeout` (10 s).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// `[slurm]` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmSection {
    pub drain: bool,
    pub node_name: String,
    pub scontrol: Option<String>,
}

/// `[slurm]` as the agent uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmConfig {
    pub drain: bool,
    /// The node's name in Slurm; empty: the short host name.
    pub node_name: String,
    /// The `scontrol` program: a path, or a name looked up in `PATH`.
    pub scontrol: String,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmSection::default().into_config()
    }
}

impl SlurmSection {
    pub fn into_config(self) -> SlurmConfig {
        SlurmConfig {
            drain: self.drain,
            node_name: self.node_name,
            scontrol: self
                .scontrol
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "scontrol".into()),
        }
    }
}

impl SlurmConfig {
    /// The node name in force: the configured one, else the short host name.
    pub fn node(&self) -> String {
        if !self.node_name.is_empty() {
            return self.node_name.clone();
        }
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .map(|h| h.split('.').next().unwrap_or_default().to_string())
            .unwrap_or_default()
    }

    /// What `check-config` says about `[slurm]`.
    pub fn describe(&self) -> String {
        if !self.drain {
            return "slurm: off\n".to_string();
        }
        format!(
            "slurm: drain node '{node}' with `{sc} update NodeName={node} State=DRAIN \
             Reason=\"{REASON_PREFIX} GPU <i> <UUID> <condition> (<action>)\"` when a GPU fails; \
             resume it when every GPU passes or warns again, only if the drain is ours (reason \
             starting '{REASON_PREFIX}'); each call at most {t}\n",
            node = self.node(),
            sc = self.scontrol,
            t = humantime::format_duration(CALL_TIMEOUT),
        )
    }
}

/// The reason written for the first failing GPU's most drastic failing condition, or `None`
/// when no GPU fails (`Resume`).
pub fn failing_reason(h: &NodeHealth) -> Option<String> {
    let gpu = h.gpus.iter().find(|g| g.verdict.status == Status::Fail)?;
    let worst = gpu
        .verdict
        .conditions
        .iter()
        .filter(|c| c.severity == Status::Fail)
        .max_by_key(|c| c.action)?;
    let reason = format!(
        "{REASON_PREFIX} GPU {} {} {} ({})",
        gpu.index,
        gpu.uuid,
        worst.name,
        worst.action.as_str()
    );
    Some(cut(reason, MAX_REASON_BYTES))
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

#[cfg(test)]
mod tests;
