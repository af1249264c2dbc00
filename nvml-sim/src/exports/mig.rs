//! The MIG profile queries: the GPU-instance profile table (`…GetGpuInstanceProfileInfo`,
//! `…InfoV`) and its placements (`…GetGpuInstancePossiblePlacements_v2`) answer whatever the
//! mode, as the real H100 and H200 do on driver 580. Models without MIG answer NOT_SUPPORTED to
//! every MIG call but `nvmlDeviceIsMigDeviceHandle` (0). The instance lifecycle is in
//! `mig_gi.rs` (mode, GPU instances) and `mig_ci.rs` (compute instances, MIG device handles).

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t,
    nvmlGpuInstanceProfileInfo_v2_t, nvmlGpuInstanceProfileInfo_v3_t,
};

use crate::export;
use crate::ffi::{self, get, put, put_slice, NvResult};
use crate::models::GiProfile;
use crate::state::{gpu, GpuRef};

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` in nvml.h API 13: profile indices from here on are
/// INVALID_ARGUMENT (below, a profile the model lacks is NOT_SUPPORTED).
const PROFILE_INDEX_COUNT: c_uint = 0x12;
const INFO_V2: c_uint =
    (std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as c_uint) | (2 << 24);
const INFO_V3: c_uint =
    (std::mem::size_of::<nvmlGpuInstanceProfileInfo_v3_t>() as c_uint) | (3 << 24);

/// The GPU, if its model has MIG (else NOT_SUPPORTED).
pub(super) fn mig_gpu(device: nvmlDevice_t) -> NvResult<GpuRef> {
    let g = gpu(device)?;
    if !g.model.mig_capable() {
        return Err(ffi::NOT_SUPPORTED);
    }
    Ok(g)
}

fn at_index(g: &GpuRef, index: c_uint) -> NvResult<&'static GiProfile> {
    if index >= PROFILE_INDEX_COUNT {
        return Err(ffi::INVALID_ARGUMENT);
    }
    g.model.mig_profile_at(index).ok_or(ffi::NOT_SUPPORTED)
}

/// CHOSEN: a profile id the model does not have is INVALID_ARGUMENT.
pub(super) fn by_id(g: &GpuRef, id: c_uint) -> NvResult<&'static GiProfile> {
    g.model.mig_profile_by_id(id).ok_or(ffi::INVALID_ARGUMENT)
}

/// NVML's profile name: `"MIG 1g.10gb"`, NUL-padded.
pub(super) fn name96(p: &GiProfile) -> [std::ffi::c_char; 96] {
    let mut out = [0; 96];
    for (o, b) in out
        .iter_mut()
        .zip(format!("MIG {}", p.name).bytes().take(95))
    {
        *o = b as std::ffi::c_char;
    }
    out
}

export!(
    fn nvmlDeviceGetGpuInstanceProfileInfo(
        device: nvmlDevice_t,
        profile: c_uint,
        info: *mut nvmlGpuInstanceProfileInfo_t,
    ) {
        let g = mig_gpu(device)?;
        let p = at_index(&g, profile)?;
        put(
            info,
            nvmlGpuInstanceProfileInfo_t {
                id: p.id,
                isP2pSupported: 0,
                sliceCount: p.slices,
                instanceCount: p.instances,
                multiprocessorCount: p.sms,
                copyEngineCount: p.copy_engines,
                decoderCount: p.decoders,
                encoderCount: p.encoders,
                jpegCount: p.jpegs,
                ofaCount: p.ofas,
                memorySizeMB: p.memory_mb,
            },
        )
    }
);

export!(
    /// `version` v2 (`0x02000098`) or v3 (`0x03000098`, capabilities 0: no P2P, no graphics);
    /// 0 is read as v2 and left 0, as the real driver did for the capture's pynvml 13.610.
    /// Other versions answer ARGUMENT_VERSION_MISMATCH.
    fn nvmlDeviceGetGpuInstanceProfileInfoV(
        device: nvmlDevice_t,
        profile: c_uint,
        info: *mut nvmlGpuInstanceProfileInfo_v2_t,
    ) {
        let g = mig_gpu(device)?;
        let version = get(info)?.version;
        if ![0, INFO_V2, INFO_V3].contains(&version) {
            return Err(ffi::ARGUMENT_VERSION_MISMATCH);
        }
        let p = at_index(&g, profile)?;
        if version == INFO_V3 {
            return put(
                info.cast::<nvmlGpuInstanceProfileInfo_v3_t>(),
                nvmlGpuInstanceProfileInfo_v3_t {
                    version,
                    id: p.id,
                    sliceCount: p.slices,
                    instanceCount: p.instances,
                    multiprocessorCount: p.sms,
                    copyEngineCount: p.copy_engines,
                    decoderCount: p.decoders,
                    encoderCount: p.encoders,
                    jpegCount: p.jpegs,
                    ofaCount: p.ofas,
                    memorySizeMB: p.memory_mb,
                    name: name96(p),
                    capabilities: 0,
                },
            );
        }
        put(
            info,
            nvmlGpuInstanceProfileInfo_v2_t {
                version,
                id: p.id,
                isP2pSupported: 0,
                sliceCount: p.slices,
                instanceCount: p.instances,
                multiprocessorCount: p.sms,
                copyEngineCount: p.copy_engines,
                decoderCount: p.decoders,
                encoderCount: p.encoders,
                jpegCount: p.jpegs,
                ofaCount: p.ofas,
                memorySizeMB: p.memory_mb,
                name: name96(p),
            },
        )
    }
);

export!(
    /// Every placement of the profile, MIG enabled or not (nvml.h); NULL `placements` only
    /// sets `*count`.
    fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        device: nvmlDevice_t,
        profile_id: c_uint,
        placements: *mut nvmlGpuInstancePlacement_t,
        count: *mut c_uint,
    ) {
        let g = mig_gpu(device)?;
        let p = by_id(&g, profile_id)?;
        let all: Vec<nvmlGpuInstancePlacement_t> = p
            .placement_starts
            .iter()
            .map(|&start| nvmlGpuInstancePlacement_t {
                start,
                size: p.placement_size,
            })
            .collect();
        get(count)?;
        put(count, all.len() as c_uint)?;
        if placements.is_null() {
            return Ok(());
        }
        put_slice(placements, &all)
    }
);
