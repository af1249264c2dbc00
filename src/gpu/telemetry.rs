//! Reads one poll's telemetry of one GPU, grouped into sources so that each group's duration
//! and success can be reported on its own.

use std::collections::HashMap;

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, RetirementCause, TemperatureSensor,
};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::Device;

use super::{CallLog, ProcessCursor};
use crate::snapshot::{
    Clocks, EccCounts, GpuProcess, GpuReading, Memory, ProcessKind, RemappedRows, RetiredPages,
};

/// `NVML_FI_DEV_MEMORY_TEMP`: HBM temperature, which `nvmlDeviceGetTemperature` does not offer.
const FI_MEMORY_TEMP: u32 = 82;
/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: the driver's recommended recovery action.
const FI_RECOVERY_ACTION: u32 = 230;
/// How long a process's last utilization sample stays current without a newer one.
const UTIL_HORIZON_US: u64 = 10_000_000;

pub(super) fn read(device: &Device, cursor: &mut ProcessCursor, log: &mut CallLog) -> GpuReading {
    let mut r = GpuReading::default();

    log.begin("utilization");
    if let Some(u) = log.read("nvmlDeviceGetUtilizationRates", device.utilization_rates()) {
        r.gpu_util_percent = Some(u.gpu);
        r.mem_util_percent = Some(u.memory);
    }
    if log.lost {
        log.end();
        return r;
    }
    r.enc_util_percent = log
        .read(
            "nvmlDeviceGetEncoderUtilization",
            device.encoder_utilization(),
        )
        .map(|u| u.utilization);
    r.dec_util_percent = log
        .read(
            "nvmlDeviceGetDecoderUtilization",
            device.decoder_utilization(),
        )
        .map(|u| u.utilization);

    log.begin("memory");
    r.memory = log
        .read("nvmlDeviceGetMemoryInfo_v2", device.memory_info())
        .map(|m| Memory {
            total: m.total,
            reserved: m.reserved,
            used: m.used,
            free: m.free,
        });
    if let Some(b) = log.read("nvmlDeviceGetBAR1MemoryInfo", device.bar1_memory_info()) {
        r.bar1_total_bytes = Some(b.total);
        r.bar1_used_bytes = Some(b.used);
    }

    log.begin("thermal");
    r.temperature_c = log.read(
        "nvmlDeviceGetTemperature",
        device.temperature(TemperatureSensor::Gpu),
    );
    r.fan_percent = log.read("nvmlDeviceGetFanSpeed_v2", device.fan_speed(0));
    if let Some(values) = log.read(
        "nvmlDeviceGetFieldValues",
        device.field_values_for(&[FieldId(FI_MEMORY_TEMP), FieldId(FI_RECOVERY_ACTION)]),
    ) {
        for sample in values.into_iter().flatten() {
            let value = match sample.value {
                Ok(v) => as_u64(v),
                Err(e) => {
                    log.fail("nvmlDeviceGetFieldValues", &e);
                    None
                }
            };
            match sample.field.0 {
                FI_MEMORY_TEMP => r.memory_temperature_c = value.map(|v| v as u32),
                FI_RECOVERY_ACTION => r.recovery_action = value.map(|v| v as u32),
                _ => {}
            }
        }
    }

    log.begin("power");
    r.power_mw = log.read("nvmlDeviceGetPowerUsage", device.power_usage());
    r.energy_mj = log.read(
        "nvmlDeviceGetTotalEnergyConsumption",
        device.total_energy_consumption(),
    );
    r.power_limit_mw = log.read(
        "nvmlDeviceGetPowerManagementLimit",
        device.power_management_limit(),
    );
    r.enforced_power_limit_mw = log.read(
        "nvmlDeviceGetEnforcedPowerLimit",
        device.enforced_power_limit(),
    );

    log.begin("clocks");
    let clock = |log: &mut CallLog, c| log.read("nvmlDeviceGetClockInfo", device.clock_info(c));
    r.clocks_mhz = Clocks {
        graphics: clock(log, Clock::Graphics),
        sm: clock(log, Clock::SM),
        memory: clock(log, Clock::Memory),
        video: clock(log, Clock::Video),
    };
    r.clock_event_reasons = log
        .read(
            "nvmlDeviceGetCurrentClocksThrottleReasons",
            device.current_throttle_reasons(),
        )
        .map(|b| b.bits());

    log.begin("pcie");
    r.pcie_tx_kbs = log.read(
        "nvmlDeviceGetPcieThroughput",
        device.pcie_throughput(PcieUtilCounter::Send),
    );
    r.pcie_rx_kbs = log.read(
        "nvmlDeviceGetPcieThroughput",
        device.pcie_throughput(PcieUtilCounter::Receive),
    );
    r.pcie_replay_count = log.read(
        "nvmlDeviceGetPcieReplayCounter",
        device.pcie_replay_counter(),
    );
    r.pcie_generation = log.read(
        "nvmlDeviceGetCurrPcieLinkGeneration",
        device.current_pcie_link_gen(),
    );
    r.pcie_width = log.read(
        "nvmlDeviceGetCurrPcieLinkWidth",
        device.current_pcie_link_width(),
    );

    log.begin("ecc");
    read_ecc(device, &mut r, log);

    log.begin("mig");
    if let Some(m) = log.read("nvmlDeviceGetMigMode", device.mig_mode()) {
        r.mig_mode_current = Some(m.current == 1);
        r.mig_mode_pending = Some(m.pending == 1);
    }

    log.begin("processes");
    r.processes = read_processes(device, r.mig_mode_current == Some(true), cursor, log);
    log.end();
    r
}

