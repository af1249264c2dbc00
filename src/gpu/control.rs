//! The GPU settings the sharing subsystem observes and changes: the compute mode
//! (`nvmlDeviceGetComputeMode` / `nvmlDeviceSetComputeMode`).
//!
//! Remediation's built-in actions write the power limit and the compute mode
//! ([`Session::set_power_limit`], [`Session::fence`]) on the owner of changes' session
//! ([`crate::changes`]; the poller's stays with the poller), reading the value back so that
//! the caller records what the driver now says.
//!
//! Plain data out; writes fail with a [`ControlError`], reads with a typed code. Setting the
//! compute mode needs root, takes effect at once and lasts until the driver unloads (Linux
//! resets it to DEFAULT on reboot); on a GPU with MIG enabled NVML wants MIG device handles
//! instead (nvml.h, `nvmlDeviceSetComputeMode`).

use nvml_wrapper::error::NvmlError;
use serde::Serialize;

use super::{code, InitError, Session};
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
    pub fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), ControlError> {
        let mut device = self
            .nvml
            .device_by_index(index)
            .map_err(failed("nvmlDeviceGetHandleByIndex"))?;
        device
            .set_compute_mode(to_wrapper(mode))
            .map_err(failed("nvmlDeviceSetComputeMode"))
    }
}

/// Why a write through this module failed. The words are those of the audit records and the
/// reports that carry them (`remediation/actions.rs`, `sharing/apply.rs`).
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// NVML could not be brought up (the reason says what to check).
    #[error("{0}")]
    Init(#[from] InitError),
    /// No handle for the GPU with this UUID.
    #[error("GPU {uuid}: {source}")]
    Device { uuid: String, source: NvmlError },
    /// A call failed; `call` names it, with its argument where that helps.
    #[error("{call}: {source}")]
    Call { call: String, source: NvmlError },
}

impl ControlError {
    /// NVML's code for the failure.
    pub fn code(&self) -> NvmlCode {
        match self {
            ControlError::Init(e) => e.code,
            ControlError::Device { source, .. } | ControlError::Call { source, .. } => code(source),
        }
    }
}

fn failed(call: impl Into<String>) -> impl FnOnce(NvmlError) -> ControlError {
    let call = call.into();
    move |source| ControlError::Call { call, source }
}

impl Session {
    fn device_by_uuid(&self, uuid: &str) -> Result<nvml_wrapper::Device<'_>, ControlError> {
        self.nvml
            .device_by_uuid(uuid)
            .map_err(|source| ControlError::Device {
                uuid: uuid.to_string(),
                source,
            })
    }

    /// Sets the power management limit of the GPU `uuid` to `watts`, or back to its default
    /// when `None`; returns the limit in force afterwards, in watts.
    pub fn set_power_limit(&self, uuid: &str, watts: Option<u32>) -> Result<f64, ControlError> {
        let mut device = self.device_by_uuid(uuid)?;
        let mw = match watts {
            Some(w) => w.saturating_mul(1000),
            None => device
                .power_management_limit_default()
                .map_err(failed("nvmlDeviceGetPowerManagementDefaultLimit"))?,
        };
        device
            .set_power_management_limit(mw)
            .map_err(failed(format!(
                "nvmlDeviceSetPowerManagementLimit({mw} mW)"
            )))?;
        let now = device
            .power_management_limit()
            .map_err(failed("nvmlDeviceGetPowerManagementLimit"))?;
        Ok(f64::from(now) / 1000.0)
    }

    /// Sets the compute mode of the GPU `uuid`: `PROHIBITED` when `prohibit` (no new CUDA
    /// contexts; running ones keep running), else `DEFAULT`; returns the mode in force
    /// afterwards.
    pub fn fence(&self, uuid: &str, prohibit: bool) -> Result<String, ControlError> {
        let mut device = self.device_by_uuid(uuid)?;
        let mode = if prohibit {
            ComputeMode::Prohibited
        } else {
            ComputeMode::Default
        };
        device
            .set_compute_mode(to_wrapper(mode))
            .map_err(failed(format!(
                "nvmlDeviceSetComputeMode({})",
                mode.as_str()
            )))?;
        let now = device
            .compute_mode()
            .map_err(failed("nvmlDeviceGetComputeMode"))?;
        // The words of the configuration and the sharing report (`prohibited`), not the
        // wrapper's Rust names.
        Ok(from_wrapper(now).as_str().to_string())
    }
}
