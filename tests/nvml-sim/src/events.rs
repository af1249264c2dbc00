//! Event delivery bookkeeping for one event set, kept pure so it can be unit tested: which GPUs
//! the set is registered on (with which `nvmlEventType*` mask), and which scenario event ids it
//! has already received. Every `[[gpu.event]]` id is delivered exactly once to every set
//! registered for XID events on that GPU, including ids that a rewritten scenario adds later.

use std::collections::{BTreeMap, BTreeSet};

use crate::resolve::Gpu;

/// `nvmlEventTypeXidCriticalError`.
pub const XID_CRITICAL_ERROR: u64 = 0x8;

/// What one `nvmlEventSet_t` has been told and has seen.
#[derive(Debug, Default, Clone)]
pub struct EventSet {
    registered: BTreeMap<u32, u64>,
    delivered: BTreeSet<(u32, u64)>,
}

impl EventSet {
    /// Adds `mask` to the event types this set receives from GPU `gpu`.
    pub fn register(&mut self, gpu: u32, mask: u64) {
        *self.registered.entry(gpu).or_insert(0) |= mask;
    }

    /// The next undelivered XID event `(gpu index, xid)` for this set, marked as delivered.
    /// GPUs are visited in index order and events in scenario order. Lost GPUs still deliver:
    /// that is how an XID 79 reaches a set registered before the GPU fell off the bus.
    pub fn next(&mut self, gpus: &[Gpu]) -> Option<(u32, u64)> {
        for gpu in gpus {
            let mask = self.registered.get(&gpu.index).copied().unwrap_or(0);
            if mask & XID_CRITICAL_ERROR == 0 {
                continue;
            }
            for ev in &gpu.events {
                if self.delivered.insert((gpu.index, ev.id)) {
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
        let mut a = EventSet::default();
        assert_eq!(a.next(&g), None, "nothing registered");
        a.register(0, XID_CRITICAL_ERROR);
        assert_eq!(a.next(&g), Some((0, 79)));
        assert_eq!(a.next(&g), Some((0, 48)));
        assert_eq!(a.next(&g), None, "GPU 1 not registered");
        a.register(1, 0x4); // PState only: no XIDs
        assert_eq!(a.next(&g), None);
        a.register(1, XID_CRITICAL_ERROR);
        assert_eq!(a.next(&g), Some((1, 13)));
        assert_eq!(a.next(&g), None);

        let mut b = EventSet::default();
        b.register(0, XID_CRITICAL_ERROR);
        assert_eq!(b.next(&g), Some((0, 79)), "a second set gets its own copy");
    }

    #[test]
    fn ids_added_by_a_rewrite_are_delivered_old_ones_are_not() {
        let mut a = EventSet::default();
        a.register(0, XID_CRITICAL_ERROR);
        let g = gpus(TWO);
        while a.next(&g).is_some() {}
        let rewritten = TWO.replace(
            "id = 2\nxid = 48",
            "id = 2\nxid = 48\n[[gpu.event]]\nid = 7\nxid = 94",
        );
        assert_eq!(a.next(&gpus(&rewritten)), Some((0, 94)));
        assert_eq!(a.next(&gpus(&rewritten)), None);
    }
}
