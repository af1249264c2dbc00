//! `nvmlDeviceGetFieldValues`: the call succeeds and each requested value carries its own
//! `nvmlReturn`. Supported: `NVML_FI_DEV_MEMORY_TEMP` (82; NOT_SUPPORTED per value on boards
//! without a memory sensor, L4 and T4) and `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (230: none 0,
//! gpu_reset 1, node_reboot 2, drain_p2p 3, drain_and_reset 4), and on GPUs with NVLink
//! `NVML_FI_DEV_NVLINK_LINK_COUNT` (91), the error totals over all links (CRC flit 38, CRC data
//! 45, replay 52, recovery 59) and the cumulative data throughput counters in KiB
//! (`NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` 138 / `_RX` 139), read per link with `scopeId` = the
//! link (INVALID_ARGUMENT in the slot for a link the board lacks; CHOSEN: the GPU's traffic is
//! spread evenly over its active links), and per link (`scopeId`) the DL replay, recovery and
//! CRC counts (161-163). Every other id answers NOT_SUPPORTED in its own slot.

use std::ffi::c_int;
use std::time::{SystemTime, UNIX_EPOCH};

use nvml_wrapper_sys::bindings::{field_id, nvmlDevice_t, nvmlFieldValue_t, nvmlValue_t};

use crate::export;
use crate::ffi::{self, get_at, put_at, NvResult};
use crate::resolve::Gpu;
use crate::state::gpu;

/// NVML_VALUE_TYPE_UNSIGNED_INT.
const UNSIGNED_INT: u32 = 1;
/// NVML_VALUE_TYPE_UNSIGNED_LONG_LONG.
const UNSIGNED_LONG_LONG: u32 = 3;

/// A field's value and its type.
enum Value {
    U32(u32),
    U64(u64),
}

/// The NVLink fields: `None` when `field` is not one of them.
fn nvlink_field(g: &Gpu, field: u32, scope: u32) -> Option<NvResult<Value>> {
    let error_total = |counter: usize| -> NvResult<Value> {
        let n = g.nvlink.as_ref().ok_or(ffi::NOT_SUPPORTED)?;
        Ok(Value::U64(n.errors[counter]))
    };
    Some(match field {
        field_id::NVML_FI_DEV_NVLINK_LINK_COUNT => g
            .nvlink
            .as_ref()
            .map(|n| Value::U32(n.active.len() as u32))
            .ok_or(ffi::NOT_SUPPORTED),
        field_id::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL => error_total(0),
        field_id::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL => error_total(1),
        field_id::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL => error_total(2),
        field_id::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL => error_total(3),
        field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
        | field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX => (|| {
            let n = g.nvlink.as_ref().ok_or(ffi::NOT_SUPPORTED)?;
            let active = *n.active.get(scope as usize).ok_or(ffi::INVALID_ARGUMENT)?;
            let rx = field == field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
            let total = crate::state::nvlink_kib(g.index as usize, rx)?;
            Ok(Value::U64(match active {
                true => total / n.active_links().max(1),
                false => 0,
            }))
        })(),
        // Per link (`scopeId` = link): DL replay, recovery, CRC (CHOSEN: the CRC flit count).
        field_id::NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY
        | field_id::NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY
        | field_id::NVML_FI_DEV_NVLINK_ERROR_DL_CRC => (|| {
            let n = g.nvlink.as_ref().ok_or(ffi::NOT_SUPPORTED)?;
            let counter = field - field_id::NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY;
            super::nvlink::link_errors(n, scope, counter).map(Value::U64)
        })(),
        _ => return None,
    })
}

/// The `valueType` the real H100 and H200 set even when a field answers NOT_SUPPORTED: the
/// NVLink ECC data error counts (155-160) DOUBLE (0), the DL replay/recovery/CRC errors
/// (161-163) UNSIGNED_LONG_LONG (3), link speed/state/version (164-166) UNSIGNED_INT (1).
fn value_type_of(field: u32) -> Option<u32> {
    match field {
        155..=160 => Some(0),
        161..=163 => Some(3),
        164..=166 => Some(UNSIGNED_INT),
        field_id::NVML_FI_DEV_MEMORY_TEMP
        | field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        | field_id::NVML_FI_DEV_NVLINK_LINK_COUNT => Some(UNSIGNED_INT),
        38 | 45 | 52 | 59 | 138 | 139 => Some(UNSIGNED_LONG_LONG),
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
                field_id::NVML_FI_DEV_MEMORY_TEMP => g
                    .memory_temperature_c
                    .map(Value::U32)
                    .ok_or(ffi::NOT_SUPPORTED),
                field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION => Ok(Value::U32(g.recovery_action)),
                f => nvlink_field(&g, f, v.scopeId).unwrap_or(Err(ffi::NOT_SUPPORTED)),
            };
            v.timestamp = now_us;
            if let Some(t) = value_type_of(v.fieldId) {
                v.valueType = t;
            }
            v.latencyUsec = 0;
            let mut value = nvmlValue_t { ullVal: 0 };
            match answer {
                Ok(Value::U32(x)) => {
                    value.uiVal = x;
                    v.valueType = UNSIGNED_INT;
                    v.nvmlReturn = ffi::SUCCESS;
                }
                Ok(Value::U64(x)) => {
                    value.ullVal = x;
                    v.valueType = UNSIGNED_LONG_LONG;
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
