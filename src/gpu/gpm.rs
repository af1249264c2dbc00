//! GPU Performance Monitoring (GPM, Hopper and newer): the profiling metrics dcgm-exporter
//! takes from DCGM's profiling module, here from NVML alone.
//!
//! GPM metrics are computed between two samples (`nvmlGpmMetricsGet`). Each GPU keeps two
//! sample buffers allocated for its lifetime: each edge of the profiling window (the poller
//! calls [`GpmSampler::poll`] every `[poller] profiling_interval`, not every poll) fills one
//! (`nvmlGpmSampleGet`) and compares it with the previous edge's, then the roles swap: the
//! ratios are the averages over the window, and a window costs two NVML calls per GPU, one of
//! them `nvmlGpmMetricsGet` at 1.0-1.45 ms of CPU on a real H200. Between edges the poller
//! serves the last window's metrics. A failed sample or comparison leaves the GPU without
//! metrics until two samples in a row succeed again (the window after the next good sample). Support is asked once per GPU (`nvmlGpmQueryDeviceSupport`); a GPU without
//! GPM (A100, L4, T4...) is never asked again and its metrics stay absent.
//!
//! The raw symbols are used instead of nvml-wrapper's `GpmSample` because that type borrows
//! `&Nvml` and cannot be kept across polls next to the `Arc<Nvml>` it borrows from.

use std::sync::Arc;

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlGpmMetricsGet_t, nvmlGpmSample_t, nvmlGpmSupport_t, NVML_GPM_METRICS_GET_VERSION,
    NVML_GPM_SUPPORT_VERSION,
};

use super::CallLog;
use crate::snapshot::GpmMetrics;

/// `nvmlGpmMetricId_t` values (nvml.h) and how each converts: percent → ratio, or MiB/s →
/// bytes/s ("PCIe traffic from this GPU in MiB/sec").
const GRAPHICS_UTIL: u32 = 1;
const SM_UTIL: u32 = 2;
const SM_OCCUPANCY: u32 = 3;
const ANY_TENSOR_UTIL: u32 = 5;
const DRAM_BW_UTIL: u32 = 10;
const FP64_UTIL: u32 = 11;
const FP32_UTIL: u32 = 12;
const FP16_UTIL: u32 = 13;
const PCIE_TX_PER_SEC: u32 = 20;
const PCIE_RX_PER_SEC: u32 = 21;

const METRICS: [u32; 10] = [
    GRAPHICS_UTIL,
    SM_UTIL,
    SM_OCCUPANCY,
    ANY_TENSOR_UTIL,
    DRAM_BW_UTIL,
    FP64_UTIL,
    FP32_UTIL,
    FP16_UTIL,
    PCIE_TX_PER_SEC,
    PCIE_RX_PER_SEC,
];

/// Per-GPU GPM state kept by the poller between polls.
#[derive(Default)]
pub struct GpmSampler {
    /// `Some(false)` once NVML said the GPU has no GPM: never asked again.
    supported: Option<bool>,
    samples: Option<Samples>,
    /// Per GPU instance (by id), while MIG is enabled: `nvmlGpmMigSampleGet` samples.
    mig: std::collections::BTreeMap<u32, Samples>,
}

/// Two sample buffers of one NVML session; freed (before that session can shut down, since
/// they hold its `Arc<Nvml>`) on drop.
struct Samples {
    nvml: Arc<Nvml>,
    previous: nvmlGpmSample_t,
    current: nvmlGpmSample_t,
    /// Whether `previous` holds a sample taken at the last window edge.
    primed: bool,
}

// SAFETY: the two sample handles are opaque allocations of the NVML library, which is
// thread-safe (nvml.h: "NVML is thread-safe so it is safe to make simultaneous NVML calls from
// multiple threads"); `Samples` is owned by one GPU worker at a time and only moved between
// threads, never shared, so no handle is used from two threads at once.
unsafe impl Send for Samples {}