fn read_ecc(device: &Device, r: &mut GpuReading, log: &mut CallLog) {
    r.ecc_enabled = log
        .read("nvmlDeviceGetEccMode", device.is_ecc_enabled())
        .map(|m| m.currently_enabled);
    if r.ecc_enabled == Some(true) {
        let count = |log: &mut CallLog, e, c| {
            log.read("nvmlDeviceGetTotalEccErrors", device.total_ecc_errors(e, c))
        };
        r.ecc = EccCounts {
            corrected_volatile: count(log, MemoryError::Corrected, EccCounter::Volatile),
            uncorrected_volatile: count(log, MemoryError::Uncorrected, EccCounter::Volatile),
            corrected_aggregate: count(log, MemoryError::Corrected, EccCounter::Aggregate),
            uncorrected_aggregate: count(log, MemoryError::Uncorrected, EccCounter::Aggregate),
        };
    }
    // Ampere and newer replaced page retirement with row remapping: there the retired-pages
    // calls answer NOT_SUPPORTED and the values stay absent.
    let pages = |log: &mut CallLog, cause| {
        log.read("nvmlDeviceGetRetiredPages", device.retired_pages(cause))
            .map(|p| p.len() as u64)
    };
    r.retired_pages = RetiredPages {
        single_bit: pages(log, RetirementCause::MultipleSingleBitEccErrors),
        double_bit: pages(log, RetirementCause::DoubleBitEccError),
        pending: log.read(
            "nvmlDeviceGetRetiredPagesPendingStatus",
            device.are_pages_pending_retired(),
        ),
    };
    r.remapped_rows = log.read("nvmlDeviceGetRemappedRows", remapped_rows(device));
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

fn read_processes(
    device: &Device,
    mig_enabled: bool,
    cursor: &mut ProcessCursor,
    log: &mut CallLog,
) -> Option<Vec<GpuProcess>> {
    let compute = log.read(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        device.running_compute_processes(),
    );
    let graphics = log.read(
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        device.running_graphics_processes(),
    );
    if compute.is_none() && graphics.is_none() {
        return None;
    }
    // Process utilization is not supported on MIG-enabled GPUs (nvml.h); don't ask.
    let util_known = !mig_enabled
        && match device.process_utilization_stats(cursor.last_seen_us) {
            Ok(samples) => {
                // The buffer may hold several samples per process since the last poll, in no
                // promised order: keep the newest of each, and ask next time only for samples
                // newer than the newest seen (nvml.h, lastSeenTimeStamp).
                for s in samples {
                    cursor.last_seen_us = cursor.last_seen_us.max(s.timestamp);
                    let newer = cursor.latest.get(&s.pid).is_none_or(|l| s.timestamp >= l.2);
                    if newer {
                        cursor
                            .latest
                            .insert(s.pid, (s.sm_util, s.mem_util, s.timestamp));
                    }
                }
                true
            }
            // NOT_FOUND: no sample newer than the last one seen, i.e. no process was active.
            Err(NvmlError::NotFound) => true,
            Err(e) => {
                log.fail("nvmlDeviceGetProcessUtilization", &e);
                false
            }
        };
    // Samples carry CPU timestamps (µs since the epoch). A process whose newest sample is older
    // than the horizon has not used the GPU since: forget it, so that it reads 0 below instead
    // of repeating its last busy value for as long as it keeps running. The horizon is measured
    // from now, on every poll, whether or not new samples came.
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let horizon = now_us.saturating_sub(UTIL_HORIZON_US);
    cursor.latest.retain(|_, l| l.2 >= horizon);
    let mut out: Vec<GpuProcess> = Vec::new();
    let kinds = [
        (compute, ProcessKind::Compute),
        (graphics, ProcessKind::Graphics),
    ];
    for (list, kind) in kinds {
        for p in list.unwrap_or_default() {
            let new = process(&p, kind, util_known.then_some(&cursor.latest));
            // A process in both lists (same MIG instance, if any) is one process, nvidia-smi's
            // "C+G", not two series.
            match out.iter_mut().find(|o| {
                o.pid == new.pid
                    && o.gpu_instance_id == new.gpu_instance_id
                    && o.compute_instance_id == new.compute_instance_id
            }) {
                Some(o) => {
                    if o.kind != new.kind {
                        o.kind = ProcessKind::ComputeAndGraphics;
                    }
                    o.used_memory_bytes = o.used_memory_bytes.max(new.used_memory_bytes);
                }
                None => out.push(new),
            }
        }
    }
    let running: std::collections::HashSet<u32> = out.iter().map(|p| p.pid).collect();
    cursor.latest.retain(|pid, _| running.contains(pid));
    out.sort_by_key(|p| p.pid);
    Some(out)
}

/// `latest` is `None` when utilization is unknown this poll (MIG, or the call failed): the
/// values are then absent. Otherwise a process without a recent sample was idle: 0.
fn process(
    p: &ProcessInfo,
    kind: ProcessKind,
    latest: Option<&HashMap<u32, (u32, u32, u64)>>,
) -> GpuProcess {
    let util = latest.map(|l| l.get(&p.pid).map_or((0, 0), |u| (u.0, u.1)));
    GpuProcess {
        pid: p.pid,
        kind,
        used_memory_bytes: match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        },
        sm_util_percent: util.map(|u| u.0),
        mem_util_percent: util.map(|u| u.1),
        gpu_instance_id: p.gpu_instance_id,
        compute_instance_id: p.compute_instance_id,
        info: None,
    }
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
