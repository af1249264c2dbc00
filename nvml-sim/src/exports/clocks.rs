//! Clocks, fans and clock event (throttle) reasons. Every board in the model table is fanless:
//! like the real H100 and H200 on driver 580, `nvmlDeviceGetNumFans` answers SUCCESS with 0,
//! `nvmlDeviceGetFanSpeed_v2` answers INVALID_ARGUMENT for a fan index the board does not have,
//! and `nvmlDeviceGetFanSpeed` NOT_SUPPORTED. Event reasons are exported under both the
//! deprecated `ClocksThrottleReasons` names (what nvml-wrapper 0.13 calls) and the current
//! `ClocksEventReasons` names.

use std::ffi::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{nvmlClockId_t, nvmlClockType_t, nvmlDevice_t};

use crate::export;
use crate::ffi::{self, get, put, put_slice, NvResult};
use crate::models::{Clocks, Model};
use crate::state::gpu;

fn pick(c: Clocks, clock_type: nvmlClockType_t) -> NvResult<c_uint> {
    match clock_type {
        0 => Ok(c.graphics),
        1 => Ok(c.sm),
        2 => Ok(c.mem),
        3 => Ok(c.video),
        _ => Err(ffi::INVALID_ARGUMENT),
    }
}

/// Application clocks (target = default: setters are not simulated); video has none.
fn app_clock(model: &Model, clock_type: nvmlClockType_t) -> NvResult<c_uint> {
    let (gr, mem) = model.app_clocks;
    let app = Clocks {
        graphics: gr,
        sm: gr,
        mem,
        video: 0,
    };
    match pick(app, clock_type)? {
        0 => Err(ffi::NOT_SUPPORTED),
        v => Ok(v),
    }
}

export!(
    /// Current clock: graphics 0, SM 1, memory 2, video 3 (MHz).
    fn nvmlDeviceGetClockInfo(
        device: nvmlDevice_t,
        clock_type: nvmlClockType_t,
        clock: *mut c_uint,
    ) {
        put(clock, pick(gpu(device)?.clocks, clock_type)?)
    }
);

export!(
    fn nvmlDeviceGetMaxClockInfo(
        device: nvmlDevice_t,
        clock_type: nvmlClockType_t,
        clock: *mut c_uint,
    ) {
        put(clock, pick(gpu(device)?.model.max_clocks, clock_type)?)
    }
);

export!(
    /// CURRENT 0, APP_CLOCK_TARGET 1 and APP_CLOCK_DEFAULT 2 (the model's application clocks;
    /// video has none: NOT_SUPPORTED), CUSTOMER_BOOST_MAX 3 (the max clocks).
    fn nvmlDeviceGetClock(
        device: nvmlDevice_t,
        clock_type: nvmlClockType_t,
        clock_id: nvmlClockId_t,
        clock_mhz: *mut c_uint,
    ) {
        let g = gpu(device)?;
        let value = match clock_id {
            0 => pick(g.clocks, clock_type)?,
            1 | 2 => app_clock(g.model, clock_type)?,
            3 => pick(g.model.max_clocks, clock_type)?,
            _ => return Err(ffi::INVALID_ARGUMENT),
        };
        put(clock_mhz, value)
    }
);

export!(
    fn nvmlDeviceGetApplicationsClock(
        device: nvmlDevice_t,
        clock_type: nvmlClockType_t,
        clock_mhz: *mut c_uint,
    ) {
        put(clock_mhz, app_clock(gpu(device)?.model, clock_type)?)
    }
);

export!(
    fn nvmlDeviceGetDefaultApplicationsClock(
        device: nvmlDevice_t,
        clock_type: nvmlClockType_t,
        clock_mhz: *mut c_uint,
    ) {
        put(clock_mhz, app_clock(gpu(device)?.model, clock_type)?)
    }
);

export!(
    /// Highest first. A NULL array or a `*count` too small sets the count and answers
    /// INSUFFICIENT_SIZE.
    fn nvmlDeviceGetSupportedMemoryClocks(
        device: nvmlDevice_t,
        count: *mut c_uint,
        clocks_mhz: *mut c_uint,
    ) {
        let clocks = gpu(device)?.model.supported_mem_clocks;
        let room = get(count)? as usize;
        put(count, clocks.len() as c_uint)?;
        if clocks_mhz.is_null() || room < clocks.len() {
            return Err(ffi::INSUFFICIENT_SIZE);
        }
        put_slice(clocks_mhz, clocks)
    }
);

export!(
    /// NOT_SUPPORTED on boards without fans (all six models).
    fn nvmlDeviceGetFanSpeed(device: nvmlDevice_t, speed: *mut c_uint) {
        put(speed, gpu(device)?.fan_percent.ok_or(ffi::NOT_SUPPORTED)?)
    }
);

export!(
    /// INVALID_ARGUMENT for a fan the board does not have: on a fanless board, any index (the
    /// real H100 answers so for fan 0).
    fn nvmlDeviceGetFanSpeed_v2(device: nvmlDevice_t, fan_index: c_uint, speed: *mut c_uint) {
        let g = gpu(device)?;
        if fan_index >= g.model.fans {
            return Err(ffi::INVALID_ARGUMENT);
        }
        put(speed, g.fan_percent.ok_or(ffi::NOT_SUPPORTED)?)
    }
);

export!(
    /// SUCCESS with 0 on fanless boards, as the real H100 and H200 answer.
    fn nvmlDeviceGetNumFans(device: nvmlDevice_t, num_fans: *mut c_uint) {
        put(num_fans, gpu(device)?.model.fans)
    }
);

export!(
    /// The scenario's `throttle_reasons` bits exactly as listed: HW thermal / power-brake
    /// slowdowns do not imply the HwSlowdown bit (list `hw_slowdown` too to get it).
    fn nvmlDeviceGetCurrentClocksThrottleReasons(device: nvmlDevice_t, reasons: *mut c_ulonglong) {
        put(reasons, gpu(device)?.throttle_reasons)
    }
);

export!(
    fn nvmlDeviceGetCurrentClocksEventReasons(device: nvmlDevice_t, reasons: *mut c_ulonglong) {
        put(reasons, gpu(device)?.throttle_reasons)
    }
);

export!(
    fn nvmlDeviceGetSupportedClocksThrottleReasons(
        device: nvmlDevice_t,
        reasons: *mut c_ulonglong,
    ) {
        put(reasons, gpu(device)?.model.supported_clock_event_reasons)
    }
);

export!(
    fn nvmlDeviceGetSupportedClocksEventReasons(device: nvmlDevice_t, reasons: *mut c_ulonglong) {
        put(reasons, gpu(device)?.model.supported_clock_event_reasons)
    }
);
