//! The native family: `gpu_steward_*` series in base units (bytes, celsius, watts, joules, hertz,
//! ratios 0-1), counters ending in `_total`, identity in `gpu_steward_gpu_info` and per-GPU series
//! labelled `gpu` and `uuid` only (plus a dimension label where the metric has one).

use super::{flag, Families, Family};
use crate::snapshot::{DriverInfo, GpuIdentity, GpuReading, GpuSnapshot, GpuStatus, Snapshot};

/// The clock event (throttle) reasons NVML defines, by bit (`nvmlClocksEventReason*`).
pub const CLOCK_EVENT_REASONS: &[(u64, &str)] = &[
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

type Value = fn(&GpuReading) -> Option<f64>;

/// Which page a native series is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    /// Every profile: what the dcgm family cannot say (processes, health, up).
    Always,
    /// The same value as a dcgm-exporter field: on the full page, or when the dcgm family is
    /// off (then it is the only copy).
    Dup,
    /// Only on the full page: static or rarely read values, and enums spelled as one series per
    /// state whose meaning the lean page carries in `gpu_steward_health_condition`.
    Full,
}

impl Keep {
    pub(super) fn shown(self, view: super::View) -> bool {
        match self {
            Keep::Always => true,
            Keep::Dup => view.duplicates,
            Keep::Full => view.full,
        }
    }
}

fn ratio(percent: Option<u32>) -> Option<f64> {
    percent.map(|p| f64::from(p) / 100.0)
}

fn watts(mw: Option<u32>) -> Option<f64> {
    mw.map(|mw| f64::from(mw) / 1000.0)
}

