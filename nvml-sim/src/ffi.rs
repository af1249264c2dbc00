//! The C boundary: `nvmlReturn_t` codes with their names and the real driver's error strings,
//! the `export!` macro that wraps every exported function (call counting, `catch_unwind`, and
//! mapping `Err(code)` to the return value), and the few pointer helpers that read arguments and
//! write results. Those helpers are the only place that dereferences caller pointers: they
//! reject NULL with `INVALID_ARGUMENT` and honour buffer lengths with `INSUFFICIENT_SIZE`.

use std::cell::Cell;
use std::ffi::{c_char, c_uint, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    /// The export running on this thread, so per-function scenario overrides can be applied
    /// where the device handle is checked.
    static CURRENT: Cell<&'static str> = const { Cell::new("") };
}

/// The name of the export currently running on this thread.
pub fn current_function() -> &'static str {
    CURRENT.with(Cell::get)
}

/// `nvmlReturn_t` (a C enum, `unsigned int` on every ABI nvml-wrapper supports).
pub type Ret = c_uint;

/// Result of an export body: `Err(code)` becomes the return value.
pub type NvResult<T = ()> = Result<T, Ret>;

pub const SUCCESS: Ret = 0;
pub const UNINITIALIZED: Ret = 1;
pub const INVALID_ARGUMENT: Ret = 2;
pub const NOT_SUPPORTED: Ret = 3;
pub const NOT_FOUND: Ret = 6;
pub const INSUFFICIENT_SIZE: Ret = 7;
pub const DRIVER_NOT_LOADED: Ret = 9;
pub const TIMEOUT: Ret = 10;
pub const GPU_IS_LOST: Ret = 15;
pub const ARGUMENT_VERSION_MISMATCH: Ret = 25;
pub const UNKNOWN: Ret = 999;

/// Every `nvmlReturn_t` of nvml.h (API 13) except SUCCESS: name without the `NVML_ERROR_`
/// prefix (the spelling scenario files use), code, and `nvmlErrorString` text. Texts for 0-20
/// and 23 are NVIDIA's own (DCGM `sdk/nvidia/nvml/nvml_error_strings.h`); texts for 21, 22 and
/// 24-29 were not found in a source and are chosen here (see README).
pub const RETURN_CODES: &[(&str, Ret, &CStr)] = &[
    ("UNINITIALIZED", 1, c"Uninitialized"),
    ("INVALID_ARGUMENT", 2, c"Invalid Argument"),
    ("NOT_SUPPORTED", 3, c"Not Supported"),
    ("NO_PERMISSION", 4, c"Insufficient Permissions"),
    ("ALREADY_INITIALIZED", 5, c"Already Initialized"),
    ("NOT_FOUND", 6, c"Not Found"),
    ("INSUFFICIENT_SIZE", 7, c"Insufficient Size"),
    ("INSUFFICIENT_POWER", 8, c"Insufficient External Power"),
    ("DRIVER_NOT_LOADED", 9, c"Driver Not Loaded"),
    ("TIMEOUT", 10, c"Timeout"),
    ("IRQ_ISSUE", 11, c"Interrupt Request Issue"),
    ("LIBRARY_NOT_FOUND", 12, c"NVML Shared Library Not Found"),
    ("FUNCTION_NOT_FOUND", 13, c"Function Not Found"),
    ("CORRUPTED_INFOROM", 14, c"Corrupted infoROM"),
    ("GPU_IS_LOST", 15, c"GPU is lost"),
    ("RESET_REQUIRED", 16, c"GPU requires reset"),
    (
        "OPERATING_SYSTEM",
        17,
        c"GPU access blocked by the operating system",
    ),
    (
        "LIB_RM_VERSION_MISMATCH",
        18,
        c"Driver/library version mismatch",
    ),
    ("IN_USE", 19, c"In use by another client"),
    ("MEMORY", 20, c"Insufficient Memory"),
    ("NO_DATA", 21, c"No data"),
    ("VGPU_ECC_NOT_SUPPORTED", 22, c"vGPU ECC not supported"),
    ("INSUFFICIENT_RESOURCES", 23, c"Insufficient Resources"),
    ("FREQ_NOT_SUPPORTED", 24, c"Frequency not supported"),
    (
        "ARGUMENT_VERSION_MISMATCH",
        25,
        c"Argument version mismatch",
    ),
    ("DEPRECATED", 26, c"Deprecated"),
    ("NOT_READY", 27, c"Not ready"),
    ("GPU_NOT_FOUND", 28, c"GPU not found"),
    ("INVALID_STATE", 29, c"Invalid state"),
    ("UNKNOWN", 999, c"Unknown Error"),
];

/// The code for a scenario spelling such as `"GPU_IS_LOST"`.
pub fn code_by_name(name: &str) -> Option<Ret> {
    RETURN_CODES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, c, _)| *c)
}

/// The static text `nvmlErrorString` answers for `code`.
pub fn error_string(code: Ret) -> &'static CStr {
    if code == SUCCESS {
        return c"Success";
    }
    RETURN_CODES
        .iter()
        .find(|(_, c, _)| *c == code)
        .map(|(_, _, s)| *s)
        .unwrap_or(c"Unknown Error")
}

