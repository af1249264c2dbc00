//! The MIG lifecycle through the built library's C ABI (nvml-wrapper 0.13 wraps none of the
//! create/destroy calls): mode changes and pending mode, GPU and compute instances with and
//! without placement, MIG device handles and UUIDs, stale handles, IN_USE, `NVML_SIM_STATE`
//! persistence across library instances, simulated resets, `mig_faults` and `NVML_SIM_STATS`.

mod common;

use std::ffi::{c_char, c_uint, CStr};
use std::ptr::null_mut;

use common::Sim;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t, nvmlComputeInstance_t, nvmlDevice_t,
    nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlGpuInstance_t,
};

const IN_USE: u32 = 19;
const INSUFFICIENT_RESOURCES: u32 = 23;
const INVALID_ARGUMENT: u32 = 2;
const NOT_FOUND: u32 = 6;
const UNKNOWN: u32 = 999;

/// Calls a raw symbol of the loaded library.
macro_rules! call {
    ($nvml:expr, $sym:ident ( $($arg:expr),* )) => {{
        let f = $nvml.lib().$sym.as_ref().expect(stringify!($sym));
        // SAFETY: the symbol comes from the loaded simulator; every pointer argument is NULL
        // or points to a live local of the type nvml.h declares.
        unsafe { f($($arg),*) }
    }};
}

fn device(nvml: &Nvml, i: u32) -> nvmlDevice_t {
    let mut d: nvmlDevice_t = null_mut();
    assert_eq!(call!(nvml, nvmlDeviceGetHandleByIndex_v2(i, &mut d)), 0);
    d
}

fn mode(nvml: &Nvml, d: nvmlDevice_t) -> (u32, u32) {
    let (mut c, mut p) = (9, 9);
    assert_eq!(call!(nvml, nvmlDeviceGetMigMode(d, &mut c, &mut p)), 0);
    (c, p)
}

fn set_mode(nvml: &Nvml, d: nvmlDevice_t, m: u32) -> (u32, u32) {
    let mut status = 77;
    let r = call!(nvml, nvmlDeviceSetMigMode(d, m, &mut status));
    (r, status)
}

fn create_gi(
    nvml: &Nvml,
    d: nvmlDevice_t,
    id: u32,
    at: Option<u32>,
) -> Result<nvmlGpuInstance_t, u32> {
    let mut gi: nvmlGpuInstance_t = null_mut();
    let r = match at {
        None => call!(nvml, nvmlDeviceCreateGpuInstance(d, id, &mut gi)),
        Some(start) => {
            let mut info = nvmlGpuInstancePlacement_t { start, size: 0 };
            let mut n: c_uint = 8;
            let mut all = [nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 8];
            assert_eq!(
                call!(
                    nvml,
                    nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, id, all.as_mut_ptr(), &mut n)
                ),
                0
            );
            info.size = all[0].size;
            call!(
                nvml,
                nvmlDeviceCreateGpuInstanceWithPlacement(d, id, &info, &mut gi)
            )
        }
    };
    if r == 0 {
        Ok(gi)
    } else {
        Err(r)
    }
}

fn gi_info(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<nvmlGpuInstanceInfo_t, u32> {
    let mut info = nvmlGpuInstanceInfo_t {
        device: null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    };
    match call!(nvml, nvmlGpuInstanceGetInfo(gi, &mut info)) {
        0 => Ok(info),
        r => Err(r),
    }
}

fn create_ci(nvml: &Nvml, gi: nvmlGpuInstance_t, id: u32) -> Result<nvmlComputeInstance_t, u32> {
    let mut ci: nvmlComputeInstance_t = null_mut();
    match call!(nvml, nvmlGpuInstanceCreateComputeInstance(gi, id, &mut ci)) {
        0 => Ok(ci),
        r => Err(r),
    }
}

fn gis(nvml: &Nvml, d: nvmlDevice_t, profile: u32) -> Vec<nvmlGpuInstance_t> {
    let mut out = [null_mut(); 7];
    let mut n: c_uint = 7;
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstances(d, profile, out.as_mut_ptr(), &mut n)
        ),
        0
    );
    out[..n as usize].to_vec()
}

