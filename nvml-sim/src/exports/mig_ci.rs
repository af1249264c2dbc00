//! Compute instances inside GPU instances, and MIG device handles (one per compute instance).
//!
//! CI profiles: index = id, offered per GI size as `instances::ci_profiles` says; engine
//! profile must be 0 (`NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`). SMs are the GI's × c/g
//! (CHOSEN), engines are the GI's (shared). MIG device handles enumerate densely, GI id then CI
//! id; with MIG disabled `…GetMigDeviceHandleByIndex` answers NOT_FOUND and the MIG-handle calls
//! on a full GPU (`…GetGpuInstanceId`, `…GetComputeInstanceId`,
//! `…GetDeviceHandleFromMigDeviceHandle`) INVALID_ARGUMENT, as on the captured boards.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::{
    nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t, nvmlComputeInstanceProfileInfo_t,
    nvmlComputeInstanceProfileInfo_v2_t, nvmlComputeInstance_t, nvmlDevice_t, nvmlGpuInstance_t,
};

use super::mig::mig_gpu;
use super::mig_gi::gi_gpu;
use crate::export;
use crate::ffi::{self, get, put, put_slice, NvResult};
use crate::instances::{ci_profile, ci_starts, CiProfile, GpuInstance, Op};
use crate::models::GiProfile;
use crate::state::{gpu, handle_of, GpuRef};
use crate::store::{self, Found};

const CI_INFO_V2: c_uint =
    (std::mem::size_of::<nvmlComputeInstanceProfileInfo_v2_t>() as c_uint) | (2 << 24);

/// The GPU instance behind a handle, its profile and the CI profile `id` inside it
/// (NOT_SUPPORTED when the GI offers no such CI profile).
fn gi_and_profile(
    h: nvmlGpuInstance_t,
    id: c_uint,
) -> NvResult<(GpuRef, GpuInstance, &'static GiProfile, CiProfile)> {
    let (g, found) = gi_gpu(h)?;
    let gi = store::read(g.index, |m| {
        m.gpu_instances
            .iter()
            .find(|gi| gi.id == found.gi)
            .cloned()
            .ok_or(ffi::INVALID_ARGUMENT)
    })?;
    let p = g
        .model
        .mig_profile_by_id(gi.profile_id)
        .ok_or(ffi::UNKNOWN)?;
    let cp = ci_profile(p.slices, id).ok_or(ffi::NOT_SUPPORTED)?;
    Ok((g, gi, p, cp))
}

fn ci_info_v1(p: &GiProfile, cp: &CiProfile) -> nvmlComputeInstanceProfileInfo_t {
    nvmlComputeInstanceProfileInfo_t {
        id: cp.id,
        sliceCount: cp.slices,
        instanceCount: cp.instances,
        multiprocessorCount: p.sms * cp.slices / p.slices,
        sharedCopyEngineCount: p.copy_engines,
        sharedDecoderCount: p.decoders,
        sharedEncoderCount: p.encoders,
        sharedJpegCount: p.jpegs,
        sharedOfaCount: p.ofas,
    }
}

export!(
    /// By CI profile index; engine profile must be 0 (shared).
    fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gpu_instance: nvmlGpuInstance_t,
        profile: c_uint,
        eng_profile: c_uint,
        info: *mut nvmlComputeInstanceProfileInfo_t,
    ) {
        if eng_profile != 0 {
            return Err(ffi::NOT_SUPPORTED);
        }
        let (_, _, p, cp) = gi_and_profile(gpu_instance, profile)?;
        put(info, ci_info_v1(p, &cp))
    }
);

