use std::time::{Duration, SystemTime};

use super::*;
use crate::health::journal::{open_in, Journal};
use crate::health::{Action, EventKind, Status};

fn event(n: u64) -> HealthEvent {
    HealthEvent {
        time: SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_322_245 + n),
        gpu: 1,
        uuid: "GPU-1".into(),
        kind: EventKind::Raised,
        condition: format!("xid_{n}"),
        severity: Status::Fail,
        action: Action::RebootNode,
        reason: format!("XID {n}"),
        before_restart: false,
    }
}

fn conditions(j: &Journal) -> Vec<String> {
    j.since(None).into_iter().map(|e| e.condition).collect()
}

#[test]
fn events_come_back_after_a_restart_marked_as_before_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut first, problems) = open_in(dir.path());
    assert!(problems.is_empty(), "{problems:?}");
    first.append([event(79), event(48)]);
    drop(first);

    let (second, problems) = open_in(dir.path());
    assert!(problems.is_empty(), "{problems:?}");
    let back = second.since(None);
    assert_eq!(conditions(&second), ["xid_48", "xid_79"], "newest first");
    assert!(back.iter().all(|e| e.before_restart));
    let mut expected = event(48);
    expected.before_restart = true;
    assert_eq!(back[0], expected, "every field survives");
    let json = serde_json::to_value(&back[0]).expect("json");
    assert_eq!(json["before_restart"], true);
    assert_eq!(
        serde_json::to_value(event(1))
            .expect("json")
            .get("before_restart"),
        None,
        "this run's events carry no mark"
    );
}

#[test]
fn a_damaged_file_is_set_aside_and_what_could_be_read_is_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = serde_json::to_string(&event(79)).expect("json");
    let path = dir.path().join(FILE_NAME);
    std::fs::write(&path, format!("{good}\n{{\"torn\": \n\u{0}\u{1}garbage\n")).expect("write");

    let (mut j, problems) = open_in(dir.path());
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains(&path.display().to_string()) && problems[0].contains("set aside"),
        "{problems:?}"
    );
    assert!(dir.path().join("journal.jsonl.damaged").is_file());
    assert_eq!(conditions(&j), ["xid_79"]);
    // The fresh file works.
    j.append([event(48)]);
    drop(j);
    let (again, problems) = open_in(dir.path());
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(conditions(&again), ["xid_48"]);
}

#[test]
fn a_symlink_or_a_fifo_in_place_of_the_file_is_set_aside_not_followed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("elsewhere");
    std::fs::write(&target, "not ours\n").expect("write");
    std::os::unix::fs::symlink(&target, dir.path().join(FILE_NAME)).expect("symlink");
    let (mut j, problems) = open_in(dir.path());
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("symlink"), "{problems:?}");
    j.append([event(1)]);
    assert_eq!(
        std::fs::read_to_string(&target).expect("read"),
        "not ours\n",
        "never written through"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    nix::unistd::mkfifo(
        &dir.path().join(FILE_NAME),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .expect("mkfifo");
    let (_, problems) = open_in(dir.path());
    assert_eq!(problems.len(), 1, "{problems:?}");
}

#[test]
fn rotation_keeps_the_newest_within_twice_the_size_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut j, _) = open_in(dir.path());
    let line = serde_json::to_string(&event(0)).expect("json").len() as u64 + 1;
    let n = 3 * MAX_FILE_BYTES / line;
    for i in 0..n {
        j.append([event(i)]);
    }
    drop(j);
    let main = std::fs::metadata(dir.path().join(FILE_NAME)).expect("file");
    let rotated = std::fs::metadata(dir.path().join(ROTATED_NAME)).expect("rotated");
    assert!(main.len() <= MAX_FILE_BYTES && rotated.len() <= MAX_FILE_BYTES);
    let (back, problems) = open_in(dir.path());
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(back.len(), crate::health::journal::CAPACITY);
    assert_eq!(back.since(None)[0].condition, format!("xid_{}", n - 1));
}