fn mig_devices(nvml: &Nvml, d: nvmlDevice_t) -> Vec<(u32, u32, String)> {
    let mut out = Vec::new();
    for i in 0..7 {
        let mut m: nvmlDevice_t = null_mut();
        match call!(nvml, nvmlDeviceGetMigDeviceHandleByIndex(d, i, &mut m)) {
            0 => {}
            NOT_FOUND => break,
            r => panic!("MigDeviceHandleByIndex({i}) = {r}"),
        }
        let (mut gi, mut ci, mut is) = (0, 0, 0);
        assert_eq!(call!(nvml, nvmlDeviceIsMigDeviceHandle(m, &mut is)), 0);
        assert_eq!(is, 1);
        assert_eq!(call!(nvml, nvmlDeviceGetGpuInstanceId(m, &mut gi)), 0);
        assert_eq!(call!(nvml, nvmlDeviceGetComputeInstanceId(m, &mut ci)), 0);
        let mut parent: nvmlDevice_t = null_mut();
        assert_eq!(
            call!(
                nvml,
                nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m, &mut parent)
            ),
            0
        );
        assert_eq!(parent, d);
        let mut buf = [0 as c_char; 96];
        assert_eq!(call!(nvml, nvmlDeviceGetUUID(m, buf.as_mut_ptr(), 96)), 0);
        // SAFETY: the simulator NUL-terminates what it writes into the 96-byte buffer.
        let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        out.push((gi, ci, uuid));
    }
    out
}

const ONE_H100: &str = "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\n";

#[test]
fn lifecycle_handles_and_in_use() {
    let sim = Sim::new(ONE_H100);
    let nvml = sim.init();
    let d = device(&nvml, 0);
    assert_eq!(mode(&nvml, d), (0, 0));
    assert_eq!(
        create_gi(&nvml, d, 9, None),
        Err(3),
        "NOT_SUPPORTED with MIG off"
    );
    assert_eq!(set_mode(&nvml, d, 1), (0, 0));
    assert_eq!(mode(&nvml, d), (1, 1));
    let mut max = 0;
    assert_eq!(call!(nvml, nvmlDeviceGetMaxMigDeviceCount(d, &mut max)), 0);
    assert_eq!(max, 7);

    // 3g without placement lands at the highest start (4); another at 0 by placement.
    let a = create_gi(&nvml, d, 9, None).expect("3g");
    assert_eq!(gi_info(&nvml, a).expect("info").placement.start, 4);
    let b = create_gi(&nvml, d, 9, Some(0)).expect("3g at 0");
    let ib = gi_info(&nvml, b).expect("info");
    assert_eq!(
        (ib.placement.start, ib.placement.size, ib.profileId),
        (0, 4, 9)
    );
    assert_eq!(ib.device, d);
    assert_eq!(create_gi(&nvml, d, 19, None), Err(INSUFFICIENT_RESOURCES));
    let mut left = 9;
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstanceRemainingCapacity(d, 19, &mut left)
        ),
        0
    );
    assert_eq!(left, 0);
    assert_eq!(gis(&nvml, d, 9).len(), 2);

    // Full CI (profile 2 = 3 slices) in each; MIG devices enumerate with MIG- UUIDs.
    let ca = create_ci(&nvml, a, 2).expect("ci a");
    create_ci(&nvml, b, 2).expect("ci b");
    let mut info = nvmlComputeInstanceInfo_t {
        device: null_mut(),
        gpuInstance: null_mut(),
        id: 9,
        profileId: 9,
        placement: nvmlComputeInstancePlacement_t { start: 9, size: 9 },
    };
    assert_eq!(call!(nvml, nvmlComputeInstanceGetInfo_v2(ca, &mut info)), 0);
    assert_eq!(
        (
            info.gpuInstance,
            info.id,
            info.profileId,
            info.placement.size
        ),
        (a, 0, 2, 3)
    );
    let migs = mig_devices(&nvml, d);
    assert_eq!(migs.len(), 2);
    assert!(migs.iter().all(|(_, _, u)| u.starts_with("MIG-")));
    assert_ne!(migs[0].2, migs[1].2);

    // CI before GI; a destroyed handle is stale.
    assert_eq!(call!(nvml, nvmlGpuInstanceDestroy(a)), IN_USE);
    assert_eq!(call!(nvml, nvmlComputeInstanceDestroy(ca)), 0);
    assert_eq!(
        call!(nvml, nvmlComputeInstanceDestroy(ca)),
        INVALID_ARGUMENT
    );
    assert_eq!(call!(nvml, nvmlGpuInstanceDestroy(a)), 0);
    assert_eq!(gi_info(&nvml, a).map(|i| i.id), Err(INVALID_ARGUMENT));
    assert_eq!(call!(nvml, nvmlGpuInstanceDestroy(a)), INVALID_ARGUMENT);
    assert_eq!(mig_devices(&nvml, d).len(), 1);

    // Disabling with instances left is IN_USE.
    assert_eq!(set_mode(&nvml, d, 0).0, IN_USE);
}