impl Drop for Samples {
    fn drop(&mut self) {
        if let Ok(free) = nvml_sym(self.nvml.lib().nvmlGpmSampleFree.as_ref()) {
            for s in [self.previous, self.current]
                .into_iter()
                .filter(|s| !s.is_null())
            {
                // SAFETY: both handles came from `nvmlGpmSampleAlloc` of this library (kept
                // loaded by `self.nvml`) and are freed exactly once, here.
                unsafe {
                    free(s);
                }
            }
        }
    }
}

impl GpmSampler {
    /// One window edge: samples the GPU and returns the metrics since the previous edge (`None`
    /// at the first edge, on GPUs without GPM and on MIG-enabled GPUs, which need per-instance
    /// sampling).
    pub fn poll(
        &mut self,
        nvml: &Arc<Nvml>,
        device: &Device,
        mig_enabled: bool,
        log: &mut CallLog,
    ) -> Option<GpmMetrics> {
        if self.supported.is_none() {
            match log.call("nvmlGpmQueryDeviceSupport", || query_support(device)) {
                Ok(s) => self.supported = Some(s),
                Err(c) => {
                    if c.is_unsupported() {
                        self.supported = Some(false);
                    }
                    return None;
                }
            }
        }
        if self.supported != Some(true) || mig_enabled {
            self.samples = None;
            return None;
        }
        self.mig.clear();
        if !self
            .samples
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(&s.nvml, nvml))
        {
            self.samples = None;
            self.samples = Some(log.read("nvmlGpmSampleAlloc", || Samples::alloc(nvml))?);
        }
        let samples = self.samples.as_mut()?;
        if log
            .read("nvmlGpmSampleGet", || samples.take(device))
            .is_none()
        {
            samples.primed = false;
            return None;
        }
        let metrics = if samples.primed {
            log.read("nvmlGpmMetricsGet", || samples.compare())
        } else {
            None
        };
        std::mem::swap(&mut samples.previous, &mut samples.current);
        samples.primed = true;
        metrics
    }
}

impl GpmSampler {
    /// One window edge of a MIG-enabled GPU: samples each of `gpu_instances`
    /// (`nvmlGpmMigSampleGet`) and returns, per GPU instance id, the metrics since the previous
    /// edge (an instance seen
    /// for the first time has none yet). Instances gone are forgotten. This is the activity per
    /// instance dcgm-exporter cannot give (NVIDIA/dcgm-exporter#105, #430).
    pub fn poll_mig(
        &mut self,
        nvml: &Arc<Nvml>,
        device: &Device,
        gpu_instances: &[u32],
        log: &mut CallLog,
    ) -> Vec<(u32, GpmMetrics)> {
        if self.supported != Some(true) {
            return Vec::new();
        }
        self.mig
            .retain(|gi, s| gpu_instances.contains(gi) && Arc::ptr_eq(&s.nvml, nvml));
        let mut out = Vec::new();
        for &gi in gpu_instances {
            let samples = match self.mig.entry(gi) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    match log.read("nvmlGpmSampleAlloc", || Samples::alloc(nvml)) {
                        Some(s) => e.insert(s),
                        None => continue,
                    }
                }
            };
            if log
                .read("nvmlGpmMigSampleGet", || samples.take_mig(device, gi))
                .is_none()
            {
                samples.primed = false;
                continue;
            }
            if samples.primed {
                if let Some(m) = log.read("nvmlGpmMetricsGet", || samples.compare()) {
                    out.push((gi, m));
                }
            }
            std::mem::swap(&mut samples.previous, &mut samples.current);
            samples.primed = true;
        }
        out
    }
}

fn query_support(device: &Device) -> Result<bool, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlGpmQueryDeviceSupport.as_ref())?;
    let mut support = nvmlGpmSupport_t {
        version: NVML_GPM_SUPPORT_VERSION,
        isSupportedDevice: 0,
    };
    // SAFETY: `device.handle()` is a live handle borrowed for the call; `support` is a
    // writable `nvmlGpmSupport_t` with its version set, as nvml.h requires.
    unsafe { nvml_try(sym(device.handle(), &mut support))? };
    Ok(support.isSupportedDevice != 0)
}

