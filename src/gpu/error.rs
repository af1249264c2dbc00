//! NVML errors into [`NvmlCode`], and initialisation failures into words an operator can act on.

use nvml_wrapper::error::NvmlError;

use crate::snapshot::NvmlCode;

/// Why NVML could not be brought up.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason}")]
pub struct InitError {
    pub code: NvmlCode,
    /// What happened and what to check, for logs and `/readyz`.
    pub reason: String,
}

/// The typed code of an nvml-wrapper error.
pub(crate) fn code(e: &NvmlError) -> NvmlCode {
    #[allow(deprecated)]
    match e {
        NvmlError::Uninitialized => NvmlCode::Uninitialized,
        NvmlError::InvalidArg => NvmlCode::InvalidArgument,
        NvmlError::NotSupported => NvmlCode::NotSupported,
        NvmlError::NoPermission => NvmlCode::NoPermission,
        NvmlError::AlreadyInitialized => NvmlCode::AlreadyInitialized,
        NvmlError::NotFound => NvmlCode::NotFound,
        NvmlError::InsufficientSize(_) => NvmlCode::InsufficientSize,
        NvmlError::InsufficientPower => NvmlCode::InsufficientPower,
        NvmlError::DriverNotLoaded => NvmlCode::DriverNotLoaded,
        NvmlError::Timeout => NvmlCode::Timeout,
        NvmlError::IrqIssue => NvmlCode::IrqIssue,
        NvmlError::LibraryNotFound | NvmlError::LibloadingError(_) => NvmlCode::LibraryNotFound,
        NvmlError::FunctionNotFound => NvmlCode::FunctionNotFound,
        NvmlError::FailedToLoadSymbol(_) => NvmlCode::SymbolNotFound,
        NvmlError::CorruptedInfoROM => NvmlCode::CorruptedInfoRom,
        NvmlError::GpuLost => NvmlCode::GpuIsLost,
        NvmlError::ResetRequired => NvmlCode::ResetRequired,
        NvmlError::OperatingSystem => NvmlCode::OperatingSystem,
        NvmlError::LibRmVersionMismatch => NvmlCode::LibRmVersionMismatch,
        NvmlError::InUse => NvmlCode::InUse,
        NvmlError::InsufficientMemory => NvmlCode::InsufficientMemory,
        NvmlError::NoData => NvmlCode::NoData,
        NvmlError::VgpuEccNotSupported => NvmlCode::VgpuEccNotSupported,
        NvmlError::Unknown => NvmlCode::Unknown,
        NvmlError::UnexpectedVariant(c) => NvmlCode::Return(*c),
        NvmlError::Utf8Error(_) | NvmlError::NulError(_) => NvmlCode::BadString,
        _ => NvmlCode::Unknown,
    }
}

pub(super) fn init_error(lib: &str, e: &NvmlError) -> InitError {
    let reason = match e {
        NvmlError::LibloadingError(inner) => format!(
            "cannot load the NVML library '{lib}': {inner}; install the NVIDIA driver or pass \
             --nvml-lib with the path of libnvidia-ml.so.1"
        ),
        NvmlError::DriverNotLoaded => format!(
            "NVML ('{lib}') reports that the NVIDIA driver is not loaded; check `lsmod | grep \
             nvidia` and the driver installation"
        ),
        NvmlError::NoPermission => {
            format!("NVML ('{lib}') denied access; the agent needs read access to /dev/nvidia*")
        }
        other => format!("NVML ('{lib}') failed to initialise: {other}"),
    };
    InitError {
        code: code(e),
        reason,
    }
}