#[test]
fn processes_make_mode_changes_pending_and_block_destroy() {
    let scenario = "version = 1\n[[gpu]]\nmodel = \"A100-SXM4-40GB\"\nmig_mode = true\n\
                    mig_devices = [\"3g.20gb\", \"2g.10gb\"]\n[[gpu.process]]\npid = 77\n\
                    mig_device = \"3g.20gb\"\n";
    let sim = Sim::new(scenario);
    let nvml = sim.init();
    let d = device(&nvml, 0);
    assert_eq!(mig_devices(&nvml, d).len(), 2);
    let busy = gis(&nvml, d, 9)[0];
    let mut cis = [null_mut(); 7];
    let mut n: c_uint = 7;
    assert_eq!(
        call!(
            nvml,
            nvmlGpuInstanceGetComputeInstances(busy, 2, cis.as_mut_ptr(), &mut n)
        ),
        0
    );
    assert_eq!(n, 1);
    assert_eq!(call!(nvml, nvmlComputeInstanceDestroy(cis[0])), IN_USE);
    // The process is reported in its instance.
    let procs = nvml
        .device_by_index(0)
        .expect("dev")
        .running_compute_processes()
        .expect("procs");
    assert_eq!(procs.len(), 1);
    assert!(procs[0].gpu_instance_id.is_some());
}

#[test]
fn pending_mode_needs_a_reset_and_state_persists() {
    let scenario = "version = 1\n[[gpu]]\nmodel = \"H200-SXM-141GB\"\n[[gpu.process]]\npid = 5\n";
    let sim = Sim::new(scenario);
    let state = sim.dir.path().join("mig-state.json");
    std::env::set_var("NVML_SIM_STATE", &state);
    {
        let nvml = sim.init();
        let d = device(&nvml, 0);
        assert_eq!(set_mode(&nvml, d, 1), (0, IN_USE));
        assert_eq!(mode(&nvml, d), (0, 1));
    }
    // Another library instance (a new process) still sees it pending.
    let lib2 = sim.dir.path().join("second.so");
    std::fs::copy(&sim.lib, &lib2).expect("copy");
    let nvml = Nvml::builder()
        .lib_path(lib2.as_os_str())
        .init()
        .expect("init");
    let d = device(&nvml, 0);
    assert_eq!(mode(&nvml, d), (0, 1));
    // A simulated reset (reset_count raised) makes it current.
    sim.rewrite(&scenario.replace("[[gpu.process]]\npid = 5\n", "reset_count = 1\n"));
    assert!(common::eventually(
        std::time::Duration::from_secs(3),
        || mode(&nvml, d) == (1, 1)
    ));
    let gi = create_gi(&nvml, d, 14, Some(2)).expect("2g at 2");
    create_ci(&nvml, gi, 1).expect("full 2g CI");
    let migs = mig_devices(&nvml, d);
    drop(nvml);
    // A third instance finds the layout, with the same MIG UUID.
    let lib3 = sim.dir.path().join("third.so");
    std::fs::copy(&sim.lib, &lib3).expect("copy");
    let nvml = Nvml::builder()
        .lib_path(lib3.as_os_str())
        .init()
        .expect("init");
    let d = device(&nvml, 0);
    assert_eq!(mode(&nvml, d), (1, 1));
    assert_eq!(mig_devices(&nvml, d), migs);
    let g = gis(&nvml, d, 14);
    assert_eq!(gi_info(&nvml, g[0]).expect("info").placement.start, 2);
    std::env::remove_var("NVML_SIM_STATE");
}

