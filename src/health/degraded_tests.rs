//! The degradation checks through the evaluator, at chosen instants: what the defaults raise,
//! when, and when they clear.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::health::{Evaluator, HealthConfig, NodeHealth, Status};
use crate::snapshot::{GpuIdentity, GpuReading, GpuSnapshot, GpuStatus, NvmlStatus, Snapshot};

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000 + secs)
}

/// An H100 as the real one answers: Gen5 x16 at most (shared/reference/real-h100).
fn h100() -> GpuSnapshot {
    let id = GpuIdentity {
        uuid: "GPU-0".into(),
        max_pcie_generation: Some(5),
        max_pcie_width: Some(16),
        ..GpuIdentity::default()
    };
    let reading = GpuReading {
        pcie_generation: Some(5),
        pcie_width: Some(16),
        gpu_util_percent: Some(0),
        ..GpuReading::default()
    };
    reading_of(id, reading)
}

fn reading_of(id: GpuIdentity, reading: GpuReading) -> GpuSnapshot {
    GpuSnapshot {
        index: 0,
        identity: Some(Arc::new(id)),
        status: GpuStatus::Up,
        reading,
        failed_calls: 0,
        failing_runs: 0,
        xids: BTreeMap::new(),
        last_xid: None,
    }
}

fn eval(e: &mut Evaluator, g: &GpuSnapshot, t: u64) -> NodeHealth {
    let mut s = Snapshot::starting(at(t));
    s.nvml = NvmlStatus::Up;
    s.gpus = vec![g.clone()];
    e.evaluate(&s, at(t)).0
}

fn names(h: &NodeHealth) -> Vec<String> {
    h.gpus[0]
        .verdict
        .conditions
        .iter()
        .map(|c| c.name.clone())
        .collect()
}

#[test]
fn defaults_are_dcgms_sbe_limit_over_a_minute_and_a_minute_busy() {
    let c = HealthConfig::default();
    assert_eq!(c.ecc_correctable_per_minute, 10.0);
    assert_eq!(c.ecc_correctable_window, Duration::from_secs(60));
    assert_eq!(c.pcie_busy_for, Duration::from_secs(60));
}

/// The slow tier reads the counter every 10 s (the default `slow_interval`); the poll sees the
/// same value in between.
#[test]
fn a_correctable_storm_warns_after_the_window_and_clears_when_it_stops() {
    let mut e = Evaluator::default();
    let mut g = h100();
    g.reading.ecc.corrected_volatile = Some(3);
    for t in (0..60).step_by(5) {
        assert!(names(&eval(&mut e, &g, t)).is_empty(), "t={t}");
    }
    // 6 a minute: under DCGM's 10.
    let mut count = 3;
    for t in (60..=180).step_by(5) {
        if t % 10 == 0 {
            count += 1;
        }
        g.reading.ecc.corrected_volatile = Some(count);
        let h = eval(&mut e, &g, t);
        assert!(
            names(&h).is_empty(),
            "6/min is under the limit (t={t}): {h:?}"
        );
    }
    // 17,700 a second (NVIDIA/NVSentinel#1748), read every 10 s.
    let mut raised = None;
    for t in (185..=300).step_by(5) {
        if t % 10 == 0 {
            count += 177_000;
        }
        g.reading.ecc.corrected_volatile = Some(count);
        let h = eval(&mut e, &g, t);
        if raised.is_none() && !names(&h).is_empty() {
            raised = Some(t);
            assert_eq!(names(&h), ["ecc_sbe_rate"]);
            let c = &h.gpus[0].verdict.conditions[0];
            assert_eq!((c.severity, c.action), (Status::Warn, super::Action::None));
            assert!(
                c.reason.contains("at or above the limit of 10/min"),
                "{}",
                c.reason
            );
            assert_eq!(c.since, at(t));
        }
    }
    // The window is one minute; the first sample in it is at most 10 s old.
    let raised = raised.expect("raised");
    assert!(raised <= 190, "raised at {raised}");
    let h = eval(&mut e, &g, 300);
    let reason = &h.gpus[0].verdict.conditions[0].reason;
    assert!(reason.contains("per minute over the last 1m"), "{reason}");
    // Stops: clears once the window no longer covers growth.
    for t in (305..=370).step_by(5) {
        eval(&mut e, &g, t);
    }
    assert!(names(&eval(&mut e, &g, 375)).is_empty());
}

#[test]
fn a_counter_that_restarts_is_not_a_storm_and_zero_means_any_error() {
    let mut e = Evaluator::new(HealthConfig {
        ecc_correctable_per_minute: 0.0,
        ecc_correctable_window: Duration::from_secs(10),
        ..HealthConfig::default()
    });
    let mut g = h100();
    g.reading.ecc.corrected_volatile = Some(1_000_000);
    for t in 0..=10 {
        assert!(
            names(&eval(&mut e, &g, t)).is_empty(),
            "no growth, no error"
        );
    }
    g.reading.ecc.corrected_volatile = Some(0); // a GPU reset
    for t in 11..=22 {
        assert!(names(&eval(&mut e, &g, t)).is_empty());
    }
    g.reading.ecc.corrected_volatile = Some(1);
    assert_eq!(names(&eval(&mut e, &g, 23)), ["ecc_sbe_rate"]);
}

