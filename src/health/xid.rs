//! XID occurrences of one GPU over time: how many times each XID was seen within the window, and
//! the conditions that follows from it (catalog verdict, config override, escalation on repeats).
//!
//! The poller's snapshot carries cumulative counts per XID; this module turns successive counts
//! into timestamped occurrences, so it never double-counts an XID that stays in the snapshot and
//! forgets occurrences older than the longest window it serves.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime};

use super::catalog::{self, Verdict};
use super::conditions::Finding;
use super::{HealthConfig, Status};
use crate::snapshot::XidStat;

/// More occurrences than this from one poll are recorded as this many: the window only needs
/// to know "at least the escalation threshold", and memory stays bounded.
const MAX_PER_POLL: u64 = 1000;

/// A new occurrence of an XID, found by comparing cumulative counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewXid {
    pub xid: u64,
    /// How many arrived since the previous poll.
    pub count: u64,
    pub at: SystemTime,
}

#[derive(Debug, Default, Clone)]
pub struct XidHistory {
    /// Cumulative counts as of the previous snapshot.
    seen: BTreeMap<u64, u64>,
    /// (xid, when), oldest first.
    occurrences: VecDeque<(u64, SystemTime)>,
}

impl XidHistory {
    /// Records what is new in the snapshot's cumulative counts. The poller keeps them per UUID
    /// for as long as the evaluator keeps this history, so they only grow; a count below the
    /// previous one could only come from a counter that started over, whose whole count is new.
    pub fn ingest(&mut self, xids: &BTreeMap<u64, XidStat>) -> Vec<NewXid> {
        let mut new = Vec::new();
        for (xid, stat) in xids {
            let before = self.seen.get(xid).copied().unwrap_or(0);
            let count = if stat.count >= before {
                stat.count - before
            } else {
                stat.count
            };
            if count > 0 {
                for _ in 0..count.min(MAX_PER_POLL) {
                    self.occurrences.push_back((*xid, stat.last_seen));
                }
                new.push(NewXid {
                    xid: *xid,
                    count,
                    at: stat.last_seen,
                });
            }
        }
        self.seen = xids.iter().map(|(x, s)| (*x, s.count)).collect();
        new
    }

    /// Forgets occurrences older than `keep`.
    pub fn prune(&mut self, now: SystemTime, keep: Duration) {
        while let Some((_, at)) = self.occurrences.front() {
            if within(*at, now, keep) {
                break;
            }
            self.occurrences.pop_front();
        }
    }

    /// Occurrences per XID within `window` of `now`.
    pub fn counts(&self, now: SystemTime, window: Duration) -> BTreeMap<u64, u64> {
        let mut out = BTreeMap::new();
        for (xid, at) in &self.occurrences {
            if within(*at, now, window) {
                *out.entry(*xid).or_insert(0) += 1;
            }
        }
        out
    }

    /// One condition per XID seen within `xid_window` that the catalog or config does not
    /// ignore; `xid_escalate_after` occurrences escalate it one level.
    pub fn findings(&self, now: SystemTime, config: &HealthConfig) -> Vec<Finding> {
        let window = humantime::format_duration(config.xid_window);
        self.counts(now, config.xid_window)
            .into_iter()
            .filter_map(|(xid, n)| {
                let Verdict::Raise { severity, action } =
                    catalog::verdict(xid, &config.xid_overrides)
                else {
                    return None;
                };
                let (mnemonic, description) = catalog::describe(xid);
                let mut reason = format!(
                    "XID {xid} ({mnemonic}: {description}) seen {n} time(s) in the last {window}"
                );
                let escalate = config.xid_escalate_after > 0
                    && n >= u64::from(config.xid_escalate_after)
                    && severity != Status::Pass;
                let (severity, action) = if escalate {
                    reason.push_str(&format!(
                        "; repeated at least {} times, so escalated",
                        config.xid_escalate_after
                    ));
                    (Status::Fail, action.escalate())
                } else {
                    (severity, action)
                };
                Some(Finding {
                    name: format!("xid_{xid}"),
                    severity,
                    reason,
                    action,
                })
            })
            .collect()
    }
}

/// True when `at` is less than `window` before `now` (or after it: clocks step).
fn within(at: SystemTime, now: SystemTime, window: Duration) -> bool {
    now.duration_since(at).map_or(true, |age| age < window)
}
