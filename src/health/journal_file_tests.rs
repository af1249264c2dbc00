use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
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

/// `load` in a thread, given `within` to answer: a start that hangs fails the test instead.
fn load_within(
    dir: &Path,
    within: Duration,
) -> (Option<JournalFile>, Vec<HealthEvent>, Vec<String>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(load(&dir));
    });
    rx.recv_timeout(within)
        .expect("the journal was not opened in time: the start hangs")
}

/// Issue 26, defect 2: a FIFO at the journal that cannot be set aside (a directory in the way)
/// hung the start on the open for append. Now the journal is kept in memory, and said so.
#[test]
fn a_fifo_that_cannot_be_set_aside_leaves_the_journal_in_memory_without_blocking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(FILE_NAME);
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    std::fs::create_dir(dir.path().join("journal.jsonl.damaged")).expect("mkdir");
    let (file, earlier, problems) = load_within(dir.path(), Duration::from_secs(5));
    assert!(file.is_none(), "nothing is appended to a FIFO");
    assert!(earlier.is_empty());
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains("FIFO") && problems[0].contains("could not be set aside"),
        "{problems:?}"
    );
    assert!(problems[1].contains("kept in memory only"), "{problems:?}");
    // The journal itself works, in memory.
    let (mut j, _) = open_in(dir.path());
    j.append([event(48)]);
    assert_eq!(conditions(&j), ["xid_48"]);
    assert!(std::fs::symlink_metadata(&path)
        .expect("still there")
        .file_type()
        .is_fifo());
}

/// A damaged regular file that cannot be set aside is not appended to either (the next line
/// would be glued to the damage): memory only, the file left as it was.
#[test]
fn a_damaged_file_that_cannot_be_set_aside_is_left_as_it_was() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(FILE_NAME);
    let good = serde_json::to_string(&event(79)).expect("json");
    let text = format!("{good}\nnot an event\n");
    std::fs::write(&path, &text).expect("write");
    std::fs::create_dir(dir.path().join("journal.jsonl.damaged")).expect("mkdir");
    let (mut j, problems) = open_in(dir.path());
    assert_eq!(conditions(&j), ["xid_79"], "{problems:?}");
    assert!(
        problems.iter().any(|p| p.contains("kept in memory only")),
        "{problems:?}"
    );
    j.append([event(48)]);
    assert_eq!(std::fs::read_to_string(&path).expect("read"), text);
}

/// Opening for append never blocks, even on a FIFO someone reads: refused as not a regular
/// file.
#[test]
fn a_fifo_is_never_opened_for_append_read_or_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(FILE_NAME);
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let e = append_to(&path).expect_err("no reader");
    assert!(e.to_string().contains("FIFO"), "{e}");
    // A reader holds it open (non-blocking, or this open would wait for a writer).
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&path)
        .expect("reader");
    let e = append_to(&path).expect_err("with a reader");
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

/// Issue 26, defect 8 (the start's half): a torn last line (a crash or a full disk mid-write)
/// set the whole file aside. Now the torn line is cut off and every whole line kept, in place.
#[test]
fn a_torn_last_line_is_cut_off_and_every_whole_line_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(FILE_NAME);
    let whole = format!(
        "{}\n{}\n",
        serde_json::to_string(&event(79)).expect("json"),
        serde_json::to_string(&event(48)).expect("json")
    );
    let torn = serde_json::to_string(&event(31)).expect("json");
    std::fs::write(&path, format!("{whole}{}", &torn[..torn.len() / 2])).expect("write");
    let (mut j, problems) = open_in(dir.path());
    assert!(problems.is_empty(), "not damage: {problems:?}");
    assert!(!dir.path().join("journal.jsonl.damaged").exists());
    assert_eq!(conditions(&j), ["xid_48", "xid_79"]);
    assert_eq!(std::fs::read_to_string(&path).expect("read"), whole);
    j.append([event(13)]);
    drop(j);
    let (again, problems) = open_in(dir.path());
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(conditions(&again), ["xid_13", "xid_48", "xid_79"]);
}

#[path = "../../tests/common/fullfs.rs"]
mod fullfs;

/// Issue 26, defect 8: on a full disk a line was written half (tmpfs takes what fits in the
/// file's last page), and the next line was glued to it. Now a short write is cut back: every
/// line of the file stays a whole event, and the next start keeps them all. A real tmpfs.
#[test]
fn a_full_disk_leaves_no_torn_line_and_the_next_start_keeps_every_event() {
    let test = "a_full_disk_leaves_no_torn_line_and_the_next_start_keeps_every_event";
    let Some(fs) = fullfs::SmallFs::new(test, 256) else {
        return;
    };
    let dir = fs.path("state");
    std::fs::create_dir(&dir).expect("mkdir");
    let long = |n: u64| {
        let mut e = event(n);
        // 3000 bytes: a second line does not fit in the first one's page.
        e.reason = "r".repeat(3000);
        e
    };
    let (mut j, problems) = open_in(&dir);
    assert!(problems.is_empty(), "{problems:?}");
    j.append([long(79)]);
    let path = dir.join(FILE_NAME);
    let one = std::fs::metadata(&path).expect("file").len();
    fs.fill();
    j.append([long(48)]);
    assert_eq!(
        std::fs::metadata(&path).expect("file").len(),
        one,
        "the half-written line is cut back"
    );
    assert!(
        crate::warnings::all().contains_key(COMPONENT),
        "the failed write is warned"
    );
    fs.free();
    j.append([long(13)]);
    drop(j);
    let text = std::fs::read_to_string(&path).expect("read");
    for line in text.lines() {
        serde_json::from_str::<HealthEvent>(line).expect("every line is an event");
    }
    let (again, problems) = open_in(&dir);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(conditions(&again), ["xid_13", "xid_79"]);
}
