//! GPU Performance Monitoring (nvml.h "GPM", Hopper and newer): `nvmlGpmQueryDeviceSupport`,
//! `nvmlGpmSampleAlloc`, `nvmlGpmSampleFree`, `nvmlGpmSampleGet`, `nvmlGpmMigSampleGet`,
//! `nvmlGpmMetricsGet`.
//!
//! A sample is a heap allocation whose address is the handle; live handles are kept in a set so
//! that an unknown, freed or twice-freed handle answers INVALID_ARGUMENT instead of touching
//! memory. Metrics come from the scenario's `gpm` values at the time of `nvmlGpmMetricsGet`
//! (the simulator keeps no counter history): percentages for the `*_UTIL` metrics and MiB/s for
//! PCIe, as nvml.h documents them. GPUs older than Hopper answer `isSupportedDevice = 0` and
//! NOT_SUPPORTED to sampling.

use std::collections::BTreeMap;
use std::ffi::c_uint;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpmMetricsGet_t, nvmlGpmSample_st, nvmlGpmSample_t, nvmlGpmSupport_t,
    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_SUPPORT_VERSION,
};

use crate::export;
use crate::ffi::{self, get, put};
use crate::models::HOPPER;
use crate::resolve::Gpm;
use crate::state::{gpu, index_of, scenario};

/// What a sample handle holds: the GPU and instant of the last `nvmlGpmSampleGet`, and the
/// GPU instance for `nvmlGpmMigSampleGet`.
#[derive(Debug, Clone, Copy)]
struct Sample {
    taken: Option<(usize, Instant)>,
    gpu_instance: Option<u32>,
}

/// Live samples by handle address. The boxes own the allocations the handles point to.
static SAMPLES: Mutex<BTreeMap<usize, Box<u64>>> = Mutex::new(BTreeMap::new());
static TAKEN: Mutex<BTreeMap<usize, Sample>> = Mutex::new(BTreeMap::new());

fn supported(architecture: u32) -> bool {
    architecture >= HOPPER
}

export!(
    /// `isSupportedDevice` = 1 on Hopper and newer; the struct's version must be 1.
    fn nvmlGpmQueryDeviceSupport(device: nvmlDevice_t, gpm_support: *mut nvmlGpmSupport_t) {
        let g = gpu(device)?;
        let mut s = get(gpm_support)?;
        if s.version != NVML_GPM_SUPPORT_VERSION {
            return Err(ffi::ARGUMENT_VERSION_MISMATCH);
        }
        s.isSupportedDevice = c_uint::from(supported(g.model.architecture));
        put(gpm_support, s)
    }
);

export!(
    fn nvmlGpmSampleAlloc(gpm_sample: *mut nvmlGpmSample_t) {
        scenario()?;
        if gpm_sample.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let token = Box::new(0u64);
        let handle = std::ptr::from_ref::<u64>(&token)
            .cast_mut()
            .cast::<nvmlGpmSample_st>();
        let key = handle as usize;
        SAMPLES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, token);
        TAKEN.lock().unwrap_or_else(PoisonError::into_inner).insert(
            key,
            Sample {
                taken: None,
                gpu_instance: None,
            },
        );
        put(gpm_sample, handle)
    }
);

export!(
    fn nvmlGpmSampleFree(gpm_sample: nvmlGpmSample_t) {
        scenario()?;
        let key = gpm_sample as usize;
        TAKEN
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
        SAMPLES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key)
            .map(drop)
            .ok_or(ffi::INVALID_ARGUMENT)
    }
);

export!(
    fn nvmlGpmSampleGet(device: nvmlDevice_t, gpm_sample: nvmlGpmSample_t) {
        let g = gpu(device)?;
        if !supported(g.model.architecture) {
            return Err(ffi::NOT_SUPPORTED);
        }
        let index = index_of(device).ok_or(ffi::INVALID_ARGUMENT)?;
        let mut taken = TAKEN.lock().unwrap_or_else(PoisonError::into_inner);
        let s = taken
            .get_mut(&(gpm_sample as usize))
            .ok_or(ffi::INVALID_ARGUMENT)?;
        s.taken = Some((index, Instant::now()));
        s.gpu_instance = None;
        Ok(())
    }
);

