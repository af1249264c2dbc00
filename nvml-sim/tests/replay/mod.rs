//! Replays the questions of a real-driver capture (`benches/real-check/nvml_capture.py`,
//! `nvml_cost.py` and the MIG probe; see `nvml-sim/tests/data/README.md`) against the simulator
//! loaded as a dynamic library, with the same NVML symbol, arguments and count-probe sequence as
//! the capture's pynvml 13.610 used, and answers in the capture's JSON shape (`plain()` of pynvml's
//! value). A key this module cannot map answers `None`, so the caller can fail on it.

#![allow(dead_code)]

mod device;
mod probe;

use std::ffi::{c_char, c_uint, c_ulonglong, CStr};
use std::path::Path;

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlProcessInfo_t, nvmlReturn_t, NvmlLib};
use serde_json::{json, Value};

/// A call's outcome: the value as the capture records it, or the `nvmlReturn_t`.
pub type Answer = Result<Value, u32>;

pub const FUNCTION_NOT_FOUND: u32 = 13;
pub const INSUFFICIENT_SIZE: u32 = 7;

/// pynvml's exception names as the captures spell them, with their codes.
pub const ERROR_NAMES: &[(&str, u32)] = &[
    ("NVMLError_Uninitialized", 1),
    ("NVMLError_InvalidArgument", 2),
    ("NVMLError_NotSupported", 3),
    ("NVMLError_NoPermission", 4),
    ("NVMLError_NotFound", 6),
    ("NVMLError_InsufficientSize", 7),
    ("NVMLError_Timeout", 10),
    ("NVMLError_FunctionNotFound", 13),
    ("NVMLError_GpuIsLost", 15),
    ("NVMLError_ArgumentVersionMismatch", 25),
    ("NVMLError_Unknown", 999),
];

type U32Of = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t;
type U64Of = unsafe extern "C" fn(nvmlDevice_t, *mut c_ulonglong) -> nvmlReturn_t;
type U32At = unsafe extern "C" fn(nvmlDevice_t, c_uint, *mut c_uint) -> nvmlReturn_t;
type PairOf = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut c_uint) -> nvmlReturn_t;
type StrOf = unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t;
type ProcsOf =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> nvmlReturn_t;

/// The simulator, initialised, with the handle of GPU 0.
pub struct Replay {
    pub lib: NvmlLib,
    pub dev: nvmlDevice_t,
}

/// The symbol, or FUNCTION_NOT_FOUND (what pynvml reports for a missing one).
pub fn sym<T: Copy>(s: &Result<T, libloading::Error>) -> Result<T, u32> {
    s.as_ref().copied().map_err(|_| FUNCTION_NOT_FOUND)
}

pub fn check(ret: nvmlReturn_t) -> Result<(), u32> {
    if ret == 0 {
        Ok(())
    } else {
        Err(ret)
    }
}

/// A NUL-terminated C buffer as a string.
pub fn text(buf: &[c_char]) -> Value {
    // SAFETY: every buffer passed here was zero-initialised and is at least one byte longer
    // than what the library may write, so it holds a NUL.
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Value::String(s.to_string_lossy().into_owned())
}

/// A capture entry as the answer it records: `{"ok": v}` or `{"code": c}`; `nvml_cost.py`'s
/// `mig_profiles` rows are the value itself, or a bare error name.
pub fn recorded(entry: &Value) -> Option<Answer> {
    if let Some(name) = entry.as_str() {
        return ERROR_NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, c)| Err(*c));
    }
    if let Some(code) = entry.get("code") {
        return Some(Err(code.as_u64()? as u32));
    }
    match entry.get("ok") {
        Some(v) => Some(Ok(v.clone())),
        None if entry.get("err").is_none() && entry.get("exc").is_none() => Some(Ok(entry.clone())),
        None => None,
    }
}

/// Splits `GetClock_0_1` into `("GetClock", [0, 1])`: trailing all-digit parts are arguments.
pub fn split_key(key: &str) -> (&str, Vec<u32>) {
    let mut base = key;
    let mut args = Vec::new();
    while let Some((head, tail)) = base.rsplit_once('_') {
        match tail.parse::<u32>() {
            Ok(n) => {
                args.insert(0, n);
                base = head;
            }
            Err(_) => break,
        }
    }
    (base, args)
}

impl Replay {
    /// Loads `lib`, initialises it (the scenario comes from `NVML_SIM_SCENARIO`) and takes GPU 0.
    pub fn open(lib: &Path) -> Replay {
        // SAFETY: loading the simulator, whose initialisers are plain Rust statics.
        let lib = unsafe { NvmlLib::new(lib) }.expect("dlopen the simulator");
        let init = sym(&lib.nvmlInit_v2).expect("nvmlInit_v2");
        let by_index = sym(&lib.nvmlDeviceGetHandleByIndex_v2).expect("handle by index");
        let mut dev = std::ptr::null_mut();
        // SAFETY: nvmlInit_v2 takes no argument; the handle call gets a valid out-pointer.
        unsafe {
            assert_eq!(init(), 0, "nvmlInit_v2");
            assert_eq!(by_index(0, &mut dev), 0, "GPU 0");
        }
        Replay { lib, dev }
    }

