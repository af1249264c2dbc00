//! The owner's order of work, seen from outside: the record before the act, the outcome after
//! it, the poller told only when the node was touched, and nothing done without a record.

use std::path::Path;
use std::sync::mpsc;

use serde_json::Value;

use super::*;
use crate::audit::event::{NodeChange, Slurm};

/// A typed record to write (which one does not matter to the owner).
fn slurm(resume: bool) -> Event {
    let c = NodeChange {
        node: "n1".into(),
        reason: None,
        reason_before: String::new(),
        state_before: "IDLE".into(),
        trigger: "test".into(),
    };
    Event::Slurm(if resume {
        Slurm::Resume(c)
    } else {
        Slurm::Drain(c)
    })
}

/// A waker that counts on a channel, as the poller's control does.
fn waker() -> (Waker, mpsc::Receiver<()>) {
    let (tx, rx) = mpsc::channel();
    (Arc::new(move || tx.send(()).is_ok()), rx)
}

fn owner_at(audit_file: &Path) -> Arc<Owner> {
    Owner::with(Setup {
        nvml_lib: String::new(),
        audit_file: audit_file.to_path_buf(),
        mig: MigConfig::default(),
    })
}

fn events(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            format!(
                "{}/{}",
                v["component"].as_str().unwrap_or(""),
                v["event"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[test]
fn the_decision_is_on_disk_before_the_act_and_the_outcome_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    let owner = owner_at(&audit);
    let (wake, rx) = waker();
    owner.set_waker(wake);
    let begun = owner.begin(slurm(false)).expect("recorded");
    let seen_during_act = begun.act(|_| {
        let during = events(&audit);
        Done {
            value: during,
            after: Some(slurm(true)),
            touched: true,
        }
    });
    assert_eq!(
        seen_during_act,
        ["slurm/drain"],
        "the act ran before its record"
    );
    assert_eq!(events(&audit), ["slurm/drain", "slurm/resume"]);
    assert!(rx.try_recv().is_ok(), "the poller was not woken");
}

#[test]
fn an_act_that_touched_nothing_does_not_wake_the_poller() {
    let dir = tempfile::tempdir().expect("tempdir");
    let owner = owner_at(&dir.path().join("audit.jsonl"));
    let (wake, rx) = waker();
    owner.set_waker(wake);
    let begun = owner.begin(slurm(false)).expect("recorded");
    begun.act(|_| Done {
        value: (),
        after: None,
        touched: false,
    });
    assert!(rx.try_recv().is_err(), "woken for nothing");
}

#[test]
fn without_a_record_there_is_no_right_to_act() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The audit log's directory does not exist (and is not the agent's state directory).
    let owner = owner_at(&dir.path().join("missing").join("audit.jsonl"));
    let refused = owner.begin(slurm(false));
    let e = refused.expect_err("no record, no act");
    assert_eq!(e.name(), "audit_failed");
    assert!(e.to_string().contains("missing"), "{e}");
}

#[test]
fn a_process_without_a_poller_leaves_the_notice_for_the_daemon() {
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    let owner = owner_at(&audit);
    let notice = dir.path().join(notice::FILE_NAME);
    let begun = owner.begin(slurm(false)).expect("recorded");
    begun.act(|_| Done {
        value: (),
        after: None,
        touched: false,
    });
    assert!(!notice.exists(), "a notice for nothing");
    let begun = owner.begin(slurm(false)).expect("recorded");
    begun.act(|_| Done {
        value: (),
        after: None,
        touched: true,
    });
    let text = std::fs::read_to_string(&notice).expect("the notice");
    assert!(
        text.starts_with(&format!("pid {} at ", std::process::id())),
        "{text}"
    );
}