export!(
    /// `version` v2 (`0x02000088`; 0 read as v2); name `"MIG 1c.3g.40gb"`, or the GI's name
    /// for the full-size CI.
    fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        gpu_instance: nvmlGpuInstance_t,
        profile: c_uint,
        eng_profile: c_uint,
        info: *mut nvmlComputeInstanceProfileInfo_v2_t,
    ) {
        let version = get(info)?.version;
        if ![0, CI_INFO_V2].contains(&version) {
            return Err(ffi::ARGUMENT_VERSION_MISMATCH);
        }
        if eng_profile != 0 {
            return Err(ffi::NOT_SUPPORTED);
        }
        let (_, _, p, cp) = gi_and_profile(gpu_instance, profile)?;
        let v1 = ci_info_v1(p, &cp);
        let name = if cp.slices == p.slices {
            format!("MIG {}", p.name)
        } else {
            format!("MIG {}c.{}", cp.slices, p.name)
        };
        let mut name96 = [0; 96];
        for (o, b) in name96.iter_mut().zip(name.bytes().take(95)) {
            *o = b as std::ffi::c_char;
        }
        put(
            info,
            nvmlComputeInstanceProfileInfo_v2_t {
                version,
                id: v1.id,
                sliceCount: v1.sliceCount,
                instanceCount: v1.instanceCount,
                multiprocessorCount: v1.multiprocessorCount,
                sharedCopyEngineCount: v1.sharedCopyEngineCount,
                sharedDecoderCount: v1.sharedDecoderCount,
                sharedEncoderCount: v1.sharedEncoderCount,
                sharedJpegCount: v1.sharedJpegCount,
                sharedOfaCount: v1.sharedOfaCount,
                name: name96,
            },
        )
    }
);

export!(
    fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        gpu_instance: nvmlGpuInstance_t,
        profile_id: c_uint,
        count: *mut c_uint,
    ) {
        let (_, gi, p, cp) = gi_and_profile(gpu_instance, profile_id)?;
        let used = gi
            .compute_instances
            .iter()
            .fold(0u32, |m, c| m | (((1 << c.size) - 1) << c.start));
        let mut probe = used;
        let mut n = 0;
        for s in ci_starts(p.slices, cp.slices) {
            let mask = ((1 << cp.slices) - 1) << s;
            if probe & mask == 0 {
                probe |= mask;
                n += 1;
            }
        }
        let same = gi
            .compute_instances
            .iter()
            .filter(|c| c.profile_id == cp.id)
            .count() as u32;
        put(count, n.min(cp.instances.saturating_sub(same)))
    }
);

export!(
    /// Every placement of the CI profile inside the GI; NULL `placements` only sets `*count`.
    fn nvmlGpuInstanceGetComputeInstancePossiblePlacements(
        gpu_instance: nvmlGpuInstance_t,
        profile_id: c_uint,
        placements: *mut nvmlComputeInstancePlacement_t,
        count: *mut c_uint,
    ) {
        let (_, _, p, cp) = gi_and_profile(gpu_instance, profile_id)?;
        let all: Vec<nvmlComputeInstancePlacement_t> = ci_starts(p.slices, cp.slices)
            .into_iter()
            .map(|start| nvmlComputeInstancePlacement_t {
                start,
                size: cp.slices,
            })
            .collect();
        let room = get(count)? as usize;
        put(count, all.len() as c_uint)?;
        if placements.is_null() {
            return Ok(());
        }
        if room < all.len() {
            return Err(ffi::INSUFFICIENT_SIZE);
        }
        put_slice(placements, &all)
    }
);

fn create(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    placement: Option<(u32, u32)>,
    out: *mut nvmlComputeInstance_t,
) -> NvResult {
    if out.is_null() {
        return Err(ffi::INVALID_ARGUMENT);
    }
    let (g, found) = gi_gpu(gpu_instance)?;
    store::fault(g.index, Op::CreateComputeInstance, &g.mig_faults)?;
    let ci = store::change(g.index, |m, serial| {
        m.create_ci(g.model, found.gi, profile_id, placement, serial)
    })?;
    put(out, store::ci_handle(ci.serial))
}

export!(
    /// INSUFFICIENT_RESOURCES when the CI does not fit in the GI's free compute slices.
    fn nvmlGpuInstanceCreateComputeInstance(
        gpu_instance: nvmlGpuInstance_t,
        profile_id: c_uint,
        compute_instance: *mut nvmlComputeInstance_t,
    ) {
        create(gpu_instance, profile_id, None, compute_instance)
    }
);

