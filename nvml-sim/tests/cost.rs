//! The cost model (`NVML_SIM_COST`) through the built library: a listed call takes its wall
//! time, a CPU cost burns process CPU time while a sleep-dominated one does not, calls on two
//! GPUs from two threads overlap (no simulator lock is held while a cost is spent), and a
//! malformed table fails init loudly. Costs are sleep-dominated and bounds generous, so a
//! loaded two-core machine cannot make these tests fail by being slow.

mod common;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use common::Sim;
use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
use nvml_wrapper::error::NvmlError;

const TWO_GPUS: &str = "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\ncount = 2\n";

/// Writes a cost table into the test's directory and points `NVML_SIM_COST` at it.
fn with_costs(sim: &Sim, functions: &[(&str, f64, Option<f64>)]) {
    let entries: serde_json::Map<String, serde_json::Value> = functions
        .iter()
        .map(|(name, wall, cpu)| {
            (
                (*name).to_owned(),
                serde_json::json!({"wall_us": wall, "cpu_us": cpu}),
            )
        })
        .collect();
    let table = serde_json::json!({ "functions": entries });
    let path = sim.dir.path().join("costs.json");
    std::fs::write(&path, table.to_string()).expect("write cost table");
    std::env::set_var("NVML_SIM_COST", &path);
}

fn cpu_clock(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec.
    assert_eq!(unsafe { libc::clock_gettime(clock, &mut ts) }, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[test]
fn a_listed_call_takes_its_wall_time() {
    let sim = Sim::new(TWO_GPUS);
    with_costs(
        &sim,
        &[("nvmlDeviceGetPcieThroughput", 30_000.0, Some(1_000.0))],
    );
    let nvml = sim.init();
    let gpu = nvml.device_by_index(0).expect("gpu 0");
    let t = Instant::now();
    gpu.pcie_throughput(PcieUtilCounter::Send).expect("tx");
    assert!(
        t.elapsed() >= Duration::from_millis(30),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn calls_on_two_gpus_from_two_threads_overlap() {
    let sim = Sim::new(TWO_GPUS);
    with_costs(
        &sim,
        &[("nvmlDeviceGetPcieThroughput", 300_000.0, Some(1_000.0))],
    );
    let nvml = sim.init();
    let gpus = [
        nvml.device_by_index(0).expect("gpu 0"),
        nvml.device_by_index(1).expect("gpu 1"),
    ];
    let start = Barrier::new(2);
    let t = Instant::now();
    let each: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = gpus
            .iter()
            .map(|gpu| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    let t = Instant::now();
                    gpu.pcie_throughput(PcieUtilCounter::Send).expect("tx");
                    t.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let total = t.elapsed();
    assert!(
        each.iter().all(|d| *d >= Duration::from_millis(300)),
        "{each:?}"
    );
    // Serialised, the two would take at least 600 ms.
    assert!(total < Duration::from_millis(540), "no overlap: {total:?}");
}

#[test]
fn a_slow_call_on_one_gpu_does_not_block_another() {
    let sim = Sim::new(TWO_GPUS);
    with_costs(
        &sim,
        &[("nvmlDeviceGetPcieThroughput", 600_000.0, Some(1_000.0))],
    );
    let nvml = sim.init();
    let (slow, other) = (
        nvml.device_by_index(0).expect("gpu 0"),
        nvml.device_by_index(1).expect("gpu 1"),
    );
    let started = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            started.wait();
            slow.pcie_throughput(PcieUtilCounter::Receive).expect("rx");
        });
        started.wait();
        std::thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        other.power_usage().expect("power");
        other.name().expect("name");
        let waited = t.elapsed();
        assert!(
            waited < Duration::from_millis(400),
            "blocked for {waited:?}"
        );
    });
}

#[test]
fn a_cpu_cost_burns_cpu_and_a_sleeping_one_does_not() {
    let sim = Sim::new(TWO_GPUS);
    with_costs(
        &sim,
        &[
            ("nvmlDeviceGetTotalEnergyConsumption", 50_000.0, None),
            ("nvmlDeviceGetPcieThroughput", 100_000.0, Some(1_000.0)),
        ],
    );
    let nvml = sim.init();
    let gpu = nvml.device_by_index(0).expect("gpu 0");
    let before = cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID);
    gpu.total_energy_consumption().expect("energy");
    let burnt = cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID) - before;
    assert!(
        burnt >= Duration::from_millis(49),
        "process CPU grew {burnt:?}"
    );

    let before = cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID);
    let t = Instant::now();
    gpu.pcie_throughput(PcieUtilCounter::Send).expect("tx");
    let (wall, cpu) = (
        t.elapsed(),
        cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID) - before,
    );
    assert!(wall >= Duration::from_millis(100), "{wall:?}");
    assert!(cpu < Duration::from_millis(50), "slept, not spun: {cpu:?}");
}

#[test]
fn no_table_no_cost_and_a_bad_table_fails_init() {
    let sim = Sim::new(TWO_GPUS);
    let path = sim.dir.path().join("costs.json");
    std::fs::write(
        &path,
        "{\"functions\": {\"nvmlDeviceGetPowerUsag\": {\"wall_us\": 1}}}",
    )
    .expect("write");
    std::env::set_var("NVML_SIM_COST", &path);
    assert!(
        matches!(sim.try_init(), Err(NvmlError::Unknown)),
        "unknown function"
    );
    std::fs::write(&path, "{\"functions\": ").expect("write");
    assert!(
        matches!(sim.try_init(), Err(NvmlError::Unknown)),
        "malformed JSON"
    );
    std::fs::remove_file(&path).expect("remove");
    assert!(
        matches!(sim.try_init(), Err(NvmlError::Unknown)),
        "unreadable"
    );
    std::env::remove_var("NVML_SIM_COST");
    let nvml = sim.try_init().expect("no table: init succeeds");
    let gpu = nvml.device_by_index(0).expect("gpu 0");
    let t = Instant::now();
    for _ in 0..100 {
        gpu.pcie_throughput(PcieUtilCounter::Send).expect("tx");
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}
