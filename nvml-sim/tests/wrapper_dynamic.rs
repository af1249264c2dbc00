//! The built `libnvml_sim.so` through nvml-wrapper 0.13, for behaviour over time: injected
//! faults, lost GPUs, XID events, live scenario rewrites, energy integration, init errors, the
//! `NVML_SIM_STATS` file, and the raw C ABI (every listed symbol, error strings, calls before
//! init).

mod common;

use std::ffi::{c_char, c_uint, CStr};
use std::time::{Duration, Instant};

use common::{eventually, Sim, MIXED};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;

#[test]
fn injected_errors_and_unsupported() {
    let sim = Sim::new(MIXED);
    let nvml = sim.init();
    let t4 = nvml.device_by_index(1).expect("gpu 1");
    assert!(matches!(t4.power_usage(), Err(NvmlError::Unknown)));
    assert!(matches!(
        t4.temperature(TemperatureSensor::Gpu),
        Err(NvmlError::GpuLost)
    ));
    assert!(matches!(
        t4.total_energy_consumption(),
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(t4.name().expect("other calls work"), "Tesla T4");
}

#[test]
fn events_rewrites_and_loss() {
    let sim = Sim::new(MIXED);
    let nvml = sim.init();
    let h100 = nvml.device_by_index(0).expect("gpu 0");
    let l4 = nvml.device_by_index(3).expect("gpu 3");
    assert!(h100
        .supported_event_types()
        .expect("types")
        .contains(EventTypes::CRITICAL_XID_ERROR));
    let set = nvml.create_event_set().expect("set");
    let set = h100
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .expect("register");
    let set = l4
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .expect("register l4");

    let ev = set.wait(2000).expect("xid 48");
    assert_eq!(ev.event_type, EventTypes::CRITICAL_XID_ERROR);
    assert!(matches!(ev.event_data, Some(XidError::Value(48))));
    assert_eq!(ev.device.index().expect("index"), 0);
    let t0 = Instant::now();
    assert!(
        matches!(set.wait(150), Err(NvmlError::Timeout)),
        "each id once"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(150),
        "wait blocks until the timeout"
    );

    // A rewrite: visible 200 ms after the rename; its new event is delivered, the old is not.
    let rewritten = MIXED
        .replace("temperature_c = 62", "temperature_c = 75")
        .replace(
            "id = 1\nxid = 48",
            "id = 1\nxid = 48\n[[gpu.event]]\nid = 2\nxid = 94",
        );
    sim.rewrite(&rewritten);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(h100.temperature(TemperatureSensor::Gpu).expect("temp"), 75);
    let ev = set.wait(2000).expect("xid 94");
    assert!(matches!(ev.event_data, Some(XidError::Value(94))));
    assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));

    // A second set registered now gets nothing old: 48 and 94 were delivered already.
    let other = h100.register_events(
        EventTypes::CRITICAL_XID_ERROR,
        nvml.create_event_set().expect("set"),
    );
    let other = other.expect("register");
    assert!(matches!(other.wait(100), Err(NvmlError::Timeout)));

    // The GPU falls off the bus: old handle answers GPU_IS_LOST, lookups too, the count stays,
    // and the set registered before the loss still receives the XID 79.
    let lost = rewritten
        .replace(
            "recovery_action = \"gpu_reset\"",
            "recovery_action = \"gpu_reset\"\nlost = true",
        )
        .replace(
            "id = 2\nxid = 94",
            "id = 2\nxid = 94\n[[gpu.event]]\nid = 3\nxid = 79",
        );
    sim.rewrite(&lost);
    assert!(eventually(Duration::from_secs(2), || matches!(
        h100.name(),
        Err(NvmlError::GpuLost)
    )));
    assert!(matches!(nvml.device_by_index(0), Err(NvmlError::GpuLost)));
    assert_eq!(nvml.device_count().expect("count"), 5);
    let ev = set.wait(2000).expect("xid 79 from the lost GPU");
    assert!(matches!(ev.event_data, Some(XidError::Value(79))));
    let ev = other.wait(2000).expect("xid 79 on the second set too");
    assert!(matches!(ev.event_data, Some(XidError::Value(79))));

    // A malformed rewrite keeps the previous scenario.
    sim.rewrite("version = 1\n[[gpu]]\nmodel = \"V100\"\n");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(nvml.device_count().expect("count"), 5);
    assert_eq!(l4.name().expect("still the old scenario"), "NVIDIA L4");
}

