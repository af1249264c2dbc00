//! The apply's step runner: success, a failure in the middle undone newest first, an undo
//! that fails, and a dry run.

use super::*;
use crate::config::sharing::Timeslice;
use crate::gpu::ComputeMode;

/// Records what it was asked; fails the call numbered `fail_at` (and, when `stuck`, every
/// later call too).
struct Fake {
    calls: Vec<(u32, Change)>,
    fail_at: Option<usize>,
    stuck: bool,
    /// What `observe` answers after the run (`None`: the read fails).
    after: Option<Vec<ObservedGpu>>,
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

    fn observe(&mut self) -> Result<Vec<ObservedGpu>, String> {
        self.after
            .clone()
            .ok_or_else(|| "fake: no reading".to_string())
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
        after: None,
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
        after: None,
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
        after: None,
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
        after: None,
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

fn observed(index: u32, mode: ComputeMode, timeslice: Result<Timeslice, String>) -> ObservedGpu {
    ObservedGpu {
        index,
        uuid: format!("GPU-{index}"),
        mig_enabled: false,
        compute_mode: Ok(mode),
        timeslice,
    }
}

/// Issue 26 bug 1: a time-slice that cannot be read (nvidia-smi missing) is left alone, the
/// compute modes are applied and kept, and the report says so: no undo it never did.
#[test]
fn an_unreadable_setting_is_reported_and_what_was_applied_is_said_exactly() {
    let unread = || Err("'nvidia-smi compute-policy -l' could not start".to_string());
    let mut node = Fake {
        calls: vec![],
        fail_at: None,
        stuck: false,
        after: Some(vec![observed(0, ComputeMode::ExclusiveProcess, unread())]),
    };
    let plan = Plan {
        steps: vec![steps().remove(0)],
        skipped: vec![Skipped {
            gpu: Some(0),
            uuid: "GPU-0".into(),
            setting: "timeslice",
            reason: "cannot read its time-slice; left as it is".into(),
            error: true,
        }],
        unchanged: 0,
    };
    let before = vec![observed(0, ComputeMode::Default, unread())];
    let report = apply_plan(plan, before, &mut node, None, false, "cli");
    assert_eq!(node.calls.len(), 1, "no undo: {:?}", node.calls);
    assert!(!report.ok, "the node does not match the configuration");
    assert!(report.consistent, "{:?}", report.error);
    assert_eq!(report.steps[0].outcome, Outcome::Applied);
    let text = report.render_text();
    assert!(!text.contains("undo"), "{text}");
    assert!(
        text.ends_with("applied 1 change(s); 1 setting(s) could not be read and are left as they are: the node does not fully match the configuration\n"),
        "{text}"
    );
}

#[test]
fn a_step_the_node_does_not_hold_afterwards_makes_the_report_inconsistent() {
    let mut node = Fake {
        calls: vec![],
        fail_at: None,
        stuck: false,
        after: Some(vec![observed(
            0,
            ComputeMode::Default,
            Ok(Timeslice::Default),
        )]),
    };
    let plan = Plan {
        steps: vec![steps().remove(0)],
        skipped: vec![],
        unchanged: 0,
    };
    let before = vec![observed(0, ComputeMode::Default, Ok(Timeslice::Default))];
    let report = apply_plan(plan, before, &mut node, None, false, "api");
    assert!(!report.ok && !report.consistent);
    assert!(report
        .error
        .as_deref()
        .is_some_and(|e| e.contains("gpu 0 compute_mode was applied but reads otherwise")));
}

#[test]
fn a_read_only_run_that_cannot_read_never_says_it_left_the_node() {
    let report = Report::failed("cli", true, "cannot load NVML".into());
    let text = report.render_text();
    assert!(!text.contains("FAILED; the node was left"), "{text}");
    assert!(
        text.contains("dry run: the node could not be observed"),
        "{text}"
    );
}

#[test]
fn a_change_that_cannot_be_recorded_stops_the_apply_and_is_undone() {
    let mut node = Fake {
        calls: vec![],
        fail_at: None,
        stuck: false,
        after: None,
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
