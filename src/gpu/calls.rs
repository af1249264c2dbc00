//! Bookkeeping of NVML calls during one poll: which failed and how, which answered "not
//! supported", and how long each source (group of related calls) took.
//!
//! "Not supported" is not an error: the value is simply absent. `GPU_IS_LOST` is an error and
//! also marks the GPU lost so that the caller stops asking it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nvml_wrapper::error::NvmlError;

use super::error_code;

#[derive(Debug, Default)]
pub struct CallLog {
    current: Option<(&'static str, Instant)>,
    /// Failed calls this poll: (NVML function, error code).
    pub errors: Vec<(&'static str, String)>,
    /// Set when any call answered `GPU_IS_LOST`.
    pub lost: bool,
    /// Per source: total time and whether every call succeeded (or was not supported).
    pub sources: BTreeMap<&'static str, (Duration, bool)>,
}

impl CallLog {
    /// Starts timing `source`; calls recorded from now on belong to it.
    pub fn begin(&mut self, source: &'static str) {
        self.end();
        self.current = Some((source, Instant::now()));
        self.sources.entry(source).or_insert((Duration::ZERO, true));
    }

    /// Stops timing the current source.
    pub fn end(&mut self) {
        if let Some((source, started)) = self.current.take() {
            let entry = self.sources.entry(source).or_insert((Duration::ZERO, true));
            entry.0 += started.elapsed();
        }
    }

    /// Records the outcome of one NVML call and returns its value, if any.
    pub fn read<T>(&mut self, function: &'static str, result: Result<T, NvmlError>) -> Option<T> {
        self.call(function, result).ok()
    }

    /// Records the outcome of one NVML call and passes it through.
    pub fn call<T>(
        &mut self,
        function: &'static str,
        result: Result<T, NvmlError>,
    ) -> Result<T, NvmlError> {
        if let Err(e) = &result {
            self.fail(function, e);
        }
        result
    }

    /// Records a failed call (no-op for "not supported").
    pub fn fail(&mut self, function: &'static str, e: &NvmlError) {
        match e {
            NvmlError::NotSupported => {}
            NvmlError::GpuLost => {
                // Counted, but it does not fail the source: a lost GPU is a GPU verdict
                // (gpu_up 0, health), not a sign that the agent's collection is broken.
                self.lost = true;
                self.errors.push((function, error_code(e)));
            }
            other => self.record(function, error_code(other)),
        }
    }

    fn record(&mut self, function: &'static str, code: String) {
        self.errors.push((function, code));
        if let Some((source, _)) = self.current {
            if let Some(entry) = self.sources.get_mut(source) {
                entry.1 = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_supported_is_absent_not_an_error() {
        let mut log = CallLog::default();
        log.begin("power");
        assert_eq!(
            log.read::<u32>("nvmlDeviceGetPowerUsage", Err(NvmlError::NotSupported)),
            None
        );
        log.end();
        assert!(log.errors.is_empty());
        assert!(log.sources["power"].1);
    }

    #[test]
    fn errors_fail_their_source_and_lost_is_flagged() {
        let mut log = CallLog::default();
        log.begin("power");
        assert_eq!(
            log.read::<u32>("nvmlDeviceGetPowerUsage", Err(NvmlError::Unknown)),
            None
        );
        log.begin("thermal");
        assert_eq!(log.read("nvmlDeviceGetTemperature", Ok(40u32)), Some(40));
        log.begin("memory");
        let _ = log.read::<u32>("nvmlDeviceGetMemoryInfo_v2", Err(NvmlError::GpuLost));
        log.end();
        assert_eq!(
            log.errors,
            vec![
                ("nvmlDeviceGetPowerUsage", "unknown".to_string()),
                ("nvmlDeviceGetMemoryInfo_v2", "gpu_is_lost".to_string())
            ]
        );
        assert!(!log.sources["power"].1);
        assert!(log.sources["thermal"].1);
        assert!(
            log.sources["memory"].1,
            "a lost GPU does not fail the source"
        );
        assert!(log.lost);
    }
}