/// Runs one export body: counts the call, catches any panic (answering `UNKNOWN`), turns
/// `Err(code)` into the return value and makes the call cost its `NVML_SIM_COST` price, if any,
/// measured from the call's entry: the simulator's own work in the body (locks, bookkeeping,
/// the scenario check) is part of the price, as a real driver's work is part of what it was
/// measured to cost, not added to it. The rest of the price is spent after the body, so with no
/// simulator lock held. Nothing unwinds past this function.
pub fn run(name: &'static str, body: impl FnOnce() -> NvResult) -> Ret {
    let entered = crate::cost::enter(name);
    crate::stats::count(name);
    CURRENT.with(|c| c.set(name));
    let ret = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    };
    // The body has returned, so none of its locks is held: costs on different threads overlap.
    crate::cost::settle(name, entered);
    ret
}

/// Declares `#[no_mangle] pub unsafe extern "C" fn NAME(args) -> nvmlReturn_t` whose body
/// (returning [`NvResult`]) runs inside [`run`] under the function's own name.
#[macro_export]
macro_rules! export {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        ///
        /// # Safety
        /// C ABI as declared in nvml.h: pointer arguments must be NULL or valid for the
        /// documented element count; NULL out-pointers are rejected with INVALID_ARGUMENT.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::ffi::Ret {
            $crate::ffi::run(stringify!($name), move || -> $crate::ffi::NvResult { $body })
        }
    };
}

// The helpers below trust the C caller as nvml.h requires: a non-NULL pointer argument points
// to storage of the declared type (and, for buffers, of the declared length). That contract is
// the only thing their `unsafe` blocks rely on besides the NULL checks made first. They are
// crate-private on purpose: only the `extern "C"` exports (whose `# Safety` sections state that
// contract) pass them pointers, always ones received from the C caller.

/// Writes `value` through the out-pointer `p`.
pub(crate) fn put<T>(p: *mut T, value: T) -> NvResult {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: `p` is non-NULL and, per the nvml.h contract, points to writable storage for a T
    // (`write_unaligned` so a C caller's packing cannot make this UB).
    unsafe { p.write_unaligned(value) };
    Ok(())
}

/// Reads the in/out struct the caller passed (e.g. a versioned struct's `version` field).
pub(crate) fn get<T: Copy>(p: *const T) -> NvResult<T> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: `p` is non-NULL and, per the nvml.h contract, points to an initialised T.
    Ok(unsafe { p.read_unaligned() })
}

/// Copies `s` plus a NUL terminator into `buf` of `len` bytes; `INSUFFICIENT_SIZE` when it
/// does not fit (nothing is written then).
pub(crate) fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> NvResult {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let bytes = s.as_bytes();
    if (len as usize) < bytes.len() + 1 {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` is non-NULL and the caller promises `len` writable bytes; we write
    // `bytes.len() + 1 <= len` bytes, from a Rust slice that cannot overlap the C buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Copies `items` into the caller's array `p` (room for at least `items.len()` elements, which
/// the caller has checked against its count argument).
pub(crate) fn put_slice<T: Copy>(p: *mut T, items: &[T]) -> NvResult {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    for (i, item) in items.iter().enumerate() {
        // SAFETY: `p` is non-NULL and the caller's count (checked by our caller) covers `i`.
        unsafe { p.add(i).write_unaligned(*item) };
    }
    Ok(())
}

/// Reads element `i` of the caller's array `p` (in/out arrays such as field values).
pub(crate) fn get_at<T: Copy>(p: *const T, i: usize) -> NvResult<T> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: `p` is non-NULL and the caller's count (checked by our caller) covers `i`.
    Ok(unsafe { p.add(i).read_unaligned() })
}

/// Writes element `i` of the caller's array `p`.
pub(crate) fn put_at<T>(p: *mut T, i: usize, value: T) -> NvResult {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: `p` is non-NULL and the caller's count (checked by our caller) covers `i`.
    unsafe { p.add(i).write_unaligned(value) };
    Ok(())
}

/// Reads a NUL-terminated input string (UUID, serial, PCI bus id).
pub(crate) fn get_str(p: *const c_char) -> NvResult<String> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: `p` is non-NULL and, per the nvml.h contract, NUL-terminated.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(str::to_owned).map_err(|_| INVALID_ARGUMENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_strings_are_the_drivers() {
        assert_eq!(code_by_name("GPU_IS_LOST"), Some(15));
        assert_eq!(code_by_name("UNKNOWN"), Some(999));
        assert_eq!(code_by_name("SUCCESS"), None);
        assert_eq!(code_by_name("gpu_is_lost"), None);
        assert_eq!(error_string(0), c"Success");
        assert_eq!(error_string(9), c"Driver Not Loaded");
        assert_eq!(error_string(15), c"GPU is lost");
        assert_eq!(error_string(12345), c"Unknown Error");
    }

    #[test]
    fn put_str_honours_length() {
        let mut buf = [0 as c_char; 4];
        assert_eq!(put_str(buf.as_mut_ptr(), 4, "abcd"), Err(INSUFFICIENT_SIZE));
        assert_eq!(put_str(buf.as_mut_ptr(), 4, "abc"), Ok(()));
        assert_eq!(buf[3], 0);
        assert_eq!(put_str(std::ptr::null_mut(), 4, "a"), Err(INVALID_ARGUMENT));
    }

    #[test]
    fn run_catches_panics() {
        assert_eq!(run("test", || panic!("boom")), UNKNOWN);
        assert_eq!(run("test", || Err(NOT_FOUND)), NOT_FOUND);
    }
}
