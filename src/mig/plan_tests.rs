use super::*;
use crate::config::mig_layout::{DeviceFilter, Devices, LayoutEntry};
use crate::snapshot::mig::{ComputeInstance, GpuProcess, MigMode};

/// The H100 80GB HBM3 table (NVIDIA's MIG User Guide, `nvidia-smi mig -lgipp`): (index, id,
/// name, slices, instances, starts, size).
type Row = (u32, u32, &'static str, u32, u32, &'static [u32], u32);

const H100: &[Row] = &[
    (0, 19, "1g.10gb", 1, 7, &[0, 1, 2, 3, 4, 5, 6], 1),
    (1, 14, "2g.20gb", 2, 3, &[0, 2, 4], 2),
    (2, 9, "3g.40gb", 3, 2, &[0, 4], 4),
    (3, 5, "4g.40gb", 4, 1, &[0], 4),
    (4, 0, "7g.80gb", 7, 1, &[0], 8),
    (7, 20, "1g.10gb+me", 1, 1, &[0, 1, 2, 3, 4, 5, 6], 1),
    (9, 15, "1g.20gb", 1, 4, &[0, 2, 4, 6], 2),
];

fn h100(index: u32, enabled: bool) -> MigGpu {
    MigGpu {
        index,
        uuid: format!("GPU-{index}"),
        name: "NVIDIA H100 80GB HBM3".into(),
        pci_device_id: 0x2330_10DE,
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
        pci_subsystem_id: 0x16C1_10DE,
        mig: Some(MigMode {
            current: enabled,
            pending: enabled,
        }),
        profiles: H100
            .iter()
            .map(
                |&(index, id, name, slices, instances, starts, size)| GiProfile {
                    index,
                    id,
                    name: name.into(),
                    slices,
                    instances,
                    memory_mib: 10_000,
                    placements: starts.iter().map(|&s| (s, size)).collect(),
                },
            )
            .collect(),
        instances: Vec::new(),
        processes: Vec::new(),
    }
}

/// Adds a GPU instance with one full-size compute instance.
fn with(mut gpu: MigGpu, name: &str, start: u32) -> MigGpu {
    let p = gpu.profile(name).expect("profile").clone();
    let id = gpu.instances.len() as u32 + 1;
    gpu.instances.push(GpuInstance {
        profile: p.name.clone(),
        profile_id: p.id,
        gpu_instance_id: id,
        start,
        size: p.placements[0].1,
        memory_mib: p.memory_mib,
        memory_used_bytes: None,
        memory_free_bytes: None,
        compute_instances: vec![ComputeInstance {
            profile: p.name.clone(),
            profile_id: full_ci_profile(p.slices).expect("full CI"),
            compute_instance_id: 0,
            start: 0,
            size: p.slices,
            uuid: None,
            mig_index: None,
        }],
    });
    gpu
}

fn layout(devices: &[(&str, u32)]) -> Layout {
    Layout {
        entries: vec![LayoutEntry {
            device_filter: Vec::new(),
            devices: Devices::All,
            mig_enabled: true,
            mig_devices: devices.iter().map(|&(n, c)| (n.to_owned(), c)).collect(),
        }],
    }
}

