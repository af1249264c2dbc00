//! Helpers for the integration tests: a fresh copy of the built `libnvml_sim.so` per test (the
//! library keeps global state per loaded copy and `dlopen` of one path returns one instance),
//! scenario files written and atomically rewritten in a temp dir, and a process-wide lock that
//! serialises tests because the `NVML_SIM_*` variables are process-global.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

static ENV_LOCK: Mutex<()> = Mutex::new(());

/// One test's simulator: its own library copy and scenario file, holding the env lock.
pub struct Sim {
    pub dir: tempfile::TempDir,
    pub lib: PathBuf,
    pub scenario: PathBuf,
    _guard: MutexGuard<'static, ()>,
}

/// The freshest built library: `cargo test` writes the cdylib to `target/<profile>/deps/`
/// (beside the test executable) without copying it up to `target/<profile>/`, which only
/// `cargo build` refreshes; so take whichever of the two is newer.
pub fn built_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let candidates = [
        deps.join("libnvml_sim.so"),
        deps.parent().expect("profile dir").join("libnvml_sim.so"),
    ];
    let newest = candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t);
    let (_, lib) = newest.expect("libnvml_sim.so built beside the test executable");
    lib.clone()
}

impl Sim {
    /// Copies the library, writes `scenario`, sets `NVML_SIM_SCENARIO`, clears `NVML_SIM_STATS`
    /// and `NVML_SIM_COST`.
    pub fn new(scenario: &str) -> Sim {
        let guard = ENV_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
        let dir = tempfile::tempdir().expect("temp dir");
        let lib = dir.path().join("libnvidia-ml-sim.so");
        std::fs::copy(built_library(), &lib).expect("copy library");
        let path = dir.path().join("scenario.toml");
        std::fs::write(&path, scenario).expect("write scenario");
        std::env::set_var("NVML_SIM_SCENARIO", &path);
        std::env::remove_var("NVML_SIM_STATS");
        std::env::remove_var("NVML_SIM_COST");
        Sim {
            dir,
            lib,
            scenario: path,
            _guard: guard,
        }
    }

    pub fn try_init(&self) -> Result<Nvml, NvmlError> {
        Nvml::builder().lib_path(self.lib.as_os_str()).init()
    }

    pub fn init(&self) -> Nvml {
        self.try_init().expect("nvmlInit_v2 succeeds")
    }

    /// Rewrites the scenario the way the contract says: write a temp file, rename over.
    pub fn rewrite(&self, text: &str) {
        let tmp = self.dir.path().join("scenario.toml.tmp");
        std::fs::write(&tmp, text).expect("write temp scenario");
        std::fs::rename(&tmp, &self.scenario).expect("rename scenario");
    }
}

/// Polls `cond` every 20 ms until it holds or `within` passes.
pub fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub const MIB: u64 = 1024 * 1024;

/// A node mixing models and faults; indices are referred to by the tests.
pub const MIXED: &str = r#"version = 1
[driver]
version = "580.95.05"
cuda_version = 13000

# 0: a busy H100 with every telemetry field set
[[gpu]]
model = "H100-SXM5-80GB"
uuid = "GPU-0b4f6a5c-1111-2222-3333-444455556666"
pci_bus_id = "00000000:3b:00.0"
serial = "1654922000123"
power_limit_w = 650
recovery_action = "gpu_reset"
gpu_util_percent = 87
mem_util_percent = 41
enc_util_percent = 3
dec_util_percent = 4
memory_used_mib = 40960
temperature_c = 62
memory_temperature_c = 70
power_w = 512.5
sm_clock_mhz = 1980
mem_clock_mhz = 2619
pcie_tx_kib_s = 1200
pcie_rx_kib_s = 800
pcie_replay_count = 5
ecc = { sbe_volatile = 1, dbe_volatile = 2, sbe_aggregate = 12, dbe_aggregate = 3 }
remapped_rows = { correctable = 4, uncorrectable = 1, pending = true, failure = false }
throttle_reasons = ["sw_power_cap", "hw_slowdown"]
[[gpu.process]]
pid = 4242
used_memory_mib = 30720
sm_util_percent = 80
mem_util_percent = 30
[[gpu.process]]
pid = 4243
kind = "graphics"
used_memory_mib = 1024
sm_util_percent = 5
mem_util_percent = 1
[[gpu.event]]
id = 1
xid = 48

# 1: a T4 with retired pages and injected faults
[[gpu]]
model = "T4"
retired_pages = { sbe = 2, dbe = 1, pending = true }
errors = { nvmlDeviceGetPowerUsage = "UNKNOWN", nvmlDeviceGetTemperature = "GPU_IS_LOST" }
unsupported = ["nvmlDeviceGetTotalEnergyConsumption"]

# 2: an A100 in MIG mode
[[gpu]]
model = "A100-SXM4-80GB"
mig_mode = true
mig_devices = ["3g.40gb", "2g.20gb"]
[[gpu.process]]
pid = 5001
used_memory_mib = 14336
mig_device = "3g.40gb"

# 3: an idle L4 (all defaults)
[[gpu]]
model = "L4"

# 4: an H200 that fell off the bus
[[gpu]]
model = "H200-SXM-141GB"
pci_bus_id = "00000000:9B:00.0"
lost = true
"#;
