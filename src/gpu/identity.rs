//! Reads what a GPU is: name, UUID, serial, PCI identity, architecture and fixed limits.
//! Done when a device is first seen, and again on later polls only while a field failed with an
//! error (not "not supported"): a transient failure at the first poll must not leave an empty
//! name or bus id for the life of the process.

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureThreshold};
use nvml_wrapper::Device;

use super::CallLog;
use crate::snapshot::{Clocks, GpuIdentity, NvmlCode, TemperatureThresholds};

/// One identity read.
#[derive(Debug, Clone, PartialEq)]
pub struct IdentityRead {
    pub identity: GpuIdentity,
    /// No call failed other than with "not supported": nothing left to re-read.
    pub complete: bool,
}

impl IdentityRead {
    /// This read, with the fields it failed to get taken from `older` (an earlier read of the
    /// same board; ignored when it is another board).
    pub fn merged(self, older: Option<&GpuIdentity>) -> GpuIdentity {
        let new = self.identity;
        let Some(old) = older.filter(|o| o.uuid == new.uuid) else {
            return new;
        };
        let text = |n: String, o: &String| if n.is_empty() { o.clone() } else { n };
        let pci_known = !new.pci_bus_id.is_empty();
        GpuIdentity {
            index: new.index,
            name: text(new.name, &old.name),
            serial: new.serial.or_else(|| old.serial.clone()),
            pci_device_id: if pci_known {
                new.pci_device_id
            } else {
                old.pci_device_id
            },
            pci_subsystem_id: if pci_known {
                new.pci_subsystem_id
            } else {
                old.pci_subsystem_id
            },
            pci_bus_id: text(new.pci_bus_id, &old.pci_bus_id),
            minor_number: new.minor_number.or(old.minor_number),
            architecture: new.architecture.or_else(|| old.architecture.clone()),
            compute_capability: new.compute_capability.or(old.compute_capability),
            power_default_limit_mw: new.power_default_limit_mw.or(old.power_default_limit_mw),
            power_min_limit_mw: new.power_min_limit_mw.or(old.power_min_limit_mw),
            power_max_limit_mw: new.power_max_limit_mw.or(old.power_max_limit_mw),
            max_clocks_mhz: Clocks {
                graphics: new.max_clocks_mhz.graphics.or(old.max_clocks_mhz.graphics),
                sm: new.max_clocks_mhz.sm.or(old.max_clocks_mhz.sm),
                memory: new.max_clocks_mhz.memory.or(old.max_clocks_mhz.memory),
                video: new.max_clocks_mhz.video.or(old.max_clocks_mhz.video),
            },
            thresholds: TemperatureThresholds {
                shutdown_c: new.thresholds.shutdown_c.or(old.thresholds.shutdown_c),
                slowdown_c: new.thresholds.slowdown_c.or(old.thresholds.slowdown_c),
                gpu_max_c: new.thresholds.gpu_max_c.or(old.thresholds.gpu_max_c),
                memory_max_c: new.thresholds.memory_max_c.or(old.thresholds.memory_max_c),
            },
            max_pcie_generation: new.max_pcie_generation.or(old.max_pcie_generation),
            max_pcie_width: new.max_pcie_width.or(old.max_pcie_width),
            uuid: new.uuid,
        }
    }
}