/// Per-GPU series without a dimension label: (name, help, value).
const GAUGES: &[(&str, Keep, &str, Value)] = &[
    ("gpu_steward_gpu_utilization_ratio", Keep::Dup, "Fraction of the last sample period during which a kernel ran on the GPU (nvmlDeviceGetUtilizationRates.gpu).", |r| ratio(r.gpu_util_percent)),
    ("gpu_steward_memory_utilization_ratio", Keep::Dup, "Fraction of the last sample period during which device memory was read or written (nvmlDeviceGetUtilizationRates.memory).", |r| ratio(r.mem_util_percent)),
    ("gpu_steward_encoder_utilization_ratio", Keep::Dup, "Video encoder utilization (nvmlDeviceGetEncoderUtilization).", |r| ratio(r.enc_util_percent)),
    ("gpu_steward_decoder_utilization_ratio", Keep::Dup, "Video decoder utilization (nvmlDeviceGetDecoderUtilization).", |r| ratio(r.dec_util_percent)),
    ("gpu_steward_memory_total_bytes", Keep::Dup, "Installed framebuffer memory (nvmlDeviceGetMemoryInfo_v2.total).", |r| r.memory.map(|m| m.total as f64)),
    ("gpu_steward_memory_used_bytes", Keep::Dup, "Framebuffer memory allocated, excluding reserved (nvmlDeviceGetMemoryInfo_v2.used).", |r| r.memory.map(|m| m.used as f64)),
    ("gpu_steward_memory_free_bytes", Keep::Dup, "Framebuffer memory free (nvmlDeviceGetMemoryInfo_v2.free).", |r| r.memory.map(|m| m.free as f64)),
    ("gpu_steward_memory_reserved_bytes", Keep::Dup, "Framebuffer memory reserved by the driver and firmware (nvmlDeviceGetMemoryInfo_v2.reserved).", |r| r.memory.map(|m| m.reserved as f64)),
    ("gpu_steward_bar1_memory_total_bytes", Keep::Full, "BAR1 aperture size (nvmlDeviceGetBAR1MemoryInfo.bar1Total).", |r| r.bar1_total_bytes.map(|v| v as f64)),
    ("gpu_steward_bar1_memory_used_bytes", Keep::Full, "BAR1 memory in use (nvmlDeviceGetBAR1MemoryInfo.bar1Used).", |r| r.bar1_used_bytes.map(|v| v as f64)),
    ("gpu_steward_temperature_celsius", Keep::Dup, "GPU die temperature (nvmlDeviceGetTemperature, NVML_TEMPERATURE_GPU).", |r| r.temperature_c.map(f64::from)),
    ("gpu_steward_memory_temperature_celsius", Keep::Dup, "Memory (HBM) temperature (field NVML_FI_DEV_MEMORY_TEMP).", |r| r.memory_temperature_c.map(f64::from)),
    ("gpu_steward_power_watts", Keep::Dup, "Board power draw (nvmlDeviceGetPowerUsage).", |r| watts(r.power_mw)),
    ("gpu_steward_power_limit_watts", Keep::Full, "Power management limit (nvmlDeviceGetPowerManagementLimit).", |r| watts(r.power_limit_mw)),
    ("gpu_steward_enforced_power_limit_watts", Keep::Full, "Power limit the driver enforces, the minimum of all limiters (nvmlDeviceGetEnforcedPowerLimit).", |r| watts(r.enforced_power_limit_mw)),
    ("gpu_steward_fan_speed_ratio", Keep::Full, "Intended fan speed as a fraction of the maximum (nvmlDeviceGetFanSpeed_v2, fan 0).", |r| ratio(r.fan_percent)),
    ("gpu_steward_pcie_transmit_bytes_per_second", Keep::Dup, "PCIe transmit throughput: GPM PCIE_TX_PER_SEC between two polls where the GPU has GPM, else a 20 ms sample of nvmlDeviceGetPcieThroughput TX (KB/s x 1024).", |r| r.pcie_tx_bytes_per_second),
    ("gpu_steward_pcie_receive_bytes_per_second", Keep::Dup, "PCIe receive throughput: GPM PCIE_RX_PER_SEC between two polls where the GPU has GPM, else a 20 ms sample of nvmlDeviceGetPcieThroughput RX (KB/s x 1024).", |r| r.pcie_rx_bytes_per_second),
    ("gpu_steward_pcie_link_generation", Keep::Full, "Current PCIe link generation (nvmlDeviceGetCurrPcieLinkGeneration).", |r| r.pcie_generation.map(f64::from)),
    ("gpu_steward_pcie_link_width", Keep::Full, "Current PCIe link width in lanes (nvmlDeviceGetCurrPcieLinkWidth).", |r| r.pcie_width.map(f64::from)),
    ("gpu_steward_ecc_enabled", Keep::Full, "1 if ECC is enabled (nvmlDeviceGetEccMode current).", |r| r.ecc_enabled.map(flag)),
    ("gpu_steward_retired_pages_pending", Keep::Full, "1 if pages are pending retirement until the next reset (nvmlDeviceGetRetiredPagesPendingStatus).", |r| r.retired_pages.pending.map(flag)),
    ("gpu_steward_remapped_rows_pending", Keep::Full, "1 if row remapping is pending until the next GPU reset (nvmlDeviceGetRemappedRows isPending).", |r| r.remapped_rows.map(|x| flag(x.pending))),
    ("gpu_steward_row_remap_failed", Keep::Dup, "1 if a row remapping has failed (nvmlDeviceGetRemappedRows failureOccurred).", |r| r.remapped_rows.map(|x| flag(x.failure))),
    ("gpu_steward_mig_mode_enabled", Keep::Full, "1 if MIG mode is currently enabled (nvmlDeviceGetMigMode current).", |r| r.mig_mode_current.map(flag)),
    ("gpu_steward_mig_mode_pending_enabled", Keep::Full, "1 if MIG mode will be enabled after the next reset (nvmlDeviceGetMigMode pending).", |r| r.mig_mode_pending.map(flag)),
    ("gpu_steward_recovery_action", Keep::Full, "Driver-recommended recovery action: 0 none, 1 GPU reset, 2 node reboot, 3 drain peer-to-peer, 4 drain and reset, 5 recover the IMEX domain (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION).", |r| r.recovery_action.map(f64::from)),
    ("gpu_steward_gpu_processes", Keep::Always, "Compute and graphics processes running on the GPU (nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetGraphicsRunningProcesses_v3).", |r| r.process_count.map(f64::from)),
];

const COUNTERS: &[(&str, Keep, &str, Value)] = &[
    ("gpu_steward_energy_joules_total", Keep::Dup, "Energy consumed since the driver was loaded (nvmlDeviceGetTotalEnergyConsumption, mJ / 1000).", |r| r.energy_mj.map(|mj| mj as f64 / 1000.0)),
    ("gpu_steward_pcie_replays_total", Keep::Dup, "PCIe replays (nvmlDeviceGetPcieReplayCounter).", |r| r.pcie_replay_count.map(f64::from)),
];

