//! The change the Slurm component makes, as a typed request, and the one place that makes it:
//! read the node, decide whether the change is ours to make, write the audit record, act.
//!
//! Run as a change of the agent's single owner of changes ([`crate::changes`]), which lends
//! it the audit record (`record`).
//!
//! Must not: resume a node whose drain is not ours (the reason does not start with
//! [`super::REASON_PREFIX`]), drain over an admin's drain (that would replace their reason), or
//! call `scontrol update` without an audit record on disk. Blocking.

use super::scontrol::{Error, NodeState, Scontrol};
use super::REASON_PREFIX;
use crate::audit::event::{NodeChange, Slurm};
use crate::audit::{AuditFailed, Event};

/// The audit component of these records.
pub const COMPONENT: &str = "slurm";

/// What the agent asks of Slurm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Drain the node with this reason (it starts with [`REASON_PREFIX`]).
    Drain { reason: String },
    /// Resume the node, if the drain is ours.
    Resume,
}

/// What handling a request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// The node was drained (or resumed) by this call.
    Changed,
    /// Nothing to do: the node is already as asked.
    AlreadyThere,
    /// Someone else's drain is on the node: left as it is (their state and reason).
    NotOurs { reason: String },
}

/// Why a request was not carried out.
#[derive(Debug, thiserror::Error)]
pub enum Failed {
    #[error("{0}")]
    Scontrol(#[from] Error),
    #[error("the audit record of the Slurm {what} could not be written ({error}); the node is left as it is")]
    Audit { what: &'static str, error: String },
}

impl Failed {
    /// The series' `result` label.
    pub fn result(&self) -> &'static str {
        match self {
            Failed::Scontrol(e) => e.result,
            Failed::Audit { .. } => crate::audit::AUDIT_FAILED,
        }
    }
}

/// Carries out requests for one node.
#[derive(Debug, Clone)]
pub struct Drainer {
    pub scontrol: Scontrol,
    pub node: String,
}

/// Writes one audit record of the component (the change owner's writer).
pub type RecordFn<'a> = dyn Fn(Event) -> Result<(), AuditFailed> + 'a;

impl Drainer {
    /// Reads the node, then drains or resumes it if that is ours to do, auditing first.
    pub fn handle(
        &self,
        request: &Request,
        trigger: &str,
        record: &RecordFn<'_>,
    ) -> Result<Done, Failed> {
        let now = self.scontrol.show_node(&self.node)?;
        match request {
            Request::Drain { reason } => {
                if now.drained() {
                    return Ok(verdict_on_drained(&now));
                }
                self.audit(record, "drain", &now, Some(reason), trigger)?;
                self.scontrol.drain(&self.node, reason)?;
            }
            Request::Resume => {
                if !now.drained() {
                    return Ok(Done::AlreadyThere);
                }
                if !now.reason.starts_with(REASON_PREFIX) {
                    return Ok(Done::NotOurs {
                        reason: now.reason.clone(),
                    });
                }
                self.audit(record, "resume", &now, None, trigger)?;
                self.scontrol.resume(&self.node)?;
            }
        }
        Ok(Done::Changed)
    }

    fn audit(
        &self,
        record: &RecordFn<'_>,
        what: &'static str,
        now: &NodeState,
        reason: Option<&String>,
        trigger: &str,
    ) -> Result<(), Failed> {
        let change = NodeChange {
            node: self.node.clone(),
            reason: reason.cloned(),
            reason_before: now.reason.clone(),
            state_before: now.state.clone(),
            trigger: trigger.to_string(),
        };
        let event = match what {
            "drain" => Slurm::Drain(change),
            _ => Slurm::Resume(change),
        };
        record(Event::Slurm(event)).map_err(|e| Failed::Audit {
            what,
            error: e.to_string(),
        })
    }
}

/// A drained node asked to drain: ours already, or someone else's to keep.
fn verdict_on_drained(now: &NodeState) -> Done {
    if now.reason.starts_with(REASON_PREFIX) {
        Done::AlreadyThere
    } else {
        Done::NotOurs {
            reason: now.reason.clone(),
        }
    }
}
