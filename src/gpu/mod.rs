//! The NVML boundary: the only code in the agent that names `nvml_wrapper`.
//!
//! It turns NVML into plain data (`snapshot` types) and NVML errors into [`NvmlCode`]. It does
//! not decide what a failure means for health or metrics, nor when to read what: it offers
//! one [`GpuReader`] per device with a table of reads ([`READS`]), each tagged with its cost
//! class ([`Tier`]), and reports per call what happened and what it cost so that the poller can
//! schedule, count and publish. [`control`] holds the only writes (power limit, compute mode),
//! for remediation's built-in actions.
//!
//! All `unsafe` of the agent lives here (raw NVML symbols nvml-wrapper does not wrap), each block
//! with a `// SAFETY:` comment.

mod calls;
pub mod control;
mod error;
mod events;
mod gpm;
mod identity;
mod mig;
mod nvlink;
mod processes;
mod reader;
mod telemetry;
mod topology;

pub use calls::{CallLog, InCall};
pub use control::{ComputeMode, ControlError, GpuControl};
pub use error::InitError;
pub use events::{Coverage, OnXid, XidEvent, XidWatcher};
pub use identity::IdentityRead;
pub use mig::{MigCallError, MigControl};
pub use reader::{GpuReader, Handle, Library, Read, ReadOutcome, Tier, READS};

pub(crate) use error::code;

use std::ffi::OsStr;
use std::sync::Arc;

use nvml_wrapper::Nvml;

use crate::snapshot::{DriverInfo, NvmlCode};

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
            .map_err(|e| error::init_error(lib, &e))?;
        Ok(Session {
            nvml: Arc::new(nvml),
        })
    }

    pub fn driver_info(&self, log: &mut CallLog) -> DriverInfo {
        let nvml = &self.nvml;
        DriverInfo {
            driver_version: log
                .read("nvmlSystemGetDriverVersion", || nvml.sys_driver_version())
                .unwrap_or_default(),
            nvml_version: log.read("nvmlSystemGetNVMLVersion", || nvml.sys_nvml_version()),
            cuda_version: log.read("nvmlSystemGetCudaDriverVersion_v2", || {
                nvml.sys_cuda_driver_version()
            }),
        }
    }

    /// The number of GPUs the driver knows, including ones that are lost.
    pub fn device_count(&self, log: &mut CallLog) -> Result<u32, NvmlCode> {
        let nvml = &self.nvml;
        log.call("nvmlDeviceGetCount_v2", || nvml.device_count())
    }

    /// MIG control (read and change layouts) over this session.
    pub fn mig(&self) -> MigControl {
        MigControl::new(self.nvml.clone())
    }

    /// A reader for the GPU at `index`, with nothing learned about it yet.
    pub fn reader(&self, index: u32) -> GpuReader {
        GpuReader::new(self.nvml.clone(), index)
    }

    /// Starts the session's XID watcher (one event set); register GPUs with
    /// [`XidWatcher::register`].
    pub fn watch_xids(&self, sink: std::sync::mpsc::Sender<XidEvent>, on_xid: OnXid) -> XidWatcher {
        XidWatcher::start(self.nvml.clone(), sink, on_xid)
    }
}