impl Samples {
    fn alloc(nvml: &Arc<Nvml>) -> Result<Samples, NvmlError> {
        let alloc = nvml_sym(nvml.lib().nvmlGpmSampleAlloc.as_ref())?;
        // Checked before allocating so that `Drop` can always free.
        nvml_sym(nvml.lib().nvmlGpmSampleFree.as_ref())?;
        let mut samples = Samples {
            nvml: nvml.clone(),
            previous: std::ptr::null_mut(),
            current: std::ptr::null_mut(),
            primed: false,
        };
        // SAFETY: each out-pointer is a field of `samples`, writable; on success NVML stores
        // an opaque handle there, which `Drop` frees (and a failed one stays NULL).
        unsafe {
            nvml_try(alloc(&mut samples.previous))?;
            nvml_try(alloc(&mut samples.current))?;
        }
        Ok(samples)
    }

    fn take(&mut self, device: &Device) -> Result<(), NvmlError> {
        let get = nvml_sym(self.nvml.lib().nvmlGpmSampleGet.as_ref())?;
        // SAFETY: the handle is live for the call and `current` is a sample allocated by this
        // library and owned by `self`.
        unsafe { nvml_try(get(device.handle(), self.current)) }
    }

    fn take_mig(&mut self, device: &Device, gpu_instance: u32) -> Result<(), NvmlError> {
        let get = nvml_sym(self.nvml.lib().nvmlGpmMigSampleGet.as_ref())?;
        // SAFETY: the handle is live for the call, `gpu_instance` is a plain id, and `current`
        // is a sample allocated by this library and owned by `self`.
        unsafe { nvml_try(get(device.handle(), gpu_instance, self.current)) }
    }

    fn compare(&self) -> Result<GpmMetrics, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlGpmMetricsGet.as_ref())?;
        // SAFETY: `nvmlGpmMetricsGet_t` is plain C data (integers, floats, pointers) for which
        // all-zero bytes are a valid value.
        let mut request: nvmlGpmMetricsGet_t = unsafe { std::mem::zeroed() };
        request.version = NVML_GPM_METRICS_GET_VERSION;
        request.numMetrics = METRICS.len() as u32;
        request.sample1 = self.previous;
        request.sample2 = self.current;
        for (slot, id) in request.metrics.iter_mut().zip(METRICS) {
            slot.metricId = id;
        }
        // SAFETY: `request` is a writable, versioned `nvmlGpmMetricsGet_t` whose two samples
        // are owned by `self` and were filled by `nvmlGpmSampleGet`.
        unsafe { nvml_try(sym(&mut request))? };
        let mut m = GpmMetrics::default();
        for r in request.metrics.iter().take(METRICS.len()) {
            if r.nvmlReturn != 0 || !r.value.is_finite() {
                continue;
            }
            let ratio = Some((r.value / 100.0).clamp(0.0, 1.0));
            let bytes = Some(r.value.max(0.0) * 1024.0 * 1024.0);
            match r.metricId {
                GRAPHICS_UTIL => m.graphics_active = ratio,
                SM_UTIL => m.sm_active = ratio,
                SM_OCCUPANCY => m.sm_occupancy = ratio,
                ANY_TENSOR_UTIL => m.tensor_active = ratio,
                DRAM_BW_UTIL => m.dram_active = ratio,
                FP64_UTIL => m.fp64_active = ratio,
                FP32_UTIL => m.fp32_active = ratio,
                FP16_UTIL => m.fp16_active = ratio,
                PCIE_TX_PER_SEC => m.pcie_tx_bytes_per_second = bytes,
                PCIE_RX_PER_SEC => m.pcie_rx_bytes_per_second = bytes,
                _ => {}
            }
        }
        Ok(m)
    }
}
