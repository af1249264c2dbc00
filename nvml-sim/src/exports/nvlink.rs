//! NVLink and the GPU fabric: link state, per-link error counters and the fabric info of
//! Hopper and newer. A GPU without `nvlink` in its scenario answers NOT_SUPPORTED to all of them,
//! as the captured H100 and H200 do (passed through to a VM, where NVML sees no links); a link
//! index the board does not have is INVALID_ARGUMENT (nvml.h: "link is invalid"). Throughput
//! and summed error counts are `nvmlDeviceGetFieldValues` fields (`fields.rs`).
//!
//! Topology between two GPUs: `nvmlDeviceGetP2PStatus` over NVLink is OK when both have an
//! active link (an HGX baseboard connects every GPU through its NVSwitches; CHOSEN: no
//! point-to-point bridges are modelled), NOT_SUPPORTED otherwise; `nvmlDeviceGetTopologyCommonAncestor`
//! is SINGLE (one PCIe switch, `nvidia-smi topo` PIX) for GPUs with the same `pcie_switch` and
//! SYSTEM (CHOSEN: across the CPUs' interconnect) for the others; INTERNAL for a GPU with itself.

use std::ffi::c_uint;
use std::mem::size_of;

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEnableState_t, nvmlGpuFabricInfo_t, nvmlGpuFabricInfo_v2_t,
    nvmlGpuFabricInfo_v3_t, nvmlNvLinkErrorCounter_t,
};

use crate::export;
use crate::ffi::{self, get, put, NvResult};
use crate::resolve::{Fabric, Nvlink};
use crate::state::gpu;

/// `NVML_P2P_CAPS_INDEX_NVLINK`.
const P2P_NVLINK: u32 = 2;
/// `nvmlGpuP2PStatus_t`: OK 0, NOT_SUPPORTED 5.
const P2P_OK: u32 = 0;
const P2P_NOT_SUPPORTED: u32 = 5;
/// `nvmlGpuTopologyLevel_t`.
const TOPOLOGY_INTERNAL: u32 = 0;
const TOPOLOGY_SINGLE: u32 = 10;
const TOPOLOGY_SYSTEM: u32 = 50;

fn has_active_link(n: &Option<Nvlink>) -> bool {
    n.as_ref().is_some_and(|n| n.active_links() > 0)
}

export!(
    fn nvmlDeviceGetP2PStatus(
        device1: nvmlDevice_t,
        device2: nvmlDevice_t,
        p2p_index: c_uint,
        p2p_status: *mut c_uint,
    ) {
        let (a, b) = (gpu(device1)?, gpu(device2)?);
        let status = match p2p_index {
            P2P_NVLINK if has_active_link(&a.nvlink) && has_active_link(&b.nvlink) => P2P_OK,
            P2P_NVLINK => P2P_NOT_SUPPORTED,
            // READ, WRITE, ATOMICS, PCI: over PCIe within a switch (CHOSEN).
            0 | 1 | 3 | 4 if a.pcie_switch == b.pcie_switch => P2P_OK,
            0 | 1 | 3 | 4 => P2P_NOT_SUPPORTED,
            _ => return Err(ffi::INVALID_ARGUMENT),
        };
        put(p2p_status, status)
    }
);

export!(
    fn nvmlDeviceGetTopologyCommonAncestor(
        device1: nvmlDevice_t,
        device2: nvmlDevice_t,
        path_info: *mut c_uint,
    ) {
        let (a, b) = (gpu(device1)?, gpu(device2)?);
        let level = if a.index == b.index {
            TOPOLOGY_INTERNAL
        } else if a.pcie_switch == b.pcie_switch {
            TOPOLOGY_SINGLE
        } else {
            TOPOLOGY_SYSTEM
        };
        put(path_info, level)
    }
);

