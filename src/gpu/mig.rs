//! MIG through NVML: read a GPU's layout (mode, GPU instances with profile, placement and ids,
//! compute instances with their MIG UUIDs, processes) and change it (mode, create with an
//! explicit placement, destroy).
//!
//! nvml-wrapper 0.13 wraps none of the instance calls (and its `possible_placements` always
//! returns an empty list), so they are made on the raw symbols of the already-loaded library
//! (`Nvml::lib`). Instance handles never leave this file: callers name instances by GPU index
//! and driver-assigned ids, and every call looks the handle up again, so a handle is never used
//! after the instance it names was destroyed.
//!
//! Names follow mig-parted (`1g.10gb`, `1g.10gb+me`, `1c.3g.40gb`): the driver's own profile
//! name (`…ProfileInfoV`, "MIG 1g.10gb") when it gives one, else go-nvlib's formula.

use std::sync::Arc;

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t, nvmlComputeInstanceProfileInfo_t,
    nvmlComputeInstance_t, nvmlDevice_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_v2_t, nvmlGpuInstance_t,
};

use super::code;
use crate::snapshot::mig::{
    profile_name, ComputeInstance, GiProfile, GpuInstance, GpuProcess, MigGpu, MigMode,
};
use crate::snapshot::NvmlCode;

/// A failed MIG call: which NVML function, and its code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {code}")]
pub struct MigCallError {
    pub call: &'static str,
    pub code: NvmlCode,
}

type R<T> = Result<T, MigCallError>;

fn fail(call: &'static str) -> impl Fn(NvmlError) -> MigCallError {
    move |e| MigCallError {
        call,
        code: code(&e),
    }
}

/// GI profile indices 0..0x12 (nvml.h API 13); CI profile indices 0..9.
const GI_PROFILE_INDICES: u32 = 0x12;
const CI_PROFILE_INDICES: u32 = 9;
const GI_INFO_V2: u32 = (std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32) | (2 << 24);
/// `nvmlProcessInfo_t` id meaning "not in an instance".
const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// MIG control over one NVML session.
#[derive(Clone)]
pub struct MigControl {
    nvml: Arc<Nvml>,
}

