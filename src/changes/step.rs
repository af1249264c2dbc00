//! The changes the acting subsystems make with their own means (a reclaim signal or hook, a
//! remediation hook or built-in action, a memory-guard signal): the subsystem decides and says
//! what to record; the owner writes that record first, and only then lends the means to act
//! ([`Begun::act`]), records the outcome the act returns, and wakes the poller when the act
//! says it touched the node.
//!
//! The decision's record and the act may be apart in time: a reclaim decision is recorded
//! when the ladder takes it (the ladder must know at once whether it may go on) and its
//! signals are sent on a thread of their own. [`Begun`] is the proof, moved to that thread,
//! that the record is on disk.
//!
//! Must not: act before [`Owner::begin`] returned, or record through anything but the owner.

use std::sync::Arc;

use super::{Acting, AuditFailed, Owner};
use crate::audit::Event;

/// What an act returns: its typed result, the record of its outcome, and whether it touched
/// the node (signals sent, a setting written, a hook run).
#[derive(Debug)]
pub struct Done<T> {
    pub value: T,
    pub after: Option<Event>,
    pub touched: bool,
}

/// A decision on record: the right to act on it, once.
#[must_use = "a decision on record is acted on (or dropped: nothing is done)"]
pub struct Begun {
    owner: Arc<Owner>,
    component: &'static str,
}

impl std::fmt::Debug for Begun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Begun")
            .field("component", &self.component)
            .finish_non_exhaustive()
    }
}

impl Owner {
    /// Writes the decision's record; the right to act on it, or why not (nothing may be done).
    pub fn begin(self: &Arc<Self>, decision: impl Into<Event>) -> Result<Begun, AuditFailed> {
        let decision = decision.into();
        let component = decision.component();
        self.record(decision)?;
        Ok(Begun {
            owner: self.clone(),
            component,
        })
    }
}

impl Begun {
    /// Acts with the owner's means, records the outcome the act returns (a record that
    /// cannot be written is logged and counted by the audit log: the act is done), and wakes
    /// the poller when the act touched the node.
    pub fn act<T>(self, f: impl FnOnce(&Acting<'_>) -> Done<T>) -> T {
        let owner = &self.owner;
        let done = f(&Acting { owner });
        if let Some(r) = done.after {
            if let Err(e) = owner.record(r) {
                tracing::error!(error = %e, component = self.component, "cannot record the outcome of a change");
            }
        }
        if done.touched {
            owner.wake();
        }
        done.value
    }
}
