//! Unit tests of the evaluation over time: successive snapshots at chosen instants, no sleeping.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::*;
use crate::snapshot::{
    GpuIdentity, GpuReading, GpuSnapshot, GpuStatus, NvmlStatus, RemappedRows, Snapshot, XidStat,
};

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
}

fn gpu() -> GpuSnapshot {
    let mut id = GpuIdentity {
        uuid: "GPU-0".into(),
        ..GpuIdentity::default()
    };
    id.thresholds.slowdown_c = Some(90);
    GpuSnapshot {
        index: 0,
        identity: Some(Arc::new(id)),
        status: GpuStatus::Up,
        reading: GpuReading::default(),
        failed_calls: 0,
        failing_runs: 0,
        xids: BTreeMap::new(),
        last_xid: None,
    }
}

fn snap(g: &GpuSnapshot, t: u64) -> Snapshot {
    let mut s = Snapshot::starting(at(t));
    s.nvml = NvmlStatus::Up;
    s.gpus = vec![g.clone()];
    s
}

fn xid(g: &mut GpuSnapshot, xid: u64, count: u64, t: u64) {
    g.xids.insert(
        xid,
        XidStat {
            count,
            last_seen: at(t),
        },
    );
    g.last_xid = Some(xid);
}

fn names(h: &NodeHealth) -> Vec<String> {
    h.gpus[0]
        .verdict
        .conditions
        .iter()
        .map(|c| c.name.clone())
        .collect()
}

fn kinds(events: &[HealthEvent]) -> Vec<(EventKind, String)> {
    events
        .iter()
        .map(|e| (e.kind, e.condition.clone()))
        .collect()
}

#[test]
fn a_healthy_gpu_passes_and_nothing_is_journalled() {
    let mut e = Evaluator::default();
    let (h, ev) = e.evaluate(&snap(&gpu(), 0), at(0));
    assert_eq!(h.gpus[0].verdict.status, Status::Pass);
    assert_eq!(h.gpus[0].verdict.action, Action::None);
    assert!(ev.is_empty());
}

#[test]
fn conditions_are_raised_once_keep_their_since_and_clear() {
    let mut e = Evaluator::default();
    let mut g = gpu();
    g.reading.ecc.uncorrected_volatile = Some(1);
    g.reading.remapped_rows = Some(RemappedRows {
        pending: true,
        ..RemappedRows::default()
    });
    let (h, ev) = e.evaluate(&snap(&g, 0), at(0));
    assert_eq!(names(&h), vec!["ecc_dbe", "row_remap_pending"]);
    assert_eq!(h.gpus[0].verdict.status, Status::Fail);
    assert_eq!(ev.len(), 2);
    let (h, ev) = e.evaluate(&snap(&g, 5), at(5));
    assert!(ev.is_empty(), "no event while nothing changes: {ev:?}");
    assert_eq!(h.gpus[0].verdict.conditions[0].since, at(0));
    g.reading.ecc.uncorrected_volatile = Some(0);
    g.reading.remapped_rows = None;
    let (h, ev) = e.evaluate(&snap(&g, 10), at(10));
    assert_eq!(h.gpus[0].verdict.status, Status::Pass);
    assert_eq!(
        kinds(&ev),
        vec![
            (EventKind::Cleared, "ecc_dbe".into()),
            (EventKind::Cleared, "row_remap_pending".into())
        ]
    );
}

#[test]
fn lost_gpu_fails_with_reboot() {
    let mut e = Evaluator::default();
    let mut g = gpu();
    g.status = GpuStatus::Lost;
    let (h, _) = e.evaluate(&snap(&g, 0), at(0));
    let v = &h.gpus[0].verdict;
    assert_eq!((v.status, v.action), (Status::Fail, Action::RebootNode));
    assert_eq!(names(&h), vec!["gpu_lost"]);
}

#[test]
fn a_pending_mig_mode_warns_with_what_blocks_the_reset() {
    let mut e = Evaluator::default();
    let mut g = gpu();
    g.reading.mig_mode_current = Some(false);
    g.reading.mig_mode_pending = Some(false);
    let (h, _) = e.evaluate(&snap(&g, 0), at(0));
    assert!(names(&h).is_empty());
    g.reading.mig_mode_pending = Some(true);
    g.reading.processes = Some(vec![crate::snapshot::GpuProcess {
        pid: 4242,
        kind: crate::snapshot::ProcessKind::Compute,
        used_memory_bytes: None,
        sm_util_percent: None,
        mem_util_percent: None,
        gpu_instance_id: None,
        compute_instance_id: None,
        info: None,
    }]);
    let (h, _) = e.evaluate(&snap(&g, 1), at(1));
    assert_eq!(names(&h), vec!["mig_mode_pending".to_string()]);
    let v = &h.gpus[0].verdict;
    assert_eq!(v.status, Status::Warn);
    assert_eq!(v.action, Action::DrainAndReset);
    let reason = &v.conditions[0].reason;
    assert!(
        reason.contains("disabled and enabled is pending") && reason.contains("4242"),
        "{reason}"
    );
}

