//! Profiling metrics from NVML GPM (Hopper and newer): dcgm-exporter's `DCGM_FI_PROF_*` names
//! (ratios 0-1 and bytes per second, as dcgm-exporter prints them) and native equivalents.
//!
//! Absent, never 0, on GPUs without GPM (A100, L4, T4...) and on the first poll (a GPM metric
//! needs two samples). On MIG-enabled GPUs the dcgm family has one series per GPU instance
//! (`GPU_I_PROFILE`, `GPU_I_ID`, as dcgm-exporter labels MIG series) and the GPU-wide ones are
//! absent; the native per-instance series are in `mig.rs`.

use super::dcgm_sets::{ByName, Labelled, NameSet};
use super::{Families, Family};
use crate::snapshot::{GpmMetrics, GpuStatus, Snapshot};

type Value = fn(&GpmMetrics) -> Option<f64>;

/// (dcgm 4.8 name, dcgm 4.9 name, dcgm help as default-counters.csv words it, lean, native
/// name, native help, value). Lean: dcgm-exporter's default profiling fields on Hopper.
#[rustfmt::skip]
const METRICS: &[(&str, &str, &str, bool, &str, &str, Value)] = &[
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", "Ratio of time the graphics engine is active.", true,
     "gpu_steward_graphics_engine_active_ratio", "Fraction of time the graphics or compute engine was active between two polls (GPM NVML_GPM_METRIC_GRAPHICS_UTIL).", |m| m.graphics_active),
    ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO", "The ratio of cycles an SM has at least 1 warp assigned.", false,
     "gpu_steward_sm_active_ratio", "Fraction of cycles an SM had at least one warp assigned, averaged over SMs (GPM NVML_GPM_METRIC_SM_UTIL).", |m| m.sm_active),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO", "The ratio of number of warps resident on an SM.", false,
     "gpu_steward_sm_occupancy_ratio", "Resident warps as a fraction of the SMs' maximum (GPM NVML_GPM_METRIC_SM_OCCUPANCY).", |m| m.sm_occupancy),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO", "Ratio of cycles the tensor (HMMA) pipe is active.", true,
     "gpu_steward_tensor_pipe_active_ratio", "Fraction of cycles any tensor pipe was active (GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL).", |m| m.tensor_active),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO", "Ratio of cycles the device memory interface is active sending or receiving data.", true,
     "gpu_steward_dram_active_ratio", "Fraction of cycles the device memory interface was busy (GPM NVML_GPM_METRIC_DRAM_BW_UTIL).", |m| m.dram_active),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_FP64_UTIL_RATIO", "Ratio of cycles the fp64 pipes are active.", false,
     "gpu_steward_fp64_pipe_active_ratio", "Fraction of cycles the FP64 pipes were active (GPM NVML_GPM_METRIC_FP64_UTIL).", |m| m.fp64_active),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_FP32_UTIL_RATIO", "Ratio of cycles the fp32 pipes are active.", false,
     "gpu_steward_fp32_pipe_active_ratio", "Fraction of cycles the FP32 pipes were active (GPM NVML_GPM_METRIC_FP32_UTIL).", |m| m.fp32_active),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_FP16_UTIL_RATIO", "Ratio of cycles the fp16 pipes are active.", false,
     "gpu_steward_fp16_pipe_active_ratio", "Fraction of cycles the FP16 pipes were active (GPM NVML_GPM_METRIC_FP16_UTIL).", |m| m.fp16_active),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", true,
     "gpu_steward_pcie_gpm_transmit_bytes_per_second", "PCIe transmit rate between two polls, headers included (GPM NVML_GPM_METRIC_PCIE_TX_PER_SEC, MiB/s x 1048576).", |m| m.pcie_tx_bytes_per_second),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", true,
     "gpu_steward_pcie_gpm_receive_bytes_per_second", "PCIe receive rate between two polls, headers included (GPM NVML_GPM_METRIC_PCIE_RX_PER_SEC, MiB/s x 1048576).", |m| m.pcie_rx_bytes_per_second),
];

/// The `DCGM_FI_PROF_*` gauges (ratios and bytes per second in both name sets), with the dcgm
/// family's labels of each GPU; on the lean page only dcgm-exporter's default ones.
pub(super) fn render_dcgm(sets: &[(NameSet, Vec<Labelled>)], full: bool, out: &mut Families) {
    for (v48, v49, help, lean, _, _, value) in METRICS {
        if !(full || *lean) {
            continue;
        }
        let mut families = ByName::default();
        for (set, gpus) in sets {
            let name = match set {
                NameSet::V48 => v48,
                NameSet::V49 => v49,
            };
            let f = families.get(name, help, false);
            for (labels, g) in gpus {
                f.add_opt(labels, g.reading.gpm.as_ref().and_then(value));
                // MIG: one series per GPU instance, labelled like dcgm-exporter's MIG series.
                for (gi, m) in &g.reading.mig_gpm {
                    let profile = g
                        .reading
                        .mig_instances
                        .iter()
                        .flatten()
                        .find(|i| i.gpu_instance_id == *gi)
                        .map(|i| i.profile.clone());
                    let Some(profile) = profile else { continue };
                    let mut l = labels.clone();
                    l.push(("GPU_I_PROFILE", profile));
                    l.push(("GPU_I_ID", gi.to_string()));
                    f.add_opt(&l, value(m));
                }
            }
        }
        families.push_into(out);
    }
}

/// (4.8 name, 4.9 name, on the lean page, native name) of every profiling field.
pub(super) fn names() -> impl Iterator<Item = (&'static str, &'static str, bool, &'static str)> {
    METRICS
        .iter()
        .map(|(v48, v49, _, lean, native, _, _)| (*v48, *v49, *lean, *native))
}

/// The native `gpu_steward_*_ratio` and `_bytes_per_second` gauges.
pub(super) fn render_native(snapshot: &Snapshot, out: &mut Families) {
    for (_, _, _, _, name, help, value) in METRICS {
        let mut f = Family::gauge(name, help);
        for g in snapshot.gpus.iter().filter(|g| g.status == GpuStatus::Up) {
            f.add_opt(
                &[("gpu", g.index.to_string()), ("uuid", g.uuid().to_string())],
                g.reading.gpm.as_ref().and_then(value),
            );
        }
        out.push(f);
    }
}