/// The value NVML reports for `id`, in NVML's unit; `None` for metrics not simulated.
fn value(gpm: &Gpm, id: u32) -> Option<f64> {
    let pct = |r: f64| r * 100.0;
    let mib_s = |b: f64| b / (1024.0 * 1024.0);
    Some(match id {
        1 => pct(gpm.gr_engine_active),
        2 => pct(gpm.sm_active),
        3 => pct(gpm.sm_occupancy),
        5 => pct(gpm.tensor_active),
        10 => pct(gpm.dram_active),
        11 => pct(gpm.fp64_active),
        12 => pct(gpm.fp32_active),
        13 => pct(gpm.fp16_active),
        20 => mib_s(gpm.pcie_tx_bytes_per_s),
        21 => mib_s(gpm.pcie_rx_bytes_per_s),
        _ => return None,
    })
}

export!(
    /// Version must be `NVML_GPM_METRICS_GET_VERSION`; both samples taken, on the same GPU,
    /// sample 2 after sample 1; at most `NVML_GPM_METRIC_MAX` metrics. Each metric carries its
    /// own return code (NOT_SUPPORTED for ids not simulated).
    fn nvmlGpmMetricsGet(metrics_get: *mut nvmlGpmMetricsGet_t) {
        let sc = scenario()?;
        let mut m = get(metrics_get)?;
        if m.version != NVML_GPM_METRICS_GET_VERSION {
            return Err(ffi::ARGUMENT_VERSION_MISMATCH);
        }
        let n = m.numMetrics as usize;
        if n > m.metrics.len() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let taken = TAKEN.lock().unwrap_or_else(PoisonError::into_inner);
        let at = |s: nvmlGpmSample_t| {
            taken
                .get(&(s as usize))
                .and_then(|t| t.taken.map(|(g, i)| (g, i, t.gpu_instance)))
        };
        let (Some((g1, t1, i1)), Some((g2, t2, i2))) = (at(m.sample1), at(m.sample2)) else {
            return Err(ffi::INVALID_ARGUMENT);
        };
        drop(taken);
        if g1 != g2 || t2 <= t1 || i1 != i2 {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let g = sc.gpus.get(g2).ok_or(ffi::GPU_IS_LOST)?;
        // CHOSEN: a GPU instance with a scenario process in it is as active as the GPU's `gpm`
        // says; one without is idle (0).
        let busy = match i2 {
            None => true,
            Some(gi) => crate::store::read(g.index, |mg| Ok(crate::store::busy(g, mg, gi, None)))?,
        };
        for slot in m.metrics.iter_mut().take(n) {
            let v = value(&g.gpm, slot.metricId).map(|v| if busy { v } else { 0.0 });
            match v {
                Some(v) => {
                    slot.value = v;
                    slot.nvmlReturn = ffi::SUCCESS;
                }
                None => {
                    slot.value = 0.0;
                    slot.nvmlReturn = ffi::NOT_SUPPORTED;
                }
            }
            slot.metricInfo.shortName = std::ptr::null_mut();
            slot.metricInfo.longName = std::ptr::null_mut();
            slot.metricInfo.unit = std::ptr::null_mut();
        }
        put(metrics_get, m)
    }
);

export!(
    /// With MIG disabled there is no GPU instance to sample: INVALID_ARGUMENT, as on the
    /// captured H100 and H200. With MIG enabled: the GPU instance's sample (NOT_FOUND for an
    /// id no live GPU instance has).
    fn nvmlGpmMigSampleGet(
        device: nvmlDevice_t,
        gpu_instance_id: c_uint,
        gpm_sample: nvmlGpmSample_t,
    ) {
        let g = gpu(device)?;
        if !supported(g.model.architecture) {
            return Err(ffi::NOT_SUPPORTED);
        }
        if !crate::store::enabled(&g) {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let live = crate::store::read(g.index, |m| {
            Ok(m.gpu_instances.iter().any(|gi| gi.id == gpu_instance_id))
        })?;
        if !live {
            return Err(ffi::NOT_FOUND);
        }
        let index = index_of(device).ok_or(ffi::INVALID_ARGUMENT)?;
        let mut taken = TAKEN.lock().unwrap_or_else(PoisonError::into_inner);
        let s = taken
            .get_mut(&(gpm_sample as usize))
            .ok_or(ffi::INVALID_ARGUMENT)?;
        s.taken = Some((index, Instant::now()));
        s.gpu_instance = Some(gpu_instance_id);
        Ok(())
    }
);
