//! Running processes and per-process utilisation, with NVML's count-probe conventions:
//! a NULL buffer or a too-small `*infoCount` sets the needed count and answers
//! INSUFFICIENT_SIZE (SUCCESS with 0 when there is nothing to report). Memory is in bytes.
//! Utilisation samples are generated on a fixed 1 s period (CHOSEN): each process has one
//! sample, stamped with the start of the current wall-clock second in microseconds. A process
//! with 0 % SM and 0 % memory utilisation has no sample at all (CHOSEN): the driver records
//! samples for processes that ran in the sample period, so an idle process shows up as the
//! absence of samples, and consumers must not repeat its last busy value.

use std::ffi::{c_uint, c_ulonglong};
use std::time::{SystemTime, UNIX_EPOCH};

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t, nvmlProcessUtilizationInfo_v1_t,
    nvmlProcessUtilizationSample_t, nvmlProcessesUtilizationInfo_t,
};

use crate::export;
use crate::ffi::{self, get, put, put_slice, NvResult};
use crate::resolve::{Gpu, Process};
use crate::scenario::ProcessKind;
use crate::state::gpu;

const MIB: u64 = 1024 * 1024;
/// "Not a MIG process" in `gpuInstanceId`/`computeInstanceId`.
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;
/// CHOSEN: utilisation sampling period.
pub const SAMPLE_PERIOD_US: u64 = 1_000_000;
/// `ProcessesUtilizationInfo_v1` = sizeof(nvmlProcessesUtilizationInfo_v1_t) | 1 << 24.
const PROCESSES_UTIL_V1: c_uint =
    (std::mem::size_of::<nvmlProcessesUtilizationInfo_t>() as c_uint) | (1 << 24);

/// A process with a `mig_device` reports the live instance it runs in (`store::process_instance`).
fn v2(p: &Process, g: &Gpu) -> nvmlProcessInfo_t {
    let (gi, ci) = crate::store::read(g.index, |m| Ok(crate::store::process_instance(g, m, p)))
        .ok()
        .flatten()
        .unwrap_or((NO_INSTANCE, NO_INSTANCE));
    nvmlProcessInfo_t {
        pid: p.pid,
        usedGpuMemory: p.used_memory_mib * MIB,
        gpuInstanceId: gi,
        computeInstanceId: ci,
    }
}

fn v1(p: &Process, _g: &Gpu) -> nvmlProcessInfo_v1_t {
    nvmlProcessInfo_v1_t {
        pid: p.pid,
        usedGpuMemory: p.used_memory_mib * MIB,
    }
}

/// The shared body of every `Get*RunningProcesses*`.
fn list<T: Copy>(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    kind: ProcessKind,
    make: fn(&Process, &Gpu) -> T,
) -> NvResult {
    let g = gpu(device)?;
    let items: Vec<T> = g
        .processes
        .iter()
        .filter(|p| p.kind == kind)
        .map(|p| make(p, &g))
        .collect();
    let room = get(count)? as usize;
    put(count, items.len() as c_uint)?;
    if items.is_empty() {
        return Ok(());
    }
    if infos.is_null() || room < items.len() {
        return Err(ffi::INSUFFICIENT_SIZE);
    }
    put_slice(infos, &items)
}

export!(
    fn nvmlDeviceGetComputeRunningProcesses_v3(
        device: nvmlDevice_t,
        info_count: *mut c_uint,
        infos: *mut nvmlProcessInfo_t,
    ) {
        list(device, info_count, infos, ProcessKind::Compute, v2)
    }
);

export!(
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(
        device: nvmlDevice_t,
        info_count: *mut c_uint,
        infos: *mut nvmlProcessInfo_t,
    ) {
        list(device, info_count, infos, ProcessKind::Graphics, v2)
    }
);

export!(
    /// Same layout as v3 (`nvmlProcessInfo_v2_t`).
    fn nvmlDeviceGetComputeRunningProcesses_v2(
        device: nvmlDevice_t,
        info_count: *mut c_uint,
        infos: *mut nvmlProcessInfo_t,
    ) {
        list(device, info_count, infos, ProcessKind::Compute, v2)
    }
);

export!(
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(
        device: nvmlDevice_t,
        info_count: *mut c_uint,
        infos: *mut nvmlProcessInfo_t,
    ) {
        list(device, info_count, infos, ProcessKind::Graphics, v2)
    }
);