#[test]
fn a_delivered_event_is_not_replayed_to_a_later_set() {
    let sim = Sim::new(MIXED);
    let nvml = sim.init();
    let h100 = nvml.device_by_index(0).expect("gpu 0");
    let first = h100
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().expect("set"),
        )
        .expect("register");
    let ev = first.wait(2000).expect("the pending xid 48");
    assert!(matches!(ev.event_data, Some(XidError::Value(48))));
    // As after a re-enumeration or a new NVML session: a new set on the same driver.
    let later = h100
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().expect("set"),
        )
        .expect("register");
    assert!(
        matches!(later.wait(300), Err(NvmlError::Timeout)),
        "xid 48 happened before this set registered"
    );
}

#[test]
fn two_sets_registered_before_a_rewrite_both_get_its_event() {
    let sim = Sim::new(MIXED);
    let nvml = sim.init();
    let h100 = nvml.device_by_index(0).expect("gpu 0");
    let register = || {
        h100.register_events(
            EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().expect("set"),
        )
        .expect("register")
    };
    let (a, b) = (register(), register());
    let ev = a.wait(2000).expect("the pending xid 48");
    assert!(matches!(ev.event_data, Some(XidError::Value(48))));
    assert!(
        matches!(b.wait(100), Err(NvmlError::Timeout)),
        "a pending event goes to the first set that takes it"
    );
    sim.rewrite(&MIXED.replace(
        "id = 1\nxid = 48",
        "id = 1\nxid = 48\n[[gpu.event]]\nid = 2\nxid = 94",
    ));
    for set in [&a, &b] {
        let ev = set.wait(2000).expect("the rewritten xid 94");
        assert!(matches!(ev.event_data, Some(XidError::Value(94))));
        assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));
    }
}

#[test]
fn energy_follows_power_over_time() {
    let sim = Sim::new(MIXED);
    let nvml = sim.init();
    let h100 = nvml.device_by_index(0).expect("gpu 0");
    let slope = |watts: f64| {
        let before_1 = Instant::now();
        let e1 = h100.total_energy_consumption().expect("energy");
        let after_1 = Instant::now();
        std::thread::sleep(Duration::from_millis(400));
        let before_2 = Instant::now();
        let e2 = h100.total_energy_consumption().expect("energy");
        let after_2 = Instant::now();
        assert!(e2 > e1, "monotonic");
        let de = (e2 - e1) as f64; // mJ
        let lo = watts * (before_2 - after_1).as_secs_f64() * 1000.0 - 2.0;
        let hi = watts * (after_2 - before_1).as_secs_f64() * 1000.0 + 2.0;
        assert!(
            lo <= de && de <= hi,
            "{de} mJ not within [{lo}, {hi}] for {watts} W"
        );
        e2
    };
    let e = slope(512.5);
    sim.rewrite(&MIXED.replace("power_w = 512.5", "power_w = 100.0"));
    assert!(eventually(Duration::from_secs(2), || h100
        .power_usage()
        .ok()
        == Some(100_000)));
    let e_after = slope(100.0);
    assert!(e_after > e, "the counter never goes back");
}

#[test]
fn init_errors_missing_variable_and_malformed_scenarios() {
    let sim = Sim::new(&MIXED.replace(
        "cuda_version = 13000",
        "cuda_version = 13000\ninit_error = \"DRIVER_NOT_LOADED\"",
    ));
    assert!(matches!(sim.try_init(), Err(NvmlError::DriverNotLoaded)));
    sim.rewrite(MIXED);
    let nvml = sim
        .try_init()
        .expect("init succeeds once init_error is gone");
    // init_error set by a reload while initialised does not affect this session.
    sim.rewrite(&MIXED.replace(
        "cuda_version = 13000",
        "cuda_version = 13000\ninit_error = \"UNKNOWN\"",
    ));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(nvml.device_count().expect("count"), 5);
    drop(nvml);

    sim.rewrite("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nfan = 3\n");
    assert!(
        matches!(sim.try_init(), Err(NvmlError::Unknown)),
        "malformed scenario"
    );

    std::env::remove_var("NVML_SIM_SCENARIO");
    assert!(
        matches!(sim.try_init(), Err(NvmlError::DriverNotLoaded)),
        "variable unset"
    );
}

