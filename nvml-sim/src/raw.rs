//! The scenario file's serde shape (version 1; keys in `nvml-sim/README.md`): the `Raw*`
//! structs exactly as TOML deserializes them, spans kept for error positions, and the small
//! value types (enums by name, ECC and row counters) they share with the resolved scenario.
//! Plain data at the bottom of the crate: it imports nothing of it, and `validate`, `resolve`
//! and `scenario::parse` all build on it.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScenario {
    pub version: Spanned<u32>,
    #[serde(default)]
    pub driver: Option<RawDriver>,
    #[serde(default)]
    pub gpu: Vec<Spanned<RawGpu>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDriver {
    pub version: Option<String>,
    pub cuda_version: Option<i32>,
    pub init_error: Option<Spanned<String>>,
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
    /// `NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN` (5).
    RecoverImexDomain,
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
    /// The volatile and aggregate correctable (single-bit) counters grow by this many a second
    /// from when the scenario says so (in device memory), on top of the counts above.
    pub correctable_per_s: u64,
}

/// `pcie = { gen, width, replays_per_s }`: the current link (the maximum stays the model's)
/// and a replay rate added to `pcie_replay_count`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawPcie {
    pub gen: Option<Spanned<u32>>,
    pub width: Option<Spanned<u32>>,
    pub replays_per_s: Option<Spanned<f64>>,
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
    pub pcie: Option<Spanned<RawPcie>>,
    pub fan_percent: Option<Spanned<u32>>,
    pub ecc: Option<Ecc>,
    pub ecc_sram: Option<Spanned<Ecc>>,
    pub module_id: Option<u32>,
    pub virtualization_mode: Option<VirtualizationMode>,
    pub remapped_rows: Option<Spanned<RemappedRows>>,
    pub retired_pages: Option<Spanned<RetiredPages>>,
    pub throttle_reasons: Option<Vec<ThrottleReason>>,
    pub gpm: Option<Spanned<RawGpm>>,
    /// The board's NVLinks; absent = NVLink calls answer NOT_SUPPORTED (a VM, a PCIe board).
    pub nvlink: Option<Spanned<RawNvlink>>,
    /// `nvmlDeviceGetGpuFabricInfoV` (Hopper and newer, with `nvlink`).
    pub fabric: Option<Spanned<RawFabric>>,
    /// The PCIe switch the GPU sits behind: GPUs with the same number share it
    /// (`nvmlDeviceGetTopologyCommonAncestor` SINGLE); default: a switch of its own.
    pub pcie_switch: Option<u32>,
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

/// `nvlink = { ... }`: links down (indices), error counts summed over the GPU's links (NVML's
/// `nvmlNvLinkErrorCounter_t` kinds), and throughput in KiB/s over all active links.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawNvlink {
    pub down: Vec<Spanned<u32>>,
    pub replay_errors: u64,
    pub recovery_errors: u64,
    pub crc_flit_errors: u64,
    pub crc_data_errors: u64,
    pub tx_kib_s: u64,
    pub rx_kib_s: u64,
}

/// `nvmlGpuFabricState_t` by name (`NVML_GPU_FABRIC_STATE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FabricState {
    NotStarted = 1,
    InProgress = 2,
    #[default]
    Completed = 3,
}

/// The fields of `nvmlGpuFabricInfo_v3_t::healthMask` a scenario can set (each to its "true"
/// or non-"none" value; the others read as "false"/"none").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FabricHealthBit {
    DegradedBw,
    RouteRecovery,
    RouteUnhealthy,
    AccessTimeoutRecovery,
    IncorrectConfiguration,
}

/// `fabric = { state, status, health }`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFabric {
    #[serde(default)]
    pub state: FabricState,
    /// An `nvmlReturn_t` name (default SUCCESS).
    pub status: Option<Spanned<String>>,
    #[serde(default)]
    pub health: Vec<FabricHealthBit>,
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
