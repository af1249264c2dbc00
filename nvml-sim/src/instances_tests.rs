use super::*;
use crate::models::by_key;

fn model(key: &str) -> &'static Model {
    by_key(key).expect("model in the table")
}

fn enabled(m: &Model) -> MigGpu {
    let _ = m;
    MigGpu::new("GPU-test", true)
}

fn profile(m: &Model, name: &str) -> &'static GiProfile {
    m.mig_profile_named(name).expect("profile of the model")
}

/// Creates GIs of the named profiles without placement, in order; the first failure's code.
fn create_all(gpu: &mut MigGpu, m: &Model, names: &[&str]) -> Result<Vec<u32>, Ret> {
    let mut ids = Vec::new();
    for (i, n) in names.iter().enumerate() {
        ids.push(gpu.create_gi(m, profile(m, n), None, i as u64 + 1)?);
    }
    Ok(ids)
}

#[test]
fn driver_choice_reproduces_the_guides_ordering_effect_on_a100() {
    // MIG User Guide: `-cgi 19,19,14,9` fails with Insufficient Resources, `9,19,14,19` works.
    let m = model("A100-SXM4-40GB");
    let mut bad = enabled(m);
    assert_eq!(
        create_all(&mut bad, m, &["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]),
        Err(INSUFFICIENT_RESOURCES)
    );
    let mut good = enabled(m);
    assert!(create_all(&mut good, m, &["3g.20gb", "1g.5gb", "2g.10gb", "1g.5gb"]).is_ok());
}

#[test]
fn placements_capacity_and_limits() {
    let m = model("H100-SXM5-80GB");
    let mut g = enabled(m);
    // Seven 1g fill the compute slices; an eighth has no room.
    assert!(create_all(&mut g, m, &["1g.10gb"; 7]).is_ok());
    assert_eq!(g.remaining(m, profile(m, "1g.10gb")), 0);
    assert_eq!(
        g.create_gi(m, profile(m, "1g.10gb"), None, 99),
        Err(INSUFFICIENT_RESOURCES)
    );
    // Explicit placements: overlap refused, a start the profile lacks is INVALID_ARGUMENT.
    let mut g = enabled(m);
    let p3 = profile(m, "3g.40gb");
    assert_eq!(g.create_gi(m, p3, Some((0, 4)), 1), Ok(1));
    assert_eq!(
        g.create_gi(m, p3, Some((0, 4)), 2),
        Err(INSUFFICIENT_RESOURCES)
    );
    assert_eq!(
        g.create_gi(m, p3, Some((2, 4)), 2),
        Err(ffi::INVALID_ARGUMENT)
    );
    assert_eq!(
        g.create_gi(m, p3, Some((4, 3)), 2),
        Err(ffi::INVALID_ARGUMENT)
    );
    // 4g@0 overlaps the 3g@0; 2g fits at 4 and 6? only 4 (starts 0,2,4).
    assert_eq!(
        g.create_gi(m, profile(m, "4g.40gb"), Some((0, 4)), 3),
        Err(INSUFFICIENT_RESOURCES)
    );
    assert_eq!(g.remaining(m, profile(m, "2g.20gb")), 1);
    assert_eq!(g.remaining(m, p3), 1);
    // Only one +me per GPU.
    let mut g = enabled(m);
    let me = profile(m, "1g.10gb+me");
    assert!(g.create_gi(m, me, None, 1).is_ok());
    assert_eq!(g.create_gi(m, me, None, 2), Err(INSUFFICIENT_RESOURCES));
    // A 4g at 0 and a 3g at 4 fill the whole GPU (allowed since R510).
    let mut g = enabled(m);
    assert!(create_all(&mut g, m, &["4g.40gb", "3g.40gb"]).is_ok());
    assert_eq!(g.remaining(m, profile(m, "1g.10gb")), 0);
}

#[test]
fn disabled_mode_creates_nothing_and_reports_full_capacity() {
    let m = model("H200-SXM-141GB");
    let mut g = MigGpu::new("GPU-x", false);
    assert_eq!(g.remaining(m, profile(m, "1g.18gb")), 7);
    assert_eq!(
        g.create_gi(m, profile(m, "1g.18gb"), None, 1),
        Err(ffi::NOT_SUPPORTED)
    );
}

#[test]
fn ids_are_lowest_free_and_reused() {
    let m = model("H100-SXM5-80GB");
    let mut g = enabled(m);
    let ids = create_all(&mut g, m, &["1g.10gb", "1g.10gb", "1g.10gb"]).expect("fit");
    assert_eq!(ids, vec![1, 2, 3]);
    g.destroy_gi(2, false).expect("destroy");
    assert_eq!(g.create_gi(m, profile(m, "1g.10gb"), None, 9), Ok(2));
}

#[test]
fn compute_instances_and_in_use() {
    let m = model("H100-SXM5-80GB");
    let mut g = enabled(m);
    let gi = g
        .create_gi(m, profile(m, "3g.40gb"), None, 1)
        .expect("fits");
    // 3g offers 1c, 2c and 3c (ids 0, 1, 2), not 4c.
    let ids: Vec<u32> = ci_profiles(3).iter().map(|p| p.id).collect();
    assert_eq!(ids, vec![0, 1, 2]);
    assert_eq!(g.create_ci(m, gi, 3, None, 2), Err(ffi::NOT_SUPPORTED));
    // Three 1c fit, a fourth does not; a full 3c no longer fits either.
    for s in 0..3 {
        assert!(g.create_ci(m, gi, 0, None, 10 + s).is_ok());
    }
    assert_eq!(g.create_ci(m, gi, 0, None, 20), Err(INSUFFICIENT_RESOURCES));
    assert_eq!(g.create_ci(m, gi, 2, None, 21), Err(INSUFFICIENT_RESOURCES));
    // GI destroy with live CIs is IN_USE; a CI with a process is IN_USE.
    assert_eq!(g.destroy_gi(gi, false), Err(IN_USE));
    assert_eq!(g.destroy_ci(gi, 0, true), Err(IN_USE));
    for ci in 0..3 {
        g.destroy_ci(gi, ci, false).expect("idle CI");
    }
    assert_eq!(g.destroy_gi(gi, true), Err(IN_USE), "a process in the GI");
    assert_eq!(g.destroy_gi(gi, false), Ok(()));
    assert_eq!(g.destroy_gi(gi, false), Err(ffi::INVALID_ARGUMENT), "gone");
    // Placement inside a 7g: 3c at 0 and 3, not at 1.
    let gi = g
        .create_gi(m, profile(m, "7g.80gb"), None, 30)
        .expect("empty GPU");
    assert_eq!(
        g.create_ci(m, gi, 2, Some((1, 3)), 31),
        Err(ffi::INVALID_ARGUMENT)
    );
    assert!(g.create_ci(m, gi, 2, Some((3, 3)), 32).is_ok());
    assert_eq!(
        g.create_ci(m, gi, 1, Some((4, 2)), 33),
        Err(INSUFFICIENT_RESOURCES)
    );
}

#[test]
fn mode_changes_pending_and_reset() {
    let m = model("A100-SXM4-80GB");
    let mut g = MigGpu::new("GPU-y", false);
    // Idle bare-metal GPU: applies at once.
    assert_eq!(g.set_mode(true, false, false), Ok(ffi::SUCCESS));
    assert!(g.current && g.pending);
    g.create_gi(m, profile(m, "7g.80gb"), None, 1)
        .expect("fits");
    // Disabling with instances left is refused.
    assert_eq!(g.set_mode(false, false, false), Err(IN_USE));
    g.destroy_gi(1, false).expect("no CI");
    // With processes the change stays pending.
    assert_eq!(g.set_mode(false, true, false), Ok(IN_USE));
    assert!(g.current && !g.pending);
    g.reset();
    assert!(!g.current && !g.pending);
    assert_eq!(g.set_mode(true, false, true), Ok(RESET_REQUIRED));
    assert!(!g.current && g.pending);
}

#[test]
fn faults_fail_the_nth_call_only() {
    let mut g = MigGpu::new("GPU-z", true);
    let faults = BTreeMap::from([("create_gpu_instance".to_owned(), vec![2])]);
    assert_eq!(g.fault(Op::CreateGpuInstance, &faults), Ok(()));
    assert_eq!(g.fault(Op::CreateGpuInstance, &faults), Err(ffi::UNKNOWN));
    assert_eq!(g.fault(Op::CreateGpuInstance, &faults), Ok(()));
    assert_eq!(g.fault(Op::DestroyGpuInstance, &faults), Ok(()));
}

#[test]
fn layout_searches_placements() {
    let m = model("H100-SXM5-80GB");
    // 1g.20gb needs an even start; listing them first must still find room for the 3g.
    let names = ["1g.20gb", "1g.20gb", "3g.40gb"];
    let profiles: Vec<&GiProfile> = names.iter().map(|n| profile(m, n)).collect();
    let g = MigGpu::layout(m, "GPU-l", &profiles).expect("feasible");
    assert_eq!(g.gpu_instances.len(), 3);
    assert!(g
        .gpu_instances
        .iter()
        .all(|gi| gi.compute_instances.len() == 1));
    let too_much: Vec<&GiProfile> = ["4g.40gb", "4g.40gb"]
        .iter()
        .map(|n| profile(m, n))
        .collect();
    assert!(MigGpu::layout(m, "GPU-l", &too_much).is_none());
}

#[test]
fn mig_uuids_look_like_the_drivers() {
    let u = mig_uuid("GPU-a", 1, 0, 7);
    assert!(u.starts_with("MIG-") && u.len() == 40, "{u}");
    assert_ne!(u, mig_uuid("GPU-a", 1, 0, 8));
}
