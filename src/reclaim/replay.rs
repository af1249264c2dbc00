//! Reading reclaim's hourly count back from the audit log at start: every reclaim is recorded
//! (and fsynced) before anything is signalled or run, so the `reclaim` records of the last hour
//! are the reclaims that count against `max_reclaims_per_hour`, across restarts and crash loops.
//!
//! Must not fail the start: an unreadable file or line is logged and skipped. As with the
//! remediation rails, a dry run counts dry-run records too, and a live agent only live ones:
//! trying a configuration in dry run first does not hold back the real reclaims.

use std::path::Path;
use std::time::SystemTime;

use crate::audit::event::Reclaim;
use crate::audit::{Entry, Event};

/// When the reclaims recorded in `audit_file` were decided (dry-run ones only when `dry_run`).
/// A record dated after `now` (the clock was set back since) is read as decided `now`: it
/// counts for the coming hour, neither never nor until its future date plus an hour. Logged
/// once, with how many.
pub fn reclaims(audit_file: &Path, dry_run: bool, now: SystemTime) -> Vec<SystemTime> {
    let mut at = Vec::new();
    let mut future = 0u64;
    crate::audit::read_back(audit_file, "reclaim", "reclaim", |r: Entry| {
        let Event::Reclaim(Reclaim::Reclaim(unit)) = &r.event else {
            return;
        };
        if unit.dry_run && !dry_run {
            return;
        }
        if let Ok(t) = humantime::parse_rfc3339(&r.ts) {
            if t > now {
                future += 1;
            }
            at.push(t.min(now));
        }
    });
    if future > 0 {
        tracing::warn!(file = %audit_file.display(), records = future, "reclaim records dated in the future (was the clock set back?) are read as made now");
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::event::ReclaimUnit;
    use crate::audit::AuditLog;

    fn unit(gpu: u32, dry_run: bool) -> ReclaimUnit {
        ReclaimUnit {
            dry_run,
            gpu,
            step: "reclaim".into(),
            trigger: Some("reclaim".into()),
            uuid: format!("GPU-{gpu}"),
            ..ReclaimUnit::default()
        }
    }

    #[test]
    fn live_reclaims_count_and_dry_runs_only_in_a_dry_run() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        assert!(
            reclaims(&path, false, SystemTime::now()).is_empty(),
            "no log yet is no reclaim"
        );
        let log = AuditLog::open(&path).expect("open");
        let write = |r: Reclaim| log.record(&Event::Reclaim(r)).expect("write");
        write(Reclaim::Reclaim(unit(0, false)));
        write(Reclaim::Reclaim(unit(1, true)));
        write(Reclaim::Warn(unit(2, false)));
        // Another component's event of the same name does not count.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| {
                use std::io::Write;
                f.write_all(b"{\"ts\":\"2026-11-22T11:30:00.000Z\",\"component\":\"remediation\",\"event\":\"reclaim\",\"dry_run\":false}\n")
            })
            .expect("append");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| {
                use std::io::Write;
                f.write_all(
                    b"{\"ts\":\"x\",\"component\":\"reclaim\",\"event\":\"reclaim\",\"torn\n",
                )
            })
            .expect("append a torn line");
        assert_eq!(reclaims(&path, false, SystemTime::now()).len(), 1);
        assert_eq!(reclaims(&path, true, SystemTime::now()).len(), 2);
    }

    /// Issue 33 defect 11: a record dated a day ahead (the clock set back since) counts as made
    /// now, not until a day and an hour from now.
    #[test]
    fn a_reclaim_dated_in_the_future_is_read_as_now() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let now = humantime::parse_rfc3339("2026-11-22T12:00:00Z").expect("time");
        std::fs::write(
            &path,
            "{\"ts\":\"2026-11-23T12:00:00.000Z\",\"component\":\"reclaim\",\"event\":\"reclaim\",\"dry_run\":false}\n\
             {\"ts\":\"2026-11-22T11:30:00.000Z\",\"component\":\"reclaim\",\"event\":\"reclaim\",\"dry_run\":false}\n",
        )
        .expect("write");
        let at = reclaims(&path, false, now);
        let half_hour_ago = now - std::time::Duration::from_secs(1800);
        assert_eq!(at, vec![now, half_hour_ago]);
    }

    /// A log written before records were typed: its one live reclaim counts, and its dry-run
    /// one only in a dry run.
    #[test]
    fn a_log_of_the_previous_format_is_counted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = crate::audit::legacy_log::write(dir.path());
        let now = humantime::parse_rfc3339("2026-11-27T10:30:00Z").expect("time");
        assert_eq!(reclaims(&path, false, now).len(), 1);
        assert_eq!(reclaims(&path, true, now).len(), 2);
    }
}
