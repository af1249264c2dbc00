//! Board, firmware and driver-mode queries: persistence, performance and power state, power
//! management mode, VBIOS and inforom versions, part number, board and module ids,
//! virtualization and display mode, power source, NUMA node, CPU affinity and accounting. The
//! values are the real H100's and H200's on driver 580 (`tests/data/real-h*`), from the model
//! table or the scenario where they are per board.

use std::ffi::{c_char, c_uint, c_ulong};

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEnableState_t, nvmlGpuVirtualizationMode_t, nvmlHostVgpuMode_t,
    nvmlPowerSource_t, nvmlPstates_t,
};

use crate::export;
use crate::ffi::{self, get, put, put_at, put_str};
use crate::state::gpu;

/// Accounting buffer size (processes) both captured boards report.
const ACCOUNTING_BUFFER: c_uint = 4000;

export!(
    /// CHOSEN: always enabled (as on the captured boards; data-center nodes run
    /// nvidia-persistenced).
    fn nvmlDeviceGetPersistenceMode(device: nvmlDevice_t, mode: *mut nvmlEnableState_t) {
        gpu(device)?;
        put(mode, 1)
    }
);

/// P0 under any load, the model's idle state otherwise (P0 on A100/H100/H200, P8 on L4/T4).
fn pstate(device: nvmlDevice_t) -> ffi::NvResult<nvmlPstates_t> {
    let g = gpu(device)?;
    Ok(if g.gpu_util > 0 {
        0
    } else {
        g.model.idle_pstate
    })
}

export!(
    fn nvmlDeviceGetPerformanceState(device: nvmlDevice_t, p_state: *mut nvmlPstates_t) {
        put(p_state, pstate(device)?)
    }
);

export!(
    /// Deprecated alias of the performance state (nvml.h).
    fn nvmlDeviceGetPowerState(device: nvmlDevice_t, p_state: *mut nvmlPstates_t) {
        put(p_state, pstate(device)?)
    }
);

export!(
    /// Power management is always enabled on these boards.
    fn nvmlDeviceGetPowerManagementMode(device: nvmlDevice_t, mode: *mut nvmlEnableState_t) {
        gpu(device)?;
        put(mode, 1)
    }
);

export!(
    fn nvmlDeviceGetVbiosVersion(device: nvmlDevice_t, version: *mut c_char, length: c_uint) {
        put_str(version, length, gpu(device)?.model.board.vbios)
    }
);

export!(
    fn nvmlDeviceGetInforomImageVersion(
        device: nvmlDevice_t,
        version: *mut c_char,
        length: c_uint,
    ) {
        put_str(version, length, gpu(device)?.model.board.inforom_image)
    }
);

export!(
    fn nvmlDeviceGetBoardPartNumber(
        device: nvmlDevice_t,
        part_number: *mut c_char,
        length: c_uint,
    ) {
        put_str(part_number, length, gpu(device)?.model.board.part_number)
    }
);

export!(
    /// `bus << 8 | device` of the PCI address: the captured H100 at 00:06.0 answers 0x6 and a
    /// published A100 at 2F:00.0 shows 0x2f00 (CHOSEN as the rule).
    fn nvmlDeviceGetBoardId(device: nvmlDevice_t, board_id: *mut c_uint) {
        let g = gpu(device)?;
        put(board_id, (g.pci.bus << 8) | g.pci.device)
    }
);

export!(
    /// The scenario's `module_id` (default: index + 1).
    fn nvmlDeviceGetModuleId(device: nvmlDevice_t, module_id: *mut c_uint) {
        put(module_id, gpu(device)?.module_id)
    }
);

export!(
    /// The scenario's `virtualization_mode` (default none; the captured boards, passed through
    /// to a virtual machine, answer PASSTHROUGH = 1).
    fn nvmlDeviceGetVirtualizationMode(
        device: nvmlDevice_t,
        mode: *mut nvmlGpuVirtualizationMode_t,
    ) {
        put(mode, gpu(device)?.virtualization_mode)
    }
);

export!(
    /// NOT_SUPPORTED, as on both captured boards (no vGPU host driver).
    fn nvmlDeviceGetHostVgpuMode(device: nvmlDevice_t, _mode: *mut nvmlHostVgpuMode_t) {
        gpu(device)?;
        Err(ffi::NOT_SUPPORTED)
    }
);

export!(
    fn nvmlDeviceGetDisplayMode(device: nvmlDevice_t, display: *mut nvmlEnableState_t) {
        put(display, gpu(device)?.model.display_mode)
    }
);

export!(
    /// AC (0), as on both captured boards.
    fn nvmlDeviceGetPowerSource(device: nvmlDevice_t, source: *mut nvmlPowerSource_t) {
        gpu(device)?;
        put(source, 0)
    }
);

export!(
    /// NOT_SUPPORTED, as on both captured boards (CHOSEN for all: a bare-metal host would
    /// answer the GPU's NUMA node).
    fn nvmlDeviceGetNumaNodeId(device: nvmlDevice_t, _node: *mut c_uint) {
        gpu(device)?;
        Err(ffi::NOT_SUPPORTED)
    }
);

export!(
    /// Every CPU this process may use (the captured 16-vCPU machine answered 0xFFFF): CHOSEN,
    /// as no NUMA topology is simulated.
    fn nvmlDeviceGetCpuAffinity(device: nvmlDevice_t, cpu_set_size: c_uint, cpu_set: *mut c_ulong) {
        gpu(device)?;
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let bits = c_ulong::BITS as usize;
        for word in 0..cpu_set_size as usize {
            let set = cpus.saturating_sub(word * bits).min(bits);
            let mask = if set == bits {
                c_ulong::MAX
            } else {
                (1 << set) - 1
            };
            put_at(cpu_set, word, mask)?;
        }
        Ok(())
    }
);

export!(
    /// Disabled (0), as on both captured boards.
    fn nvmlDeviceGetAccountingMode(device: nvmlDevice_t, mode: *mut nvmlEnableState_t) {
        gpu(device)?;
        put(mode, 0)
    }
);

export!(
    fn nvmlDeviceGetAccountingBufferSize(device: nvmlDevice_t, buffer_size: *mut c_uint) {
        gpu(device)?;
        put(buffer_size, ACCOUNTING_BUFFER)
    }
);

export!(
    /// Accounting is disabled: no pids (SUCCESS with `*count` = 0).
    fn nvmlDeviceGetAccountingPids(device: nvmlDevice_t, count: *mut c_uint, _pids: *mut c_uint) {
        gpu(device)?;
        get(count)?;
        put(count, 0)
    }
);