#[test]
fn stats_file_counts_calls() {
    let sim = Sim::new(MIXED);
    let stats = sim.dir.path().join("stats.json");
    std::env::set_var("NVML_SIM_STATS", &stats);
    let nvml = sim.init();
    let h100 = nvml.device_by_index(0).expect("gpu 0");
    for _ in 0..3 {
        h100.power_usage().expect("power");
    }
    let read = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&stats).expect("stats file")).expect("json")
    };
    assert!(stats.exists(), "written while calls are made");
    drop(nvml); // the final nvmlShutdown writes the file
    let v = read();
    assert_eq!(v["nvmlDeviceGetPowerUsage"], 3, "{v}");
    assert_eq!(v["nvmlInit_v2"], 1);
    assert_eq!(v["nvmlShutdown"], 1);
    assert_eq!(v["nvmlDeviceGetHandleByIndex_v2"], 1);
    std::env::remove_var("NVML_SIM_STATS");
}

/// Threads of this process named `name` (the stats writer is the simulator's, not a caller's).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == name)
        .count()
}

#[test]
fn stats_are_written_by_the_simulators_thread_not_inside_a_call() {
    let sim = Sim::new(MIXED);
    let stats = sim.dir.path().join("stats.json");
    std::env::set_var("NVML_SIM_STATS", &stats);
    let before = threads_named("nvml-sim-stats");
    let nvml = sim.init();
    // A thread takes its name once it runs: wait for it.
    assert!(
        eventually(Duration::from_secs(5), || threads_named("nvml-sim-stats")
            == before + 1),
        "one writer"
    );
    let h100 = nvml.device_by_index(0).expect("gpu 0");
    for _ in 0..3 {
        h100.power_usage().expect("power");
    }
    // No further call is made: only the writer thread can put the three calls in the file
    // (calls themselves never write it, so that no call's CPU time includes the write).
    let read = || -> Option<serde_json::Value> {
        serde_json::from_str(&std::fs::read_to_string(&stats).ok()?).ok()
    };
    assert!(
        eventually(Duration::from_secs(5), || read()
            .is_some_and(|v| v["nvmlDeviceGetPowerUsage"] == 3)),
        "the counts reach the file within a second or so: {:?}",
        read()
    );
    drop(nvml);
    assert_eq!(
        threads_named("nvml-sim-stats"),
        before,
        "stopped at the last shutdown"
    );
    assert_eq!(read().expect("stats")["nvmlShutdown"], 1);
    std::env::remove_var("NVML_SIM_STATS");
}

#[test]
fn raw_abi_symbols_strings_and_uninitialized() {
    let sim = Sim::new(MIXED);
    // SAFETY: loading our own simulator library, which has no unsafe initialisers.
    let lib = unsafe { libloading::Library::new(&sim.lib) }.expect("dlopen");
    for name in nvml_sim::EXPORTED {
        // SAFETY: only resolving the address, never calling through the wrong type.
        let sym = unsafe { lib.get::<*const ()>(name.as_bytes()) };
        assert!(sym.is_ok(), "{name} is listed but not exported");
    }
    type Count = unsafe extern "C" fn(*mut c_uint) -> c_uint;
    type Plain = unsafe extern "C" fn() -> c_uint;
    type ErrStr = unsafe extern "C" fn(c_uint) -> *const c_char;
    // SAFETY: the types match nvml.h's declarations of these symbols.
    let (count, init, shutdown, err_str) = unsafe {
        (
            lib.get::<Count>(b"nvmlDeviceGetCount_v2").expect("count"),
            lib.get::<Plain>(b"nvmlInit_v2").expect("init"),
            lib.get::<Plain>(b"nvmlShutdown").expect("shutdown"),
            lib.get::<ErrStr>(b"nvmlErrorString").expect("error string"),
        )
    };
    let mut n = 0;
    // SAFETY: valid out-pointers; the functions take no other arguments.
    unsafe {
        assert_eq!(count(&mut n), 1, "UNINITIALIZED before init");
        assert_eq!(shutdown(), 1, "UNINITIALIZED when not initialised");
        assert_eq!(init(), 0);
        assert_eq!(init(), 0, "ref-counted");
        assert_eq!(count(std::ptr::null_mut()), 2, "NULL out-pointer");
        assert_eq!(shutdown(), 0);
        assert_eq!(count(&mut n), 0, "still initialised once");
        assert_eq!(n, 5);
        assert_eq!(shutdown(), 0);
        assert_eq!(count(&mut n), 1);
    }
    for (code, text) in [
        (0, "Success"),
        (2, "Invalid Argument"),
        (7, "Insufficient Size"),
        (15, "GPU is lost"),
        (999, "Unknown Error"),
    ] {
        // SAFETY: nvmlErrorString returns a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr(err_str(code)) };
        assert_eq!(s.to_str().expect("ascii"), text);
    }
}
