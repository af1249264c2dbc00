//! The GPU settings the sharing subsystem observes and changes: the compute mode
//! (`nvmlDeviceGetComputeMode` / `nvmlDeviceSetComputeMode`).
//!
//! Remediation's built-in actions write the power limit and the compute mode through the free
//! functions at the end, each with a session of its own (the poller's stays with the poller),
//! reading the value back so that the caller records what the driver now says.
//!
//! Plain data out, typed codes for errors. Setting the compute mode needs root, takes effect at
//! once and lasts until the driver unloads (Linux resets it to DEFAULT on reboot); on a GPU with
//! MIG enabled NVML wants MIG device handles instead (nvml.h, `nvmlDeviceSetComputeMode`).

use std::ffi::OsStr;

use nvml_wrapper::Nvml;
use serde::Serialize;

use super::{code, Session};
use crate::snapshot::NvmlCode;

pub use crate::snapshot::ComputeMode;

pub(super) fn from_wrapper(m: nvml_wrapper::enum_wrappers::device::ComputeMode) -> ComputeMode {
    use nvml_wrapper::enum_wrappers::device::ComputeMode as W;
    match m {
        W::Default => ComputeMode::Default,
        W::ExclusiveThread => ComputeMode::ExclusiveThread,
        W::Prohibited => ComputeMode::Prohibited,
        W::ExclusiveProcess => ComputeMode::ExclusiveProcess,
    }
}

fn to_wrapper(m: ComputeMode) -> nvml_wrapper::enum_wrappers::device::ComputeMode {
    use nvml_wrapper::enum_wrappers::device::ComputeMode as W;
    match m {
        ComputeMode::Default => W::Default,
        ComputeMode::ExclusiveThread => W::ExclusiveThread,
        ComputeMode::Prohibited => W::Prohibited,
        ComputeMode::ExclusiveProcess => W::ExclusiveProcess,
    }
}

/// One GPU as the sharing subsystem sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuControl {
    pub index: u32,
    /// Empty when NVML could not tell.
    pub uuid: String,
    /// `None` when NVML could not tell (or the model has no MIG).
    pub mig_enabled: Option<bool>,
    pub compute_mode: Result<ComputeMode, NvmlCode>,
}

impl Session {
    /// Every GPU's index, UUID, MIG mode and compute mode; a GPU whose handle fails is listed
    /// with the error as its compute mode.
    pub fn compute_modes(&self) -> Result<Vec<GpuControl>, NvmlCode> {
        let count = self.nvml.device_count().map_err(|e| code(&e))?;
        Ok((0..count).map(|index| self.control_of(index)).collect())
    }

    fn control_of(&self, index: u32) -> GpuControl {
        let device = match self.nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                return GpuControl {
                    index,
                    uuid: String::new(),
                    mig_enabled: None,
                    compute_mode: Err(code(&e)),
                }
            }
        };
        GpuControl {
            index,
            uuid: device.uuid().unwrap_or_default(),
            mig_enabled: device
                .mig_mode()
                .ok()
                .map(|m| m.current == nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE),
            compute_mode: device
                .compute_mode()
                .map(from_wrapper)
                .map_err(|e| code(&e)),
        }
    }

    /// Sets the compute mode of GPU `index` (`nvmlDeviceSetComputeMode`).
    pub fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), NvmlCode> {
        let mut device = self.nvml.device_by_index(index).map_err(|e| code(&e))?;
        device
            .set_compute_mode(to_wrapper(mode))
            .map_err(|e| code(&e))
    }
}
fn open(lib: &str) -> Result<Nvml, String> {
    Nvml::builder()
        .lib_path(OsStr::new(lib))
        .init()
        .map_err(|e| format!("NVML init ({lib}): {e}"))
}

/// Sets the power management limit of the GPU `uuid` to `watts`, or back to its default when
/// `None`; returns the limit in force afterwards, in watts.
pub fn set_power_limit(lib: &str, uuid: &str, watts: Option<u32>) -> Result<f64, String> {
    let nvml = open(lib)?;
    let mut device = nvml
        .device_by_uuid(uuid)
        .map_err(|e| format!("GPU {uuid}: {e}"))?;
    let mw = match watts {
        Some(w) => w.saturating_mul(1000),
        None => device
            .power_management_limit_default()
            .map_err(|e| format!("nvmlDeviceGetPowerManagementDefaultLimit: {e}"))?,
    };
    device
        .set_power_management_limit(mw)
        .map_err(|e| format!("nvmlDeviceSetPowerManagementLimit({mw} mW): {e}"))?;
    let now = device
        .power_management_limit()
        .map_err(|e| format!("nvmlDeviceGetPowerManagementLimit: {e}"))?;
    Ok(f64::from(now) / 1000.0)
}

/// Sets the compute mode of the GPU `uuid`: `PROHIBITED` when `prohibit` (no new CUDA contexts;
/// running ones keep running), else `DEFAULT`; returns the mode in force afterwards.
pub fn set_compute_mode(lib: &str, uuid: &str, prohibit: bool) -> Result<String, String> {
    let nvml = open(lib)?;
    let mut device = nvml
        .device_by_uuid(uuid)
        .map_err(|e| format!("GPU {uuid}: {e}"))?;
    use nvml_wrapper::enum_wrappers::device::ComputeMode as W;
    let mode = if prohibit { W::Prohibited } else { W::Default };
    device
        .set_compute_mode(mode)
        .map_err(|e| format!("nvmlDeviceSetComputeMode({mode:?}): {e}"))?;
    let now = device
        .compute_mode()
        .map_err(|e| format!("nvmlDeviceGetComputeMode: {e}"))?;
    Ok(format!("{now:?}"))
}