/// The poller's read of the layout (slow tier): only while MIG is enabled; the profile table
/// is read once per board and kept.
pub(super) fn poll_layout(
    nvml: &Arc<Nvml>,
    profiles: &mut Option<Vec<GiProfile>>,
    dev: &Device,
    enabled: bool,
    errors: &mut Vec<(&'static str, NvmlCode)>,
) -> Option<Vec<GpuInstance>> {
    if !enabled {
        return None;
    }
    let ctl = MigControl::new(nvml.clone());
    if profiles.is_none() {
        match ctl.device_profiles(dev) {
            Ok(p) => *profiles = Some(p),
            Err(e) => {
                errors.push((e.call, e.code));
                return None;
            }
        }
    }
    let table = profiles.as_deref().unwrap_or_default();
    match ctl.layout(dev, table) {
        Ok(l) => Some(l),
        Err(e) => {
            errors.push((e.call, e.code));
            None
        }
    }
}

/// One MIG device as `mig_uuids` reads it.
struct MigDevice {
    gi: u32,
    ci: u32,
    /// The index `nvmlDeviceGetMigDeviceHandleByIndex` took.
    index: u32,
    uuid: String,
    /// (used, free) bytes.
    memory: Option<(u64, u64)>,
}

/// The handles of one live GPU instance, for this call only.
struct GiHandle {
    raw: nvmlGpuInstance_t,
}

impl MigControl {
    pub(super) fn new(nvml: Arc<Nvml>) -> Self {
        MigControl { nvml }
    }

    pub fn device_count(&self) -> R<u32> {
        self.nvml
            .device_count()
            .map_err(fail("nvmlDeviceGetCount_v2"))
    }

    fn device(&self, index: u32) -> R<Device<'_>> {
        self.nvml
            .device_by_index(index)
            .map_err(fail("nvmlDeviceGetHandleByIndex_v2"))
    }

    /// Reads GPU `index`: identity, MIG mode, profiles, instances and processes.
    pub fn read(&self, index: u32) -> R<MigGpu> {
        let dev = self.device(index)?;
        let uuid = dev.uuid().map_err(fail("nvmlDeviceGetUUID"))?;
        let name = dev.name().map_err(fail("nvmlDeviceGetName"))?;
        let pci = dev.pci_info().map_err(fail("nvmlDeviceGetPciInfo_v3"))?;
        let mig = match dev.mig_mode() {
            Ok(m) => Some(MigMode {
                current: m.current == 1,
                pending: m.pending == 1,
            }),
            Err(NvmlError::NotSupported) => None,
            Err(e) => return Err(fail("nvmlDeviceGetMigMode")(e)),
        };
        let mut gpu = MigGpu {
            index,
            uuid,
            name,
            pci_device_id: pci.pci_device_id,
            pci_bus_id: pci.bus_id,
            pci_subsystem_id: pci.pci_sub_system_id.unwrap_or(0),
            mig,
            profiles: Vec::new(),
            instances: Vec::new(),
            processes: processes(&dev)?,
        };
        if mig.is_none() {
            return Ok(gpu);
        }
        let total_mib = dev
            .memory_info()
            .map_err(fail("nvmlDeviceGetMemoryInfo_v2"))?
            .total
            / (1024 * 1024);
        gpu.profiles = self.profiles(&dev, total_mib)?;
        if mig.is_some_and(|m| m.current) {
            gpu.instances = self.layout(&dev, &gpu.profiles)?;
        }
        Ok(gpu)
    }

    /// The GPU instances of a MIG-enabled device, with their compute instances and MIG UUIDs.
    pub(super) fn layout(&self, dev: &Device, profiles: &[GiProfile]) -> R<Vec<GpuInstance>> {
        let mut instances = self.instances(dev, profiles)?;
        let devices = self.mig_uuids(dev)?;
        for gi in &mut instances {
            for ci in &mut gi.compute_instances {
                let found = devices
                    .iter()
                    .find(|d| d.gi == gi.gpu_instance_id && d.ci == ci.compute_instance_id);
                ci.uuid = found.map(|d| d.uuid.clone());
                ci.mig_index = found.map(|d| d.index);
                // Every MIG device of a GPU instance reports the instance's memory.
                if let Some((used, free)) = found.and_then(|d| d.memory) {
                    gi.memory_used_bytes = Some(used);
                    gi.memory_free_bytes = Some(free);
                }
            }
        }
        Ok(instances)
    }

    /// The GPU-instance profiles of a device (for [`MigControl::layout`]).
    pub(super) fn device_profiles(&self, dev: &Device) -> R<Vec<GiProfile>> {
        let total_mib = dev
            .memory_info()
            .map_err(fail("nvmlDeviceGetMemoryInfo_v2"))?
            .total
            / (1024 * 1024);
        self.profiles(dev, total_mib)
    }

    fn profiles(&self, dev: &Device, total_mib: u64) -> R<Vec<GiProfile>> {
        let lib = self.nvml.lib();
        let info_v = nvml_sym(lib.nvmlDeviceGetGpuInstanceProfileInfoV.as_ref())
            .map_err(fail("nvmlDeviceGetGpuInstanceProfileInfoV"))?;
        let placements = nvml_sym(lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref())
            .map_err(fail("nvmlDeviceGetGpuInstancePossiblePlacements_v2"))?;
        let mut out = Vec::new();
        for index in 0..GI_PROFILE_INDICES {
            // SAFETY: zeroed is a valid bit pattern for this plain C struct (integers and a
            // char array); `version` is set before the call reads it.
            let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
            info.version = GI_INFO_V2;
            // SAFETY: `dev` is a live handle of this library (it borrows `self.nvml`), `info`
            // is a valid, writable v2 struct whose version says so.
            let ret = unsafe { info_v(dev.handle(), index, &mut info) };
            match nvml_try(ret) {
                Ok(()) => {}
                Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
                Err(e) => return Err(fail("nvmlDeviceGetGpuInstanceProfileInfoV")(e)),
            }
            let mut count = 0u32;
            // SAFETY: NULL placements asks for the count only (nvml.h); `count` is writable.
            let ret =
                unsafe { placements(dev.handle(), info.id, std::ptr::null_mut(), &mut count) };
            nvml_try(ret).map_err(fail("nvmlDeviceGetGpuInstancePossiblePlacements_v2"))?;
            let mut list = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
            // SAFETY: `list` has room for `count` placements, as `count` says.
            let ret = unsafe { placements(dev.handle(), info.id, list.as_mut_ptr(), &mut count) };
            nvml_try(ret).map_err(fail("nvmlDeviceGetGpuInstancePossiblePlacements_v2"))?;
            list.truncate(count as usize);
            let driver_name = c_name(&info.name);
            let name = driver_name
                .strip_prefix("MIG ")
                .map(str::to_owned)
                .filter(|n| !n.is_empty())
                .or_else(|| profile_name(index, info.memorySizeMB, total_mib))
                .unwrap_or_else(|| format!("profile-{}", info.id));
            out.push(GiProfile {
                index,
                id: info.id,
                name,
                slices: info.sliceCount,
                instances: info.instanceCount,
                memory_mib: info.memorySizeMB,
                placements: list.iter().map(|p| (p.start, p.size)).collect(),
            });
        }
        Ok(out)
    }

    /// Every GPU instance of every profile, in GI id order, with their compute instances.
    fn instances(&self, dev: &Device, profiles: &[GiProfile]) -> R<Vec<GpuInstance>> {
        let lib = self.nvml.lib();
        let list = nvml_sym(lib.nvmlDeviceGetGpuInstances.as_ref())
            .map_err(fail("nvmlDeviceGetGpuInstances"))?;
        let info_of = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())
            .map_err(fail("nvmlGpuInstanceGetInfo"))?;
        let mut out = Vec::new();
        for p in profiles {
            let mut handles: Vec<nvmlGpuInstance_t> =
                vec![std::ptr::null_mut(); p.instances.max(1) as usize];
            let mut count = handles.len() as u32;
            // SAFETY: `handles` has room for `count` handles (the profile's instance count,
            // as nvml.h asks); `dev` is live.
            let ret = unsafe { list(dev.handle(), p.id, handles.as_mut_ptr(), &mut count) };
            nvml_try(ret).map_err(fail("nvmlDeviceGetGpuInstances"))?;
            handles.truncate(count as usize);
            for h in handles {
                let mut info = empty_gi_info();
                // SAFETY: `h` was just returned by the driver for a live GPU instance; `info`
                // is writable.
                let ret = unsafe { info_of(h, &mut info) };
                nvml_try(ret).map_err(fail("nvmlGpuInstanceGetInfo"))?;
                out.push(GpuInstance {
                    profile: p.name.clone(),
                    profile_id: p.id,
                    gpu_instance_id: info.id,
                    start: info.placement.start,
                    size: info.placement.size,
                    memory_mib: p.memory_mib,
                    memory_used_bytes: None,
                    memory_free_bytes: None,
                    compute_instances: self.compute_instances(GiHandle { raw: h }, p)?,
                });
            }
        }
        out.sort_by_key(|gi| gi.gpu_instance_id);
        Ok(out)
    }

    fn compute_instances(&self, gi: GiHandle, p: &GiProfile) -> R<Vec<ComputeInstance>> {
        let lib = self.nvml.lib();
        let prof = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())
            .map_err(fail("nvmlGpuInstanceGetComputeInstanceProfileInfo"))?;
        let list = nvml_sym(lib.nvmlGpuInstanceGetComputeInstances.as_ref())
            .map_err(fail("nvmlGpuInstanceGetComputeInstances"))?;
        let info_of = nvml_sym(lib.nvmlComputeInstanceGetInfo_v2.as_ref())
            .map_err(fail("nvmlComputeInstanceGetInfo_v2"))?;
        let mut out = Vec::new();
        for index in 0..CI_PROFILE_INDICES {
            // SAFETY: zeroed is valid for this all-integer C struct.
            let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `gi.raw` is a live GPU instance handle listed in this same read;
            // `info` is writable. Engine profile 0 = shared.
            let ret = unsafe { prof(gi.raw, index, 0, &mut info) };
            match nvml_try(ret) {
                Ok(()) => {}
                Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
                Err(e) => return Err(fail("nvmlGpuInstanceGetComputeInstanceProfileInfo")(e)),
            }
            let mut handles: Vec<nvmlComputeInstance_t> =
                vec![std::ptr::null_mut(); info.instanceCount.max(1) as usize];
            let mut count = handles.len() as u32;
            // SAFETY: room for `count` handles, the profile's instance count.
            let ret = unsafe { list(gi.raw, info.id, handles.as_mut_ptr(), &mut count) };
            nvml_try(ret).map_err(fail("nvmlGpuInstanceGetComputeInstances"))?;
            handles.truncate(count as usize);
            for h in handles {
                let mut ci = empty_ci_info();
                // SAFETY: `h` was just listed by the driver; `ci` is writable.
                let ret = unsafe { info_of(h, &mut ci) };
                nvml_try(ret).map_err(fail("nvmlComputeInstanceGetInfo_v2"))?;
                let profile = if info.sliceCount == p.slices {
                    p.name.clone()
                } else {
                    format!("{}c.{}", info.sliceCount, p.name)
                };
                out.push(ComputeInstance {
                    profile,
                    profile_id: ci.profileId,
                    compute_instance_id: ci.id,
                    start: ci.placement.start,
                    size: ci.placement.size,
                    uuid: None,
                    mig_index: None,
                });
            }
        }
        out.sort_by_key(|c| c.compute_instance_id);
        Ok(out)
    }

    /// Every MIG device: ids, `MIG-…` UUID and memory.
    fn mig_uuids(&self, dev: &Device) -> R<Vec<MigDevice>> {
        let lib = self.nvml.lib();
        let gi_id = nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())
            .map_err(fail("nvmlDeviceGetGpuInstanceId"))?;
        let ci_id = nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())
            .map_err(fail("nvmlDeviceGetComputeInstanceId"))?;
        let max = dev
            .mig_device_count()
            .map_err(fail("nvmlDeviceGetMaxMigDeviceCount"))?;
        let mut out = Vec::new();
        for i in 0..max {
            let m = match dev.mig_device_by_index(i) {
                Ok(m) => m,
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(e) => return Err(fail("nvmlDeviceGetMigDeviceHandleByIndex")(e)),
            };
            let (mut g, mut c) = (0u32, 0u32);
            // SAFETY: `m` is a MIG device handle the driver just returned; outputs writable.
            let ret = unsafe { gi_id(m.handle(), &mut g) };
            nvml_try(ret).map_err(fail("nvmlDeviceGetGpuInstanceId"))?;
            // SAFETY: as above.
            let ret = unsafe { ci_id(m.handle(), &mut c) };
            nvml_try(ret).map_err(fail("nvmlDeviceGetComputeInstanceId"))?;
            // Memory is optional: a driver that cannot say leaves it absent.
            let memory = m.memory_info().ok().map(|i| (i.used, i.free));
            out.push(MigDevice {
                gi: g,
                ci: c,
                index: i,
                uuid: m.uuid().map_err(fail("nvmlDeviceGetUUID"))?,
                memory,
            });
        }
        Ok(out)
    }

    /// Sets the MIG mode; returns the activation status (`Ok(None)`: in effect now;
    /// `Some(code)`: pending, e.g. `InUse` or `ResetRequired`).
    pub fn set_mode(&self, index: u32, enable: bool) -> R<Option<NvmlCode>> {
        let dev = self.device(index)?;
        let sym = nvml_sym(self.nvml.lib().nvmlDeviceSetMigMode.as_ref())
            .map_err(fail("nvmlDeviceSetMigMode"))?;
        let mut status = 0u32;
        // SAFETY: `dev` is live; `status` is a writable nvmlReturn_t.
        let ret = unsafe { sym(dev.handle(), u32::from(enable), &mut status) };
        nvml_try(ret).map_err(fail("nvmlDeviceSetMigMode"))?;
        Ok(match nvml_try(status) {
            Ok(()) => None,
            Err(e) => Some(code(&e)),
        })
    }

    /// Creates a GPU instance of profile `profile_id` at `(start, size)`; returns its id.
    pub fn create_gpu_instance(
        &self,
        index: u32,
        profile_id: u32,
        start: u32,
        size: u32,
    ) -> R<u32> {
        const CALL: &str = "nvmlDeviceCreateGpuInstanceWithPlacement";
        let dev = self.device(index)?;
        let lib = self.nvml.lib();
        let create =
            nvml_sym(lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref()).map_err(fail(CALL))?;
        let info_of = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())
            .map_err(fail("nvmlGpuInstanceGetInfo"))?;
        let placement = nvmlGpuInstancePlacement_t { start, size };
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: `dev` is live; `placement` is read, `gi` written.
        let ret = unsafe { create(dev.handle(), profile_id, &placement, &mut gi) };
        nvml_try(ret).map_err(fail(CALL))?;
        let mut info = empty_gi_info();
        // SAFETY: `gi` was just created by the driver; `info` is writable.
        let ret = unsafe { info_of(gi, &mut info) };
        nvml_try(ret).map_err(fail("nvmlGpuInstanceGetInfo"))?;
        Ok(info.id)
    }

    fn gpu_instance(&self, dev: &Device, id: u32) -> R<GiHandle> {
        let sym = nvml_sym(self.nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref())
            .map_err(fail("nvmlDeviceGetGpuInstanceById"))?;
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: `dev` is live; `gi` is writable.
        let ret = unsafe { sym(dev.handle(), id, &mut gi) };
        nvml_try(ret).map_err(fail("nvmlDeviceGetGpuInstanceById"))?;
        Ok(GiHandle { raw: gi })
    }

    /// Destroys GPU instance `gi_id` (its compute instances must be gone).
    pub fn destroy_gpu_instance(&self, index: u32, gi_id: u32) -> R<()> {
        let dev = self.device(index)?;
        let gi = self.gpu_instance(&dev, gi_id)?;
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceDestroy.as_ref())
            .map_err(fail("nvmlGpuInstanceDestroy"))?;
        // SAFETY: `gi.raw` was looked up by id just now and is destroyed once, here.
        let ret = unsafe { sym(gi.raw) };
        nvml_try(ret).map_err(fail("nvmlGpuInstanceDestroy"))
    }

    /// Creates a compute instance of CI profile `profile_id` at `start` in GI `gi_id`; returns
    /// its id.
    pub fn create_compute_instance(
        &self,
        index: u32,
        gi_id: u32,
        profile_id: u32,
        start: u32,
        size: u32,
    ) -> R<u32> {
        const CALL: &str = "nvmlGpuInstanceCreateComputeInstanceWithPlacement";
        let dev = self.device(index)?;
        let gi = self.gpu_instance(&dev, gi_id)?;
        let lib = self.nvml.lib();
        let create = nvml_sym(
            lib.nvmlGpuInstanceCreateComputeInstanceWithPlacement
                .as_ref(),
        )
        .map_err(fail(CALL))?;
        let info_of = nvml_sym(lib.nvmlComputeInstanceGetInfo_v2.as_ref())
            .map_err(fail("nvmlComputeInstanceGetInfo_v2"))?;
        let placement = nvmlComputeInstancePlacement_t { start, size };
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi.raw` was looked up just now; `placement` is read, `ci` written.
        let ret = unsafe { create(gi.raw, profile_id, &placement, &mut ci) };
        nvml_try(ret).map_err(fail(CALL))?;
        let mut info = empty_ci_info();
        // SAFETY: `ci` was just created; `info` is writable.
        let ret = unsafe { info_of(ci, &mut info) };
        nvml_try(ret).map_err(fail("nvmlComputeInstanceGetInfo_v2"))?;
        Ok(info.id)
    }

    /// Destroys compute instance `ci_id` of GI `gi_id`.
    pub fn destroy_compute_instance(&self, index: u32, gi_id: u32, ci_id: u32) -> R<()> {
        let dev = self.device(index)?;
        let gi = self.gpu_instance(&dev, gi_id)?;
        let lib = self.nvml.lib();
        let by_id = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceById.as_ref())
            .map_err(fail("nvmlGpuInstanceGetComputeInstanceById"))?;
        let destroy = nvml_sym(lib.nvmlComputeInstanceDestroy.as_ref())
            .map_err(fail("nvmlComputeInstanceDestroy"))?;
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi.raw` was looked up just now; `ci` is writable.
        let ret = unsafe { by_id(gi.raw, ci_id, &mut ci) };
        nvml_try(ret).map_err(fail("nvmlGpuInstanceGetComputeInstanceById"))?;
        // SAFETY: `ci` was looked up just now and is destroyed once, here.
        let ret = unsafe { destroy(ci) };
        nvml_try(ret).map_err(fail("nvmlComputeInstanceDestroy"))
    }

    /// The CI profiles a GPU instance offers: (CI profile id, compute slices).
    pub fn compute_profiles(&self, index: u32, gi_id: u32) -> R<Vec<(u32, u32)>> {
        let dev = self.device(index)?;
        let gi = self.gpu_instance(&dev, gi_id)?;
        let prof = nvml_sym(
            self.nvml
                .lib()
                .nvmlGpuInstanceGetComputeInstanceProfileInfo
                .as_ref(),
        )
        .map_err(fail("nvmlGpuInstanceGetComputeInstanceProfileInfo"))?;
        let mut out = Vec::new();
        for index in 0..CI_PROFILE_INDICES {
            // SAFETY: zeroed is valid for this all-integer C struct.
            let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `gi.raw` was looked up just now; `info` is writable.
            let ret = unsafe { prof(gi.raw, index, 0, &mut info) };
            match nvml_try(ret) {
                Ok(()) => out.push((info.id, info.sliceCount)),
                Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
                Err(e) => return Err(fail("nvmlGpuInstanceGetComputeInstanceProfileInfo")(e)),
            }
        }
        Ok(out)
    }
}

