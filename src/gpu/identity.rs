//! Reads what a GPU is: name, UUID, serial, PCI identity, architecture and fixed limits.
//! Done once per device when it is first seen, not on every poll.

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureThreshold};
use nvml_wrapper::Device;

use super::{error_code, CallLog};
use crate::snapshot::{Clocks, GpuIdentity, TemperatureThresholds};

/// `Err` carries the NVML error code when the UUID, the one field identity cannot do without,
/// is unreadable.
pub(super) fn read(device: &Device, index: u32, log: &mut CallLog) -> Result<GpuIdentity, String> {
    let uuid = log
        .call("nvmlDeviceGetUUID", device.uuid())
        .map_err(|e| error_code(&e))?;
    let pci = log.read("nvmlDeviceGetPciInfo_v3", device.pci_info());
    let constraints = log.read(
        "nvmlDeviceGetPowerManagementLimitConstraints",
        device.power_management_limit_constraints(),
    );
    let max_clock = |log: &mut CallLog, clock| {
        log.read("nvmlDeviceGetMaxClockInfo", device.max_clock_info(clock))
    };
    let threshold = |log: &mut CallLog, t| {
        log.read(
            "nvmlDeviceGetTemperatureThreshold",
            device.temperature_threshold(t),
        )
    };
    Ok(GpuIdentity {
        index,
        uuid,
        name: log
            .read("nvmlDeviceGetName", device.name())
            .unwrap_or_default(),
        serial: log.read("nvmlDeviceGetSerial", device.serial()),
        pci_bus_id: pci
            .as_ref()
            .map(|p| normalize_bus_id(&p.bus_id))
            .unwrap_or_default(),
        pci_device_id: pci.as_ref().map_or(0, |p| p.pci_device_id),
        pci_subsystem_id: pci.as_ref().and_then(|p| p.pci_sub_system_id).unwrap_or(0),
        minor_number: log.read("nvmlDeviceGetMinorNumber", device.minor_number()),
        architecture: log
            .read("nvmlDeviceGetArchitecture", device.architecture())
            .map(|a| a.to_string()),
        compute_capability: log
            .read(
                "nvmlDeviceGetCudaComputeCapability",
                device.cuda_compute_capability(),
            )
            .map(|c| (c.major, c.minor)),
        power_default_limit_mw: log.read(
            "nvmlDeviceGetPowerManagementDefaultLimit",
            device.power_management_limit_default(),
        ),
        power_min_limit_mw: constraints.as_ref().map(|c| c.min_limit),
        power_max_limit_mw: constraints.as_ref().map(|c| c.max_limit),
        max_clocks_mhz: Clocks {
            graphics: max_clock(log, Clock::Graphics),
            sm: max_clock(log, Clock::SM),
            memory: max_clock(log, Clock::Memory),
            video: max_clock(log, Clock::Video),
        },
        thresholds: TemperatureThresholds {
            shutdown_c: threshold(log, TemperatureThreshold::Shutdown),
            slowdown_c: threshold(log, TemperatureThreshold::Slowdown),
            gpu_max_c: threshold(log, TemperatureThreshold::GpuMax),
            memory_max_c: threshold(log, TemperatureThreshold::MemoryMax),
        },
        max_pcie_generation: log.read(
            "nvmlDeviceGetMaxPcieLinkGeneration",
            device.max_pcie_link_gen(),
        ),
        max_pcie_width: log.read(
            "nvmlDeviceGetMaxPcieLinkWidth",
            device.max_pcie_link_width(),
        ),
    })
}

/// NVML fills `busId` as `DDDDDDDD:BB:DD.F` in upper case; dcgm-exporter prints it as NVML gives
/// it. Keep NVML's form but make sure stray NULs or spaces do not leak into labels.
fn normalize_bus_id(raw: &str) -> String {
    raw.trim_matches(|c: char| c == '\0' || c.is_whitespace())
        .to_string()
}