export!(
    fn nvmlDeviceGetComputeRunningProcesses(
        device: nvmlDevice_t,
        info_count: *mut c_uint,
        infos: *mut nvmlProcessInfo_v1_t,
    ) {
        list(device, info_count, infos, ProcessKind::Compute, v1)
    }
);

export!(
    fn nvmlDeviceGetGraphicsRunningProcesses(
        device: nvmlDevice_t,
        info_count: *mut c_uint,
        infos: *mut nvmlProcessInfo_v1_t,
    ) {
        list(device, info_count, infos, ProcessKind::Graphics, v1)
    }
);

/// The latest sample tick (µs since the epoch), a multiple of [`SAMPLE_PERIOD_US`].
pub fn latest_tick_us(now: SystemTime) -> u64 {
    let us = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    us / SAMPLE_PERIOD_US * SAMPLE_PERIOD_US
}

/// The samples newer than `last_seen_us` (none ⇒ NOT_FOUND); NOT_SUPPORTED on MIG-enabled GPUs.
fn samples(g: &Gpu, last_seen_us: u64) -> NvResult<Vec<(u32, u64, u32, u32)>> {
    if crate::store::enabled(g) {
        return Err(ffi::NOT_SUPPORTED);
    }
    let tick = latest_tick_us(SystemTime::now());
    if tick <= last_seen_us {
        return Err(ffi::NOT_FOUND);
    }
    let found: Vec<_> = g
        .processes
        .iter()
        .filter(|p| p.sm_util_percent > 0 || p.mem_util_percent > 0)
        .map(|p| (p.pid, tick, p.sm_util_percent, p.mem_util_percent))
        .collect();
    if found.is_empty() {
        return Err(ffi::NOT_FOUND);
    }
    Ok(found)
}

export!(
    /// Samples newer than `last_seen_time_stamp` (µs); NOT_FOUND when there are none; NULL
    /// `utilization` (or too small a count) sets the count and answers INSUFFICIENT_SIZE.
    /// NOT_SUPPORTED on MIG-enabled GPUs (nvml.h).
    fn nvmlDeviceGetProcessUtilization(
        device: nvmlDevice_t,
        utilization: *mut nvmlProcessUtilizationSample_t,
        process_samples_count: *mut c_uint,
        last_seen_time_stamp: c_ulonglong,
    ) {
        let g = gpu(device)?;
        let samples: Vec<nvmlProcessUtilizationSample_t> = samples(&g, last_seen_time_stamp)?
            .into_iter()
            .map(|(pid, stamp, sm, mem)| nvmlProcessUtilizationSample_t {
                pid,
                timeStamp: stamp,
                smUtil: sm,
                memUtil: mem,
                encUtil: 0,
                decUtil: 0,
            })
            .collect();
        let room = get(process_samples_count)? as usize;
        put(process_samples_count, samples.len() as c_uint)?;
        if utilization.is_null() || room < samples.len() {
            return Err(ffi::INSUFFICIENT_SIZE);
        }
        put_slice(utilization, &samples)
    }
);

export!(
    /// The same samples in `nvmlProcessesUtilizationInfo_v1_t` (version must be
    /// `ProcessesUtilizationInfo_v1`); a NULL array or too small a `processSamplesCount` sets
    /// the count and answers INSUFFICIENT_SIZE.
    fn nvmlDeviceGetProcessesUtilizationInfo(
        device: nvmlDevice_t,
        info: *mut nvmlProcessesUtilizationInfo_t,
    ) {
        let g = gpu(device)?;
        let mut head = get(info)?;
        if head.version != PROCESSES_UTIL_V1 {
            return Err(ffi::ARGUMENT_VERSION_MISMATCH);
        }
        let samples: Vec<nvmlProcessUtilizationInfo_v1_t> = samples(&g, head.lastSeenTimeStamp)?
            .into_iter()
            .map(|(pid, stamp, sm, mem)| nvmlProcessUtilizationInfo_v1_t {
                timeStamp: stamp,
                pid,
                smUtil: sm,
                memUtil: mem,
                encUtil: 0,
                decUtil: 0,
                jpgUtil: 0,
                ofaUtil: 0,
            })
            .collect();
        let room = head.processSamplesCount as usize;
        head.processSamplesCount = samples.len() as c_uint;
        put(info, head)?;
        if head.procUtilArray.is_null() || room < samples.len() {
            return Err(ffi::INSUFFICIENT_SIZE);
        }
        put_slice(head.procUtilArray, &samples)
    }
);
