//! Event delivery bookkeeping, kept pure so it can be unit tested: which GPUs a set is
//! registered on (with which `nvmlEventType*` mask), which scenario event ids existed when it
//! registered, and which ids it has received; plus, per library instance, which ids have been
//! delivered to any set at all.
//!
//! A real driver delivers an event only to the sets registered when it occurs. The simulator
//! models a scenario's events as "pending in the driver" until some set receives them, so an
//! `[[gpu.event]]` id reaches a set registered for XIDs on its GPU when either
//! - no set of this library instance has received it yet (it was pending), or
//! - a rewrite added it to the scenario after the set registered on that GPU (it occurred
//!   while the set was listening).
//!
//! Each set receives an id at most once; an id already delivered is not replayed to sets that
//! register later.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use crate::resolve::Gpu;

/// `nvmlEventTypeXidCriticalError`.
pub const XID_CRITICAL_ERROR: u64 = 0x8;
/// `nvmlEventTypeGpuRecoveryAction`: the driver's recommended recovery action changed; its
/// `eventData` is the action (`NVML_GPU_RECOVERY_ACTION_*`).
pub const GPU_RECOVERY_ACTION: u64 = 0x8000;

/// Event ids `(gpu index, id)` delivered to at least one set of this library instance.
pub type Delivered = BTreeSet<(u32, u64)>;

/// What one `nvmlEventSet_t` has been told and has seen.
#[derive(Debug, Default, Clone)]
pub struct EventSet {
    registered: BTreeMap<u32, u64>,
    /// Ids in the scenario when the set registered for XIDs on their GPU.
    known_at_registration: BTreeSet<(u32, u64)>,
    delivered: BTreeSet<(u32, u64)>,
    /// The recovery action each GPU registered for `GPU_RECOVERY_ACTION` had when the set
    /// last looked: a change to another action (not none) is an event.
    recovery_seen: BTreeMap<u32, u32>,
}

impl EventSet {
    /// Adds `mask` to the event types this set receives from `gpu`. The first registration
    /// that includes XIDs remembers which of the GPU's event ids already existed.
    pub fn register(&mut self, gpu: &Gpu, mask: u64) {
        let before = self.registered.get(&gpu.index).copied().unwrap_or(0);
        if before & XID_CRITICAL_ERROR == 0 && mask & XID_CRITICAL_ERROR != 0 {
            self.known_at_registration
                .extend(gpu.events.iter().map(|ev| (gpu.index, ev.id)));
        }
        if before & GPU_RECOVERY_ACTION == 0 && mask & GPU_RECOVERY_ACTION != 0 {
            self.recovery_seen.insert(gpu.index, gpu.recovery_action);
        }
        self.registered.insert(gpu.index, before | mask);
    }

    /// The next recovery-action event `(gpu index, action)` for this set: a GPU registered for
    /// it whose action changed since the set last looked, to one other than none. The action
    /// a GPU had when the set registered is not an event (it occurred before).
    pub fn next_recovery(&mut self, gpus: &[Gpu]) -> Option<(u32, u32)> {
        for gpu in gpus {
            let Some(seen) = self.recovery_seen.get_mut(&gpu.index) else {
                continue;
            };
            if *seen != gpu.recovery_action {
                *seen = gpu.recovery_action;
                if gpu.recovery_action != 0 {
                    return Some((gpu.index, gpu.recovery_action));
                }
            }
        }
        None
    }

