//! The NVML boundary: the only code in the agent that names `nvml_wrapper`.
//!
//! It turns NVML into plain data (`snapshot` types) and NVML errors into strings and flags. It
//! does not decide what a failure means for health or metrics; it reports what happened per call
//! so that the poller can count it and renderers can leave the value out.
//!
//! All `unsafe` of the agent lives here (raw NVML symbols nvml-wrapper does not wrap), each block
//! with a `// SAFETY:` comment.

mod calls;
mod events;
mod gpm;
mod identity;
mod telemetry;

pub use calls::CallLog;
pub use events::{Coverage, XidEvent, XidWatcher};
pub use gpm::GpmSampler;
pub use identity::IdentityRead;

use std::ffi::OsStr;
use std::sync::Arc;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use crate::snapshot::{DriverInfo, GpuReading};

/// Why NVML could not be brought up.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason}")]
pub struct InitError {
    /// Short machine-readable cause (`library_not_found`, `driver_not_loaded`, ...).
    pub code: String,
    /// What happened and what to check, for logs and `/readyz`.
    pub reason: String,
}

/// A live NVML session. Cheap to clone; the library stays loaded while any clone lives.
#[derive(Clone)]
pub struct Session {
    nvml: Arc<Nvml>,
}

impl Session {
    /// Loads the library at `lib` (a path, or a bare name for the loader's search) and
    /// initialises NVML.
    pub fn open(lib: &str) -> Result<Self, InitError> {
        let nvml = Nvml::builder()
            .lib_path(OsStr::new(lib))
            .init()
            .map_err(|e| init_error(lib, &e))?;
        Ok(Session {
            nvml: Arc::new(nvml),
        })
    }

    pub fn driver_info(&self, log: &mut CallLog) -> DriverInfo {
        DriverInfo {
            driver_version: log
                .read("nvmlSystemGetDriverVersion", self.nvml.sys_driver_version())
                .unwrap_or_default(),
            nvml_version: log.read("nvmlSystemGetNVMLVersion", self.nvml.sys_nvml_version()),
            cuda_version: log.read(
                "nvmlSystemGetCudaDriverVersion_v2",
                self.nvml.sys_cuda_driver_version(),
            ),
        }
    }

    /// The number of GPUs the driver knows, including ones that are lost.
    pub fn device_count(&self) -> Result<u32, String> {
        self.nvml.device_count().map_err(|e| error_code(&e))
    }

    /// Reads one poll of the GPU at `index`: its identity too when `with_identity` (identity is
    /// read when a device is first seen and while a field of it keeps failing, not every poll),
    /// and its telemetry, keeping process-utilization state in `cursor` and GPM samples in
    /// `gpm`. `Err` carries the NVML error code when the handle itself cannot be had
    /// (`gpu_is_lost` when the GPU fell off the bus).
    pub fn read_gpu(
        &self,
        index: u32,
        with_identity: bool,
        cursor: &mut ProcessCursor,
        gpm: &mut GpmSampler,
        log: &mut CallLog,
    ) -> Result<(Option<IdentityRead>, GpuReading), String> {
        log.begin("identity");
        let device = log
            .call(
                "nvmlDeviceGetHandleByIndex_v2",
                self.nvml.device_by_index(index),
            )
            .map_err(|e| error_code(&e))?;
        let identity = if with_identity {
            Some(identity::read(&device, index, log)?)
        } else {
            None
        };
        let mut reading = telemetry::read(&device, cursor, log);
        if !log.lost {
            log.begin("gpm");
            let mig = reading.mig_mode_current == Some(true);
            reading.gpm = gpm.poll(&self.nvml, &device, mig, log);
        }
        Ok((identity, reading))
    }

    /// Starts the session's XID watcher (one event set); register GPUs with
    /// [`XidWatcher::register`].
    pub fn watch_xids(&self, sink: std::sync::mpsc::Sender<XidEvent>) -> XidWatcher {
        XidWatcher::start(self.nvml.clone(), sink)
    }
}

/// Per-GPU state for `nvmlDeviceGetProcessUtilization`, which returns only samples newer than
/// the caller's last-seen timestamp (and `NOT_FOUND` when there are none).
#[derive(Debug, Default, Clone)]
pub struct ProcessCursor {
    /// CPU timestamp (µs) of the newest sample seen.
    pub last_seen_us: u64,
    /// Latest (sm, mem) utilization per pid with the sample's timestamp.
    pub latest: std::collections::HashMap<u32, (u32, u32, u64)>,
}

/// NVML's return code name in snake case, for metric labels and health reasons.
pub(crate) fn error_code(e: &NvmlError) -> String {
    #[allow(deprecated)]
    let code = match e {
        NvmlError::Uninitialized => "uninitialized",
        NvmlError::InvalidArg => "invalid_argument",
        NvmlError::NotSupported => "not_supported",
        NvmlError::NoPermission => "no_permission",
        NvmlError::AlreadyInitialized => "already_initialized",
        NvmlError::NotFound => "not_found",
        NvmlError::InsufficientSize(_) => "insufficient_size",
        NvmlError::InsufficientPower => "insufficient_power",
        NvmlError::DriverNotLoaded => "driver_not_loaded",
        NvmlError::Timeout => "timeout",
        NvmlError::IrqIssue => "irq_issue",
        NvmlError::LibraryNotFound => "library_not_found",
        NvmlError::FunctionNotFound => "function_not_found",
        NvmlError::CorruptedInfoROM => "corrupted_inforom",
        NvmlError::GpuLost => "gpu_is_lost",
        NvmlError::ResetRequired => "reset_required",
        NvmlError::OperatingSystem => "operating_system",
        NvmlError::LibRmVersionMismatch => "lib_rm_version_mismatch",
        NvmlError::InUse => "in_use",
        NvmlError::InsufficientMemory => "insufficient_memory",
        NvmlError::NoData => "no_data",
        NvmlError::VgpuEccNotSupported => "vgpu_ecc_not_supported",
        NvmlError::Unknown => "unknown",
        NvmlError::FailedToLoadSymbol(_) => "symbol_not_found",
        NvmlError::LibloadingError(_) => "library_not_found",
        NvmlError::UnexpectedVariant(code) => return format!("nvml_return_{code}"),
        NvmlError::Utf8Error(_) | NvmlError::NulError(_) => "bad_string",
        _ => "other",
    };
    code.to_string()
}

fn init_error(lib: &str, e: &NvmlError) -> InitError {
    let code = error_code(e);
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
    InitError { code, reason }
}
