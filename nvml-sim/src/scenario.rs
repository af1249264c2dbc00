//! The scenario file (version 1; keys in `nvml-sim/README.md`, examples in `tests/scenarios/`): its
//! serde shape, and strict validation that reports the first problem as `LINE:COL: message`
//! (1-based, from the TOML span of the offending key or value, else the `[[gpu]]` table).
//! Validation accepts exactly what the format allows; anything else (unknown keys, models,
//! return-code or function names, impossible memory or MIG layouts, out-of-range percentages...) is
//! an error, so a typo in a test scenario fails loudly instead of silently taking a default.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use crate::error::unknown_code;
pub use crate::error::ScenarioError;
use crate::ffi::code_by_name;
use crate::resolve::{self, Scenario};
use crate::validate::validate_gpu;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScenario {
    version: Spanned<u32>,
    #[serde(default)]
    driver: Option<RawDriver>,
    #[serde(default)]
    gpu: Vec<Spanned<RawGpu>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDriver {
    version: Option<String>,
    cuda_version: Option<i32>,
    init_error: Option<Spanned<String>>,
}

/// `nvmlComputeMode_t` by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ComputeModeName {
    #[default]
    Default = 0,
    ExclusiveThread = 1,
    Prohibited = 2,
    ExclusiveProcess = 3,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryAction {
    #[default]
    None,
    GpuReset,
    NodeReboot,
    DrainP2p,
    DrainAndReset,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ProcessKind {
    #[default]
    Compute,
    Graphics,
}

/// Clock throttle / event reasons, with their `nvmlClocksEventReason*` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThrottleReason {
    GpuIdle = 0x1,
    ApplicationsClocksSetting = 0x2,
    SwPowerCap = 0x4,
    HwSlowdown = 0x8,
    SyncBoost = 0x10,
    SwThermalSlowdown = 0x20,
    HwThermalSlowdown = 0x40,
    HwPowerBrakeSlowdown = 0x80,
}

/// `nvmlGpuVirtualizationMode_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum VirtualizationMode {
    #[default]
    None = 0,
    Passthrough = 1,
    Vgpu = 2,
    HostVgpu = 3,
    HostVsga = 4,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Ecc {
    pub sbe_volatile: u64,
    pub dbe_volatile: u64,
    pub sbe_aggregate: u64,
    pub dbe_aggregate: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetiredPages {
    pub sbe: u32,
    pub dbe: u32,
    pub pending: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGpu {
    pub model: Spanned<String>,
    pub count: Option<Spanned<u32>>,
    pub uuid: Option<Spanned<String>>,
    pub pci_bus_id: Option<Spanned<String>>,
    pub serial: Option<Spanned<String>>,
    pub mig_mode: Option<Spanned<bool>>,
    /// The compute mode before any `nvmlDeviceSetComputeMode`.
    pub compute_mode: Option<ComputeModeName>,
    pub mig_devices: Option<Vec<Spanned<String>>>,
    /// Simulated GPU resets so far: raising it resets the GPU (see `store`).
    pub reset_count: Option<u64>,
    /// `nvmlDeviceSetMigMode` leaves the change pending with RESET_REQUIRED (a passthrough VM).
    pub mig_reset_required: Option<bool>,
    /// MIG calls that fail: operation → the Nth call (1-based, per GPU, since the library
    /// loaded), or a list of them, answers UNKNOWN and changes nothing.
    pub mig_faults: Option<BTreeMap<Spanned<String>, Spanned<FaultCalls>>>,
    pub power_limit_w: Option<Spanned<u32>>,
    pub lost: Option<bool>,
    pub recovery_action: Option<RecoveryAction>,
    pub unsupported: Option<Vec<Spanned<String>>>,
    pub errors: Option<BTreeMap<Spanned<String>, Spanned<String>>>,
    /// Calls on this GPU that take this many milliseconds longer (a hung or slow driver call),
    /// spent in the calling thread without any simulator lock held.
    pub delay_ms: Option<BTreeMap<Spanned<String>, Spanned<u64>>>,
    pub gpu_util_percent: Option<Spanned<u32>>,
    pub mem_util_percent: Option<Spanned<u32>>,
    pub enc_util_percent: Option<Spanned<u32>>,
    pub dec_util_percent: Option<Spanned<u32>>,
    pub memory_used_mib: Option<Spanned<u64>>,
    pub temperature_c: Option<u32>,
    pub memory_temperature_c: Option<u32>,
    pub power_w: Option<Spanned<f64>>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub pcie_tx_kib_s: Option<u32>,
    pub pcie_rx_kib_s: Option<u32>,
    pub pcie_replay_count: Option<u32>,
    pub fan_percent: Option<Spanned<u32>>,
    pub ecc: Option<Ecc>,
    pub ecc_sram: Option<Spanned<Ecc>>,
    pub module_id: Option<u32>,
    pub virtualization_mode: Option<VirtualizationMode>,
    pub remapped_rows: Option<Spanned<RemappedRows>>,
    pub retired_pages: Option<Spanned<RetiredPages>>,
    pub throttle_reasons: Option<Vec<ThrottleReason>>,
    pub gpm: Option<Spanned<RawGpm>>,
    #[serde(default)]
    pub process: Vec<Spanned<RawProcess>>,
    #[serde(default)]
    pub event: Vec<RawEvent>,
}

/// `gpm = { ... }`: GPM metrics (Hopper and newer) as ratios 0-1 and bytes per second; each
/// omitted one is derived from the GPU's utilization (see `resolve::Gpm::derive`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawGpm {
    pub gr_engine_active: Option<f64>,
    pub sm_active: Option<f64>,
    pub sm_occupancy: Option<f64>,
    pub tensor_active: Option<f64>,
    pub dram_active: Option<f64>,
    pub fp64_active: Option<f64>,
    pub fp32_active: Option<f64>,
    pub fp16_active: Option<f64>,
    pub pcie_tx_bytes_per_s: Option<f64>,
    pub pcie_rx_bytes_per_s: Option<f64>,
}

/// `mig_faults` values: one call number or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum FaultCalls {
    One(u32),
    Many(Vec<u32>),
}

impl FaultCalls {
    pub fn calls(&self) -> Vec<u32> {
        match self {
            FaultCalls::One(n) => vec![*n],
            FaultCalls::Many(v) => v.clone(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProcess {
    pub pid: u32,
    #[serde(default)]
    pub kind: ProcessKind,
    #[serde(default)]
    pub used_memory_mib: u64,
    pub sm_util_percent: Option<Spanned<u32>>,
    pub mem_util_percent: Option<Spanned<u32>>,
    pub mig_device: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEvent {
    pub id: Spanned<u64>,
    pub xid: u64,
}

/// Parses and validates a scenario text into one resolved [`Scenario`].
pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
    let raw: RawScenario = toml::from_str(text)
        .map_err(|e| ScenarioError::at(text, e.span(), e.message().trim().to_owned()))?;
    let err = |span: Range<usize>, msg: String| ScenarioError::at(text, Some(span), msg);
    if *raw.version.get_ref() != 1 {
        return Err(err(
            raw.version.span(),
            format!(
                "unsupported scenario version {}; this simulator reads version 1",
                raw.version.get_ref()
            ),
        ));
    }
    let mut init_error = None;
    // The driver of the real H100 and H200 captured in tests/data/real-h*.
    let (mut driver_version, mut cuda_version) = (String::from("580.159.04"), 13000);
    if let Some(d) = raw.driver {
        if let Some(v) = d.version {
            driver_version = v;
        }
        if let Some(c) = d.cuda_version {
            cuda_version = c;
        }
        if let Some(name) = d.init_error {
            let code = code_by_name(name.get_ref())
                .ok_or_else(|| err(name.span(), unknown_code(name.get_ref())))?;
            init_error = Some(code);
        }
    }
    let mut gpus = Vec::new();
    let mut spans = Vec::new();
    for entry in &raw.gpu {
        let g = entry.get_ref();
        let model = validate_gpu(g, &err)?;
        let count = g.count.as_ref().map_or(1, |c| *c.get_ref());
        if count == 0 {
            let span = g.count.as_ref().map_or(entry.span(), Spanned::span);
            return Err(err(span, "'count' must be at least 1".into()));
        }
        for _ in 0..count {
            let index = gpus.len() as u32;
            gpus.push(resolve::Gpu::build(index, model, g));
            spans.push(entry.span());
        }
    }
    if gpus.len() > crate::handles::MAX_GPUS {
        return Err(err(
            0..0,
            format!("at most {} GPUs are supported", crate::handles::MAX_GPUS),
        ));
    }
    let at = |(i, m): (usize, String)| err(spans[i].clone(), m);
    check_unique(&gpus, |g| g.uuid.clone(), "uuid").map_err(at)?;
    check_unique(&gpus, |g| g.serial.clone(), "serial").map_err(at)?;
    check_unique(&gpus, |g| g.pci.bus_id(), "pci_bus_id").map_err(at)?;
    Ok(Scenario {
        driver_version,
        cuda_version,
        init_error,
        gpus,
    })
}

fn check_unique(
    gpus: &[resolve::Gpu],
    key: impl Fn(&resolve::Gpu) -> String,
    what: &str,
) -> Result<(), (usize, String)> {
    let mut seen = BTreeSet::new();
    for (i, g) in gpus.iter().enumerate() {
        if !seen.insert(key(g)) {
            let msg = format!(
                "GPU {} repeats the {what} '{}' of an earlier GPU",
                g.index,
                key(g)
            );
            return Err((i, msg));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "scenario_tests.rs"]
mod tests;
