//! Utilisation, memory, temperature and power: the values the agent polls every tick, in
//! NVML's units (percent, bytes, °C, mW, mJ). Memory keeps bytes exact: v2 has
//! `total = reserved + used + free` with `used` excluding reserved; v1 reports
//! `used = reserved + allocated` and `total = free + used` (nvml.h, gpu-models.md).

use std::ffi::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{
    nvmlBAR1Memory_t, nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlTemperatureSensors_t,
    nvmlTemperatureThresholds_t, nvmlUtilization_t,
};

use crate::export;
use crate::ffi::{self, get, put};
use crate::state::{self, gpu};

const MIB: u64 = 1024 * 1024;
/// `nvmlMemory_v2` = sizeof(nvmlMemory_v2_t) | 2 << 24.
const MEMORY_V2_VERSION: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);
/// CHOSEN: the sampling period reported by the encoder/decoder utilisation calls (1 s).
const CODEC_SAMPLING_US: c_uint = 1_000_000;
/// CHOSEN: BAR1 in use at idle (not captured in gpu-models.md).
const BAR1_USED_MIB: u64 = 1;

export!(
    /// NOT_SUPPORTED on MIG-enabled GPUs ("On MIG-enabled GPUs, querying device utilization
    /// rates is not currently supported", nvml.h).
    fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, utilization: *mut nvmlUtilization_t) {
        let g = gpu(device)?;
        if g.mig_mode {
            return Err(ffi::NOT_SUPPORTED);
        }
        put(
            utilization,
            nvmlUtilization_t {
                gpu: g.gpu_util,
                memory: g.mem_util,
            },
        )
    }
);

export!(
    fn nvmlDeviceGetEncoderUtilization(
        device: nvmlDevice_t,
        utilization: *mut c_uint,
        sampling_period_us: *mut c_uint,
    ) {
        let g = gpu(device)?;
        put(utilization, g.enc_util)?;
        put(sampling_period_us, CODEC_SAMPLING_US)
    }
);

export!(
    fn nvmlDeviceGetDecoderUtilization(
        device: nvmlDevice_t,
        utilization: *mut c_uint,
        sampling_period_us: *mut c_uint,
    ) {
        let g = gpu(device)?;
        put(utilization, g.dec_util)?;
        put(sampling_period_us, CODEC_SAMPLING_US)
    }
);

export!(
    /// v1: `used` includes the driver's reservation.
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) {
        let g = gpu(device)?;
        let total = g.model.memory_total_mib * MIB;
        let used = (g.model.memory_reserved_mib + g.memory_used_mib) * MIB;
        put(
            memory,
            nvmlMemory_t {
                total,
                free: total - used,
                used,
            },
        )
    }
);

export!(
    /// v2: checks `version` (ARGUMENT_VERSION_MISMATCH otherwise); `used` excludes reserved.
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) {
        let g = gpu(device)?;
        if get(memory)?.version != MEMORY_V2_VERSION {
            return Err(ffi::ARGUMENT_VERSION_MISMATCH);
        }
        let total = g.model.memory_total_mib * MIB;
        let reserved = g.model.memory_reserved_mib * MIB;
        let used = g.memory_used_mib * MIB;
        put(
            memory,
            nvmlMemory_v2_t {
                version: MEMORY_V2_VERSION,
                total,
                reserved,
                free: total - reserved - used,
                used,
            },
        )
    }
);

export!(
    fn nvmlDeviceGetBAR1MemoryInfo(device: nvmlDevice_t, bar1_memory: *mut nvmlBAR1Memory_t) {
        let g = gpu(device)?;
        let total = g.model.bar1_total_mib * MIB;
        let used = BAR1_USED_MIB * MIB;
        put(
            bar1_memory,
            nvmlBAR1Memory_t {
                bar1Total: total,
                bar1Free: total - used,
                bar1Used: used,
            },
        )
    }
);

export!(
    /// Only NVML_TEMPERATURE_GPU (0) exists; other sensors are INVALID_ARGUMENT.
    fn nvmlDeviceGetTemperature(
        device: nvmlDevice_t,
        sensor_type: nvmlTemperatureSensors_t,
        temp: *mut c_uint,
    ) {
        let g = gpu(device)?;
        if sensor_type != 0 {
            return Err(ffi::INVALID_ARGUMENT);
        }
        put(temp, g.temperature_c)
    }
);

export!(
    /// SHUTDOWN 0, SLOWDOWN 1, MEM_MAX 2, GPU_MAX 3 from the model table; the acoustic and
    /// GPS thresholds (4-7) and thresholds a model lacks answer NOT_SUPPORTED.
    fn nvmlDeviceGetTemperatureThreshold(
        device: nvmlDevice_t,
        threshold_type: nvmlTemperatureThresholds_t,
        temp: *mut c_uint,
    ) {
        let t = gpu(device)?.model.thresholds;
        let value = match threshold_type {
            0 => t.shutdown,
            1 => t.slowdown,
            2 => t.mem_max,
            3 => t.gpu_max,
            4..=7 => None,
            _ => return Err(ffi::INVALID_ARGUMENT),
        };
        put(temp, value.ok_or(ffi::NOT_SUPPORTED)?)
    }
);

export!(
    /// Milliwatts.
    fn nvmlDeviceGetPowerUsage(device: nvmlDevice_t, power: *mut c_uint) {
        put(power, gpu(device)?.power_mw)
    }
);

export!(
    fn nvmlDeviceGetPowerManagementLimit(device: nvmlDevice_t, limit: *mut c_uint) {
        put(limit, gpu(device)?.power_limit_mw)
    }
);

export!(
    fn nvmlDeviceGetPowerManagementDefaultLimit(device: nvmlDevice_t, default_limit: *mut c_uint) {
        put(default_limit, gpu(device)?.model.power_default_w * 1000)
    }
);

export!(
    fn nvmlDeviceGetPowerManagementLimitConstraints(
        device: nvmlDevice_t,
        min_limit: *mut c_uint,
        max_limit: *mut c_uint,
    ) {
        let g = gpu(device)?;
        put(min_limit, g.model.power_min_w * 1000)?;
        put(max_limit, g.model.power_max_w * 1000)
    }
);

export!(
    /// Equal to the management limit (no other limiter is simulated).
    fn nvmlDeviceGetEnforcedPowerLimit(device: nvmlDevice_t, limit: *mut c_uint) {
        put(limit, gpu(device)?.power_limit_mw)
    }
);

export!(
    /// Millijoules since "driver load", integrated from the scenario's power over wall time.
    fn nvmlDeviceGetTotalEnergyConsumption(device: nvmlDevice_t, energy: *mut c_ulonglong) {
        let g = gpu(device)?;
        put(energy, state::energy_mj(g.index as usize)?)
    }
);