#[test]
fn the_drivers_recovery_action_wins() {
    let mut e = Evaluator::default();
    let mut g = gpu();
    g.reading.ecc.uncorrected_volatile = Some(1); // our guess: reset_gpu
    g.reading.retired_pages.single_bit = Some(70); // our guess: contact_support
    g.reading.recovery_action = Some(4);
    let (h, _) = e.evaluate(&snap(&g, 0), at(0));
    assert_eq!(h.gpus[0].verdict.action, Action::DrainAndReset);
    g.reading.recovery_action = Some(0);
    let (h, _) = e.evaluate(&snap(&g, 1), at(1));
    assert_eq!(h.gpus[0].verdict.action, Action::ContactSupport);
}

#[test]
fn xids_count_once_stay_for_the_window_and_escalate() {
    let config = HealthConfig {
        xid_window: Duration::from_secs(600),
        xid_escalate_after: 3,
        ..HealthConfig::default()
    };
    let mut e = Evaluator::new(config);
    let mut g = gpu();
    xid(&mut g, 13, 1, 0);
    let (h, ev) = e.evaluate(&snap(&g, 0), at(0));
    assert_eq!(
        kinds(&ev),
        vec![
            (EventKind::Observed, "xid_13".into()),
            (EventKind::Raised, "xid_13".into())
        ]
    );
    let c = &h.gpus[0].verdict.conditions[0];
    assert_eq!((c.severity, c.action), (Status::Warn, Action::RestartApp));
    assert_eq!(h.gpus[0].xid_window_counts.get(&13), Some(&1));
    // The same cumulative count in later snapshots is not a new occurrence.
    let (h, ev) = e.evaluate(&snap(&g, 60), at(60));
    assert!(ev.is_empty());
    assert!(h.gpus[0].verdict.conditions[0]
        .reason
        .contains("seen 1 time"));
    // Two more within the window: escalated one level.
    xid(&mut g, 13, 3, 100);
    let (h, ev) = e.evaluate(&snap(&g, 100), at(100));
    assert_eq!(
        kinds(&ev),
        vec![
            (EventKind::Observed, "xid_13".into()),
            (EventKind::Escalated, "xid_13".into())
        ]
    );
    let c = &h.gpus[0].verdict.conditions[0];
    assert_eq!((c.severity, c.action), (Status::Fail, Action::ResetGpu));
    assert_eq!(c.since, at(0), "escalation keeps the since");
    // The dcgm-style count window (5 min) forgets the first one before the health window.
    let (h, _) = e.evaluate(&snap(&g, 301), at(301));
    assert_eq!(h.gpus[0].xid_window_counts.get(&13), Some(&2));
    // 600 s after the first, two remain: back to warn; 600 s after the last, cleared.
    let (h, ev) = e.evaluate(&snap(&g, 650), at(650));
    assert_eq!(kinds(&ev), vec![(EventKind::Changed, "xid_13".into())]);
    assert_eq!(h.gpus[0].verdict.status, Status::Warn);
    let (h, ev) = e.evaluate(&snap(&g, 700), at(700));
    assert_eq!(kinds(&ev), vec![(EventKind::Cleared, "xid_13".into())]);
    assert_eq!(h.gpus[0].verdict.status, Status::Pass);
    assert!(h.gpus[0].xid_window_counts.is_empty());
}

#[test]
fn ignored_xids_are_journalled_but_raise_nothing_and_overrides_win() {
    let mut e = Evaluator::default();
    let mut g = gpu();
    xid(&mut g, 63, 1, 0); // catalog bucket IGNORE
    let (h, ev) = e.evaluate(&snap(&g, 0), at(0));
    assert!(names(&h).is_empty());
    assert_eq!(kinds(&ev), vec![(EventKind::Observed, "xid_63".into())]);
    assert_eq!(ev[0].severity, Status::Pass);

    let mut config = HealthConfig::default();
    config.xid_overrides.insert(
        13,
        XidOverride::Classify {
            severity: Status::Fail,
            action: Action::ResetGpu,
        },
    );
    config.xid_overrides.insert(48, XidOverride::Ignore);
    let mut e = Evaluator::new(config);
    let mut g = gpu();
    xid(&mut g, 13, 1, 0);
    xid(&mut g, 48, 1, 0);
    let (h, _) = e.evaluate(&snap(&g, 0), at(0));
    assert_eq!(names(&h), vec!["xid_13"]);
    assert_eq!(h.gpus[0].verdict.status, Status::Fail);
}

#[test]
fn thermal_and_power_conditions() {
    let mut e = Evaluator::default();
    let mut g = gpu();
    g.reading.temperature_c = Some(84);
    let (h, _) = e.evaluate(&snap(&g, 0), at(0));
    assert!(names(&h).is_empty(), "6 °C below slowdown is fine");
    g.reading.temperature_c = Some(85);
    g.reading.clock_event_reasons = Some(0x40 | 0x80);
    let (h, _) = e.evaluate(&snap(&g, 1), at(1));
    assert_eq!(
        names(&h),
        vec![
            "power_brake_slowdown",
            "temperature_margin",
            "thermal_slowdown"
        ]
    );
    assert_eq!(h.gpus[0].verdict.status, Status::Warn);
}

