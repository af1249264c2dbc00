//! Memory error reporting: ECC mode and counters, page retirement (T4 only) and row remapping
//! (A100, H100, H200, L4), each NOT_SUPPORTED on the models that use the other scheme, as
//! gpu-models.md records from `nvidia-smi -q` captures.

use std::ffi::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEccCounterType_t, nvmlEnableState_t, nvmlMemoryErrorType_t,
    nvmlMemoryLocation_t, nvmlPageRetirementCause_t,
};

use crate::export;
use crate::ffi::{self, get, put, put_slice, NvResult};
use crate::state::{gpu, GpuRef};

/// NVML_MEMORY_LOCATION_DRAM / DEVICE_MEMORY.
const LOCATION_DEVICE_MEMORY: nvmlMemoryLocation_t = 2;

fn total_errors(
    g: &GpuRef,
    error_type: nvmlMemoryErrorType_t,
    counter: nvmlEccCounterType_t,
) -> NvResult<u64> {
    let e = g.ecc;
    match (error_type, counter) {
        (0, 0) => Ok(e.sbe_volatile),
        (0, 1) => Ok(e.sbe_aggregate),
        (1, 0) => Ok(e.dbe_volatile),
        (1, 1) => Ok(e.dbe_aggregate),
        _ => Err(ffi::INVALID_ARGUMENT),
    }
}

/// CHOSEN: synthetic retired-page addresses and timestamps (seconds since the epoch), stable
/// per GPU, cause and page number.
fn retired(g: &GpuRef, cause: nvmlPageRetirementCause_t) -> NvResult<(Vec<u64>, Vec<u64>)> {
    if !g.model.page_retirement {
        return Err(ffi::NOT_SUPPORTED);
    }
    let n = match cause {
        0 => g.retired_pages.sbe,
        1 => g.retired_pages.dbe,
        _ => return Err(ffi::INVALID_ARGUMENT),
    };
    let base = 0x0004_0000_0000 + (u64::from(cause) << 32) + (u64::from(g.index) << 36);
    let addresses = (0..u64::from(n)).map(|k| base + k * 0x1000).collect();
    let stamps = (0..u64::from(n)).map(|k| 1_700_000_000 + k * 60).collect();
    Ok((addresses, stamps))
}

export!(
    /// ECC is enabled (current and pending) on all six models.
    fn nvmlDeviceGetEccMode(
        device: nvmlDevice_t,
        current: *mut nvmlEnableState_t,
        pending: *mut nvmlEnableState_t,
    ) {
        gpu(device)?;
        put(current, 1)?;
        put(pending, 1)
    }
);

export!(
    /// CORRECTED 0 / UNCORRECTED 1 × VOLATILE 0 / AGGREGATE 1.
    fn nvmlDeviceGetTotalEccErrors(
        device: nvmlDevice_t,
        error_type: nvmlMemoryErrorType_t,
        counter_type: nvmlEccCounterType_t,
        ecc_counts: *mut c_ulonglong,
    ) {
        let g = gpu(device)?;
        put(ecc_counts, total_errors(&g, error_type, counter_type)?)
    }
);

export!(
    /// CHOSEN: every error is in device memory (location 2); other locations count 0.
    fn nvmlDeviceGetMemoryErrorCounter(
        device: nvmlDevice_t,
        error_type: nvmlMemoryErrorType_t,
        counter_type: nvmlEccCounterType_t,
        location_type: nvmlMemoryLocation_t,
        count: *mut c_ulonglong,
    ) {
        let g = gpu(device)?;
        let total = total_errors(&g, error_type, counter_type)?;
        let value = match location_type {
            LOCATION_DEVICE_MEMORY => total,
            0..=7 => 0,
            _ => return Err(ffi::INVALID_ARGUMENT),
        };
        put(count, value)
    }
);

export!(
    /// Count probe: a `*pageCount` smaller than the number of pages sets it and answers
    /// INSUFFICIENT_SIZE (SUCCESS with 0 when there are none).
    fn nvmlDeviceGetRetiredPages(
        device: nvmlDevice_t,
        cause: nvmlPageRetirementCause_t,
        page_count: *mut c_uint,
        addresses: *mut c_ulonglong,
    ) {
        let g = gpu(device)?;
        let (addr, _) = retired(&g, cause)?;
        let room = get(page_count)? as usize;
        put(page_count, addr.len() as c_uint)?;
        if room < addr.len() {
            return Err(ffi::INSUFFICIENT_SIZE);
        }
        put_slice(addresses, &addr)
    }
);

export!(
    fn nvmlDeviceGetRetiredPages_v2(
        device: nvmlDevice_t,
        cause: nvmlPageRetirementCause_t,
        page_count: *mut c_uint,
        addresses: *mut c_ulonglong,
        timestamps: *mut c_ulonglong,
    ) {
        let g = gpu(device)?;
        let (addr, stamps) = retired(&g, cause)?;
        let room = get(page_count)? as usize;
        put(page_count, addr.len() as c_uint)?;
        if room < addr.len() {
            return Err(ffi::INSUFFICIENT_SIZE);
        }
        put_slice(addresses, &addr)?;
        put_slice(timestamps, &stamps)
    }
);

export!(
    fn nvmlDeviceGetRetiredPagesPendingStatus(
        device: nvmlDevice_t,
        is_pending: *mut nvmlEnableState_t,
    ) {
        let g = gpu(device)?;
        if !g.model.page_retirement {
            return Err(ffi::NOT_SUPPORTED);
        }
        put(is_pending, c_uint::from(g.retired_pages.pending))
    }
);

export!(
    fn nvmlDeviceGetRemappedRows(
        device: nvmlDevice_t,
        corr_rows: *mut c_uint,
        unc_rows: *mut c_uint,
        is_pending: *mut c_uint,
        failure_occurred: *mut c_uint,
    ) {
        let g = gpu(device)?;
        if !g.model.row_remapping {
            return Err(ffi::NOT_SUPPORTED);
        }
        let r = g.remapped_rows;
        put(corr_rows, r.correctable)?;
        put(unc_rows, r.uncorrectable)?;
        put(is_pending, c_uint::from(r.pending))?;
        put(failure_occurred, c_uint::from(r.failure))
    }
);
