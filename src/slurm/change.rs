//! A Slurm drain or resume as a change: [`crate::slurm::drain::Drainer`] reads the node and
//! decides whether the change is ours to make, then records it through the owner before it
//! calls `scontrol update`.
//!
//! Must not: call `scontrol update` unrecorded (the drainer gets no audit log, only the
//! owner's record).

use super::drain::{Done, Drainer, Failed, Request};
use crate::changes::{Acting, Change};

/// Drain or resume this node in Slurm.
#[derive(Debug, Clone)]
pub struct SlurmChange {
    pub drainer: Drainer,
    pub request: Request,
    /// What decided it, on the record (`gpu verdict`).
    pub trigger: &'static str,
}

impl Change for SlurmChange {
    const LANE: crate::changes::Lane = crate::changes::Lane::Slurm;
    type Outcome = Result<Done, Failed>;

    fn act(self, node: &Acting<'_>) -> Self::Outcome {
        let record = |event| node.record(event);
        self.drainer.handle(&self.request, self.trigger, &record)
    }

    /// A drained node is not something the poller reads: nothing to wake it for.
    fn touched(_: &Self::Outcome) -> bool {
        false
    }
}
