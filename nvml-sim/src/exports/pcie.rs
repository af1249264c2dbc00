//! PCIe: throughput, replays, link generation, width and speed. The current link is the
//! scenario's `pcie = { gen, width }`, else the model's maximum (CHOSEN: real idle links may
//! train down; the captured H100 idles at its maximum, Gen5 x16). NVLink is in `nvlink.rs`.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlPcieUtilCounter_t};

use crate::export;
use crate::ffi::{self, put, NvResult};
use crate::state::{gpu, grown, Grown};

/// `nvmlDeviceGetPcieSpeed` (Mbps per lane, i.e. MT/s) of PCIe generation `gen`: the real H100
/// answers 32000 at gen 5.
fn speed_mbps(gen: u32) -> NvResult<c_uint> {
    match gen {
        1 => Ok(2500),
        2 => Ok(5000),
        3 => Ok(8000),
        4 => Ok(16000),
        5 => Ok(32000),
        6 => Ok(64000),
        _ => Err(ffi::UNKNOWN),
    }
}

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
        let g = gpu(device)?;
        let grown = grown(g.index as usize, Grown::PcieReplays);
        let count = u64::from(g.pcie_replay_count).saturating_add(grown);
        put(value, c_uint::try_from(count).unwrap_or(c_uint::MAX))
    }
);

export!(
    fn nvmlDeviceGetCurrPcieLinkGeneration(device: nvmlDevice_t, curr_link_gen: *mut c_uint) {
        put(curr_link_gen, gpu(device)?.pcie_gen)
    }
);

export!(
    fn nvmlDeviceGetCurrPcieLinkWidth(device: nvmlDevice_t, curr_link_width: *mut c_uint) {
        put(curr_link_width, gpu(device)?.pcie_width)
    }
);

export!(
    fn nvmlDeviceGetMaxPcieLinkGeneration(device: nvmlDevice_t, max_link_gen: *mut c_uint) {
        put(max_link_gen, gpu(device)?.model.pcie_max_gen)
    }
);

export!(
    /// The GPU's own maximum (the system's can be lower; not simulated).
    fn nvmlDeviceGetGpuMaxPcieLinkGeneration(device: nvmlDevice_t, max_link_gen: *mut c_uint) {
        put(max_link_gen, gpu(device)?.model.pcie_max_gen)
    }
);

export!(
    fn nvmlDeviceGetMaxPcieLinkWidth(device: nvmlDevice_t, max_link_width: *mut c_uint) {
        put(max_link_width, gpu(device)?.model.pcie_max_width)
    }
);

export!(
    /// Current link speed in Mbps per lane (32000 at gen 5).
    fn nvmlDeviceGetPcieSpeed(device: nvmlDevice_t, pcie_speed: *mut c_uint) {
        put(pcie_speed, speed_mbps(gpu(device)?.pcie_gen)?)
    }
);

export!(
    /// `nvmlPcieLinkMaxSpeed_t`: 2500 Mbps = 1 … 32000 Mbps = 5, i.e. the generation (the real
    /// H100 answers 5).
    fn nvmlDeviceGetPcieLinkMaxSpeed(device: nvmlDevice_t, max_speed: *mut c_uint) {
        put(max_speed, gpu(device)?.model.pcie_max_gen)
    }
);
