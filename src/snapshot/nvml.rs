//! NVML return codes as the agent carries them: typed from the NVML boundary to the metric label
//! or health reason, never matched as strings.

use std::borrow::Cow;
use std::fmt;

/// Why an NVML call (or loading the library) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NvmlCode {
    Uninitialized,
    InvalidArgument,
    NotSupported,
    NoPermission,
    AlreadyInitialized,
    NotFound,
    InsufficientSize,
    InsufficientPower,
    DriverNotLoaded,
    Timeout,
    IrqIssue,
    /// The library could not be loaded (`dlopen` failed).
    LibraryNotFound,
    /// `NVML_ERROR_FUNCTION_NOT_FOUND`: the driver is older than the call.
    FunctionNotFound,
    /// The symbol is missing from the loaded library (an older driver, or the simulator).
    SymbolNotFound,
    CorruptedInfoRom,
    GpuIsLost,
    ResetRequired,
    OperatingSystem,
    LibRmVersionMismatch,
    InUse,
    InsufficientMemory,
    NoData,
    VgpuEccNotSupported,
    Unknown,
    /// A string NVML returned was not valid UTF-8 or held a NUL.
    BadString,
    /// A return code nvml-wrapper does not name.
    Return(u32),
}

impl NvmlCode {
    /// The snake-case name used in metric labels (`gpu_is_lost`, `not_supported`, ...).
    pub fn label(self) -> Cow<'static, str> {
        use NvmlCode::*;
        Cow::Borrowed(match self {
            Uninitialized => "uninitialized",
            InvalidArgument => "invalid_argument",
            NotSupported => "not_supported",
            NoPermission => "no_permission",
            AlreadyInitialized => "already_initialized",
            NotFound => "not_found",
            InsufficientSize => "insufficient_size",
            InsufficientPower => "insufficient_power",
            DriverNotLoaded => "driver_not_loaded",
            Timeout => "timeout",
            IrqIssue => "irq_issue",
            LibraryNotFound => "library_not_found",
            FunctionNotFound => "function_not_found",
            SymbolNotFound => "symbol_not_found",
            CorruptedInfoRom => "corrupted_inforom",
            GpuIsLost => "gpu_is_lost",
            ResetRequired => "reset_required",
            OperatingSystem => "operating_system",
            LibRmVersionMismatch => "lib_rm_version_mismatch",
            InUse => "in_use",
            InsufficientMemory => "insufficient_memory",
            NoData => "no_data",
            VgpuEccNotSupported => "vgpu_ecc_not_supported",
            Unknown => "unknown",
            BadString => "bad_string",
            Return(code) => return Cow::Owned(format!("nvml_return_{code}")),
        })
    }

    /// The device does not have what was asked: not an error, the value is simply absent.
    pub fn is_unsupported(self) -> bool {
        matches!(
            self,
            NvmlCode::NotSupported | NvmlCode::FunctionNotFound | NvmlCode::SymbolNotFound
        )
    }
}

impl fmt::Display for NvmlCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

impl serde::Serialize for NvmlCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.label())
    }
}
