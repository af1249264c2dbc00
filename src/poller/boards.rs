//! What accumulates about a GPU board (a UUID) since the agent started: XID counts, the last
//! XID, processes left out by the cap. It follows the board, not its index, and survives
//! re-enumeration and NVML re-initialisation, so these counters never go down for a GPU whose
//! UUID is unchanged. A board missing from the enumeration is forgotten after
//! [`FORGET_ABSENT_GPU_AFTER_POLLS`] polls (see there).

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use crate::snapshot::{XidStat, FORGET_ABSENT_GPU_AFTER_POLLS};

/// What accumulates about one board (UUID) since the agent started.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Board {
    pub xids: BTreeMap<u64, XidStat>,
    pub last_xid: Option<u64>,
    /// Processes left out by `[processes] max_per_gpu`.
    pub processes_dropped: u64,
    /// Consecutive polls (with NVML up) in which the board was not enumerated.
    absent_polls: u32,
}

#[derive(Default)]
pub(super) struct Boards {
    boards: BTreeMap<String, Board>,
}

impl Boards {
    /// The accumulated state of the board with `uuid` (created empty when first seen).
    pub fn board(&mut self, uuid: &str) -> &mut Board {
        self.boards.entry(uuid.to_string()).or_default()
    }

    /// Counts one XID on the board with `uuid`, whatever its index is now.
    pub fn record_xid(&mut self, uuid: &str, xid: u64, at: SystemTime) {
        let board = self.board(uuid);
        let stat = board.xids.entry(xid).or_insert(XidStat {
            count: 0,
            last_seen: at,
        });
        stat.count += 1;
        stat.last_seen = at;
        board.last_xid = Some(xid);
    }

    /// Ends a poll that enumerated the boards in `present`: forgets boards missing for more
    /// than [`FORGET_ABSENT_GPU_AFTER_POLLS`] polls.
    pub fn end_poll(&mut self, present: &BTreeSet<&str>) {
        self.boards.retain(|uuid, board| {
            if present.contains(uuid.as_str()) {
                board.absent_polls = 0;
                return true;
            }
            board.absent_polls = board.absent_polls.saturating_add(1);
            board.absent_polls <= FORGET_ABSENT_GPU_AFTER_POLLS
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs)
    }

    #[test]
    fn counts_follow_the_board_whatever_its_index() {
        let mut s = Boards::default();
        s.record_xid("GPU-b", 48, at(1));
        s.board("GPU-b").processes_dropped = 2;
        s.end_poll(&BTreeSet::from(["GPU-b"]));
        let b = s.board("GPU-b");
        assert_eq!(b.xids[&48].count, 1, "never reset while the UUID stays");
        assert_eq!((b.last_xid, b.processes_dropped), (Some(48), 2));
        s.record_xid("GPU-b", 48, at(2));
        assert_eq!(s.board("GPU-b").xids[&48].count, 2);
    }

    #[test]
    fn a_missing_board_is_kept_for_a_while_then_forgotten() {
        let mut s = Boards::default();
        s.record_xid("GPU-gone", 79, at(1));
        let none = BTreeSet::new();
        for _ in 0..FORGET_ABSENT_GPU_AFTER_POLLS {
            s.end_poll(&none);
        }
        assert_eq!(s.board("GPU-gone").xids[&79].count, 1, "kept");
        s.end_poll(&BTreeSet::from(["GPU-gone"]));
        for _ in 0..FORGET_ABSENT_GPU_AFTER_POLLS {
            s.end_poll(&none);
        }
        assert!(
            !s.board("GPU-gone").xids.is_empty(),
            "back once: counting again"
        );
        s.end_poll(&none);
        assert_eq!(s.board("GPU-gone"), &Board::default(), "forgotten");
    }
}