/// `Err` carries the NVML error code when the UUID, the one field identity cannot do without,
/// is unreadable. Failed fields are left empty (`""`, `None`) and `complete` is false.
pub(super) fn read(
    device: &Device,
    index: u32,
    log: &mut CallLog,
) -> Result<IdentityRead, NvmlCode> {
    let errors_before = log.errors.len();
    let uuid = log.call("nvmlDeviceGetUUID", || device.uuid())?;
    let pci = log.read("nvmlDeviceGetPciInfo_v3", || device.pci_info());
    let constraints = log.read("nvmlDeviceGetPowerManagementLimitConstraints", || {
        device.power_management_limit_constraints()
    });
    let max_clock = |log: &mut CallLog, clock: Clock| {
        log.probe_at("nvmlDeviceGetMaxClockInfo", clock as u32, || {
            device.max_clock_info(clock)
        })
    };
    let max_clocks_mhz = Clocks {
        graphics: max_clock(log, Clock::Graphics),
        sm: max_clock(log, Clock::SM),
        memory: max_clock(log, Clock::Memory),
        video: max_clock(log, Clock::Video),
    };
    let threshold = |log: &mut CallLog, t: TemperatureThreshold| {
        log.probe_at("nvmlDeviceGetTemperatureThreshold", t as u32, || {
            device.temperature_threshold(t)
        })
    };
    let thresholds = TemperatureThresholds {
        shutdown_c: threshold(log, TemperatureThreshold::Shutdown),
        slowdown_c: threshold(log, TemperatureThreshold::Slowdown),
        gpu_max_c: threshold(log, TemperatureThreshold::GpuMax),
        memory_max_c: threshold(log, TemperatureThreshold::MemoryMax),
    };
    let identity = GpuIdentity {
        index,
        uuid,
        name: log
            .read("nvmlDeviceGetName", || device.name())
            .unwrap_or_default(),
        serial: log.read("nvmlDeviceGetSerial", || device.serial()),
        pci_bus_id: pci
            .as_ref()
            .map(|p| normalize_bus_id(&p.bus_id))
            .unwrap_or_default(),
        pci_device_id: pci.as_ref().map_or(0, |p| p.pci_device_id),
        pci_subsystem_id: pci.as_ref().and_then(|p| p.pci_sub_system_id).unwrap_or(0),
        minor_number: log.read("nvmlDeviceGetMinorNumber", || device.minor_number()),
        architecture: log
            .read("nvmlDeviceGetArchitecture", || device.architecture())
            .map(|a| a.to_string()),
        compute_capability: log
            .read("nvmlDeviceGetCudaComputeCapability", || {
                device.cuda_compute_capability()
            })
            .map(|c| (c.major, c.minor)),
        power_default_limit_mw: log.read("nvmlDeviceGetPowerManagementDefaultLimit", || {
            device.power_management_limit_default()
        }),
        power_min_limit_mw: constraints.as_ref().map(|c| c.min_limit),
        power_max_limit_mw: constraints.as_ref().map(|c| c.max_limit),
        max_clocks_mhz,
        thresholds,
        max_pcie_generation: log.read("nvmlDeviceGetMaxPcieLinkGeneration", || {
            device.max_pcie_link_gen()
        }),
        max_pcie_width: log.read("nvmlDeviceGetMaxPcieLinkWidth", || {
            device.max_pcie_link_width()
        }),
    };
    Ok(IdentityRead {
        identity,
        // CallLog records every failure but "not supported" (GPU_IS_LOST included).
        complete: log.errors.len() == errors_before,
    })
}

/// NVML fills `busId` as `DDDDDDDD:BB:DD.F` in upper case; dcgm-exporter prints it as NVML gives
/// it. Keep NVML's form but make sure stray NULs or spaces do not leak into labels.
fn normalize_bus_id(raw: &str) -> String {
    raw.trim_matches(|c: char| c == '\0' || c.is_whitespace())
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> GpuIdentity {
        GpuIdentity {
            index: 0,
            uuid: "GPU-a".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            serial: Some("1".into()),
            pci_bus_id: "00000000:18:00.0".into(),
            pci_device_id: 0x2330_10DE,
            minor_number: Some(0),
            ..GpuIdentity::default()
        }
    }

    #[test]
    fn a_re_read_keeps_what_it_failed_to_get_and_takes_what_it_got() {
        let partial = GpuIdentity {
            uuid: "GPU-a".into(),
            index: 3,
            minor_number: Some(3),
            ..GpuIdentity::default()
        };
        let read = IdentityRead {
            identity: partial,
            complete: false,
        };
        let merged = read.merged(Some(&known()));
        assert_eq!(merged.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(merged.pci_bus_id, "00000000:18:00.0");
        assert_eq!(merged.pci_device_id, 0x2330_10DE);
        assert_eq!(merged.serial.as_deref(), Some("1"));
        assert_eq!((merged.index, merged.minor_number), (3, Some(3)));
    }

    #[test]
    fn another_board_shares_nothing() {
        let other = GpuIdentity {
            uuid: "GPU-b".into(),
            ..GpuIdentity::default()
        };
        let read = IdentityRead {
            identity: other.clone(),
            complete: false,
        };
        assert_eq!(read.merged(Some(&known())), other);
    }
}
