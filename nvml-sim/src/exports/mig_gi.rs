//! MIG mode and GPU instances: `nvmlDeviceSetMigMode`, create (with and without placement),
//! destroy, enumerate and describe GPU instances, and their remaining capacity. The rules are
//! in `instances.rs`, the state and handles in `store.rs`.
//!
//! With MIG disabled, as the real H100 and H200 answer on driver 580: `…GetGpuInstances`
//! SUCCESS with 0, the remaining capacity of a profile is its instance count,
//! `…GetGpuInstanceById` NOT_FOUND, creating NOT_SUPPORTED (nvml.h).

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlGpuInstance_t,
};

use super::mig::{by_id, mig_gpu};
use crate::export;
use crate::ffi::{self, get, put, put_slice, NvResult};
use crate::instances::Op;
use crate::state::{gpu, handle_of, GpuRef};
use crate::store::{self, Found};

/// The GPU behind a GPU-instance handle, checked like a device call (lost, overrides).
pub(super) fn gi_gpu(h: nvmlGpuInstance_t) -> NvResult<(GpuRef, Found)> {
    let found = store::gi_of(h)?;
    let g = gpu(handle_of(found.gpu as usize))?;
    Ok((g, found))
}

export!(
    /// Mode 0 or 1. Applies at once on an idle GPU; with processes on it the change stays
    /// pending and `*activationStatus` is IN_USE, with `mig_reset_required` RESET_REQUIRED
    /// (the function itself succeeds, as mig-parted expects: it then reads the pending mode).
    fn nvmlDeviceSetMigMode(device: nvmlDevice_t, mode: c_uint, activation_status: *mut c_uint) {
        let g = mig_gpu(device)?;
        if mode > 1 || activation_status.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        store::fault(g.index, Op::SetMigMode, &g.mig_faults)?;
        let busy = !g.processes.is_empty();
        let status = store::change(g.index, |m, _| {
            m.set_mode(mode == 1, busy, g.mig_reset_required)
        })?;
        put(activation_status, status)
    }
);

export!(
    /// How many more instances of the profile fit, each where the driver would put it.
    fn nvmlDeviceGetGpuInstanceRemainingCapacity(
        device: nvmlDevice_t,
        profile_id: c_uint,
        count: *mut c_uint,
    ) {
        let g = mig_gpu(device)?;
        let p = by_id(&g, profile_id)?;
        let n = store::read(g.index, |m| Ok(m.remaining(g.model, p)))?;
        put(count, n)
    }
);

/// The shared body of both creates.
fn create(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: Option<(u32, u32)>,
    out: *mut nvmlGpuInstance_t,
) -> NvResult {
    let g = mig_gpu(device)?;
    if out.is_null() {
        return Err(ffi::INVALID_ARGUMENT);
    }
    let p = by_id(&g, profile_id)?;
    store::fault(g.index, Op::CreateGpuInstance, &g.mig_faults)?;
    let serial = store::change(g.index, |m, serial| {
        m.create_gi(g.model, p, placement, serial).map(|_| serial)
    })?;
    put(out, store::gi_handle(serial))
}

export!(
    /// The driver chooses the placement (see `instances.rs`); INSUFFICIENT_RESOURCES when the
    /// profile no longer fits.
    fn nvmlDeviceCreateGpuInstance(
        device: nvmlDevice_t,
        profile_id: c_uint,
        gpu_instance: *mut nvmlGpuInstance_t,
    ) {
        create(device, profile_id, None, gpu_instance)
    }
);

export!(
    /// INVALID_ARGUMENT for a placement the profile does not have, INSUFFICIENT_RESOURCES for
    /// one that overlaps, exceeds the compute slices or the profile's instance count.
    fn nvmlDeviceCreateGpuInstanceWithPlacement(
        device: nvmlDevice_t,
        profile_id: c_uint,
        placement: *const nvmlGpuInstancePlacement_t,
        gpu_instance: *mut nvmlGpuInstance_t,
    ) {
        let pl = get(placement)?;
        create(device, profile_id, Some((pl.start, pl.size)), gpu_instance)
    }
);

export!(
    /// IN_USE while compute instances or processes live in it; a stale handle is
    /// INVALID_ARGUMENT.
    fn nvmlGpuInstanceDestroy(gpu_instance: nvmlGpuInstance_t) {
        let (g, found) = gi_gpu(gpu_instance)?;
        store::fault(g.index, Op::DestroyGpuInstance, &g.mig_faults)?;
        store::change(g.index, |m, _| {
            let busy = store::busy(&g, m, found.gi, None);
            m.destroy_gi(found.gi, busy)
        })
    }
);

export!(
    /// The live GPU instances of a profile; `*count` in is the room of the array (NULL array
    /// or too little room: INSUFFICIENT_SIZE with the count). SUCCESS with 0 while MIG is
    /// disabled, as captured.
    fn nvmlDeviceGetGpuInstances(
        device: nvmlDevice_t,
        profile_id: c_uint,
        gpu_instances: *mut nvmlGpuInstance_t,
        count: *mut c_uint,
    ) {
        let g = mig_gpu(device)?;
        by_id(&g, profile_id)?;
        let room = get(count)? as usize;
        let handles: Vec<nvmlGpuInstance_t> = store::read(g.index, |m| {
            Ok(m.gpu_instances
                .iter()
                .filter(|gi| m.current && gi.profile_id == profile_id)
                .map(|gi| store::gi_handle(gi.serial))
                .collect())
        })?;
        put(count, handles.len() as c_uint)?;
        if handles.is_empty() {
            return Ok(());
        }
        if gpu_instances.is_null() || room < handles.len() {
            return Err(ffi::INSUFFICIENT_SIZE);
        }
        put_slice(gpu_instances, &handles)
    }
);

export!(
    /// NOT_FOUND when no GPU instance has that id (always, with MIG disabled).
    fn nvmlDeviceGetGpuInstanceById(
        device: nvmlDevice_t,
        id: c_uint,
        gpu_instance: *mut nvmlGpuInstance_t,
    ) {
        let g = mig_gpu(device)?;
        if gpu_instance.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let serial = store::read(g.index, |m| {
            m.gpu_instances
                .iter()
                .find(|gi| m.current && gi.id == id)
                .map(|gi| gi.serial)
                .ok_or(ffi::NOT_FOUND)
        })?;
        put(gpu_instance, store::gi_handle(serial))
    }
);

export!(
    /// Parent device, id, profile id and memory-slice placement.
    fn nvmlGpuInstanceGetInfo(gpu_instance: nvmlGpuInstance_t, info: *mut nvmlGpuInstanceInfo_t) {
        let (g, found) = gi_gpu(gpu_instance)?;
        let gi = store::read(g.index, |m| {
            m.gpu_instances
                .iter()
                .find(|gi| gi.id == found.gi)
                .cloned()
                .ok_or(ffi::INVALID_ARGUMENT)
        })?;
        put(
            info,
            nvmlGpuInstanceInfo_t {
                device: handle_of(g.index as usize),
                id: gi.id,
                profileId: gi.profile_id,
                placement: nvmlGpuInstancePlacement_t {
                    start: gi.start,
                    size: gi.size,
                },
            },
        )
    }
);
