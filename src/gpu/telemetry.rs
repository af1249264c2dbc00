//! The per-GPU reads of [`super::READS`] other than processes and GPM: each fills the fields
//! it owns and leaves the others as the last read left them. A value NVML cannot give is set
//! to `None`, never kept from an earlier read.

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, RetirementCause, TemperatureSensor,
};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::Device;

use super::GpuReader;
use crate::snapshot::{Clocks, EccCounts, GpuReading, Memory, RemappedRows, RetiredPages};

/// `NVML_FI_DEV_MEMORY_TEMP`: HBM temperature, which `nvmlDeviceGetTemperature` does not offer.
const FI_MEMORY_TEMP: u32 = 82;
/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: the driver's recommended recovery action.
const FI_RECOVERY_ACTION: u32 = 230;
const FIELDS: &str = "nvmlDeviceGetFieldValues";

pub(super) fn utilization(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    let log = &mut r.log;
    let rates = log.read("nvmlDeviceGetUtilizationRates", || d.utilization_rates());
    out.gpu_util_percent = rates.as_ref().map(|u| u.gpu);
    out.mem_util_percent = rates.as_ref().map(|u| u.memory);
    out.enc_util_percent = log
        .read("nvmlDeviceGetEncoderUtilization", || {
            d.encoder_utilization()
        })
        .map(|u| u.utilization);
    out.dec_util_percent = log
        .read("nvmlDeviceGetDecoderUtilization", || {
            d.decoder_utilization()
        })
        .map(|u| u.utilization);
}

pub(super) fn memory(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    out.memory = r
        .log
        .read("nvmlDeviceGetMemoryInfo_v2", || d.memory_info())
        .map(|m| Memory {
            total: m.total,
            reserved: m.reserved,
            used: m.used,
            free: m.free,
        });
}

pub(super) fn bar1(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    let b = r
        .log
        .read("nvmlDeviceGetBAR1MemoryInfo", || d.bar1_memory_info());
    out.bar1_total_bytes = b.as_ref().map(|b| b.total);
    out.bar1_used_bytes = b.as_ref().map(|b| b.used);
}

pub(super) fn thermal(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    out.temperature_c = r.log.read("nvmlDeviceGetTemperature", || {
        d.temperature(TemperatureSensor::Gpu)
    });
    out.fan_percent = match fans(r, d) {
        0 => None,
        _ => r
            .log
            .probe_at("nvmlDeviceGetFanSpeed_v2", 0, || d.fan_speed(0)),
    };
    let wanted: Vec<FieldId> = [FI_MEMORY_TEMP, FI_RECOVERY_ACTION]
        .into_iter()
        .filter(|f| !r.log.lacks(FIELDS, *f))
        .map(FieldId)
        .collect();
    out.memory_temperature_c = None;
    out.recovery_action = None;
    if wanted.is_empty() {
        return;
    }
    let Some(values) = r.log.read(FIELDS, || d.field_values_for(&wanted)) else {
        return;
    };
    for sample in values.into_iter().flatten() {
        let field = sample.field.0;
        let value = match sample.value {
            Ok(v) => {
                r.log.answered_at(FIELDS, field);
                as_u64(v)
            }
            Err(e) => {
                r.log.fail_at(FIELDS, field, &e);
                None
            }
        };
        match field {
            FI_MEMORY_TEMP => out.memory_temperature_c = value.map(|v| v as u32),
            FI_RECOVERY_ACTION => out.recovery_action = value.map(|v| v as u32),
            _ => {}
        }
    }
}

/// How many fans the board has, asked once. Data-center boards (SXM, passively cooled PCIe)
/// have none, and a real H100 answers `nvmlDeviceGetFanSpeed_v2(dev, 0)` with
/// INVALID_ARGUMENT. A driver without `nvmlDeviceGetNumFans` gets fan 0 probed instead.
fn fans(r: &mut GpuReader, d: &Device) -> u32 {
    if let Some(n) = r.fans {
        return n;
    }
    match r.log.call("nvmlDeviceGetNumFans", || d.num_fans()) {
        Ok(n) => {
            r.fans = Some(n);
            n
        }
        Err(c) if c.is_unsupported() => {
            r.fans = Some(1);
            1
        }
        // A real failure: no fan reading this poll, asked again next poll.
        Err(_) => 0,
    }
}

pub(super) fn power(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    out.power_mw = r.log.read("nvmlDeviceGetPowerUsage", || d.power_usage());
    out.enforced_power_limit_mw = r.log.read("nvmlDeviceGetEnforcedPowerLimit", || {
        d.enforced_power_limit()
    });
}

pub(super) fn energy(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    out.energy_mj = r.log.read("nvmlDeviceGetTotalEnergyConsumption", || {
        d.total_energy_consumption()
    });
}

pub(super) fn power_limit(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    out.power_limit_mw = r.log.read("nvmlDeviceGetPowerManagementLimit", || {
        d.power_management_limit()
    });
}