#[test]
fn a_narrow_link_warns_at_once_busy_or_idle() {
    let mut e = Evaluator::default();
    let mut g = h100();
    g.reading.pcie_width = Some(8);
    let h = eval(&mut e, &g, 0);
    assert_eq!(names(&h), ["pcie_link_degraded"]);
    let reason = &h.gpus[0].verdict.conditions[0].reason;
    assert!(
        reason.starts_with("PCIe link Gen5 x8, maximum Gen5 x16: trained to x8 of x16 lanes (50%"),
        "{reason}"
    );
    g.reading.pcie_width = Some(16);
    assert!(names(&eval(&mut e, &g, 5)).is_empty());
}

#[test]
fn a_low_generation_warns_only_while_busy_for_the_configured_time() {
    let mut e = Evaluator::default();
    let mut g = h100();
    // Idle at Gen1, as GPUs save power: nothing, however long.
    g.reading.pcie_generation = Some(1);
    for t in (0..=300).step_by(5) {
        assert!(names(&eval(&mut e, &g, t)).is_empty(), "idle t={t}");
    }
    // Just under busy: still nothing.
    g.reading.gpu_util_percent = Some(49);
    for t in (305..=500).step_by(5) {
        assert!(names(&eval(&mut e, &g, t)).is_empty(), "49% t={t}");
    }
    // Busy at Gen4 of 5: a warning after a minute, not before.
    g.reading.gpu_util_percent = Some(50);
    g.reading.pcie_generation = Some(4);
    for t in (505..565).step_by(5) {
        assert!(
            names(&eval(&mut e, &g, t)).is_empty(),
            "busy for less than 1m t={t}"
        );
    }
    let h = eval(&mut e, &g, 565);
    assert_eq!(names(&h), ["pcie_link_degraded"]);
    let reason = &h.gpus[0].verdict.conditions[0].reason;
    assert!(
        reason.contains("at Gen4 below Gen5 while 50% busy (at or above 50%) for 1m"),
        "{reason}"
    );
    // Back at Gen5: cleared.
    g.reading.pcie_generation = Some(5);
    assert!(names(&eval(&mut e, &g, 570)).is_empty());
    // Busy, low, idle a moment, busy again: the minute starts again.
    g.reading.pcie_generation = Some(4);
    for t in (575..=620).step_by(5) {
        eval(&mut e, &g, t);
    }
    g.reading.gpu_util_percent = Some(0);
    eval(&mut e, &g, 625);
    g.reading.gpu_util_percent = Some(100);
    for t in (630..685).step_by(5) {
        assert!(names(&eval(&mut e, &g, t)).is_empty(), "t={t}");
    }
    assert_eq!(names(&eval(&mut e, &g, 690)), ["pcie_link_degraded"]);
}

#[test]
fn the_keys_parse_and_bad_values_say_where_and_what_to_write() {
    let ok = |text: &str| {
        crate::config::from_text("c.toml", text, &crate::config::Overrides::default())
            .expect("valid")
            .health
    };
    let err = |text: &str| {
        crate::config::from_text("c.toml", text, &crate::config::Overrides::default())
            .map(|_| ())
            .expect_err("rejected")
            .to_string()
    };
    let h = ok(
        "[health]\necc_correctable_per_minute = 100.0\necc_correctable_window = \"5m\"\n\
                pcie_busy_for = \"30s\"\n",
    );
    assert_eq!(h.ecc_correctable_per_minute, 100.0);
    assert_eq!(h.ecc_correctable_window, Duration::from_secs(300));
    assert_eq!(h.pcie_busy_for, Duration::from_secs(30));
    assert!(
        h.describe()
            .contains("correctable ECC errors at or above 100/min over 5m, PCIe link below its maximum generation while busy for 30s"),
        "{}",
        h.describe()
    );
    let e = err("[health]\necc_correctable_per_minute = -1.0\n");
    assert!(
        e.starts_with("c.toml:2:30: invalid ECC error rate -1"),
        "{e}"
    );
    let e = err("[health]\necc_correctable_window = \"0s\"\n");
    assert!(e.starts_with("c.toml:2:26:"), "{e}");
    let e = err("[health]\npcie_busy_for = \"soon\"\n");
    assert!(e.starts_with("c.toml:2:17: invalid duration 'soon'"), "{e}");
}

/// NVML's recovery action 5 is a known action: the IMEX domain in the reason, not the
/// fallback for values NVML did not define then (6 here, `contact_support`).
#[test]
fn recovery_action_5_names_the_imex_domain_and_is_not_the_unknown_fallback() {
    let mut e = Evaluator::default();
    let mut g = h100();
    g.reading.recovery_action = Some(5);
    let h = eval(&mut e, &g, 0);
    assert_eq!(names(&h), ["driver_recovery_action"]);
    let c = &h.gpus[0].verdict.conditions[0];
    assert_eq!(
        (c.severity, c.action),
        (Status::Fail, super::Action::DrainAndReset)
    );
    assert!(c.reason.contains("IMEX domain"), "{}", c.reason);
    assert!(!c.reason.contains("unknown"), "{}", c.reason);
    assert_eq!(h.gpus[0].verdict.action, super::Action::DrainAndReset);
    g.reading.recovery_action = Some(6);
    let h = eval(&mut e, &g, 1);
    let c = &h.gpus[0].verdict.conditions[0];
    assert_eq!(
        (c.severity, c.action),
        (Status::Warn, super::Action::ContactSupport)
    );
    assert!(
        c.reason.contains("unknown recovery action (6)"),
        "{}",
        c.reason
    );
}
