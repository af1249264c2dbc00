//! Library-level calls: ref-counted init/shutdown, `nvmlErrorString`, the system version
//! strings and the device count. Versions come from the scenario's `[driver]` table.

use std::ffi::{c_char, c_int, c_uint};

use nvml_wrapper_sys::bindings::nvmlConfComputeSystemState_t;

use super::code;
use crate::export;
use crate::ffi::{put, put_str, run, Ret};
use crate::state;

export!(
    /// Initialises the library (ref-counted); the 0 → 1 transition reads the scenario.
    fn nvmlInit_v2() {
        code(state::init())
    }
);

export!(
    /// Legacy name of `nvmlInit_v2`.
    fn nvmlInit() {
        code(state::init())
    }
);

export!(
    /// Like `nvmlInit_v2`; the flags (NO_GPUS, NO_ATTACH) change nothing here.
    fn nvmlInitWithFlags(_flags: c_uint) {
        code(state::init())
    }
);

export!(
    /// Drops one reference; UNINITIALIZED when there is none.
    fn nvmlShutdown() {
        code(state::shutdown())
    }
);

/// The driver's static description of `result`. Never NULL, never panics.
///
/// # Safety
/// Always safe to call; the returned pointer is to a static NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let mut text = c"Unknown Error".as_ptr();
    run("nvmlErrorString", || {
        text = crate::ffi::error_string(result).as_ptr();
        Ok(())
    });
    text
}

export!(
    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) {
        put_str(version, length, &state::scenario()?.driver_version)
    }
);

export!(
    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) {
        put_str(version, length, &state::scenario()?.nvml_version())
    }
);

export!(
    fn nvmlSystemGetCudaDriverVersion(cuda_driver_version: *mut c_int) {
        put(cuda_driver_version, state::scenario()?.cuda_version)
    }
);

export!(
    fn nvmlSystemGetCudaDriverVersion_v2(cuda_driver_version: *mut c_int) {
        put(cuda_driver_version, state::scenario()?.cuda_version)
    }
);

export!(
    /// Counts every GPU of the scenario, lost ones included (as the real driver does).
    fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) {
        put(device_count, state::scenario()?.gpus.len() as c_uint)
    }
);

export!(
    fn nvmlDeviceGetCount(device_count: *mut c_uint) {
        put(device_count, state::scenario()?.gpus.len() as c_uint)
    }
);

export!(
    /// The process's name from `/proc/PID/comm` (what the real driver answered: "python3" for
    /// the capture's own process); NOT_FOUND for a pid that does not exist.
    fn nvmlSystemGetProcessName(pid: c_uint, name: *mut c_char, length: c_uint) {
        state::scenario()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map_err(|_| crate::ffi::NOT_FOUND)?;
        put_str(name, length, comm.trim_end_matches('\n'))
    }
);

export!(
    /// Confidential computing off: environment, feature and dev-tools mode all 0 (CHOSEN: the
    /// captured boards answered SUCCESS; their values were not recorded).
    fn nvmlSystemGetConfComputeState(conf_state: *mut nvmlConfComputeSystemState_t) {
        state::scenario()?;
        put(
            conf_state,
            nvmlConfComputeSystemState_t {
                environment: 0,
                ccFeature: 0,
                devToolsMode: 0,
            },
        )
    }
);