#[test]
fn pcie_replay_rate_needs_a_full_window_and_a_high_rate() {
    let mut e = Evaluator::default();
    let mut g = gpu();
    g.reading.pcie_generation = Some(4);
    g.reading.pcie_width = Some(16); // limit 16/min
    let mut count = 0;
    for t in (0..=60).step_by(5) {
        g.reading.pcie_replay_count = Some(count);
        let (h, _) = e.evaluate(&snap(&g, t), at(t));
        assert!(names(&h).is_empty(), "no verdict before 60 s (t={t})");
        count += 1; // 12/min
    }
    for t in (65..=125).step_by(5) {
        count += 2; // now 36/min
        g.reading.pcie_replay_count = Some(count);
        e.evaluate(&snap(&g, t), at(t));
    }
    let (h, _) = e.evaluate(&snap(&g, 125), at(125));
    assert_eq!(names(&h), vec!["pcie_replay_rate"]);
    for t in (130..=200).step_by(5) {
        g.reading.pcie_replay_count = Some(count);
        e.evaluate(&snap(&g, t), at(t));
    }
    let (h, _) = e.evaluate(&snap(&g, 200), at(200));
    assert!(names(&h).is_empty());
}

#[test]
fn failing_calls_warn_after_consecutive_failed_runs() {
    let mut e = Evaluator::default();
    let mut g = gpu();
    g.failed_calls = 2;
    // A slow read that failed once stays failed for many polls until it runs again: no alarm.
    g.failing_runs = 1;
    for t in 0..5 {
        let (h, _) = e.evaluate(&snap(&g, t), at(t));
        assert!(names(&h).is_empty());
    }
    g.failing_runs = 3;
    let (h, _) = e.evaluate(&snap(&g, 5), at(5));
    assert_eq!(names(&h), vec!["nvml_calls_failing"]);
    g.failed_calls = 0;
    g.failing_runs = 0;
    let (h, _) = e.evaluate(&snap(&g, 6), at(6));
    assert!(names(&h).is_empty());
}

#[test]
fn nvml_down_keeps_the_history() {
    let mut e = Evaluator::default();
    let mut g = gpu();
    xid(&mut g, 48, 1, 0);
    e.evaluate(&snap(&g, 0), at(0));
    let mut down = snap(&g, 1);
    down.nvml = NvmlStatus::Starting;
    down.gpus.clear();
    let (h, ev) = e.evaluate(&down, at(1));
    assert!(h.gpus.is_empty() && ev.is_empty());
    let (h, ev) = e.evaluate(&snap(&g, 2), at(2));
    assert!(ev.is_empty(), "the same XID is not counted twice: {ev:?}");
    assert_eq!(names(&h), vec!["xid_48"]);
}

#[test]
fn history_follows_the_board_not_its_index() {
    let mut e = Evaluator::default();
    let mut g = gpu();
    g.index = 1;
    xid(&mut g, 48, 1, 0);
    let (_, ev) = e.evaluate(&snap(&g, 0), at(0));
    assert!(kinds(&ev).contains(&(EventKind::Observed, "xid_48".into())));
    // Re-enumerated: the board is now at index 0, then missing for a while, then back.
    g.index = 0;
    let (h, ev) = e.evaluate(&snap(&g, 5), at(5));
    assert!(ev.is_empty(), "not observed again: {ev:?}");
    assert!(h.gpus[0].verdict.conditions[0]
        .reason
        .contains("seen 1 time"));
    let mut none = snap(&g, 10);
    none.gpus.clear();
    for t in 10..20 {
        e.evaluate(&none, at(t));
    }
    let (h, ev) = e.evaluate(&snap(&g, 20), at(20));
    assert!(ev.is_empty(), "the same board, the same count: {ev:?}");
    assert_eq!(h.gpus[0].xid_window_counts.get(&48), Some(&1));
    // Another board at index 0 has none of that history.
    let mut other = gpu();
    other.identity = Some(Arc::new(GpuIdentity {
        uuid: "GPU-other".into(),
        ..GpuIdentity::default()
    }));
    let (h, _) = e.evaluate(&snap(&other, 25), at(25));
    assert!(h.gpus[0].verdict.conditions.is_empty());
    assert_eq!(h.gpus[0].uuid, "GPU-other");
}

#[test]
fn a_board_missing_too_long_is_forgotten() {
    let mut e = Evaluator::default();
    let mut g = gpu();
    xid(&mut g, 48, 1, 0);
    e.evaluate(&snap(&g, 0), at(0));
    let mut none = snap(&g, 1);
    none.gpus.clear();
    for _ in 0..=crate::snapshot::FORGET_ABSENT_GPU_AFTER_POLLS {
        e.evaluate(&none, at(1));
    }
    // The poller forgot it at the same poll: its counts start again and are new.
    xid(&mut g, 48, 1, 2);
    let (_, ev) = e.evaluate(&snap(&g, 2), at(2));
    assert!(kinds(&ev).contains(&(EventKind::Observed, "xid_48".into())));
}
