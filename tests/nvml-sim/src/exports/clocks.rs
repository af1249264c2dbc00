//! Clocks, fans, PCIe and clock throttle (event) reasons. Every board in the model table is
//! fanless, so the fan calls answer NOT_SUPPORTED. Throttle reasons are exported under both the
//! deprecated `ClocksThrottleReasons` names (what nvml-wrapper 0.13 calls) and the current
//! `ClocksEventReasons` names.

use std::ffi::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{
    nvmlClockId_t, nvmlClockType_t, nvmlDevice_t, nvmlPcieUtilCounter_t,
};

use crate::export;
use crate::ffi::{self, put, NvResult};
use crate::models::Clocks;
use crate::state::{gpu, GpuRef};

/// CHOSEN: the reasons every simulated model reports as supported: the eight named in the
/// scenario format (GpuIdle … HwPowerBrakeSlowdown).
const SUPPORTED_REASONS: c_ulonglong = 0xFF;

fn pick(c: Clocks, clock_type: nvmlClockType_t) -> NvResult<c_uint> {
    match clock_type {
        0 => Ok(c.graphics),
        1 => Ok(c.sm),
        2 => Ok(c.mem),
        3 => Ok(c.video),
        _ => Err(ffi::INVALID_ARGUMENT),
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
    /// CURRENT 0, APP_CLOCK_TARGET 1 and APP_CLOCK_DEFAULT 2 (the model's default application
    /// clocks; video has none: NOT_SUPPORTED), CUSTOMER_BOOST_MAX 3 (the max clocks).
    fn nvmlDeviceGetClock(
        device: nvmlDevice_t,
        clock_type: nvmlClockType_t,
        clock_id: nvmlClockId_t,
        clock_mhz: *mut c_uint,
    ) {
        let g = gpu(device)?;
        let value = match clock_id {
            0 => pick(g.clocks, clock_type)?,
            1 | 2 => {
                let (gr, mem) = g.model.app_clocks;
                let app = Clocks {
                    graphics: gr,
                    sm: gr,
                    mem,
                    video: 0,
                };
                match pick(app, clock_type)? {
                    0 => return Err(ffi::NOT_SUPPORTED),
                    v => v,
                }
            }
            3 => pick(g.model.max_clocks, clock_type)?,
            _ => return Err(ffi::INVALID_ARGUMENT),
        };
        put(clock_mhz, value)
    }
);

fn fan(g: &GpuRef) -> NvResult<c_uint> {
    g.fan_percent.ok_or(ffi::NOT_SUPPORTED)
}

export!(
    fn nvmlDeviceGetFanSpeed(device: nvmlDevice_t, speed: *mut c_uint) {
        put(speed, fan(&gpu(device)?)?)
    }
);

export!(
    fn nvmlDeviceGetFanSpeed_v2(device: nvmlDevice_t, fan_index: c_uint, speed: *mut c_uint) {
        let g = gpu(device)?;
        let value = fan(&g)?;
        if fan_index != 0 {
            return Err(ffi::INVALID_ARGUMENT);
        }
        put(speed, value)
    }
);

export!(
    /// CHOSEN: fanless boards answer NOT_SUPPORTED (nvml.h scopes the call to "discrete
    /// products with dedicated fans"; no capture of a fanless board's answer was found).
    fn nvmlDeviceGetNumFans(device: nvmlDevice_t, num_fans: *mut c_uint) {
        let g = gpu(device)?;
        fan(&g)?;
        put(num_fans, 1)
    }
);

export!(
    /// TX_BYTES 0 / RX_BYTES 1, in KB/s.
    fn nvmlDeviceGetPcieThroughput(
        device: nvmlDevice_t,
        counter: nvmlPcieUtilCounter_t,
        value: *mut c_uint,
    ) {
        let g = gpu(device)?;
        let v = match counter {
            0 => g.pcie_tx_kib_s,
            1 => g.pcie_rx_kib_s,
            _ => return Err(ffi::INVALID_ARGUMENT),
        };
        put(value, v)
    }
);

export!(
    fn nvmlDeviceGetPcieReplayCounter(device: nvmlDevice_t, value: *mut c_uint) {
        put(value, gpu(device)?.pcie_replay_count)
    }
);

export!(
    /// CHOSEN: the link always runs at its maximum generation (real idle links may train down).
    fn nvmlDeviceGetCurrPcieLinkGeneration(device: nvmlDevice_t, curr_link_gen: *mut c_uint) {
        put(curr_link_gen, gpu(device)?.model.pcie_max_gen)
    }
);

export!(
    /// CHOSEN: the link always runs at its maximum width.
    fn nvmlDeviceGetCurrPcieLinkWidth(device: nvmlDevice_t, curr_link_width: *mut c_uint) {
        put(curr_link_width, gpu(device)?.model.pcie_max_width)
    }
);

export!(
    fn nvmlDeviceGetMaxPcieLinkGeneration(device: nvmlDevice_t, max_link_gen: *mut c_uint) {
        put(max_link_gen, gpu(device)?.model.pcie_max_gen)
    }
);

export!(
    fn nvmlDeviceGetMaxPcieLinkWidth(device: nvmlDevice_t, max_link_width: *mut c_uint) {
        put(max_link_width, gpu(device)?.model.pcie_max_width)
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
        gpu(device)?;
        put(reasons, SUPPORTED_REASONS)
    }
);

export!(
    fn nvmlDeviceGetSupportedClocksEventReasons(device: nvmlDevice_t, reasons: *mut c_ulonglong) {
        gpu(device)?;
        put(reasons, SUPPORTED_REASONS)
    }
);
