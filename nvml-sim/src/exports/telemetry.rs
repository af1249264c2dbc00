//! Utilisation, memory, temperature and power: the values the agent polls every tick, in
//! NVML's units (percent, bytes, °C, mW, mJ). Memory keeps bytes exact: v2 has
//! `total = reserved + used + free` with `used` excluding reserved; v1 reports
//! `used = reserved + allocated` and `total = free + used` (nvml.h: `nvmlMemory_v2_t`,
//! `nvmlMemory_t`).

use std::ffi::{c_int, c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{
    nvmlBAR1Memory_t, nvmlDevice_t, nvmlMarginTemperature_t, nvmlMemory_t, nvmlMemory_v2_t,
    nvmlTemperatureSensors_t, nvmlTemperatureThresholds_t, nvmlUtilization_t,
};

use crate::export;
use crate::ffi::{self, get, put};
use crate::state::{self, gpu};

const MIB: u64 = 1024 * 1024;
/// `nvmlMemory_v2` = sizeof(nvmlMemory_v2_t) | 2 << 24.
const MEMORY_V2_VERSION: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);
/// `nvmlMarginTemperature_v1` = sizeof(nvmlMarginTemperature_v1_t) | 1 << 24.
const MARGIN_V1_VERSION: c_uint =
    (std::mem::size_of::<nvmlMarginTemperature_t>() as c_uint) | (1 << 24);
/// BAR1 in use on both captured boards at idle (1.625 MiB). CHOSEN: constant whatever the load
/// (the H100 load capture shows BAR1 use following FB use; not simulated).
const BAR1_USED_BYTES: u64 = 1_703_936;

export!(
    /// NOT_SUPPORTED on MIG-enabled GPUs ("On MIG-enabled GPUs, querying device utilization
    /// rates is not currently supported", nvml.h).
    fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, utilization: *mut nvmlUtilization_t) {
        let g = gpu(device)?;
        if crate::store::enabled(&g) {
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
        put(sampling_period_us, g.model.engine_sampling_us)
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
        put(sampling_period_us, g.model.engine_sampling_us)
    }
);

export!(
    /// v1: `used` includes the driver's reservation.
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) {
        if let Some(mig) = super::mig_ci::mig_memory(device) {
            let (total, used) = mig?;
            return put(
                memory,
                nvmlMemory_t {
                    total,
                    free: total - used,
                    used,
                },
            );
        }
        let g = gpu(device)?;
        let total = g.model.memory_total_bytes();
        let used = g.model.memory_reserved_bytes + g.memory_used_mib * MIB;
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
        if let Some(mig) = super::mig_ci::mig_memory(device) {
            let (total, used) = mig?;
            if get(memory)?.version != MEMORY_V2_VERSION {
                return Err(ffi::ARGUMENT_VERSION_MISMATCH);
            }
            return put(
                memory,
                nvmlMemory_v2_t {
                    version: MEMORY_V2_VERSION,
                    total,
                    reserved: 0,
                    free: total - used,
                    used,
                },
            );
        }
        let g = gpu(device)?;
        if get(memory)?.version != MEMORY_V2_VERSION {
            return Err(ffi::ARGUMENT_VERSION_MISMATCH);
        }
        let total = g.model.memory_total_bytes();
        let reserved = g.model.memory_reserved_bytes;
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
        let used = BAR1_USED_BYTES;
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
        let g = gpu(device)?;
        put(
            limit,
            state::written(g.index as usize)
                .power_limit_mw
                .unwrap_or(g.power_limit_mw),
        )
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
        let g = gpu(device)?;
        put(
            limit,
            state::written(g.index as usize)
                .power_limit_mw
                .unwrap_or(g.power_limit_mw),
        )
    }
);

export!(
    /// Within the model's constraints (INVALID_ARGUMENT outside, as the driver answers); kept
    /// while the library is loaded. The driver also asks for root (NO_PERMISSION otherwise):
    /// not simulated, so that unprivileged tests can exercise the write.
    fn nvmlDeviceSetPowerManagementLimit(device: nvmlDevice_t, limit: c_uint) {
        let g = gpu(device)?;
        if limit < g.model.power_min_w * 1000 || limit > g.model.power_max_w * 1000 {
            return Err(ffi::INVALID_ARGUMENT);
        }
        state::write(g.index as usize, |w| w.power_limit_mw = Some(limit));
        Ok(())
    }
);

export!(
    /// Millijoules since "driver load", integrated from the scenario's power over wall time.
    fn nvmlDeviceGetTotalEnergyConsumption(device: nvmlDevice_t, energy: *mut c_ulonglong) {
        let g = gpu(device)?;
        put(energy, state::energy_mj(g.index as usize)?)
    }
);

export!(
    /// No JPEG work is simulated: 0 % over the model's sampling period.
    fn nvmlDeviceGetJpgUtilization(
        device: nvmlDevice_t,
        utilization: *mut c_uint,
        sampling_period_us: *mut c_uint,
    ) {
        let g = gpu(device)?;
        put(utilization, 0)?;
        put(sampling_period_us, g.model.engine_sampling_us)
    }
);

export!(
    /// No optical-flow work is simulated: 0 % over the model's sampling period.
    fn nvmlDeviceGetOfaUtilization(
        device: nvmlDevice_t,
        utilization: *mut c_uint,
        sampling_period_us: *mut c_uint,
    ) {
        let g = gpu(device)?;
        put(utilization, 0)?;
        put(sampling_period_us, g.model.engine_sampling_us)
    }
);

export!(
    /// Degrees below the GPU's max operating temperature (`NVML_TEMPERATURE_THRESHOLD_GPU_MAX`),
    /// what nvidia-smi prints as "GPU T.Limit Temp" (51 °C at 36 °C on the captured H100, whose
    /// max is 87 °C). Version must be `nvmlMarginTemperature_v1`.
    fn nvmlDeviceGetMarginTemperature(device: nvmlDevice_t, margin: *mut nvmlMarginTemperature_t) {
        let g = gpu(device)?;
        if get(margin)?.version != MARGIN_V1_VERSION {
            return Err(ffi::ARGUMENT_VERSION_MISMATCH);
        }
        let max = g.model.thresholds.gpu_max.ok_or(ffi::NOT_SUPPORTED)?;
        put(
            margin,
            nvmlMarginTemperature_t {
                version: MARGIN_V1_VERSION,
                marginTemperature: max as c_int - g.temperature_c as c_int,
            },
        )
    }
);
