//! A bounded in-memory journal of health events (condition raised, escalated, changed, cleared;
//! XIDs observed), newest last, served newest first by `GET /api/v1/events`.
//!
//! The poller appends once per poll and the HTTP handler copies out what a request asks for;
//! both hold the lock only for that, so a slow client never stalls the poller. With a state
//! directory, each appended event is also written to [`super::journal_file`] (one short write,
//! no fsync: it answers "what happened lately", the logs keep the history), and what a previous
//! run wrote comes back at start, marked `before_restart`.

use std::collections::VecDeque;
use std::path::Path;
use std::time::SystemTime;

pub use super::event::{EventKind, HealthEvent};
use super::journal_file::{self, JournalFile};
use super::Status;

/// Entries kept; the oldest go first.
pub const CAPACITY: usize = 1024;

#[derive(Debug)]
pub struct Journal {
    entries: VecDeque<HealthEvent>,
    capacity: usize,
    /// The copy in the state directory, when there is one.
    file: Option<JournalFile>,
}

impl Default for Journal {
    fn default() -> Self {
        Journal::with_capacity(CAPACITY)
    }
}

impl Journal {
    pub fn with_capacity(capacity: usize) -> Self {
        Journal {
            entries: VecDeque::with_capacity(capacity.min(CAPACITY)),
            capacity: capacity.max(1),
            file: None,
        }
    }

    /// A journal that starts with `earlier` (read back from `file`, oldest first, already
    /// marked `before_restart`) and writes every appended event to `file`.
    pub fn persistent(file: JournalFile, earlier: Vec<HealthEvent>) -> Self {
        let mut j = Journal::default();
        j.append(earlier);
        j.file = Some(file);
        j
    }

    pub fn append(&mut self, events: impl IntoIterator<Item = HealthEvent>) {
        for e in events {
            if let Some(f) = &mut self.file {
                f.write(&e);
            }
            if self.entries.len() == self.capacity {
                self.entries.pop_front();
            }
            self.entries.push_back(e);
        }
    }

    /// Events at or after `since` (all when `None`), newest first.
    pub fn since(&self, since: Option<SystemTime>) -> Vec<HealthEvent> {
        self.entries
            .iter()
            .rev()
            .filter(|e| since.is_none_or(|s| e.time >= s))
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Logs a condition change once, where it happens: warn for anything that fails, info otherwise.
/// XID observations are not logged here (the poller logs each XID as it arrives).
pub fn log(e: &HealthEvent) {
    let (kind, condition, action) = (e.kind.as_str(), e.condition.as_str(), e.action.as_str());
    match e.kind {
        EventKind::Observed => {}
        _ if e.severity == Status::Fail => tracing::warn!(
            gpu = e.gpu, uuid = %e.uuid, condition, kind, severity = "fail", action,
            reason = %e.reason, "GPU health condition {kind}"
        ),
        _ => tracing::info!(
            gpu = e.gpu, uuid = %e.uuid, condition, kind, severity = e.severity.as_str(), action,
            reason = %e.reason, "GPU health condition {kind}"
        ),
    }
}

/// Parses `?since=`: RFC 3339 (`2026-01-02T03:04:05Z`) or Unix seconds (`1767322245`, `.5`
/// fractions allowed).
pub fn parse_since(s: &str) -> Result<SystemTime, String> {
    // The value comes from an unauthenticated query: quoted bounded and escaped.
    let shown = |s: &str| crate::terminal::excerpt(s, 64);
    if let Ok(secs) = s.parse::<f64>() {
        // try_from_secs_f64 and checked_add, not their panicking forms: the value comes from an
        // unauthenticated query string (`?since=1e20` must be a 400, not a dead handler).
        return std::time::Duration::try_from_secs_f64(secs)
            .ok()
            .and_then(|d| SystemTime::UNIX_EPOCH.checked_add(d))
            .ok_or_else(|| {
                format!(
                    "invalid since '{}': Unix seconds must be a non-negative number within the \
                     range of dates, e.g. '1767322245'",
                    shown(s)
                )
            });
    }
    humantime::parse_rfc3339_weak(s).map_err(|e| {
        format!(
            "invalid since '{}': {e}; use RFC 3339 (e.g. '2026-01-02T03:04:05Z') or Unix \
             seconds (e.g. '1767322245')",
            shown(s)
        )
    })
}

/// The journal for the daemon: read back from `dir` when given, writing there from now on.
/// Problems are logged and set as the `journal` agent warning; none stops the start.
pub fn open(dir: Option<&Path>) -> Journal {
    let Some(dir) = dir else {
        tracing::info!("no state directory (set STATE_DIRECTORY or create /var/lib/gpu-steward): the health journal is kept in memory only");
        return Journal::default();
    };
    let (journal, problems) = open_in(dir);
    for p in &problems {
        tracing::warn!("{p}");
    }
    crate::warnings::set(
        journal_file::COMPONENT,
        (!problems.is_empty()).then(|| problems.join("; ")),
    );
    journal
}

/// [`open`] without logging: the journal and what went wrong.
pub fn open_in(dir: &Path) -> (Journal, Vec<String>) {
    match journal_file::load(dir) {
        (Some(file), earlier, problems) => (Journal::persistent(file, earlier), problems),
        (None, earlier, problems) => {
            let mut j = Journal::default();
            j.append(earlier);
            (j, problems)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::Action;
    use std::time::Duration;

    fn event(secs: u64) -> HealthEvent {
        HealthEvent {
            time: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
            gpu: 0,
            uuid: String::new(),
            kind: EventKind::Raised,
            condition: format!("c{secs}"),
            severity: Status::Warn,
            action: Action::None,
            reason: String::new(),
            before_restart: false,
        }
    }

    #[test]
    fn bounded_and_newest_first() {
        let mut j = Journal::with_capacity(3);
        j.append((1..=5).map(event));
        assert_eq!(j.len(), 3);
        let names: Vec<String> = j.since(None).into_iter().map(|e| e.condition).collect();
        assert_eq!(names, vec!["c5", "c4", "c3"]);
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(4);
        assert_eq!(j.since(Some(t)).len(), 2);
    }

    #[test]
    fn since_accepts_rfc3339_and_unix_seconds() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_322_245);
        assert_eq!(parse_since("1767322245"), Ok(t));
        assert_eq!(parse_since("2026-01-02T02:50:45Z"), Ok(t));
        let e = parse_since("yesterday").expect_err("rejected");
        assert!(e.starts_with("invalid since 'yesterday'"), "{e}");
        assert!(parse_since("-5").is_err());
        for huge in ["1e19", "1e20", "1e300", "inf", "NaN"] {
            let e = parse_since(huge).expect_err("out of range");
            assert!(e.starts_with(&format!("invalid since '{huge}'")), "{e}");
        }
    }
}
