//! Every NVML call of a device goes through one [`CallLog`], which learns what the device can
//! answer and remembers what each call cost.
//!
//! What a device lacks is learned once per NVML session, never asked again, and never counted
//! as an error: a call that answers NOT_SUPPORTED (or whose symbol the driver lacks), or, for a
//! *probe* (a sensor, fan or clock index the device may not have), INVALID_ARGUMENT, is
//! remembered as unsupported as long as it has never succeeded. A real H100 answers
//! `nvmlDeviceGetFanSpeed_v2(dev, 0)` with INVALID_ARGUMENT because it has no fan 0: asking
//! every poll made a healthy GPU look broken. A call that *has* worked and then fails, with
//! whatever code, is a real failure: counted, and it fails its read (and so its source).
//!
//! `GPU_IS_LOST` is counted and marks the device lost; later calls in the same poll are not
//! made. It does not fail the read: a lost GPU is a GPU verdict, not broken collection.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nvml_wrapper::error::NvmlError;

use super::code;
use crate::snapshot::NvmlCode;

/// A call and its argument (a clock, sensor, field id, counter; 0 when it takes none).
type Key = (&'static str, u32);

/// The call a device's thread is in and since when (`None`: in none). Another thread reads it
/// to name a call that hangs; the calling thread sets it around each call (two uncontended
/// locks, against an NVML call of microseconds at the least).
pub type InCall = Arc<Mutex<Option<(&'static str, Instant)>>>;

/// What a device answers and what its calls cost. Lives as long as the device's NVML session.
#[derive(Debug, Default)]
pub struct CallLog {
    unsupported: HashSet<Key>,
    answered: HashSet<Key>,
    /// Failed calls since [`CallLog::begin_poll`]: (function, error).
    pub errors: Vec<(&'static str, NvmlCode)>,
    /// Set when a call answered `GPU_IS_LOST` since [`CallLog::begin_poll`].
    pub lost: bool,
    /// Calls made and wall time spent in them since [`CallLog::begin_poll`], by function.
    pub costs: BTreeMap<&'static str, (u64, Duration)>,
    /// Calls that failed (other than lost or unsupported) since [`CallLog::begin_read`].
    read_failures: u32,
    /// The call being made now.
    in_call: InCall,
}

/// How to read INVALID_ARGUMENT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// It is an error.
    Strict,
    /// It means the device has no such index (fan, sensor, clock): unsupported.
    Probe,
}

impl CallLog {
    /// A new log that tells the call being made to `in_call`.
    pub fn watched(in_call: InCall) -> Self {
        CallLog {
            in_call,
            ..CallLog::default()
        }
    }

    /// Starts a poll of the device: calls are made again (a GPU found lost is asked again).
    pub fn begin_poll(&mut self) {
        self.lost = false;
    }

    /// Hands over the errors and costs recorded so far, and starts recording anew;
    /// capabilities stay.
    #[allow(clippy::type_complexity)]
    pub fn take(
        &mut self,
    ) -> (
        Vec<(&'static str, NvmlCode)>,
        BTreeMap<&'static str, (u64, Duration)>,
    ) {
        (
            std::mem::take(&mut self.errors),
            std::mem::take(&mut self.costs),
        )
    }

    /// Where the call being made now is told (shared with whoever watches for a hang).
    pub fn in_call(&self) -> InCall {
        self.in_call.clone()
    }

    /// Starts one read (a group of calls with one outcome).
    pub fn begin_read(&mut self) {
        self.read_failures = 0;
    }

    /// Calls since [`CallLog::begin_read`] that failed other than as unsupported or lost.
    pub fn read_failures(&self) -> u32 {
        self.read_failures
    }

    /// Whether every call since [`CallLog::begin_read`] succeeded, was unsupported, or found
    /// the GPU lost.
    pub fn read_succeeded(&self) -> bool {
        self.read_failures == 0
    }

    /// Forgets what the device was found to lack, for when its mode changed (MIG enabled or
    /// disabled changes what NVML answers for the whole GPU).
    pub fn forget_capabilities(&mut self) {
        self.unsupported.clear();
        self.answered.clear();
    }

    /// Whether `function(arg)` is known to be unsupported on this device.
    pub fn lacks(&self, function: &'static str, arg: u32) -> bool {
        self.unsupported.contains(&(function, arg))
    }

    /// One call without an argument; `None` when it failed or is unsupported.
    pub fn read<T>(
        &mut self,
        function: &'static str,
        op: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        self.call_as(function, 0, Answer::Strict, op).ok()
    }

    /// One call with an argument (a clock, a counter, a field id).
    pub fn read_at<T>(
        &mut self,
        function: &'static str,
        arg: u32,
        op: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        self.call_as(function, arg, Answer::Strict, op).ok()
    }

    /// One call on an index the device may not have (INVALID_ARGUMENT = it has not).
    pub fn probe_at<T>(
        &mut self,
        function: &'static str,
        arg: u32,
        op: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        self.call_as(function, arg, Answer::Probe, op).ok()
    }

    /// A probe whose error the caller needs (INVALID_ARGUMENT = the device has no such index,
    /// learned as unsupported; `NotSupported` once learned).
    pub fn probe_call<T>(
        &mut self,
        function: &'static str,
        arg: u32,
        op: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Result<T, NvmlCode> {
        self.call_as(function, arg, Answer::Probe, op)
    }

    /// One call whose error the caller needs (`NotSupported` for a call known unsupported,
    /// `GpuIsLost` for any call after the GPU was found lost).
    pub fn call<T>(
        &mut self,
        function: &'static str,
        op: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Result<T, NvmlCode> {
        self.call_as(function, 0, Answer::Strict, op)
    }

    fn call_as<T>(
        &mut self,
        function: &'static str,
        arg: u32,
        answer: Answer,
        op: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Result<T, NvmlCode> {
        if self.lost {
            return Err(NvmlCode::GpuIsLost);
        }
        if self.unsupported.contains(&(function, arg)) {
            return Err(NvmlCode::NotSupported);
        }
        let started = Instant::now();
        self.tell(Some((function, started)));
        let result = op();
        self.tell(None);
        let cost = self.costs.entry(function).or_default();
        cost.0 += 1;
        cost.1 += started.elapsed();
        match result {
            Ok(v) => {
                self.answered.insert((function, arg));
                Ok(v)
            }
            Err(e) => {
                let c = code(&e);
                self.outcome(function, arg, answer, c);
                Err(c)
            }
        }
    }

    fn tell(&self, call: Option<(&'static str, Instant)>) {
        *self.in_call.lock().unwrap_or_else(PoisonError::into_inner) = call;
    }

    /// Records a failure NVML reported for one part of a call that succeeded as a whole (one
    /// field of `nvmlDeviceGetFieldValues`).
    pub fn fail_at(&mut self, function: &'static str, arg: u32, e: &NvmlError) {
        self.outcome(function, arg, Answer::Strict, code(e));
    }

    /// Records a success of one part of a call (one field of `nvmlDeviceGetFieldValues`).
    pub fn answered_at(&mut self, function: &'static str, arg: u32) {
        self.answered.insert((function, arg));
    }

    fn outcome(&mut self, function: &'static str, arg: u32, answer: Answer, c: NvmlCode) {
        let key = (function, arg);
        let lacking =
            c.is_unsupported() || (answer == Answer::Probe && c == NvmlCode::InvalidArgument);
        if lacking && !self.answered.contains(&key) {
            self.unsupported.insert(key);
            return;
        }
        self.errors.push((function, c));
        if c == NvmlCode::GpuIsLost {
            self.lost = true;
        } else {
            self.read_failures += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_supported_is_absent_not_an_error_and_never_asked_again() {
        let mut log = CallLog::default();
        log.begin_read();
        let mut asked = 0;
        for _ in 0..3 {
            let v: Option<u32> = log.read("nvmlDeviceGetPowerUsage", || {
                asked += 1;
                Err(NvmlError::NotSupported)
            });
            assert_eq!(v, None);
        }
        assert_eq!(asked, 1);
        assert!(log.errors.is_empty());
        assert!(log.read_succeeded());
    }

    #[test]
    fn a_probe_of_a_missing_index_is_unsupported_a_strict_call_is_an_error() {
        let mut log = CallLog::default();
        log.begin_read();
        let _ = log.probe_at::<u32>("nvmlDeviceGetFanSpeed_v2", 0, || Err(NvmlError::InvalidArg));
        assert!(log.lacks("nvmlDeviceGetFanSpeed_v2", 0));
        assert!(log.read_succeeded());
        let _ = log.read::<u32>("nvmlDeviceGetPowerUsage", || Err(NvmlError::InvalidArg));
        assert!(!log.read_succeeded());
        assert_eq!(
            log.errors,
            vec![("nvmlDeviceGetPowerUsage", NvmlCode::InvalidArgument)]
        );
    }

    #[test]
    fn a_call_that_worked_and_then_fails_is_a_real_failure_whatever_the_code() {
        let mut log = CallLog::default();
        log.begin_read();
        assert_eq!(log.read("nvmlDeviceGetPowerUsage", || Ok(1u32)), Some(1));
        let _ = log.read::<u32>("nvmlDeviceGetPowerUsage", || Err(NvmlError::NotSupported));
        assert!(!log.read_succeeded());
        assert_eq!(
            log.errors,
            vec![("nvmlDeviceGetPowerUsage", NvmlCode::NotSupported)]
        );
        assert!(
            !log.lacks("nvmlDeviceGetPowerUsage", 0),
            "asked again next time"
        );
        log.forget_capabilities();
        log.begin_read();
        let _ = log.read::<u32>("nvmlDeviceGetPowerUsage", || Err(NvmlError::NotSupported));
        assert!(
            log.read_succeeded(),
            "after a mode change it may really lack it"
        );
    }

    #[test]
    fn lost_is_counted_stops_the_poll_and_does_not_fail_the_read() {
        let mut log = CallLog::default();
        log.begin_poll();
        log.begin_read();
        let _ = log.read::<u32>("nvmlDeviceGetMemoryInfo_v2", || Err(NvmlError::GpuLost));
        assert!(log.lost && log.read_succeeded());
        let mut asked = false;
        let r = log.call::<u32>("nvmlDeviceGetTemperature", || {
            asked = true;
            Ok(40)
        });
        assert_eq!(r, Err(NvmlCode::GpuIsLost));
        assert!(!asked);
        assert_eq!(log.costs["nvmlDeviceGetMemoryInfo_v2"].0, 1);
        let (errors, costs) = log.take();
        assert_eq!(errors.len(), 1);
        assert_eq!(costs.len(), 1);
        assert!(log.errors.is_empty() && log.costs.is_empty());
        log.begin_poll();
        assert!(!log.lost);
    }

    #[test]
    fn arguments_are_learned_separately() {
        let mut log = CallLog::default();
        let _ = log.read_at::<u32>("nvmlDeviceGetClockInfo", 3, || Err(NvmlError::NotSupported));
        assert_eq!(
            log.read_at("nvmlDeviceGetClockInfo", 1, || Ok(1980u32)),
            Some(1980)
        );
        assert!(log.lacks("nvmlDeviceGetClockInfo", 3));
        assert!(!log.lacks("nvmlDeviceGetClockInfo", 1));
    }
}