fn processes(dev: &Device) -> R<Vec<GpuProcess>> {
    let mut out = Vec::new();
    let lists = [
        (
            "nvmlDeviceGetComputeRunningProcesses_v3",
            dev.running_compute_processes(),
        ),
        (
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
            dev.running_graphics_processes(),
        ),
    ];
    for (call, list) in lists {
        let list = match list {
            Ok(l) => l,
            Err(NvmlError::NotSupported) => continue,
            Err(e) => return Err(fail(call)(e)),
        };
        for p in list {
            out.push(GpuProcess {
                pid: p.pid,
                gpu_instance_id: p.gpu_instance_id.filter(|&i| i != NO_INSTANCE),
                compute_instance_id: p.compute_instance_id.filter(|&i| i != NO_INSTANCE),
            });
        }
    }
    out.sort_by_key(|p| p.pid);
    out.dedup();
    Ok(out)
}

fn empty_gi_info() -> nvmlGpuInstanceInfo_t {
    nvmlGpuInstanceInfo_t {
        device: std::ptr::null_mut::<nvml_wrapper_sys::bindings::nvmlDevice_st>() as nvmlDevice_t,
        id: 0,
        profileId: 0,
        placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    }
}

fn empty_ci_info() -> nvmlComputeInstanceInfo_t {
    nvmlComputeInstanceInfo_t {
        device: std::ptr::null_mut(),
        gpuInstance: std::ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlComputeInstancePlacement_t { start: 0, size: 0 },
    }
}

/// A NUL-terminated C char array as a string.
fn c_name(raw: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