/// `NVML_STRUCT_VERSION(GpuFabricInfo, n)`: the struct's size | n << 24.
pub const FABRIC_INFO_V2: u32 = size_of::<nvmlGpuFabricInfo_v2_t>() as u32 | 2 << 24;
pub const FABRIC_INFO_V3: u32 = size_of::<nvmlGpuFabricInfo_v3_t>() as u32 | 3 << 24;

/// The board's links, or NOT_SUPPORTED.
fn links(n: &Option<Nvlink>) -> NvResult<&Nvlink> {
    n.as_ref().ok_or(ffi::NOT_SUPPORTED)
}

/// Whether link `link` exists (INVALID_ARGUMENT if not) and is active.
fn link_active(n: &Nvlink, link: c_uint) -> NvResult<bool> {
    n.active
        .get(link as usize)
        .copied()
        .ok_or(ffi::INVALID_ARGUMENT)
}

/// Error count `counter` of link `link`: the GPU's totals are all on its lowest-numbered link.
pub fn link_errors(n: &Nvlink, link: c_uint, counter: u32) -> NvResult<u64> {
    link_active(n, link)?;
    let total = match counter {
        0..=3 => n.errors[counter as usize],
        // NVML_NVLINK_ERROR_DL_ECC_DATA: CHOSEN 0 (not in the scenario format).
        4 => 0,
        _ => return Err(ffi::INVALID_ARGUMENT),
    };
    Ok(if link == 0 { total } else { 0 })
}

export!(
    fn nvmlDeviceGetNvLinkState(
        device: nvmlDevice_t,
        link: c_uint,
        is_active: *mut nvmlEnableState_t,
    ) {
        let g = gpu(device)?;
        let active = link_active(links(&g.nvlink)?, link)?;
        put(is_active, nvmlEnableState_t::from(active))
    }
);

export!(
    fn nvmlDeviceGetNvLinkErrorCounter(
        device: nvmlDevice_t,
        link: c_uint,
        counter: nvmlNvLinkErrorCounter_t,
        counter_value: *mut u64,
    ) {
        let g = gpu(device)?;
        put(
            counter_value,
            link_errors(links(&g.nvlink)?, link, counter)?,
        )
    }
);

fn fabric(device: nvmlDevice_t) -> NvResult<Fabric> {
    gpu(device)?.fabric.ok_or(ffi::NOT_SUPPORTED)
}

export!(
    /// The versioned call: v3 (with the health summary) or v2; another version is
    /// ARGUMENT_VERSION_MISMATCH.
    fn nvmlDeviceGetGpuFabricInfoV(device: nvmlDevice_t, info: *mut nvmlGpuFabricInfo_v3_t) {
        let f = fabric(device)?;
        let asked = get(info.cast_const())?.version;
        match asked {
            FABRIC_INFO_V3 => put(
                info,
                nvmlGpuFabricInfo_v3_t {
                    version: asked,
                    clusterUuid: f.cluster_uuid,
                    status: f.status,
                    cliqueId: f.clique_id,
                    state: f.state,
                    healthMask: f.health_mask,
                    healthSummary: f.health_summary,
                },
            ),
            FABRIC_INFO_V2 => put(
                info.cast::<nvmlGpuFabricInfo_v2_t>(),
                nvmlGpuFabricInfo_v2_t {
                    version: asked,
                    clusterUuid: f.cluster_uuid,
                    status: f.status,
                    cliqueId: f.clique_id,
                    state: f.state,
                    healthMask: f.health_mask,
                },
            ),
            _ => Err(ffi::ARGUMENT_VERSION_MISMATCH),
        }
    }
);

export!(
    /// The deprecated unversioned call (no health mask).
    fn nvmlDeviceGetGpuFabricInfo(device: nvmlDevice_t, info: *mut nvmlGpuFabricInfo_t) {
        let f = fabric(device)?;
        put(
            info,
            nvmlGpuFabricInfo_t {
                clusterUuid: f.cluster_uuid,
                status: f.status,
                cliqueId: f.clique_id,
                state: f.state,
            },
        )
    }
);
