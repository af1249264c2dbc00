//! The ledger reads what the agent wrote before it was typed, and writes it the same way.

use serde_json::Value;

use super::*;
use crate::audit::legacy_log;
use crate::audit::read_back;

/// Written as [`crate::audit::AuditLog::record`] writes it, at the record's own time.
fn written(ts: &str, event: &Event) -> String {
    let body = serde_json::to_string(event).expect("serialise");
    format!("{{\"ts\":\"{ts}\",{}", &body[1..])
}

/// The records whose nested values (a MIG plan, its steps, its pending GPUs) are now written in
/// their declaration order, not sorted: the same JSON, not the same bytes.
fn reordered(e: &Event) -> bool {
    matches!(
        e,
        Event::Mig(Mig::ApplyStart { .. } | Mig::Step { .. } | Mig::ApplyDone { .. })
    )
}

fn is_known(e: &Event) -> bool {
    !matches!(
        e,
        Event::Other
            | Event::Api(Api::Other)
            | Event::Mig(Mig::Other)
            | Event::Sharing(Sharing::Other)
            | Event::Reclaim(Reclaim::Other)
            | Event::Remediation(Remediation::Other)
            | Event::Slurm(Slurm::Other)
    )
}

#[test]
fn every_record_of_the_previous_format_reads_back_as_its_event_and_is_written_the_same() {
    let mut kinds = std::collections::BTreeSet::new();
    let mut same_bytes = 0;
    for line in legacy_log::records() {
        let entry: Entry = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(is_known(&entry.event), "read as unknown: {line}");
        let v: Value = serde_json::from_str(line).expect("json");
        assert_eq!(v["component"], entry.event.component(), "{line}");
        kinds.insert(format!("{}/{}", v["component"], v["event"]));
        let again = written(&entry.ts, &entry.event);
        if reordered(&entry.event) {
            let w: Value = serde_json::from_str(&again).expect("json");
            assert_eq!(w, v, "the same record");
        } else {
            assert_eq!(again, line, "written differently");
            same_bytes += 1;
        }
    }
    // Every event the agent writes (the variants above, less `Other`).
    assert_eq!(kinds.len(), 31, "{kinds:?}");
    assert_eq!(same_bytes, 47 - 4);
}

#[test]
fn a_newer_agents_component_or_event_is_other_and_a_new_field_is_ignored() {
    let read = |l: &str| serde_json::from_str::<Entry>(l).expect("reads").event;
    assert_eq!(
        read(r#"{"ts":"t","component":"fleet","event":"joined","node":"n"}"#),
        Event::Other
    );
    assert_eq!(
        read(r#"{"ts":"t","component":"mig","event":"apply.paused","layout":"x"}"#),
        Event::Mig(Mig::Other)
    );
    let drain = read(
        r#"{"ts":"t","component":"slurm","event":"drain","node":"n","reason":"r","reason_before":"","state_before":"IDLE","trigger":"t","partition":"gpu"}"#,
    );
    assert!(
        matches!(drain, Event::Slurm(Slurm::Drain(NodeChange { ref node, .. })) if node == "n")
    );
}

#[test]
fn a_damaged_line_is_counted_and_skipped_and_the_others_read_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = legacy_log::write(dir.path());
    let mut text = std::fs::read_to_string(&path).expect("read");
    // A torn record, a known record with a field of the wrong type, and a newer agent's
    // event under a name being read back (the last is not damaged: only not one to replay).
    text.push_str("{\"ts\":\"x\",\"component\":\"reclaim\",\"event\":\"reclaim\",\"dry_run\":fa\n");
    text.push_str(
        "{\"ts\":\"x\",\"component\":\"reclaim\",\"event\":\"reclaim\",\"dry_run\":\"no\"}\n",
    );
    std::fs::write(&path, text).expect("write");
    let mut live = 0;
    let r = read_back(&path, "reclaim", "reclaim", |e| {
        if let Event::Reclaim(Reclaim::Reclaim(u)) = e.event {
            live += u64::from(!u.dry_run);
        }
    });
    assert_eq!((r.records, r.damaged, live), (2, 2, 1), "{r:?}");
}
