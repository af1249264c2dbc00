//! Event sets: XID critical errors from the scenario's `[[gpu.event]]` tables, delivered as
//! `crate::events` describes (pending ids to the first set that waits, ids added by a rewrite
//! to every set registered before it). `nvmlEventSetWait*` polls in
//! short steps and never sleeps while holding the state lock (the agent waits on one thread
//! while it polls on another); it answers TIMEOUT when nothing arrives in time.

use std::ffi::{c_uint, c_ulonglong};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t};

use crate::events::{GPU_RECOVERY_ACTION, XID_CRITICAL_ERROR};
use crate::export;
use crate::ffi::{self, put, NvResult};
use crate::state::{self, gpu};

/// The longest a waiting thread sleeps before it looks at its set (and so at the scenario file)
/// again, when no other call noticed a rewrite.
const WAIT_STEP: Duration = Duration::from_millis(250);

export!(
    fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) {
        if set.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        put(set, state::event_set_create()?)
    }
);

export!(
    /// NOT_SUPPORTED when `event_types` has a bit the GPU does not support (nvml.h). Every
    /// supported type may be registered; only XIDs are ever delivered.
    fn nvmlDeviceRegisterEvents(
        device: nvmlDevice_t,
        event_types: c_ulonglong,
        set: nvmlEventSet_t,
    ) {
        let g = gpu(device)?;
        if event_types & !g.model.supported_event_types != 0 {
            return Err(ffi::NOT_SUPPORTED);
        }
        state::with_event_set(set, |s, _, _| {
            s.register(&g, event_types);
            Ok(())
        })
    }
);

export!(
    fn nvmlDeviceGetSupportedEventTypes(device: nvmlDevice_t, event_types: *mut c_ulonglong) {
        let g = gpu(device)?;
        put(event_types, g.model.supported_event_types)
    }
);

fn wait(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeout_ms: c_uint) -> NvResult {
    if data.is_null() {
        return Err(ffi::INVALID_ARGUMENT);
    }
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        // The lock is taken and released inside `with_event_set`; we sleep without it.
        if let Some((gpu, xid)) =
            state::with_event_set(set, |s, sc, any| Ok(s.next(&sc.gpus, any)))?
        {
            return put(
                data,
                nvmlEventData_t {
                    device: state::handle_of(gpu as usize),
                    eventType: XID_CRITICAL_ERROR,
                    eventData: xid,
                    gpuInstanceId: 0xFFFF_FFFF,
                    computeInstanceId: 0xFFFF_FFFF,
                },
            );
        }
        if let Some((gpu, action)) =
            state::with_event_set(set, |s, sc, _| Ok(s.next_recovery(&sc.gpus)))?
        {
            return put(
                data,
                nvmlEventData_t {
                    device: state::handle_of(gpu as usize),
                    eventType: GPU_RECOVERY_ACTION,
                    eventData: u64::from(action),
                    gpuInstanceId: 0xFFFF_FFFF,
                    computeInstanceId: 0xFFFF_FFFF,
                },
            );
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(ffi::TIMEOUT);
        }
        // Asleep until a rewrite is installed or, at the latest, a look again: a rewrite is
        // noticed by the calls of any thread (at most every 50 ms), and by this one's next look.
        state::wait_for_install(WAIT_STEP.min(deadline - now));
    }
}

export!(
    fn nvmlEventSetWait_v2(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeoutms: c_uint) {
        wait(set, data, timeoutms)
    }
);

export!(
    fn nvmlEventSetWait(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeoutms: c_uint) {
        wait(set, data, timeoutms)
    }
);

export!(
    fn nvmlEventSetFree(set: nvmlEventSet_t) {
        state::event_set_free(set)
    }
);
