//! A validated scenario resolved into concrete per-GPU values: every field the scenario left
//! out takes the model's idle default here, and derived identity (UUID, serial, PCI bus id) is
//! computed deterministically from the index and model. Exports read only these values.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use toml::Spanned;

use crate::ffi::{code_by_name, Ret};
pub use crate::ids::{is_uuid, stable_hash};
use crate::models::Model;
pub use crate::pci::PciAddr;
use crate::raw::{
    Ecc, FabricHealthBit, FabricState, ProcessKind, RawEvent, RawGpm, RawGpu, RawProcess,
    RemappedRows, RetiredPages,
};

/// One scenario, resolved.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub driver_version: String,
    /// e.g. 13000 for CUDA 13.0.
    pub cuda_version: i32,
    pub init_error: Option<Ret>,
    pub gpus: Vec<Gpu>,
}

impl Scenario {
    /// `nvmlSystemGetNVMLVersion`: "<CUDA major>.<driver version>", e.g. "13.580.95.05"
    /// (the real library prints "12.535.129.03" on a CUDA 12.2 driver).
    pub fn nvml_version(&self) -> String {
        format!("{}.{}", self.cuda_version / 1000, self.driver_version)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Process {
    pub pid: u32,
    pub kind: ProcessKind,
    pub used_memory_mib: u64,
    pub sm_util_percent: u32,
    pub mem_util_percent: u32,
    /// Index into the GPU's `mig_devices`, when the process runs in a MIG device.
    pub mig_device: Option<usize>,
}

/// GPM metrics of one GPU, resolved: ratios 0-1 and bytes per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpm {
    pub gr_engine_active: f64,
    pub sm_active: f64,
    pub sm_occupancy: f64,
    pub tensor_active: f64,
    pub dram_active: f64,
    pub fp64_active: f64,
    pub fp32_active: f64,
    pub fp16_active: f64,
    pub pcie_tx_bytes_per_s: f64,
    pub pcie_rx_bytes_per_s: f64,
}

impl Gpm {
    /// CHOSEN: without values, GPM follows the utilization: the engine is active
    /// `gpu_util_percent` of the time, SMs 90 % of that, occupancy 45 %, tensor 50 %, FP32 30 %,
    /// FP16 40 %, FP64 0 (an AI workload); DRAM follows `mem_util_percent`; PCIe equals
    /// `pcie_{tx,rx}_kib_s` × 1024.
    fn derive(raw: RawGpm, gpu_util: u32, mem_util: u32, tx_kib: u32, rx_kib: u32) -> Gpm {
        let g = f64::from(gpu_util) / 100.0;
        Gpm {
            gr_engine_active: raw.gr_engine_active.unwrap_or(g),
            sm_active: raw.sm_active.unwrap_or(0.9 * g),
            sm_occupancy: raw.sm_occupancy.unwrap_or(0.45 * g),
            tensor_active: raw.tensor_active.unwrap_or(0.5 * g),
            dram_active: raw.dram_active.unwrap_or(f64::from(mem_util) / 100.0),
            fp64_active: raw.fp64_active.unwrap_or(0.0),
            fp32_active: raw.fp32_active.unwrap_or(0.3 * g),
            fp16_active: raw.fp16_active.unwrap_or(0.4 * g),
            pcie_tx_bytes_per_s: raw
                .pcie_tx_bytes_per_s
                .unwrap_or(f64::from(tx_kib) * 1024.0),
            pcie_rx_bytes_per_s: raw
                .pcie_rx_bytes_per_s
                .unwrap_or(f64::from(rx_kib) * 1024.0),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub id: u64,
    pub xid: u64,
}

/// One simulated GPU with every value concrete.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub index: u32,
    pub model: &'static Model,
    pub uuid: String,
    pub serial: String,
    pub pci: PciAddr,
    pub mig_mode: bool,
    /// `nvmlComputeMode_t` before any change (see [`crate::modes`]).
    pub compute_mode: u32,
    pub mig_devices: Vec<String>,
    /// Simulated resets so far (`reset_count`).
    pub reset_count: u64,
    pub mig_reset_required: bool,
    /// `mig_faults`: operation key → failing call numbers.
    pub mig_faults: BTreeMap<String, Vec<u32>>,
    pub power_limit_mw: u32,
    pub lost: bool,
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` value: none 0 … drain_and_reset 4,
    /// recover_imex_domain 5.
    pub recovery_action: u32,
    pub unsupported: BTreeSet<String>,
    pub errors: BTreeMap<String, Ret>,
    /// Extra time calls to a function take on this GPU (`delay_ms`).
    pub delays: BTreeMap<String, std::time::Duration>,
    pub gpu_util: u32,
    pub mem_util: u32,
    pub enc_util: u32,
    pub dec_util: u32,
    pub memory_used_mib: u64,
    pub temperature_c: u32,
    /// `None` on boards without a memory sensor, whatever the scenario says.
    pub memory_temperature_c: Option<u32>,
    pub power_mw: u32,
    pub clocks: crate::models::Clocks,
    pub pcie_tx_kib_s: u32,
    pub pcie_rx_kib_s: u32,
    pub pcie_replay_count: u32,
    /// The current link (`pcie.gen`, `pcie.width`; default the model's maximum).
    pub pcie_gen: u32,
    pub pcie_width: u32,
    /// Replays a second added to `pcie_replay_count` from when the scenario says so.
    pub pcie_replays_per_s: f64,
    /// `None` on fanless boards (all six models), whatever the scenario says.
    pub fan_percent: Option<u32>,
    /// Totals (location-independent counters).
    pub ecc: Ecc,
    /// The part of `ecc` that is in SRAM (location 7); the rest is in device memory.
    pub ecc_sram: Ecc,
    /// `nvmlDeviceGetModuleId`.
    pub module_id: u32,
    /// `nvmlGpuVirtualizationMode_t`.
    pub virtualization_mode: u32,
    pub remapped_rows: RemappedRows,
    pub retired_pages: RetiredPages,
    pub throttle_reasons: u64,
    pub gpm: Gpm,
    pub processes: Vec<Process>,
    pub events: Vec<Event>,
    /// `None`: NVLink calls answer NOT_SUPPORTED (no `nvlink` key, or a PCIe board).
    pub nvlink: Option<Nvlink>,
    /// `None`: `nvmlDeviceGetGpuFabricInfoV` answers NOT_SUPPORTED (no NVLink, or before Hopper).
    pub fabric: Option<Fabric>,
    /// The PCIe switch the GPU sits behind (`pcie_switch`; default 1000 + index, its own).
    pub pcie_switch: u32,
}

/// The board's NVLinks.
#[derive(Debug, Clone, PartialEq)]
pub struct Nvlink {
    /// One entry per link the board has: whether it is active.
    pub active: Vec<bool>,
    /// Error counts by `nvmlNvLinkErrorCounter_t` (replay 0, recovery 1, CRC flit 2, CRC data 3),
    /// summed over the GPU. CHOSEN: they are all on the lowest-numbered link.
    pub errors: [u64; 4],
    /// KiB/s over all active links, spread evenly over them (CHOSEN).
    pub tx_kib_s: u64,
    pub rx_kib_s: u64,
}

impl Nvlink {
    pub fn active_links(&self) -> u64 {
        self.active.iter().filter(|a| **a).count() as u64
    }
}

/// `nvmlGpuFabricInfo_v3_t` minus its version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fabric {
    pub cluster_uuid: [u8; 16],
    pub status: Ret,
    pub clique_id: u32,
    pub state: u8,
    pub health_mask: u32,
    pub health_summary: u8,
}

/// `NVML_GPU_FABRIC_HEALTH_MASK_*`: (shift, value when set, value when clear).
fn health_field(bit: FabricHealthBit) -> (u32, u32, u32) {
    match bit {
        FabricHealthBit::DegradedBw => (0, 1, 2),
        FabricHealthBit::RouteRecovery => (2, 1, 2),
        FabricHealthBit::RouteUnhealthy => (4, 1, 2),
        FabricHealthBit::AccessTimeoutRecovery => (6, 1, 2),
        // CHOSEN: "set" is NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCORRECT_SYSGUID
        // (2); clear is _NONE (1).
        FabricHealthBit::IncorrectConfiguration => (8, 2, 1),
    }
}

const HEALTH_BITS: [FabricHealthBit; 5] = [
    FabricHealthBit::DegradedBw,
    FabricHealthBit::RouteRecovery,
    FabricHealthBit::RouteUnhealthy,
    FabricHealthBit::AccessTimeoutRecovery,
    FabricHealthBit::IncorrectConfiguration,
];

fn nvlink(model: &Model, g: &RawGpu) -> Option<Nvlink> {
    let raw = g.nvlink.as_ref()?.get_ref();
    if model.nvlinks == 0 {
        return None;
    }
    let mut active = vec![true; model.nvlinks as usize];
    for d in &raw.down {
        if let Some(a) = active.get_mut(*d.get_ref() as usize) {
            *a = false;
        }
    }
    Some(Nvlink {
        active,
        errors: [
            raw.replay_errors,
            raw.recovery_errors,
            raw.crc_flit_errors,
            raw.crc_data_errors,
        ],
        tx_kib_s: raw.tx_kib_s,
        rx_kib_s: raw.rx_kib_s,
    })
}

/// A fabric status by `nvmlReturn_t` name: SUCCESS or an error's name.
pub(crate) fn fabric_status(name: &str) -> Option<Ret> {
    match name {
        "SUCCESS" => Some(crate::ffi::SUCCESS),
        other => code_by_name(other),
    }
}

/// Hopper and newer boards with NVLink have fabric info; without a `fabric` key it is a
/// healthy, completed fabric.
fn fabric(model: &Model, g: &RawGpu, has_nvlink: bool) -> Option<Fabric> {
    if !has_nvlink || model.architecture < crate::models::HOPPER {
        return None;
    }
    let raw = g.fabric.as_ref().map(Spanned::get_ref);
    let health: Vec<FabricHealthBit> = raw.map(|f| f.health.clone()).unwrap_or_default();
    let mut mask = 0;
    for bit in HEALTH_BITS {
        let (shift, set, clear) = health_field(bit);
        mask |= if health.contains(&bit) { set } else { clear } << shift;
    }
    let unhealthy = health.iter().any(|b| {
        matches!(
            b,
            FabricHealthBit::RouteUnhealthy | FabricHealthBit::IncorrectConfiguration
        )
    });
    // NVML_GPU_FABRIC_HEALTH_SUMMARY_*: HEALTHY 1, UNHEALTHY 2, LIMITED_CAPACITY 3 (CHOSEN: the
    // driver's own rule is not documented; route/configuration faults are unhealthy, the rest
    // limit capacity).
    let summary = match (unhealthy, health.is_empty()) {
        (true, _) => 2,
        (false, true) => 1,
        (false, false) => 3,
    };
    let seed = stable_hash(b"nvml-sim fabric cluster");
    let mut cluster_uuid = [0u8; 16];
    cluster_uuid[..8].copy_from_slice(&seed.to_be_bytes());
    cluster_uuid[8..].copy_from_slice(&stable_hash(&seed.to_le_bytes()).to_be_bytes());
    Some(Fabric {
        cluster_uuid,
        status: raw
            .and_then(|f| f.status.as_ref())
            .and_then(|s| fabric_status(s.get_ref()))
            .unwrap_or(crate::ffi::SUCCESS),
        // CHOSEN: every GPU of a node is in clique 1 (one NVLink domain).
        clique_id: 1,
        state: raw.map_or(FabricState::Completed, |f| f.state) as u8,
        health_mask: mask,
        health_summary: summary,
    })
}

fn derived_uuid(index: u32, model: &Model) -> String {
    let seed = format!("{}#{index}", model.key);
    let a = stable_hash(seed.as_bytes());
    let b = stable_hash(format!("{seed}/2").as_bytes());
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// CHOSEN: a derived serial is a fixed 13-digit prefix, a number from the model and the index.
fn derived_serial(index: u32, model: &Model) -> String {
    let n = 1_320_000_000_000 + stable_hash(model.key.as_bytes()) % 1_000_000 * 1000;
    format!("{}", n + u64::from(index))
}

/// CHOSEN: derived bus numbers start at 0x10 and step by one per index.
fn derived_pci(index: u32) -> PciAddr {
    PciAddr {
        domain: 0,
        bus: 0x10 + index,
        device: 0,
        function: 0,
    }
}

/// The value of a key the scenario may leave out.
fn given<T>(v: &Option<Spanned<T>>) -> Option<&T> {
    v.as_ref().map(Spanned::get_ref)
}

/// A percentage the scenario may leave out (0).
fn pct(v: &Option<Spanned<u32>>) -> u32 {
    given(v).copied().unwrap_or(0)
}

/// A value the scenario may leave out (its default).
fn or_default<T: Copy + Default>(v: &Option<Spanned<T>>) -> T {
    given(v).copied().unwrap_or_default()
}

/// A list of names the scenario may leave out (empty).
fn names<C: FromIterator<String>>(v: &Option<Vec<Spanned<String>>>) -> C {
    v.iter().flatten().map(|s| s.get_ref().clone()).collect()
}

/// The model's idle clocks, with the scenario's SM (= graphics) and memory clocks.
fn clocks(model: &Model, g: &RawGpu) -> crate::models::Clocks {
    let mut clocks = model.idle_clocks;
    if let Some(sm) = g.sm_clock_mhz {
        clocks.sm = sm;
        clocks.graphics = sm;
    }
    if let Some(mem) = g.mem_clock_mhz {
        clocks.mem = mem;
    }
    clocks
}

fn throttle_reasons(g: &RawGpu, gpu_util: u32) -> u64 {
    match &g.throttle_reasons {
        Some(list) => list.iter().fold(0, |acc, r| acc | *r as u64),
        // CHOSEN: without a list, an idle GPU reports GpuIdle and a busy one nothing.
        None if gpu_util == 0 => 0x1,
        None => 0,
    }
}

/// Per-function overrides (`errors`, `delay_ms`): function name → value.
fn by_function<T, U>(
    map: &Option<BTreeMap<Spanned<String>, Spanned<T>>>,
    value: impl Fn(&T) -> Option<U>,
) -> BTreeMap<String, U> {
    map.iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.get_ref().clone(), value(v.get_ref())?)))
        .collect()
}

fn process(p: &RawProcess, mig_devices: &[String]) -> Process {
    Process {
        pid: p.pid,
        kind: p.kind,
        used_memory_mib: p.used_memory_mib,
        sm_util_percent: pct(&p.sm_util_percent),
        mem_util_percent: pct(&p.mem_util_percent),
        mig_device: p
            .mig_device
            .as_ref()
            .and_then(|d| mig_devices.iter().position(|m| m == d.get_ref())),
    }
}

fn event(e: &RawEvent) -> Event {
    Event {
        id: *e.id.get_ref(),
        xid: e.xid,
    }
}

/// One key of `pcie = { ... }`, if given.
fn pcie_key<T: Copy>(
    g: &RawGpu,
    key: impl Fn(&crate::raw::RawPcie) -> Option<&toml::Spanned<T>>,
) -> Option<T> {
    g.pcie
        .as_ref()
        .and_then(|p| key(p.get_ref()).map(|v| *v.get_ref()))
}

impl Gpu {
    /// Resolves entry `g` (already validated) as GPU number `index`: one line per field, the
    /// scenario's value or the model's (or a derived) default.
    pub(crate) fn build(index: u32, model: &'static Model, g: &RawGpu) -> Gpu {
        let (gpu_util, mem_util) = (pct(&g.gpu_util_percent), pct(&g.mem_util_percent));
        let (tx_kib, rx_kib) = (g.pcie_tx_kib_s.unwrap_or(0), g.pcie_rx_kib_s.unwrap_or(0));
        let mig_devices: Vec<String> = names(&g.mig_devices);
        let power_w = given(&g.power_w).copied().unwrap_or(model.idle_power_w);
        let power_limit_w = given(&g.power_limit_w)
            .copied()
            .unwrap_or(model.power_default_w);
        Gpu {
            index,
            model,
            uuid: given(&g.uuid).map_or_else(|| derived_uuid(index, model), String::clone),
            serial: given(&g.serial).map_or_else(|| derived_serial(index, model), String::clone),
            pci: given(&g.pci_bus_id)
                .and_then(|p| PciAddr::parse(p))
                .unwrap_or(derived_pci(index)),
            mig_mode: given(&g.mig_mode).copied().unwrap_or(false),
            compute_mode: g.compute_mode.unwrap_or_default() as u32,
            mig_devices: mig_devices.clone(),
            reset_count: g.reset_count.unwrap_or(0),
            mig_reset_required: g.mig_reset_required.unwrap_or(false),
            mig_faults: by_function(&g.mig_faults, |f| Some(f.calls())),
            power_limit_mw: power_limit_w * 1000,
            lost: g.lost.unwrap_or(false),
            recovery_action: g.recovery_action.unwrap_or_default() as u32,
            unsupported: names(&g.unsupported),
            errors: by_function(&g.errors, |name| code_by_name(name)),
            delays: by_function(&g.delay_ms, |ms| Some(Duration::from_millis(*ms))),
            gpu_util,
            mem_util,
            enc_util: pct(&g.enc_util_percent),
            dec_util: pct(&g.dec_util_percent),
            memory_used_mib: or_default(&g.memory_used_mib),
            temperature_c: g.temperature_c.unwrap_or(model.idle_temp_c),
            memory_temperature_c: model
                .idle_mem_temp_c
                .map(|t| g.memory_temperature_c.unwrap_or(t)),
            power_mw: (power_w * 1000.0).round() as u32,
            clocks: clocks(model, g),
            pcie_tx_kib_s: tx_kib,
            pcie_rx_kib_s: rx_kib,
            pcie_replay_count: g.pcie_replay_count.unwrap_or(0),
            pcie_gen: pcie_key(g, |p| p.gen.as_ref()).unwrap_or(model.pcie_max_gen),
            pcie_width: pcie_key(g, |p| p.width.as_ref()).unwrap_or(model.pcie_max_width),
            pcie_replays_per_s: pcie_key(g, |p| p.replays_per_s.as_ref()).unwrap_or(0.0),
            fan_percent: (model.fans > 0).then(|| given(&g.fan_percent).copied().unwrap_or(30)),
            ecc: g.ecc.unwrap_or_default(),
            ecc_sram: or_default(&g.ecc_sram),
            // CHOSEN: SXM module ids count from 1 in index order unless the scenario says.
            module_id: g.module_id.unwrap_or(index + 1),
            virtualization_mode: g.virtualization_mode.unwrap_or_default() as u32,
            remapped_rows: or_default(&g.remapped_rows),
            retired_pages: or_default(&g.retired_pages),
            throttle_reasons: throttle_reasons(g, gpu_util),
            gpm: Gpm::derive(or_default(&g.gpm), gpu_util, mem_util, tx_kib, rx_kib),
            processes: g
                .process
                .iter()
                .map(|p| process(p.get_ref(), &mig_devices))
                .collect(),
            events: g.event.iter().map(event).collect(),
            nvlink: nvlink(model, g),
            fabric: fabric(model, g, g.nvlink.is_some() && model.nvlinks > 0),
            pcie_switch: g.pcie_switch.unwrap_or(1000 + index),
        }
    }

    /// Whether calls on this GPU to `function` are overridden by the scenario
    /// (`errors` first, then `unsupported`).
    pub fn override_for(&self, function: &str) -> Option<Ret> {
        self.errors.get(function).copied().or_else(|| {
            self.unsupported
                .contains(function)
                .then_some(crate::ffi::NOT_SUPPORTED)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids() {
        let m = crate::models::by_key("H100-SXM5-80GB").expect("model");
        let a = derived_uuid(0, m);
        assert!(is_uuid(&a), "{a}");
        assert_eq!(a, derived_uuid(0, m));
        assert_ne!(a, derived_uuid(1, m));
        assert!(!is_uuid("GPU-123"));
    }
}