/// Series with one dimension label: (name, help, label, [(label value, value)]).
type Dimensioned = fn(&GpuReading) -> Vec<(&'static str, Option<f64>)>;

const DIMENSIONED: &[(&str, Keep, &str, &str, bool, Dimensioned)] = &[
    ("gpu_steward_clock_hertz", Keep::Dup, "Current clock frequency (nvmlDeviceGetClockInfo, MHz x 1e6).", "clock", false, |r| {
        let c = r.clocks_mhz;
        hz(&[("graphics", c.graphics), ("sm", c.sm), ("memory", c.memory), ("video", c.video)])
    }),
    ("gpu_steward_ecc_errors_volatile_total", Keep::Dup, "ECC errors since the last driver load (nvmlDeviceGetTotalEccErrors, NVML_VOLATILE_ECC).", "error", true, |r| vec![
        ("corrected", r.ecc.corrected_volatile.map(|v| v as f64)),
        ("uncorrected", r.ecc.uncorrected_volatile.map(|v| v as f64)),
    ]),
    ("gpu_steward_ecc_errors_aggregate_total", Keep::Dup, "ECC errors over the GPU's lifetime (nvmlDeviceGetTotalEccErrors, NVML_AGGREGATE_ECC).", "error", true, |r| vec![
        ("corrected", r.ecc.corrected_aggregate.map(|v| v as f64)),
        ("uncorrected", r.ecc.uncorrected_aggregate.map(|v| v as f64)),
    ]),
    ("gpu_steward_retired_pages", Keep::Dup, "Framebuffer pages retired, by cause (nvmlDeviceGetRetiredPages).", "cause", false, |r| vec![
        ("single_bit", r.retired_pages.single_bit.map(|v| v as f64)),
        ("double_bit", r.retired_pages.double_bit.map(|v| v as f64)),
    ]),
    ("gpu_steward_remapped_rows_total", Keep::Dup, "Memory rows remapped, by the kind of error that caused it (nvmlDeviceGetRemappedRows).", "error", true, |r| vec![
        ("correctable", r.remapped_rows.map(|x| f64::from(x.correctable))),
        ("uncorrectable", r.remapped_rows.map(|x| f64::from(x.uncorrectable))),
    ]),
    ("gpu_steward_clock_event_active", Keep::Full, "1 while the clock event (throttle) reason is active (nvmlDeviceGetCurrentClocksThrottleReasons).", "reason", false, |r| {
        CLOCK_EVENT_REASONS
            .iter()
            .map(|(bit, name)| (*name, r.clock_event_reasons.map(|b| flag(b & bit != 0))))
            .collect()
    }),
];

/// Every per-GPU native name this file renders, with the page it is on.
pub(super) fn names() -> Vec<(&'static str, Keep)> {
    let mut out: Vec<(&'static str, Keep)> = GAUGES
        .iter()
        .chain(COUNTERS)
        .map(|(name, keep, _, _)| (*name, *keep))
        .collect();
    out.extend(DIMENSIONED.iter().map(|(name, keep, ..)| (*name, *keep)));
    out.push(("gpu_steward_gpu_info", Keep::Always));
    for name in [
        "gpu_steward_temperature_threshold_celsius",
        "gpu_steward_clock_max_hertz",
        "gpu_steward_power_default_limit_watts",
        "gpu_steward_pcie_link_max_generation",
        "gpu_steward_pcie_link_max_width",
    ] {
        out.push((name, Keep::Full));
    }
    out
}

fn hz(clocks: &[(&'static str, Option<u32>)]) -> Vec<(&'static str, Option<f64>)> {
    clocks
        .iter()
        .map(|(k, v)| (*k, v.map(|mhz| f64::from(mhz) * 1e6)))
        .collect()
}

pub(super) fn render(snapshot: &Snapshot, view: super::View, out: &mut Families) {
    render_identity(snapshot, view, out);
    let up: Vec<&GpuSnapshot> = snapshot
        .gpus
        .iter()
        .filter(|g| g.status == GpuStatus::Up)
        .collect();
    let labels = |g: &GpuSnapshot| [("gpu", g.index.to_string()), ("uuid", g.uuid().to_string())];
    for (table, counter) in [(GAUGES, false), (COUNTERS, true)] {
        for (name, keep, help, value) in table {
            if !keep.shown(view) {
                continue;
            }
            let mut f = Family::new(name, help, counter);
            for g in &up {
                f.add_opt(&labels(g), value(&g.reading));
            }
            out.push(f);
        }
    }
    for (name, keep, help, label, counter, values) in DIMENSIONED {
        if !keep.shown(view) {
            continue;
        }
        let mut f = Family::new(name, help, *counter);
        for g in &up {
            let [gpu, uuid] = labels(g);
            for (dim, v) in values(&g.reading) {
                f.add_opt(&[gpu.clone(), uuid.clone(), (label, dim.to_string())], v);
            }
        }
        out.push(f);
    }
}

/// The labels of `gpu_steward_gpu_info`.
fn info_labels(
    gpu: &str,
    uuid: &str,
    id: &GpuIdentity,
    driver: Option<&DriverInfo>,
) -> [(&'static str, String); 10] {
    [
        ("gpu", gpu.to_string()),
        ("uuid", uuid.to_string()),
        ("name", id.name.clone()),
        ("pci_bus_id", id.pci_bus_id.clone()),
        ("pci_device_id", format!("0x{:08X}", id.pci_device_id)),
        ("serial", id.serial.clone().unwrap_or_default()),
        ("architecture", id.architecture.clone().unwrap_or_default()),
        (
            "compute_capability",
            id.compute_capability
                .map(|(a, b)| format!("{a}.{b}"))
                .unwrap_or_default(),
        ),
        (
            "driver_version",
            driver.map(|d| d.driver_version.clone()).unwrap_or_default(),
        ),
        (
            "cuda_version",
            driver
                .and_then(|d| d.cuda_version)
                .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
                .unwrap_or_default(),
        ),
    ]
}

/// Identity and limits, which stay known for a lost GPU; `gpu_up` for every GPU NVML counts.
fn render_identity(snapshot: &Snapshot, view: super::View, out: &mut Families) {
    let driver = snapshot.driver.as_ref();
    let mut info = Family::gauge(
        "gpu_steward_gpu_info",
        "GPU identity, value 1: join on gpu and uuid for the name, bus id and versions.",
    );
    let mut up = Family::gauge(
        "gpu_steward_gpu_up",
        "1 if the GPU answered this poll, 0 if it is lost or unreadable.",
    );
    let mut thresholds = Family::gauge(
        "gpu_steward_temperature_threshold_celsius",
        "Temperature thresholds (nvmlDeviceGetTemperatureThreshold).",
    );
    let mut max_clock = Family::gauge(
        "gpu_steward_clock_max_hertz",
        "Maximum clock frequency (nvmlDeviceGetMaxClockInfo, MHz x 1e6).",
    );
    let mut power_default = Family::gauge(
        "gpu_steward_power_default_limit_watts",
        "Default power management limit (nvmlDeviceGetPowerManagementDefaultLimit).",
    );
    let mut pcie_max_gen = Family::gauge(
        "gpu_steward_pcie_link_max_generation",
        "Maximum PCIe link generation of the GPU and system (nvmlDeviceGetMaxPcieLinkGeneration).",
    );
    let mut pcie_max_width = Family::gauge(
        "gpu_steward_pcie_link_max_width",
        "Maximum PCIe link width (nvmlDeviceGetMaxPcieLinkWidth).",
    );
    for g in &snapshot.gpus {
        let gpu = g.index.to_string();
        let uuid = g.uuid().to_string();
        up.add(
            &[("gpu", gpu.as_str()), ("uuid", uuid.as_str())],
            flag(g.status == GpuStatus::Up),
        );
        let Some(id) = &g.identity else { continue };
        // Like the dcgm family: no info series until its name and bus id are read, rather than
        // one with empty labels that is replaced by another once they are.
        if id.labels_known() {
            info.add(&info_labels(&gpu, &uuid, id, driver), 1.0);
        }
        let t = id.thresholds;
        for (kind, v) in [
            ("shutdown", t.shutdown_c),
            ("slowdown", t.slowdown_c),
            ("gpu_max", t.gpu_max_c),
            ("memory_max", t.memory_max_c),
        ] {
            thresholds.add_opt(
                &[("gpu", gpu.as_str()), ("uuid", &uuid), ("threshold", kind)],
                v,
            );
        }
        let c = id.max_clocks_mhz;
        for (clock, v) in hz(&[
            ("graphics", c.graphics),
            ("sm", c.sm),
            ("memory", c.memory),
            ("video", c.video),
        ]) {
            max_clock.add_opt(
                &[("gpu", gpu.as_str()), ("uuid", &uuid), ("clock", clock)],
                v,
            );
        }
        let labels = [("gpu", gpu.as_str()), ("uuid", uuid.as_str())];
        power_default.add_opt(&labels, watts(id.power_default_limit_mw));
        pcie_max_gen.add_opt(&labels, id.max_pcie_generation);
        pcie_max_width.add_opt(&labels, id.max_pcie_width);
    }
    // Identity on every page: the documented join for names and versions, and what `status`
    // and `check-health` show of a GPU whatever the name set. Limits and maxima are static:
    // full page only.
    out.push(info);
    out.push(up);
    if Keep::Full.shown(view) {
        for f in [
            thresholds,
            max_clock,
            power_default,
            pcie_max_gen,
            pcie_max_width,
        ] {
            out.push(f);
        }
    }
}
