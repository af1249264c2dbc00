//! `nvmlDeviceGetFieldValues`: the call succeeds and each requested value carries its own
//! `nvmlReturn`. Supported: `NVML_FI_DEV_MEMORY_TEMP` (82; NOT_SUPPORTED per value on boards
//! without a memory sensor, L4 and T4) and `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (230: none 0,
//! gpu_reset 1, node_reboot 2, drain_p2p 3, drain_and_reset 4). Every other id answers
//! NOT_SUPPORTED in its own slot.

use std::ffi::c_int;
use std::time::{SystemTime, UNIX_EPOCH};

use nvml_wrapper_sys::bindings::{field_id, nvmlDevice_t, nvmlFieldValue_t, nvmlValue_t};

use crate::export;
use crate::ffi::{self, get_at, put_at};
use crate::state::gpu;

/// NVML_VALUE_TYPE_UNSIGNED_INT.
const UNSIGNED_INT: u32 = 1;

/// The `valueType` the real H100 and H200 set even when a field answers NOT_SUPPORTED: the
/// NVLink ECC data error counts (155-160) DOUBLE (0), the DL replay/recovery/CRC errors
/// (161-163) UNSIGNED_LONG_LONG (3), link speed/state/version (164-166) UNSIGNED_INT (1).
fn value_type_of(field: u32) -> Option<u32> {
    match field {
        155..=160 => Some(0),
        161..=163 => Some(3),
        164..=166 => Some(UNSIGNED_INT),
        field_id::NVML_FI_DEV_MEMORY_TEMP | field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION => {
            Some(UNSIGNED_INT)
        }
        _ => None,
    }
}

export!(
    fn nvmlDeviceGetFieldValues(
        device: nvmlDevice_t,
        values_count: c_int,
        values: *mut nvmlFieldValue_t,
    ) {
        let g = gpu(device)?;
        let n = usize::try_from(values_count).map_err(|_| ffi::INVALID_ARGUMENT)?;
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        for i in 0..n {
            let mut v = get_at(values, i)?;
            let answer = match v.fieldId {
                field_id::NVML_FI_DEV_MEMORY_TEMP => {
                    g.memory_temperature_c.ok_or(ffi::NOT_SUPPORTED)
                }
                field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION => Ok(g.recovery_action),
                _ => Err(ffi::NOT_SUPPORTED),
            };
            v.timestamp = now_us;
            if let Some(t) = value_type_of(v.fieldId) {
                v.valueType = t;
            }
            v.latencyUsec = 0;
            let mut value = nvmlValue_t { ullVal: 0 };
            match answer {
                Ok(x) => {
                    value.uiVal = x;
                    v.valueType = UNSIGNED_INT;
                    v.nvmlReturn = ffi::SUCCESS;
                }
                Err(code) => v.nvmlReturn = code,
            }
            v.value = value;
            put_at(values, i, v)?;
        }
        Ok(())
    }
);
