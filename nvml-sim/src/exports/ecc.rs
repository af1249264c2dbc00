//! Memory error reporting: ECC mode and counters, page retirement (T4 only) and row remapping
//! (A100, H100, H200, L4), each NOT_SUPPORTED on the models that use the other scheme, as
//! `nvidia-smi -q` captures of each model show (`nvml-sim/README.md`).

use std::ffi::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEccCounterType_t, nvmlEnableState_t, nvmlMemoryErrorType_t,
    nvmlMemoryLocation_t, nvmlPageRetirementCause_t, nvmlRowRemapperHistogramValues_t,
};

use crate::export;
use crate::ffi::{self, get, put, put_slice, NvResult};
use crate::scenario::Ecc;
use crate::state::{gpu, grown, GpuRef, Grown};

/// NVML_MEMORY_LOCATION_DRAM / DEVICE_MEMORY.
const LOCATION_DEVICE_MEMORY: nvmlMemoryLocation_t = 2;
/// NVML_MEMORY_LOCATION_SRAM.
const LOCATION_SRAM: nvmlMemoryLocation_t = 7;
/// NVML_MEMORY_LOCATION_COUNT.
const LOCATION_COUNT: nvmlMemoryLocation_t = 8;

/// The scenario's count plus, for the correctable counters, what `ecc.correctable_per_s` added.
fn total_errors(
    g: &GpuRef,
    error_type: nvmlMemoryErrorType_t,
    counter: nvmlEccCounterType_t,
) -> NvResult<u64> {
    let base = count_of(&g.ecc, error_type, counter)?;
    Ok(if error_type == 0 {
        base.saturating_add(grown(g.index as usize, Grown::CorrectableEcc))
    } else {
        base
    })
}

fn count_of(
    e: &Ecc,
    error_type: nvmlMemoryErrorType_t,
    counter: nvmlEccCounterType_t,
) -> NvResult<u64> {
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
    /// Only the model's locations answer (device memory 2 and SRAM 7 on every model here, as on
    /// the captured H100 and H200); the others are NOT_SUPPORTED. The scenario's `ecc_sram`
    /// part of the totals is in SRAM, the rest in device memory.
    fn nvmlDeviceGetMemoryErrorCounter(
        device: nvmlDevice_t,
        error_type: nvmlMemoryErrorType_t,
        counter_type: nvmlEccCounterType_t,
        location_type: nvmlMemoryLocation_t,
        count: *mut c_ulonglong,
    ) {
        let g = gpu(device)?;
        let total = total_errors(&g, error_type, counter_type)?;
        let sram = count_of(&g.ecc_sram, error_type, counter_type)?;
        if location_type >= LOCATION_COUNT {
            return Err(ffi::INVALID_ARGUMENT);
        }
        if !g.model.ecc_locations.contains(&location_type) {
            return Err(ffi::NOT_SUPPORTED);
        }
        let value = match location_type {
            LOCATION_DEVICE_MEMORY => total.saturating_sub(sram),
            LOCATION_SRAM => sram,
            _ => 0,
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

export!(
    /// ECC is enabled by default on all six models.
    fn nvmlDeviceGetDefaultEccMode(device: nvmlDevice_t, default_mode: *mut nvmlEnableState_t) {
        gpu(device)?;
        put(default_mode, 1)
    }
);

export!(
    /// The model's bank count as `max` and 0 in every availability bucket, exactly what the
    /// real H100 (2560) and H200 (3072) answer at idle; NOT_SUPPORTED without row remapping.
    fn nvmlDeviceGetRowRemapperHistogram(
        device: nvmlDevice_t,
        values: *mut nvmlRowRemapperHistogramValues_t,
    ) {
        let g = gpu(device)?;
        if !g.model.row_remapping {
            return Err(ffi::NOT_SUPPORTED);
        }
        put(
            values,
            nvmlRowRemapperHistogramValues_t {
                max: g.model.remap_bank_max,
                high: 0,
                partial: 0,
                low: 0,
                none: 0,
            },
        )
    }
);