#[test]
fn faults_fail_the_nth_call_and_stats_count() {
    let scenario = "version = 1\n[[gpu]]\nmodel = \"A100-SXM4-80GB\"\nmig_mode = true\n\
                    mig_faults = { create_gpu_instance = 2, destroy_compute_instance = [1] }\n";
    let sim = Sim::new(scenario);
    let stats = sim.dir.path().join("stats.json");
    std::env::set_var("NVML_SIM_STATS", &stats);
    let nvml = sim.init();
    let d = device(&nvml, 0);
    let a = create_gi(&nvml, d, 19, None).expect("first create");
    assert_eq!(create_gi(&nvml, d, 19, None), Err(UNKNOWN), "second fails");
    assert_eq!(
        gis(&nvml, d, 19).len(),
        1,
        "the failed call changed nothing"
    );
    create_gi(&nvml, d, 19, None).expect("third works");
    let ci = create_ci(&nvml, a, 0).expect("ci");
    assert_eq!(call!(nvml, nvmlComputeInstanceDestroy(ci)), UNKNOWN);
    assert_eq!(call!(nvml, nvmlComputeInstanceDestroy(ci)), 0);
    drop(nvml);
    let counts: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).expect("stats")).expect("json");
    assert_eq!(counts["nvmlDeviceCreateGpuInstance"], 3);
    assert_eq!(counts["nvmlComputeInstanceDestroy"], 2);
    std::env::remove_var("NVML_SIM_STATS");
}

#[test]
fn infeasible_initial_layouts_and_bad_fault_keys_are_rejected() {
    let sim = Sim::new(
        "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nmig_mode = true\n\
         mig_faults = { create_gpu = 1 }\n",
    );
    assert!(sim.try_init().is_err());
    sim.rewrite(
        "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nmig_mode = true\n\
         mig_devices = [\"4g.40gb\", \"1g.20gb\", \"1g.20gb\", \"1g.20gb\"]\n",
    );
    assert!(
        sim.try_init().is_err(),
        "4g@0 leaves 1g.20gb only starts 4 and 6"
    );
}

#[test]
fn processes_sharing_the_state_file_see_one_driver() {
    let sim = Sim::new(&format!("{ONE_H100}mig_mode = true\n"));
    let state = sim.dir.path().join("mig-state.json");
    std::env::set_var("NVML_SIM_STATE", &state);
    let a = sim.init();
    let lib2 = sim.dir.path().join("other.so");
    std::fs::copy(&sim.lib, &lib2).expect("copy");
    let b = Nvml::builder()
        .lib_path(lib2.as_os_str())
        .init()
        .expect("init");
    let (da, db) = (device(&a, 0), device(&b, 0));
    let kept = create_gi(&a, da, 9, Some(0)).expect("3g at 0 from A");
    let gone = create_gi(&a, da, 14, Some(4)).expect("2g at 4 from A");
    // B sees A's instances without re-initialising, and destroys one of them.
    assert_eq!(gis(&b, db, 9).len(), 1);
    let theirs = gis(&b, db, 14)[0];
    assert_eq!(call!(b, nvmlGpuInstanceDestroy(theirs)), 0);
    // A sees it gone: its handle is stale, the other handle still works.
    assert_eq!(gi_info(&a, gone).map(|i| i.id), Err(INVALID_ARGUMENT));
    assert_eq!(gi_info(&a, kept).expect("still there").placement.start, 0);
    std::env::remove_var("NVML_SIM_STATE");
}
