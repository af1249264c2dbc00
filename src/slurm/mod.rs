//! `[slurm]`: drain this node in Slurm when a GPU's verdict becomes fail, resume it when every
//! GPU passes or warns again, and only ever undo a drain the agent made itself.
//!
//! - [`scontrol`]: running `scontrol` (no shell, a timeout per call) and reading its answer;
//! - [`change`]: a drain or resume as a change the owner of changes runs;
//! - [`drain`]: the typed change (`Request::Drain{reason}`, `Request::Resume`) and its
//!   executor, which reads the node first, audits, then acts;
//! - [`task`]: the actor that turns publications into requests, off the poller's thread, with
//!   retries and backoff, and its series.
//!
//! Must not: block the poller (it only reads publications), change a node an admin drained
//! (the reason prefix [`REASON_PREFIX`] tells our drains apart), or act without its audit record.

pub mod change;
pub mod drain;
pub mod scontrol;
pub mod task;

use crate::health::{NodeHealth, Status};

pub use crate::config::slurm::{SlurmConfig, CALL_TIMEOUT, MAX_REASON_BYTES, REASON_PREFIX};

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
    // A GPU lost before its UUID was read has none: no empty field (two spaces) in its place.
    let uuid = if gpu.uuid.trim().is_empty() {
        String::new()
    } else {
        format!(" {}", gpu.uuid.trim())
    };
    let reason = format!(
        "{REASON_PREFIX} GPU {}{uuid} {} ({})",
        gpu.index,
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
