//! Writes to a GPU: the power limit and the compute mode, for remediation's built-in actions.
//!
//! Each call opens its own NVML session (the poller's stays with the poller: one owner per
//! session), finds the device by UUID, writes, and reads the value back so that the caller
//! records what the driver now says, not what was asked. Both writes need root on a real
//! driver (`NO_PERMISSION` otherwise). Blocking.

use std::ffi::OsStr;

use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::Nvml;

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
    let mode = if prohibit {
        ComputeMode::Prohibited
    } else {
        ComputeMode::Default
    };
    device
        .set_compute_mode(mode)
        .map_err(|e| format!("nvmlDeviceSetComputeMode({mode:?}): {e}"))?;
    let now = device
        .compute_mode()
        .map_err(|e| format!("nvmlDeviceGetComputeMode: {e}"))?;
    Ok(format!("{now:?}"))
}