/// Applies a plan to the found layout in memory, checking each step the way the driver would:
/// returns the resulting GPU.
fn simulate(mut gpu: MigGpu, plan: &GpuPlan) -> MigGpu {
    for step in &plan.steps {
        match step {
            Step::SetMigMode { enable } => {
                gpu.mig = Some(MigMode {
                    current: *enable,
                    pending: *enable,
                });
            }
            Step::DestroyComputeInstance {
                gpu_instance_id,
                compute_instance_id,
                ..
            } => {
                let gi = gpu
                    .instances
                    .iter_mut()
                    .find(|g| g.gpu_instance_id == *gpu_instance_id)
                    .expect("GI exists");
                gi.compute_instances
                    .retain(|c| c.compute_instance_id != *compute_instance_id);
            }
            Step::DestroyGpuInstance {
                gpu_instance_id, ..
            } => {
                let at = gpu
                    .instances
                    .iter()
                    .position(|g| g.gpu_instance_id == *gpu_instance_id)
                    .expect("GI exists");
                assert!(
                    gpu.instances[at].compute_instances.is_empty(),
                    "compute instances are destroyed before their GPU instance"
                );
                gpu.instances.remove(at);
            }
            Step::CreateComputeInstance {
                gpu_instance_id,
                size,
                profile_id,
                ..
            } => {
                let gi = gpu
                    .instances
                    .iter_mut()
                    .find(|g| g.gpu_instance_id == *gpu_instance_id)
                    .expect("GI exists");
                gi.compute_instances.push(ComputeInstance {
                    profile: gi.profile.clone(),
                    profile_id: *profile_id,
                    compute_instance_id: 0,
                    start: 0,
                    size: *size,
                    uuid: None,
                    mig_index: None,
                });
            }
            Step::CreateInstance { profile, start, .. } => {
                let id = (1..)
                    .find(|i| gpu.instances.iter().all(|g| g.gpu_instance_id != *i))
                    .expect("an id");
                gpu = with(gpu, profile, *start);
                let last = gpu.instances.len() - 1;
                gpu.instances[last].gpu_instance_id = id;
            }
        }
    }
    gpu
}

/// The driver's rules on a finished layout: valid starts, no overlap, ≤ 7 compute slices.
fn assert_valid(gpu: &MigGpu) {
    let mut used = 0u32;
    let mut slices = 0;
    for gi in &gpu.instances {
        let p = gpu.profile(&gi.profile).expect("profile");
        assert!(
            p.placements.contains(&(gi.start, gi.size)),
            "{} at {}",
            gi.profile,
            gi.start
        );
        let m = span(gi.start, gi.size);
        assert_eq!(used & m, 0, "overlap at {}:{}", gi.start, gi.size);
        used |= m;
        slices += p.slices;
    }
    assert!(slices <= 7);
}

fn counts(names: &[(&str, u32)]) -> BTreeMap<String, u32> {
    names.iter().map(|&(n, c)| (n.to_owned(), c)).collect()
}

const BALANCED: &[(&str, u32)] = &[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)];

#[test]
fn balanced_on_an_empty_gpu_needs_search_not_first_fit() {
    // Largest first with the lowest free start puts 3g@0, 2g@4, 1g@6 and then has no start
    // left for the second 1g (slice 7 starts nothing): first fit fails, search succeeds.
    let gpu = h100(0, true);
    let p = plan(std::slice::from_ref(&gpu), &layout(BALANCED)).expect("feasible");
    let g = &p.gpus[0];
    assert_eq!(g.steps.len(), 4);
    assert!(g
        .steps
        .iter()
        .all(|s| matches!(s, Step::CreateInstance { .. })));
    let done = simulate(gpu, g);
    assert_valid(&done);
    assert_eq!(found_counts(&done), counts(BALANCED));
}

#[test]
fn matching_instances_are_kept() {
    let gpu = with(with(h100(0, true), "3g.40gb", 4), "2g.20gb", 0);
    let p = plan(std::slice::from_ref(&gpu), &layout(BALANCED)).expect("feasible");
    let g = &p.gpus[0];
    assert_eq!(g.kept, vec![1, 2]);
    let starts: Vec<u32> = g
        .steps
        .iter()
        .map(|s| match s {
            Step::CreateInstance { profile, start, .. } => {
                assert_eq!(profile, "1g.10gb");
                *start
            }
            other => panic!("only creations expected, got {other}"),
        })
        .collect();
    assert_eq!(starts, vec![2, 3]);
    let done = simulate(gpu, g);
    assert_valid(&done);
    assert_eq!(found_counts(&done), counts(BALANCED));
}