    pub fn u32_of(&self, f: &Result<U32Of, libloading::Error>) -> Answer {
        let f = sym(f)?;
        let mut v = 0;
        // SAFETY: a handle of this library and a valid out-pointer, as nvml.h declares.
        check(unsafe { f(self.dev, &mut v) })?;
        Ok(json!(v))
    }

    pub fn u64_of(&self, f: &Result<U64Of, libloading::Error>) -> Answer {
        let f = sym(f)?;
        let mut v = 0;
        // SAFETY: as in `u32_of`.
        check(unsafe { f(self.dev, &mut v) })?;
        Ok(json!(v))
    }

    pub fn u32_at(&self, f: &Result<U32At, libloading::Error>, arg: u32) -> Answer {
        let f = sym(f)?;
        let mut v = 0;
        // SAFETY: as in `u32_of`; `arg` is a plain integer.
        check(unsafe { f(self.dev, arg, &mut v) })?;
        Ok(json!(v))
    }

    /// Two out-values as a list (`[current, pending]`, `[utilization, period]`, ...).
    pub fn pair(&self, f: &Result<PairOf, libloading::Error>) -> Answer {
        let f = sym(f)?;
        let (mut a, mut b) = (0, 0);
        // SAFETY: as in `u32_of`, with two out-pointers.
        check(unsafe { f(self.dev, &mut a, &mut b) })?;
        Ok(json!([a, b]))
    }

    /// A string into a buffer of `len` bytes (pynvml's buffer size for that call).
    pub fn string_of(&self, f: &Result<StrOf, libloading::Error>, len: usize) -> Answer {
        let f = sym(f)?;
        let mut buf = vec![0 as c_char; len + 1];
        // SAFETY: `buf` has `len + 1` writable bytes; we announce `len`.
        check(unsafe { f(self.dev, buf.as_mut_ptr(), len as c_uint) })?;
        Ok(text(&buf))
    }

    /// The answer to capture key `key` of section `section` ("system", "device", "probe",
    /// "mig_profiles"); `None` when the key is not one this replay knows.
    pub fn answer(&self, section: &str, key: &str) -> Option<Answer> {
        match section {
            "system" => self.system(key),
            "device" => self.device(key),
            "probe" => self.probe(key),
            "mig_profiles" => Some(self.mig_profile(key.parse().ok()?)),
            _ => None,
        }
    }

    fn system(&self, key: &str) -> Option<Answer> {
        let l = &self.lib;
        let version = |f: &Result<_, _>, len: usize| -> Answer {
            let f: unsafe extern "C" fn(*mut c_char, c_uint) -> nvmlReturn_t = sym(f)?;
            let mut buf = vec![0 as c_char; len + 1];
            // SAFETY: `buf` has `len + 1` writable bytes; we announce `len`.
            check(unsafe { f(buf.as_mut_ptr(), len as c_uint) })?;
            Ok(text(&buf))
        };
        let int = |f: &Result<unsafe extern "C" fn(*mut i32) -> nvmlReturn_t, _>| -> Answer {
            let f = sym(f)?;
            let mut v = 0;
            // SAFETY: a valid out-pointer.
            check(unsafe { f(&mut v) })?;
            Ok(json!(v))
        };
        Some(match key {
            "GetDriverVersion" => version(&l.nvmlSystemGetDriverVersion, 80),
            "GetNVMLVersion" => version(&l.nvmlSystemGetNVMLVersion, 80),
            "GetCudaDriverVersion" => int(&l.nvmlSystemGetCudaDriverVersion),
            "GetCudaDriverVersion_v2" => int(&l.nvmlSystemGetCudaDriverVersion_v2),
            "DeviceGetCount" => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetCount_v2)?;
                let mut n = 0;
                // SAFETY: a valid out-pointer.
                check(unsafe { f(&mut n) })?;
                Ok(json!(n))
            })(),
            "GetHandleByIndex_99" => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetHandleByIndex_v2)?;
                let mut d = std::ptr::null_mut();
                // SAFETY: a valid out-pointer.
                check(unsafe { f(99, &mut d) })?;
                Ok(json!("<handle>"))
            })(),
            "GetHandleByUUID_bogus" => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetHandleByUUID)?;
                let mut d = std::ptr::null_mut();
                let uuid = c"GPU-00000000-0000-0000-0000-000000000000";
                // SAFETY: a NUL-terminated string and a valid out-pointer.
                check(unsafe { f(uuid.as_ptr(), &mut d) })?;
                Ok(json!("<handle>"))
            })(),
            _ => return None,
        })
    }
}