export!(
    fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        gpu_instance: nvmlGpuInstance_t,
        profile_id: c_uint,
        placement: *const nvmlComputeInstancePlacement_t,
        compute_instance: *mut nvmlComputeInstance_t,
    ) {
        let pl = get(placement)?;
        create(
            gpu_instance,
            profile_id,
            Some((pl.start, pl.size)),
            compute_instance,
        )
    }
);

/// The GPU behind a compute-instance handle.
fn ci_gpu(h: nvmlComputeInstance_t) -> NvResult<(GpuRef, Found)> {
    let found = store::ci_of(h)?;
    let g = gpu(handle_of(found.gpu as usize))?;
    Ok((g, found))
}

export!(
    /// IN_USE while a process runs in it; a stale handle is INVALID_ARGUMENT.
    fn nvmlComputeInstanceDestroy(compute_instance: nvmlComputeInstance_t) {
        let (g, found) = ci_gpu(compute_instance)?;
        let ci = found.ci.ok_or(ffi::UNKNOWN)?;
        store::fault(g.index, Op::DestroyComputeInstance, &g.mig_faults)?;
        store::change(g.index, |m, _| {
            let busy = store::busy(&g, m, found.gi, Some(ci));
            m.destroy_ci(found.gi, ci, busy)
        })
    }
);

export!(
    /// The GI's compute instances of a CI profile, with the GPU-instance count convention.
    fn nvmlGpuInstanceGetComputeInstances(
        gpu_instance: nvmlGpuInstance_t,
        profile_id: c_uint,
        compute_instances: *mut nvmlComputeInstance_t,
        count: *mut c_uint,
    ) {
        let (_, gi, _, cp) = gi_and_profile(gpu_instance, profile_id)?;
        let room = get(count)? as usize;
        let handles: Vec<nvmlComputeInstance_t> = gi
            .compute_instances
            .iter()
            .filter(|c| c.profile_id == cp.id)
            .map(|c| store::ci_handle(c.serial))
            .collect();
        put(count, handles.len() as c_uint)?;
        if handles.is_empty() {
            return Ok(());
        }
        if compute_instances.is_null() || room < handles.len() {
            return Err(ffi::INSUFFICIENT_SIZE);
        }
        put_slice(compute_instances, &handles)
    }
);

export!(
    fn nvmlGpuInstanceGetComputeInstanceById(
        gpu_instance: nvmlGpuInstance_t,
        id: c_uint,
        compute_instance: *mut nvmlComputeInstance_t,
    ) {
        let (g, found) = gi_gpu(gpu_instance)?;
        if compute_instance.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let serial = store::read(g.index, |m| {
            m.gpu_instances
                .iter()
                .find(|gi| gi.id == found.gi)
                .and_then(|gi| gi.compute_instances.iter().find(|c| c.id == id))
                .map(|c| c.serial)
                .ok_or(ffi::NOT_FOUND)
        })?;
        put(compute_instance, store::ci_handle(serial))
    }
);

/// The GI and CI records behind a found compute instance.
fn records(found: Found) -> NvResult<(GpuInstance, crate::instances::ComputeInstance)> {
    store::read(found.gpu, |m| {
        let gi = m
            .gpu_instances
            .iter()
            .find(|gi| gi.id == found.gi)
            .ok_or(ffi::INVALID_ARGUMENT)?;
        let ci = gi
            .compute_instances
            .iter()
            .find(|c| Some(c.id) == found.ci)
            .ok_or(ffi::INVALID_ARGUMENT)?;
        Ok((gi.clone(), ci.clone()))
    })
}

export!(
    fn nvmlComputeInstanceGetInfo_v2(
        compute_instance: nvmlComputeInstance_t,
        info: *mut nvmlComputeInstanceInfo_t,
    ) {
        let (g, found) = ci_gpu(compute_instance)?;
        let (gi, ci) = records(found)?;
        put(
            info,
            nvmlComputeInstanceInfo_t {
                device: handle_of(g.index as usize),
                gpuInstance: store::gi_handle(gi.serial),
                id: ci.id,
                profileId: ci.profile_id,
                placement: nvmlComputeInstancePlacement_t {
                    start: ci.start,
                    size: ci.size,
                },
            },
        )
    }
);

