//! Rebuilding the rails at start from the audit log: every decision to act is recorded (and
//! fsynced) before its hooks run, with what the rails need (route, fingerprint, status,
//! startsAt, GPU key, time), so reading the `decision` records back restores idempotence,
//! cooldowns and the hourly count across restarts and crash loops.
//!
//! Must not fail the start: an unreadable file or line is logged and skipped (the rails are
//! then as complete as what could be read). Reads the whole file once; records older than what
//! the rails keep (a week) change nothing.

use std::path::Path;
use std::time::SystemTime;

use super::alert::Status;
use super::rails::{Handled, Rails};
use crate::audit::event::{AlertStatus, Remediation};
use crate::audit::{Entry, Event};
use crate::config::remediation::Route;

/// The rails as the decisions in `audit_file` left them. In a dry run, dry-run decisions count
/// too (as they do in memory); a live agent counts only decisions that ran, so that trying a
/// configuration in dry run first does not hold back the real actions.
pub fn rails(audit_file: &Path, routes: &[Route], dry_run: bool, now: SystemTime) -> Rails {
    let mut rails = Rails::default();
    let mut kept = 0u64;
    let mut future = 0u64;
    crate::audit::read_back(audit_file, "remediation", "decision", |r: Entry| {
        if let Some(mut h) = handled(&r, routes, dry_run) {
            // Dated after now (the clock was set back since): read as made now, so that it
            // holds a cooldown or an hourly slot from now, not until its future date.
            if h.at > now {
                future += 1;
                h.at = now;
            }
            rails.remember(h, now);
            kept += 1;
        }
    });
    if future > 0 {
        tracing::warn!(file = %audit_file.display(), decisions = future, "remediation decisions dated in the future (was the clock set back?) are read as made now");
    }
    tracing::info!(file = %audit_file.display(), decisions = kept, "remediation rails rebuilt from the audit log");
    rails
}

/// The decision in one audit record, if it is a remediation decision to act.
fn handled(r: &Entry, routes: &[Route], dry_run: bool) -> Option<Handled> {
    let Event::Remediation(Remediation::Decision(d)) = &r.event else {
        return None;
    };
    match d.decision.as_str() {
        "run" => {}
        "dry_run" if dry_run => {}
        _ => return None,
    }
    // Records written before `gpu_key` was added: the same rule as `rails::gpu_key`.
    let gpu = d
        .gpu_key
        .clone()
        .or_else(|| d.gpu_uuid.clone())
        .or_else(|| d.gpu.clone())
        .unwrap_or_else(|| "node".into());
    Some(Handled {
        // Records written before `route_id` was added name the route by its position: read as
        // the route now at that position, as they were then.
        route: match &d.route_id {
            Some(id) => id.clone(),
            None => routes.get(usize::try_from(d.route?).ok()?)?.id.clone(),
        },
        fingerprint: d.fingerprint.clone(),
        status: match d.status {
            AlertStatus::Firing => Status::Firing,
            AlertStatus::Resolved => Status::Resolved,
        },
        starts_at: d.starts_at.clone(),
        gpu,
        at: humantime::parse_rfc3339(&r.ts).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// A line as read back; `None` when it is damaged (not a known record's shape).
    fn record(v: &Value) -> Option<Entry> {
        serde_json::from_value(v.clone()).ok()
    }

    fn routes() -> Vec<Route> {
        ["-> first", "-> second"]
            .iter()
            .map(|id| Route {
                id: id.to_string(),
                matchers: Vec::new(),
                hooks: Vec::new(),
                cooldown: std::time::Duration::ZERO,
                on_resolved: false,
            })
            .collect()
    }

    #[test]
    fn only_decisions_to_act_are_read_back() {
        let routes = routes();
        let base = json!({"ts": "2026-11-22T22:30:01.123Z", "component": "remediation",
            "event": "decision", "route": 0, "route_id": "-> second", "status": "firing",
            "fingerprint": "f", "startsAt": "t0", "gpu": "0", "gpu_uuid": "GPU-a",
            "decision": "run"});
        let read = |v: &Value, dry_run| handled(&record(v)?, &routes, dry_run);
        let h = read(&base, false).expect("a run decision");
        // Known by its matchers and hooks, wherever it now stands.
        assert_eq!((h.route.as_str(), h.gpu.as_str()), ("-> second", "GPU-a"));
        let with = |k: &str, v: Value| {
            let mut r = base.clone();
            r[k] = v;
            r
        };
        assert!(read(&with("decision", json!("skip")), false).is_none());
        assert!(read(&with("decision", json!("dry_run")), false).is_none());
        assert!(read(&with("decision", json!("dry_run")), true).is_some());
        assert!(read(&with("component", json!("reclaim")), false).is_none());
        assert!(read(&with("ts", json!("yesterday")), false).is_none());
        assert_eq!(
            read(&with("gpu_key", json!("node")), false).map(|h| h.gpu),
            Some("node".to_string())
        );
        // A record from before route ids: the route at its position; none there, no decision.
        let mut old = base.clone();
        old.as_object_mut().expect("an object").remove("route_id");
        assert_eq!(read(&old, false).map(|h| h.route), Some("-> first".into()));
        old["route"] = json!(7);
        assert!(read(&old, false).is_none());
    }

    #[test]
    fn a_missing_or_damaged_log_gives_working_rails() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let _ = rails(&path, &routes(), false, SystemTime::now());
        std::fs::write(&path, "{\"half\":\n\u{0}\u{1}not json\n").expect("write");
        let _ = rails(&path, &routes(), false, SystemTime::now());
    }

    /// A log written before records were typed: its decisions to act are read back (the live
    /// one, and the dry-run one in a dry run), with their route, GPU key and time.
    #[test]
    fn a_log_of_the_previous_format_gives_its_decisions() {
        let routes: Vec<Route> = ["xid -> drain", "xid -> fence"]
            .iter()
            .map(|id| Route {
                id: id.to_string(),
                matchers: Vec::new(),
                hooks: Vec::new(),
                cooldown: std::time::Duration::ZERO,
                on_resolved: false,
            })
            .collect();
        let read = |dry_run| -> Vec<(String, String, String)> {
            crate::audit::legacy_log::records()
                .filter_map(|l| serde_json::from_str::<Entry>(l).ok())
                .filter_map(|e| handled(&e, &routes, dry_run))
                .map(|h| (h.route, h.gpu, h.fingerprint))
                .collect()
        };
        let uuid = "GPU-1f6b3c5e-0000-4000-8000-000000000000".to_string();
        assert_eq!(
            read(false),
            [("xid -> drain".into(), uuid.clone(), "abc123".into())]
        );
        assert_eq!(read(true).len(), 2);
    }
}
