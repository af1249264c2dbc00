//! Device handles and identity: lookups by index, UUID, PCI bus id and serial; name, UUID,
//! serial, PCI info, index, minor number, architecture, compute capability, brand, compute
//! mode and MIG mode. Lookups of a lost GPU answer GPU_IS_LOST (nvml.h lists it for the
//! handle calls; it is what makes nvidia-smi print "Unable to determine the device handle for
//! GPU ...: GPU is lost"), while the GPU still counts in `nvmlDeviceGetCount_v2`.

use std::ffi::{c_char, c_int, c_uint};

use nvml_wrapper_sys::bindings::{
    nvmlBrandType_t, nvmlComputeMode_t, nvmlDeviceArchitecture_t, nvmlDevice_t, nvmlPciInfo_t,
};

use crate::export;
use crate::ffi::{self, get_str, put, put_str};
use crate::resolve::PciAddr;
use crate::state::{self, gpu};

fn fixed<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

export!(
    /// INVALID_ARGUMENT past the count; GPU_IS_LOST for a lost GPU.
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) {
        let count = state::scenario()?.gpus.len();
        if index as usize >= count {
            return Err(ffi::INVALID_ARGUMENT);
        }
        put(device, state::find(|g| g.index == index)?)
    }
);

export!(
    fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) {
        let count = state::scenario()?.gpus.len();
        if index as usize >= count {
            return Err(ffi::INVALID_ARGUMENT);
        }
        put(device, state::find(|g| g.index == index)?)
    }
);

export!(
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) {
        let wanted = get_str(uuid)?;
        put(
            device,
            state::find(|g| g.uuid.eq_ignore_ascii_case(&wanted))?,
        )
    }
);

export!(
    /// Accepts every form nvml.h lists, in any case, with or without the domain.
    fn nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id: *const c_char, device: *mut nvmlDevice_t) {
        let wanted = PciAddr::parse(&get_str(pci_bus_id)?).ok_or(ffi::INVALID_ARGUMENT)?;
        put(device, state::find(|g| g.pci == wanted)?)
    }
);

export!(
    fn nvmlDeviceGetHandleByPciBusId(pci_bus_id: *const c_char, device: *mut nvmlDevice_t) {
        let wanted = PciAddr::parse(&get_str(pci_bus_id)?).ok_or(ffi::INVALID_ARGUMENT)?;
        put(device, state::find(|g| g.pci == wanted)?)
    }
);

export!(
    fn nvmlDeviceGetHandleBySerial(serial: *const c_char, device: *mut nvmlDevice_t) {
        let wanted = get_str(serial)?;
        put(device, state::find(|g| g.serial == wanted)?)
    }
);

export!(
    fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) {
        put_str(name, length, gpu(device)?.model.name)
    }
);

export!(
    fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) {
        if let Some(mig) = super::mig_ci::mig_uuid(device) {
            return put_str(uuid, length, &mig?);
        }
        put_str(uuid, length, &gpu(device)?.uuid)
    }
);

export!(
    fn nvmlDeviceGetSerial(device: nvmlDevice_t, serial: *mut c_char, length: c_uint) {
        put_str(serial, length, &gpu(device)?.serial)
    }
);

export!(
    fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let g = gpu(device)?;
        put(
            pci,
            nvmlPciInfo_t {
                busIdLegacy: fixed(&g.pci.bus_id_legacy()),
                domain: g.pci.domain,
                bus: g.pci.bus,
                device: g.pci.device,
                pciDeviceId: g.model.pci_device_id,
                pciSubSystemId: g.model.pci_subsystem_id,
                busId: fixed(&g.pci.bus_id()),
            },
        )
    }
);

export!(
    fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) {
        put(index, gpu(device)?.index)
    }
);

export!(
    /// The minor number (`/dev/nvidiaN`) equals the index here.
    fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor_number: *mut c_uint) {
        put(minor_number, gpu(device)?.index)
    }
);

export!(
    fn nvmlDeviceGetArchitecture(device: nvmlDevice_t, arch: *mut nvmlDeviceArchitecture_t) {
        put(arch, gpu(device)?.model.architecture)
    }
);

export!(
    fn nvmlDeviceGetCudaComputeCapability(
        device: nvmlDevice_t,
        major: *mut c_int,
        minor: *mut c_int,
    ) {
        let (ma, mi) = gpu(device)?.model.cuda_cc;
        put(major, ma)?;
        put(minor, mi)
    }
);

export!(
    fn nvmlDeviceGetBrand(device: nvmlDevice_t, brand: *mut nvmlBrandType_t) {
        put(brand, gpu(device)?.model.brand)
    }
);

export!(
    /// The scenario's `compute_mode` (DEFAULT when absent) until `nvmlDeviceSetComputeMode`
    /// changes it.
    fn nvmlDeviceGetComputeMode(device: nvmlDevice_t, mode: *mut nvmlComputeMode_t) {
        let g = gpu(device)?;
        put(mode, crate::modes::compute_mode(&g.uuid, g.compute_mode))
    }
);

export!(
    /// nvml.h: "Requires root/admin permissions"; EXCLUSIVE_THREAD (1) was removed (CUDA 8)
    /// and answers NOT_SUPPORTED; with MIG enabled a full-GPU handle cannot take a compute
    /// mode (`nvml-sim/README.md`, "MIG instances"), NOT_SUPPORTED. Fault injection through
    /// the scenario's `errors = { nvmlDeviceSetComputeMode = "NO_PERMISSION" }`.
    fn nvmlDeviceSetComputeMode(device: nvmlDevice_t, mode: nvmlComputeMode_t) {
        let g = gpu(device)?;
        match mode {
            0 | 2 | 3 if !g.mig_mode => {
                crate::modes::set_compute_mode(&g.uuid, mode);
                Ok(())
            }
            0..=3 => Err(ffi::NOT_SUPPORTED),
            _ => Err(ffi::INVALID_ARGUMENT),
        }
    }
);

export!(
    /// Current and pending mode (`store.rs`); NOT_SUPPORTED on models without MIG.
    fn nvmlDeviceGetMigMode(
        device: nvmlDevice_t,
        current_mode: *mut c_uint,
        pending_mode: *mut c_uint,
    ) {
        let g = gpu(device)?;
        if !g.model.mig_capable() {
            return Err(ffi::NOT_SUPPORTED);
        }
        let (current, pending) = crate::store::read(g.index, |m| Ok((m.current, m.pending)))?;
        put(current_mode, c_uint::from(current))?;
        put(pending_mode, c_uint::from(pending))
    }
);

export!(
    /// 7 with MIG enabled, 0 with MIG disabled; NOT_SUPPORTED on models without MIG (CHOSEN).
    fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) {
        let g = gpu(device)?;
        if !g.model.mig_capable() {
            return Err(ffi::NOT_SUPPORTED);
        }
        put(count, if crate::store::enabled(&g) { 7 } else { 0 })
    }
);