export!(
    /// MIG devices in GI id then CI id order; NOT_FOUND past the last (and always with MIG
    /// disabled, as captured).
    fn nvmlDeviceGetMigDeviceHandleByIndex(
        device: nvmlDevice_t,
        index: c_uint,
        mig_device: *mut nvmlDevice_t,
    ) {
        let g = mig_gpu(device)?;
        if mig_device.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let serial = store::read(g.index, |m| {
            m.gpu_instances
                .iter()
                .filter(|_| m.current)
                .flat_map(|gi| gi.compute_instances.iter())
                .nth(index as usize)
                .map(|c| c.serial)
                .ok_or(ffi::NOT_FOUND)
        })?;
        put(mig_device, store::mig_handle(serial))
    }
);

/// The compute instance behind a MIG device handle; INVALID_ARGUMENT for a full GPU (after the
/// usual device checks) or a stale MIG handle.
fn mig_device(h: nvmlDevice_t) -> NvResult<Found> {
    match store::mig_of(h) {
        Some(found) => {
            let found = found?;
            gpu(handle_of(found.gpu as usize))?;
            Ok(found)
        }
        None => {
            mig_gpu(h)?;
            Err(ffi::INVALID_ARGUMENT)
        }
    }
}

export!(
    /// 1 for MIG device handles, 0 for full GPUs.
    fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, is_mig_device: *mut c_uint) {
        if let Some(found) = store::mig_of(device) {
            found?;
            return put(is_mig_device, 1);
        }
        gpu(device)?;
        put(is_mig_device, 0)
    }
);

export!(
    /// The GPU instance id of a MIG device; INVALID_ARGUMENT on a full GPU.
    fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        put(id, mig_device(device)?.gi)
    }
);

export!(
    /// The compute instance id of a MIG device; INVALID_ARGUMENT on a full GPU.
    fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        put(id, mig_device(device)?.ci.ok_or(ffi::UNKNOWN)?)
    }
);

export!(
    /// The parent GPU of a MIG device; INVALID_ARGUMENT on a full GPU.
    fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
        mig_device_handle: nvmlDevice_t,
        device: *mut nvmlDevice_t,
    ) {
        let found = mig_device(mig_device_handle)?;
        put(device, handle_of(found.gpu as usize))
    }
);

/// The `MIG-…` UUID behind a MIG device handle, for `nvmlDeviceGetUUID`.
pub(crate) fn mig_uuid(h: nvmlDevice_t) -> Option<NvResult<String>> {
    let found = store::mig_of(h)?;
    Some(found.and_then(|f| {
        gpu(handle_of(f.gpu as usize))?;
        Ok(records(f)?.1.uuid)
    }))
}

/// Memory of the GPU instance behind a MIG device handle, for `nvmlDeviceGetMemoryInfo*`:
/// (total, used) in bytes. CHOSEN: total is the GI profile's memory, used the sum of the
/// scenario processes running in that GPU instance, nothing reserved.
pub(crate) fn mig_memory(h: nvmlDevice_t) -> Option<NvResult<(u64, u64)>> {
    let found = store::mig_of(h)?;
    Some(found.and_then(|f| {
        let g = gpu(handle_of(f.gpu as usize))?;
        let (gi, _) = records(f)?;
        let p = g
            .model
            .mig_profile_by_id(gi.profile_id)
            .ok_or(ffi::UNKNOWN)?;
        let total = p.memory_mb * 1024 * 1024;
        let used: u64 = store::read(g.index, |m| {
            Ok(g.processes
                .iter()
                .filter(|pr| store::process_instance(&g, m, pr).is_some_and(|(pg, _)| pg == f.gi))
                .map(|pr| pr.used_memory_mib * 1024 * 1024)
                .sum())
        })?;
        Ok((total, used.min(total)))
    }))
}
