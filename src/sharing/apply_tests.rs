//! The apply's step runner: success, a failure in the middle undone newest first, an undo
//! that fails, and a dry run.

use super::*;
use crate::gpu::ComputeMode;
use crate::sharing::settings::Timeslice;

/// Records what it was asked; fails the call numbered `fail_at` (and, when `stuck`, every
/// later call too).
struct Fake {
    calls: Vec<(u32, Change)>,
    fail_at: Option<usize>,
    stuck: bool,
}

impl Node for Fake {
    fn set(&mut self, gpu: u32, _: &str, change: Change) -> Result<(), String> {
        let n = self.calls.len();
        self.calls.push((gpu, change));
        match self.fail_at {
            Some(k) if n == k || (self.stuck && n > k) => Err(format!("call {n} failed")),
            _ => Ok(()),
        }
    }
}

fn steps() -> Vec<Step> {
    (0..3)
        .map(|gpu| Step {
            gpu,
            uuid: format!("GPU-{gpu}"),
            change: Change::ComputeMode {
                from: ComputeMode::Default,
                to: ComputeMode::ExclusiveProcess,
            },
        })
        .chain([Step {
            gpu: 0,
            uuid: "GPU-0".into(),
            change: Change::Timeslice {
                from: Timeslice::Default,
                to: Timeslice::Long,
            },
        }])
        .collect()
}

#[test]
fn all_steps_applied_when_nothing_fails() {
    let mut node = Fake {
        calls: vec![],
        fail_at: None,
        stuck: false,
    };
    let mut audited = 0;
    let (r, consistent) = execute(&steps(), &mut node, |_| {
        audited += 1;
        true
    });
    assert!(consistent);
    assert!(r.iter().all(|s| s.outcome == Outcome::Applied));
    assert_eq!((node.calls.len(), audited), (4, 4));
}

#[test]
fn a_failure_in_the_middle_undoes_what_was_done_newest_first() {
    let mut node = Fake {
        calls: vec![],
        fail_at: Some(2),
        stuck: false,
    };
    let (r, consistent) = execute(&steps(), &mut node, |_| true);
    assert!(consistent);
    let outcomes: Vec<Outcome> = r.iter().map(|s| s.outcome).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::RolledBack,
            Outcome::RolledBack,
            Outcome::Failed,
            Outcome::NotRun
        ]
    );
    // Calls: 0, 1, 2 (fails), then undo 1, undo 0.
    assert_eq!(node.calls.len(), 5);
    assert_eq!(node.calls[3].0, 1);
    assert_eq!(
        node.calls[4].1,
        Change::ComputeMode {
            from: ComputeMode::ExclusiveProcess,
            to: ComputeMode::Default
        }
    );
}

#[test]
fn an_undo_that_fails_is_reported_as_inconsistent() {
    let mut node = Fake {
        calls: vec![],
        fail_at: Some(1),
        stuck: true,
    };
    let (r, consistent) = execute(&steps(), &mut node, |_| true);
    assert!(!consistent);
    assert_eq!(r[0].outcome, Outcome::RollbackFailed);
    assert!(r[0]
        .error
        .as_deref()
        .is_some_and(|e| e.starts_with("could not undo")));
}

#[test]
fn a_dry_run_changes_nothing() {
    let mut node = Fake {
        calls: vec![],
        fail_at: None,
        stuck: false,
    };
    let plan = Plan {
        steps: steps(),
        skipped: vec![],
        unchanged: 0,
    };
    let report = apply_plan(plan, vec![], &mut node, None, true, "cli");
    assert!(node.calls.is_empty());
    assert!(report.ok && report.steps.iter().all(|s| s.outcome == Outcome::Planned));
    assert!(report
        .render_text()
        .contains("dry run: 4 change(s) planned"));
}

#[test]
fn a_change_that_cannot_be_recorded_stops_the_apply_and_is_undone() {
    let mut node = Fake {
        calls: vec![],
        fail_at: None,
        stuck: false,
    };
    // The disk fills after the second step's record.
    let mut written = 0;
    let (r, consistent) = execute(&steps(), &mut node, |_| {
        written += 1;
        written <= 1
    });
    assert!(consistent);
    let outcomes: Vec<Outcome> = r.iter().map(|s| s.outcome).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::RolledBack,
            Outcome::RolledBack,
            Outcome::NotRun,
            Outcome::NotRun
        ]
    );
    assert!(r[1]
        .error
        .as_deref()
        .is_some_and(|e| e.contains("could not be written")));
    // Calls: 0, 1, then undo 1, undo 0.
    assert_eq!(node.calls.len(), 4);
}