    /// The next XID event `(gpu index, xid)` for this set, marked as delivered here and in
    /// `any`. GPUs are visited in index order and events in scenario order. Lost GPUs still
    /// deliver: that is how an XID 79 reaches a set registered before the GPU fell off the bus.
    pub fn next(&mut self, gpus: &[Gpu], any: &mut Delivered) -> Option<(u32, u64)> {
        for gpu in gpus {
            let mask = self.registered.get(&gpu.index).copied().unwrap_or(0);
            if mask & XID_CRITICAL_ERROR == 0 {
                continue;
            }
            for ev in &gpu.events {
                let key = (gpu.index, ev.id);
                let pending = !any.contains(&key);
                let after_registration = !self.known_at_registration.contains(&key);
                if (pending || after_registration) && self.delivered.insert(key) {
                    any.insert(key);
                    return Some((gpu.index, ev.xid));
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(text: &str) -> Vec<Gpu> {
        crate::scenario::parse(text).expect("valid scenario").gpus
    }

    const TWO: &str = r#"
version = 1
[[gpu]]
model = "H100-SXM5-80GB"
[[gpu.event]]
id = 1
xid = 79
[[gpu.event]]
id = 2
xid = 48
[[gpu]]
model = "H100-SXM5-80GB"
[[gpu.event]]
id = 1
xid = 13
"#;

    #[test]
    fn each_id_once_per_set_and_only_where_registered() {
        let g = gpus(TWO);
        let mut any = Delivered::new();
        let mut a = EventSet::default();
        assert_eq!(a.next(&g, &mut any), None, "nothing registered");
        a.register(&g[0], XID_CRITICAL_ERROR);
        assert_eq!(a.next(&g, &mut any), Some((0, 79)));
        assert_eq!(a.next(&g, &mut any), Some((0, 48)));
        assert_eq!(a.next(&g, &mut any), None, "GPU 1 not registered");
        a.register(&g[1], 0x4); // PState only: no XIDs
        assert_eq!(a.next(&g, &mut any), None);
        a.register(&g[1], XID_CRITICAL_ERROR);
        assert_eq!(
            a.next(&g, &mut any),
            Some((1, 13)),
            "still pending: delivered"
        );
        assert_eq!(a.next(&g, &mut any), None);
    }

    #[test]
    fn a_changed_recovery_action_is_one_event_for_sets_registered_for_it() {
        let g = gpus(TWO);
        let (mut a, mut xids_only) = (EventSet::default(), EventSet::default());
        a.register(&g[1], XID_CRITICAL_ERROR | GPU_RECOVERY_ACTION);
        xids_only.register(&g[1], XID_CRITICAL_ERROR);
        assert_eq!(a.next_recovery(&g), None, "none is no event");
        let imex = gpus(&TWO.replace(
            "xid = 48\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\n",
            "xid = 48\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nrecovery_action = \"recover_imex_domain\"\n",
        ));
        assert_eq!(imex[1].recovery_action, 5);
        assert_eq!(a.next_recovery(&imex), Some((1, 5)));
        assert_eq!(a.next_recovery(&imex), None, "once");
        assert_eq!(
            xids_only.next_recovery(&imex),
            None,
            "not registered for it"
        );
        let mut later = EventSet::default();
        later.register(&imex[1], GPU_RECOVERY_ACTION);
        assert_eq!(later.next_recovery(&imex), None, "it occurred before");
        assert_eq!(a.next_recovery(&g), None, "back to none: no event");
    }

    #[test]
    fn delivered_ids_are_not_replayed_to_sets_registered_later() {
        let g = gpus(TWO);
        let mut any = Delivered::new();
        let mut a = EventSet::default();
        a.register(&g[0], XID_CRITICAL_ERROR);
        assert_eq!(a.next(&g, &mut any), Some((0, 79)));
        let mut b = EventSet::default();
        b.register(&g[0], XID_CRITICAL_ERROR);
        assert_eq!(b.next(&g, &mut any), Some((0, 48)), "48 was still pending");
        assert_eq!(
            b.next(&g, &mut any),
            None,
            "79 happened before b registered"
        );
        assert_eq!(a.next(&g, &mut any), None, "48 went to b first");
    }

    #[test]
    fn ids_added_by_a_rewrite_reach_every_set_registered_before() {
        let g = gpus(TWO);
        let mut any = Delivered::new();
        let (mut a, mut b) = (EventSet::default(), EventSet::default());
        a.register(&g[0], XID_CRITICAL_ERROR);
        b.register(&g[0], XID_CRITICAL_ERROR);
        while a.next(&g, &mut any).is_some() {}
        assert_eq!(b.next(&g, &mut any), None, "a took the pending ones");
        let rewritten = gpus(&TWO.replace(
            "id = 2\nxid = 48",
            "id = 2\nxid = 48\n[[gpu.event]]\nid = 7\nxid = 94",
        ));
        assert_eq!(a.next(&rewritten, &mut any), Some((0, 94)));
        assert_eq!(a.next(&rewritten, &mut any), None);
        assert_eq!(
            b.next(&rewritten, &mut any),
            Some((0, 94)),
            "b listened too"
        );
        let mut c = EventSet::default();
        c.register(&rewritten[0], XID_CRITICAL_ERROR);
        assert_eq!(
            c.next(&rewritten, &mut any),
            None,
            "c registered after all of it"
        );
    }
}