pub(super) fn clocks(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    let mut clock = |c: Clock| {
        r.log
            .probe_at("nvmlDeviceGetClockInfo", c as u32, || d.clock_info(c))
    };
    out.clocks_mhz = Clocks {
        graphics: clock(Clock::Graphics),
        sm: clock(Clock::SM),
        memory: clock(Clock::Memory),
        video: clock(Clock::Video),
    };
    out.clock_event_reasons = r
        .log
        .read("nvmlDeviceGetCurrentClocksThrottleReasons", || {
            d.current_throttle_reasons()
        })
        .map(|b| b.bits());
}

pub(super) fn pcie_link(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    out.pcie_generation = r.log.read("nvmlDeviceGetCurrPcieLinkGeneration", || {
        d.current_pcie_link_gen()
    });
}

pub(super) fn pcie_counters(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    out.pcie_width = r.log.read("nvmlDeviceGetCurrPcieLinkWidth", || {
        d.current_pcie_link_width()
    });
    out.pcie_replay_count = r
        .log
        .read("nvmlDeviceGetPcieReplayCounter", || d.pcie_replay_counter());
}

/// Off the critical path (20 ms per direction), and not at all where GPM gives the rates.
pub(super) fn pcie_throughput(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    if r.pcie_from_gpm(out) {
        return;
    }
    let mut rate = |c: PcieUtilCounter| {
        r.log
            .read_at("nvmlDeviceGetPcieThroughput", c as u32, || {
                d.pcie_throughput(c)
            })
            .map(|kbs| f64::from(kbs) * 1024.0)
    };
    out.pcie_tx_bytes_per_second = rate(PcieUtilCounter::Send);
    out.pcie_rx_bytes_per_second = rate(PcieUtilCounter::Receive);
}

pub(super) fn ecc(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    let log = &mut r.log;
    out.ecc_enabled = log
        .read("nvmlDeviceGetEccMode", || d.is_ecc_enabled())
        .map(|m| m.currently_enabled);
    out.ecc = EccCounts::default();
    if out.ecc_enabled == Some(true) {
        let mut count = |e: MemoryError, c: EccCounter| {
            let arg = (e as u32) << 1 | c as u32;
            log.read_at("nvmlDeviceGetTotalEccErrors", arg, || {
                d.total_ecc_errors(e, c)
            })
        };
        out.ecc = EccCounts {
            corrected_volatile: count(MemoryError::Corrected, EccCounter::Volatile),
            uncorrected_volatile: count(MemoryError::Uncorrected, EccCounter::Volatile),
            corrected_aggregate: count(MemoryError::Corrected, EccCounter::Aggregate),
            uncorrected_aggregate: count(MemoryError::Uncorrected, EccCounter::Aggregate),
        };
    }
    // Ampere and newer replaced page retirement with row remapping: there the retired-pages
    // calls answer NOT_SUPPORTED once and are not asked again.
    let mut pages = |cause: RetirementCause| {
        log.read_at("nvmlDeviceGetRetiredPages", cause as u32, || {
            d.retired_pages(cause)
        })
        .map(|p| p.len() as u64)
    };
    out.retired_pages = RetiredPages {
        single_bit: pages(RetirementCause::MultipleSingleBitEccErrors),
        double_bit: pages(RetirementCause::DoubleBitEccError),
        pending: log.read("nvmlDeviceGetRetiredPagesPendingStatus", || {
            d.are_pages_pending_retired()
        }),
    };
    out.remapped_rows = log.read("nvmlDeviceGetRemappedRows", || remapped_rows(d));
}

pub(super) fn mig_mode(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    let mode = r.log.read("nvmlDeviceGetMigMode", || d.mig_mode());
    out.mig_mode_current = mode.as_ref().map(|m| m.current == 1);
    out.mig_mode_pending = mode.as_ref().map(|m| m.pending == 1);
    r.observe_mig(out.mig_mode_current);
    // 4.1 µs on a real H100 (nvml-sim/costs/h100-driver-580.json): free at this tier.
    out.compute_mode = r
        .log
        .read("nvmlDeviceGetComputeMode", || d.compute_mode())
        .map(super::control::from_wrapper);
}

/// `nvmlDeviceGetRemappedRows` is not wrapped by nvml-wrapper 0.13; call the raw symbol.
fn remapped_rows(device: &Device) -> Result<RemappedRows, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corr, mut unc, mut pending, mut failure) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: `device.handle()` is a live handle owned by `device` (borrowed for the whole call),
    // and the four out-pointers point to distinct, writable, properly aligned locals, as
    // `nvmlDeviceGetRemappedRows(nvmlDevice_t, unsigned*, unsigned*, unsigned*, unsigned*)`
    // requires.
    unsafe {
        nvml_try(sym(
            device.handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failure,
        ))?;
    }
    Ok(RemappedRows {
        correctable: corr,
        uncorrectable: unc,
        pending: pending != 0,
        failure: failure != 0,
    })
}

fn as_u64(v: SampleValue) -> Option<u64> {
    match v {
        SampleValue::U32(v) => Some(u64::from(v)),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        SampleValue::F64(v) if v >= 0.0 => Some(v as u64),
        SampleValue::F64(_) => None,
    }
}
