//! The NVLink and fabric conditions over successive snapshots at chosen instants.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::*;
use crate::health::{Evaluator, HealthConfig, NodeHealth};
use crate::snapshot::{
    Fabric, GpuIdentity, GpuReading, GpuSnapshot, NvLinkErrors, NvLinks, NvmlCode, NvmlStatus,
    Snapshot, XidStat,
};

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
}

/// A healthy HGX H100: 18 active links, no errors, a completed healthy fabric.
fn hgx() -> GpuSnapshot {
    let reading = GpuReading {
        nvlink: Some(NvLinks {
            active: vec![true; 18],
            errors: NvLinkErrors {
                replay: Some(0),
                recovery: Some(0),
                crc_flit: Some(0),
                crc_data: Some(0),
            },
            ..NvLinks::default()
        }),
        fabric: Some(Fabric {
            state: FabricState::Completed,
            error: None,
            clique_id: 1,
            cluster_uuid: "c".into(),
            health_mask: Some(2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8),
            health_summary: Some(1),
        }),
        ..GpuReading::default()
    };
    GpuSnapshot {
        index: 0,
        identity: Some(Arc::new(GpuIdentity {
            uuid: "GPU-0".into(),
            ..GpuIdentity::default()
        })),
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

fn conditions(h: &NodeHealth) -> Vec<(String, Status, Action)> {
    h.gpus[0]
        .verdict
        .conditions
        .iter()
        .map(|c| (c.name.clone(), c.severity, c.action))
        .collect()
}

fn mask(g: &mut GpuSnapshot, m: u32) {
    if let Some(f) = g.reading.fabric.as_mut() {
        f.health_mask = Some(m);
    }
}

#[test]
fn a_healthy_hgx_gpu_and_a_gpu_without_nvlink_have_no_condition() {
    let mut e = Evaluator::default();
    for t in [0, 30, 61, 120] {
        assert!(conditions(&eval(&mut e, &hgx(), t)).is_empty());
    }
    let mut vm = hgx();
    vm.reading.nvlink = None;
    vm.reading.fabric = None;
    assert!(conditions(&eval(&mut Evaluator::default(), &vm, 0)).is_empty());
}

#[test]
fn a_link_that_goes_down_fails_the_gpu_and_clears_when_it_is_back() {
    let mut e = Evaluator::default();
    let mut g = hgx();
    eval(&mut e, &g, 0);
    if let Some(n) = g.reading.nvlink.as_mut() {
        n.active[3] = false;
    }
    let h = eval(&mut e, &g, 10);
    assert_eq!(
        conditions(&h),
        [(NVLINK_DOWN.into(), Status::Fail, Action::ResetGpu)]
    );
    assert!(h.gpus[0].verdict.conditions[0]
        .reason
        .contains("NVLink link 3 down (1 of 18)"));
    if let Some(n) = g.reading.nvlink.as_mut() {
        n.active[3] = true;
    }
    assert!(conditions(&eval(&mut e, &g, 20)).is_empty());
}

#[test]
fn a_link_down_at_start_is_down_on_an_nvswitch_board_but_not_on_a_bridged_one() {
    let mut g = hgx();
    if let Some(n) = g.reading.nvlink.as_mut() {
        n.active[17] = false;
    }
    let h = eval(&mut Evaluator::default(), &g, 0);
    assert_eq!(conditions(&h)[0].0, NVLINK_DOWN);
    // Without fabric info (an A100, a bridged PCIe board) an unconnected link is not down...
    g.reading.fabric = None;
    let mut e = Evaluator::default();
    assert!(conditions(&eval(&mut e, &g, 0)).is_empty());
    // ...until it was seen active and went down.
    if let Some(n) = g.reading.nvlink.as_mut() {
        n.active[17] = true;
    }
    eval(&mut e, &g, 10);
    if let Some(n) = g.reading.nvlink.as_mut() {
        n.active[17] = false;
    }
    assert_eq!(conditions(&eval(&mut e, &g, 20))[0].0, NVLINK_DOWN);
    // No link up at all (links present, nothing connected): nothing is down.
    if let Some(n) = g.reading.nvlink.as_mut() {
        n.active = vec![false; 12];
    }
    assert!(conditions(&eval(&mut Evaluator::default(), &g, 0)).is_empty());
}

#[test]
fn a_recovery_storm_warns_after_a_full_window_and_clears_when_it_stops() {
    let mut e = Evaluator::new(HealthConfig::default());
    let mut g = hgx();
    let set = |g: &mut GpuSnapshot, n: u64| {
        if let Some(l) = g.reading.nvlink.as_mut() {
            l.errors.recovery = Some(n);
        }
    };
    eval(&mut e, &g, 0);
    set(&mut g, 30);
    assert!(
        conditions(&eval(&mut e, &g, 30)).is_empty(),
        "window not covered"
    );
    set(&mut g, 60);
    let h = eval(&mut e, &g, 60);
    assert_eq!(
        conditions(&h),
        [(NVLINK_ERRORS.into(), Status::Warn, Action::ResetGpu)]
    );
    // One error a minute is at the threshold, not above it.
    set(&mut g, 61);
    eval(&mut e, &g, 120);
    set(&mut g, 62);
    assert!(conditions(&eval(&mut e, &g, 180)).is_empty());
}

#[test]
fn the_error_rate_threshold_and_window_are_configurable() {
    let config = HealthConfig {
        nvlink_errors_per_minute: 0.0,
        nvlink_error_window: Duration::from_secs(10),
        ..HealthConfig::default()
    };
    let mut e = Evaluator::new(config);
    let mut g = hgx();
    eval(&mut e, &g, 0);
    if let Some(l) = g.reading.nvlink.as_mut() {
        l.errors.replay = Some(1);
    }
    assert_eq!(conditions(&eval(&mut e, &g, 10))[0].0, NVLINK_ERRORS);
}

#[test]
fn nvlink_xids_raise_nvlink_errors_with_their_verdict() {
    let mut e = Evaluator::default();
    let mut g = hgx();
    g.xids.insert(
        74,
        XidStat {
            count: 1,
            last_seen: at(0),
        },
    );
    let names: Vec<String> = conditions(&eval(&mut e, &g, 1))
        .into_iter()
        .map(|c| c.0)
        .collect();
    assert!(names.contains(&NVLINK_ERRORS.to_string()), "{names:?}");
    assert!(names.contains(&"xid_74".to_string()), "{names:?}");
    let errs = conditions(&eval(&mut e, &g, 2));
    let nv = errs.iter().find(|c| c.0 == NVLINK_ERRORS).expect("raised");
    assert_eq!((nv.1, nv.2), (Status::Fail, Action::ResetGpu));
    assert!(is_nvlink_xid(144) && is_nvlink_xid(150) && !is_nvlink_xid(143));
}

#[test]
fn each_health_mask_bit_raises_its_condition_and_clears() {
    let healthy = 2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8;
    let cases = [
        (healthy & !(0x3) | 1, FABRIC_DEGRADED, Status::Warn),
        (
            healthy & !(0x3 << 2) | 1 << 2,
            FABRIC_DEGRADED,
            Status::Warn,
        ),
        (
            healthy & !(0x3 << 4) | 1 << 4,
            FABRIC_UNHEALTHY,
            Status::Fail,
        ),
        (
            healthy & !(0x3 << 6) | 1 << 6,
            FABRIC_DEGRADED,
            Status::Warn,
        ),
        (
            healthy & !(0xF << 8) | 2 << 8,
            FABRIC_UNHEALTHY,
            Status::Fail,
        ),
    ];
    for (m, name, severity) in cases {
        let mut e = Evaluator::default();
        let mut g = hgx();
        mask(&mut g, m);
        let c = conditions(&eval(&mut e, &g, 0));
        assert_eq!(c.len(), 1, "mask {m:#x}: {c:?}");
        assert_eq!((c[0].0.as_str(), c[0].1), (name, severity), "mask {m:#x}");
        mask(&mut g, healthy);
        assert!(conditions(&eval(&mut e, &g, 10)).is_empty(), "mask {m:#x}");
    }
}

#[test]
fn a_fabric_not_completed_or_not_successful_is_not_ready() {
    let mut e = Evaluator::default();
    let mut g = hgx();
    for (state, error) in [
        (FabricState::InProgress, None),
        (FabricState::NotStarted, None),
        (FabricState::Completed, Some(NvmlCode::Return(33))),
    ] {
        if let Some(f) = g.reading.fabric.as_mut() {
            (f.state, f.error) = (state, error);
        }
        let c = conditions(&eval(&mut e, &g, 0));
        assert_eq!(c, [(FABRIC_NOT_READY.into(), Status::Fail, Action::None)]);
    }
    if let Some(f) = g.reading.fabric.as_mut() {
        (f.state, f.error) = (FabricState::Completed, None);
    }
    assert!(conditions(&eval(&mut e, &g, 5)).is_empty());
}