#[test]
fn a_blocking_arrangement_is_rearranged() {
    // 3g@0 + 2g@4 leaves only slice 6 for 1g: keeping either makes the target unreachable.
    let gpu = with(with(h100(0, true), "3g.40gb", 0), "2g.20gb", 4);
    let p = plan(std::slice::from_ref(&gpu), &layout(BALANCED)).expect("feasible");
    let g = &p.gpus[0];
    let kinds: Vec<&str> = g
        .steps
        .iter()
        .map(|s| match s {
            Step::DestroyComputeInstance { .. } => "dci",
            Step::DestroyGpuInstance { .. } => "dgi",
            Step::CreateInstance { .. } => "create",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        ["dci", "dgi", "dci", "dgi", "create", "create", "create", "create"]
    );
    let done = simulate(gpu, g);
    assert_valid(&done);
    assert_eq!(found_counts(&done), counts(BALANCED));
}

#[test]
fn keeps_as_much_as_fits() {
    // 3g@4 fits the target "3g + 4g" only if the 4g goes to 0: keep it, destroy the 1g@0.
    let gpu = with(with(h100(0, true), "3g.40gb", 4), "1g.10gb", 0);
    let p = plan(
        std::slice::from_ref(&gpu),
        &layout(&[("3g.40gb", 1), ("4g.40gb", 1)]),
    )
    .expect("feasible");
    let g = &p.gpus[0];
    assert_eq!(g.kept, vec![1]);
    let done = simulate(gpu, g);
    assert_valid(&done);
    assert_eq!(
        found_counts(&done),
        counts(&[("3g.40gb", 1), ("4g.40gb", 1)])
    );
}

#[test]
fn the_same_layout_again_is_no_change() {
    let gpu = h100(0, true);
    let l = layout(BALANCED);
    let first = plan(std::slice::from_ref(&gpu), &l).expect("feasible");
    let done = simulate(gpu, &first.gpus[0]);
    let again = plan(&[done], &l).expect("feasible");
    assert!(again.is_noop(), "{:?}", again.gpus[0].steps);
    assert_eq!(again.gpus[0].kept.len(), 4);
}

#[test]
fn infeasible_layouts_name_the_gpu_and_why() {
    let gpu = h100(3, true);
    let cases: &[(&[(&str, u32)], &str)] = &[
        (
            &[("4g.40gb", 1), ("3g.40gb", 1), ("1g.10gb", 1)],
            "needs 8 compute slices",
        ),
        (
            &[("1g.20gb", 4), ("3g.40gb", 1)],
            "do not fit the GPU's 8 memory slices",
        ),
        (
            &[("1g.5gb", 1)],
            "profile '1g.5gb' does not exist on NVIDIA H100 80GB HBM3",
        ),
        (&[("1g.10gb+me", 2)], "at most 1"),
        (&[("1c.3g.40gb", 3)], "compute-instance profiles"),
        (&[("3g.40gb", 2), ("1g.10gb", 1)], "do not fit"),
    ];
    for (want, reason) in cases {
        let e = plan(std::slice::from_ref(&gpu), &layout(want)).expect_err(reason);
        assert_eq!(e.index, 3);
        assert!(e.to_string().starts_with("GPU 3 (GPU-3): "), "{e}");
        assert!(
            e.reason.contains(reason),
            "{} should say {reason}",
            e.reason
        );
    }
}

#[test]
fn disabling_destroys_compute_then_gpu_instances_then_the_mode() {
    let mut gpu = with(with(h100(0, true), "3g.40gb", 0), "2g.20gb", 4);
    gpu.processes.push(GpuProcess {
        pid: 99,
        gpu_instance_id: Some(2),
        compute_instance_id: Some(0),
    });
    let mut l = layout(&[]);
    l.entries[0].mig_enabled = false;
    let p = plan(std::slice::from_ref(&gpu), &l).expect("always feasible");
    let g = &p.gpus[0];
    assert!(matches!(
        g.steps.last(),
        Some(Step::SetMigMode { enable: false })
    ));
    assert!(matches!(
        g.steps[0],
        Step::DestroyComputeInstance {
            gpu_instance_id: 1,
            ..
        }
    ));
    assert!(matches!(
        g.steps[1],
        Step::DestroyGpuInstance {
            gpu_instance_id: 1,
            ..
        }
    ));
    assert_eq!(g.blocking_pids, vec![99]);
    let done = simulate(gpu, g);
    assert!(done.instances.is_empty());
}

#[test]
fn enabling_comes_first_and_mig_less_gpus_are_refused() {
    let gpu = h100(0, false);
    let p = plan(std::slice::from_ref(&gpu), &layout(&[("7g.80gb", 1)])).expect("feasible");
    assert_eq!(p.gpus[0].steps[0], Step::SetMigMode { enable: true });
    assert_eq!(p.gpus[0].steps.len(), 2);
    let mut l4 = h100(1, false);
    l4.mig = None;
    l4.name = "NVIDIA L4".into();
    // Under `devices: all` a GPU without MIG is skipped; named by index it is an error.
    let p = plan(&[l4.clone()], &layout(&[])).expect("skipped");
    assert!(!p.gpus[0].selected && p.is_noop());
    let mut named = layout(&[]);
    named.entries[0].devices = Devices::Indices(vec![1]);
    let e = plan(&[l4.clone()], &named).expect_err("no MIG");
    assert!(e.reason.contains("does not support MIG"));
    let mut off = layout(&[]);
    off.entries[0].mig_enabled = false;
    assert!(plan(&[l4], &off).expect("nothing to do").is_noop());
}

#[test]
fn entries_select_by_filter_and_index_last_wins() {
    let gpus = [h100(0, true), h100(1, true), h100(2, true)];
    let entry = |filter: &[&str], devices: Devices, n: u32| LayoutEntry {
        device_filter: filter
            .iter()
            .map(|f| DeviceFilter::parse(f).expect("filter"))
            .collect(),
        devices,
        mig_enabled: true,
        mig_devices: counts(&[("1g.10gb", n)]),
    };
    let l = Layout {
        entries: vec![
            entry(&["0x233010DE"], Devices::All, 1),
            entry(&[], Devices::Indices(vec![2]), 3),
            entry(&["0x20B010DE"], Devices::Indices(vec![0]), 7),
        ],
    };
    let p = plan(&gpus, &l).expect("feasible");
    let creates = |i: usize| p.gpus[i].steps.len();
    assert_eq!((creates(0), creates(1), creates(2)), (1, 1, 3));
    let sub = LayoutEntry {
        device_filter: vec![DeviceFilter::parse("0x233010DE:0x00000000").expect("filter")],
        ..entry(&[], Devices::All, 1)
    };
    let p = plan(&gpus, &Layout { entries: vec![sub] }).expect("feasible");
    assert!(p.gpus.iter().all(|g| !g.selected), "the subsystem differs");
}

#[test]
fn every_reachable_target_from_every_single_instance_start_ends_valid() {
    // Every multiset of H100 profiles up to the per-profile limits, from an empty GPU and from
    // a GPU holding one instance at each of its possible placements: either the plan is
    // rejected or applying it yields exactly the target, validly placed.
    let names: Vec<(&str, u32)> = H100.iter().map(|r| (r.2, r.4)).collect();
    let mut targets: Vec<Vec<(&str, u32)>> = vec![Vec::new()];
    for &(name, max) in &names {
        let mut next = Vec::new();
        for t in &targets {
            let used: u32 = t.iter().map(|&(n, c)| slices_of(n) * c).sum();
            for c in 0..=max {
                if used + c * slices_of(name) > 7 {
                    break;
                }
                let mut t2 = t.clone();
                if c > 0 {
                    t2.push((name, c));
                }
                next.push(t2);
            }
        }
        targets = next;
    }
    assert!(targets.len() > 100, "{} targets", targets.len());
    let mut starts = vec![h100(0, true)];
    for &(_, _, name, _, _, st, _) in H100 {
        for &s in st {
            starts.push(with(h100(0, true), name, s));
        }
    }
    let mut feasible = 0;
    for found in &starts {
        for t in &targets {
            match plan(std::slice::from_ref(found), &layout(t)) {
                Ok(p) => {
                    feasible += 1;
                    let done = simulate(found.clone(), &p.gpus[0]);
                    assert_valid(&done);
                    let want: BTreeMap<String, u32> =
                        t.iter().map(|&(n, c)| (n.to_owned(), c)).collect();
                    assert_eq!(found_counts(&done), want, "from {:?}", found.instances);
                }
                Err(e) => {
                    // Rejected only when no arrangement exists on an empty GPU either.
                    assert!(
                        plan(&[h100(0, true)], &layout(t)).is_err(),
                        "{t:?} rejected from {:?}: {e}",
                        found.instances
                    );
                }
            }
        }
    }
    assert!(feasible > 1000);
}

fn slices_of(name: &str) -> u32 {
    H100.iter().find(|r| r.2 == name).map_or(0, |r| r.3)
}
