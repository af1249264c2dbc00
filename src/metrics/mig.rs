//! MIG series: the mode per GPU (`gpu_steward_mig_mode{gpu,uuid,state}`, `state` = `current`
//! or `pending`, 1 = enabled) and one identity series per compute instance
//! (`gpu_steward_mig_instance_info{gpu,uuid,gpu_instance,compute_instance,profile,placement,
//! mig_uuid} 1`) that joins MIG UUIDs (what the kubelet hands pods) to their instance, and the
//! activity of each GPU instance from GPM MIG samples (`gpu_steward_mig_*_ratio{gpu,uuid,
//! gpu_instance,profile}`), which dcgm-exporter cannot give. Absent where NVML gave nothing: a
//! GPU without MIG has no `gpu_steward_mig_mode` series.

use super::{flag, Families, Family};
use crate::snapshot::{GpmMetrics, GpuStatus, Snapshot};

type Value = fn(&GpmMetrics) -> Option<f64>;

/// Per GPU instance, from `nvmlGpmMigSampleGet` (Hopper and newer).
const ACTIVITY: &[(&str, &str, Value)] = &[
    ("gpu_steward_mig_graphics_engine_active_ratio", "Fraction of time the GPU instance's graphics or compute engine was active between two polls (GPM MIG sample, GRAPHICS_UTIL).", |m| m.graphics_active),
    ("gpu_steward_mig_sm_active_ratio", "Fraction of cycles the GPU instance's SMs had at least one warp assigned (GPM MIG sample, SM_UTIL).", |m| m.sm_active),
    ("gpu_steward_mig_sm_occupancy_ratio", "Resident warps as a fraction of the GPU instance's SMs' maximum (GPM MIG sample, SM_OCCUPANCY).", |m| m.sm_occupancy),
    ("gpu_steward_mig_tensor_pipe_active_ratio", "Fraction of cycles any tensor pipe of the GPU instance was active (GPM MIG sample, ANY_TENSOR_UTIL).", |m| m.tensor_active),
    ("gpu_steward_mig_dram_active_ratio", "Fraction of cycles the GPU instance's memory interface was busy (GPM MIG sample, DRAM_BW_UTIL).", |m| m.dram_active),
];

/// The MIG names whose page depends on the profile.
pub(super) fn names() -> Vec<(&'static str, super::native::Keep)> {
    use super::native::Keep;
    let mut out = vec![("gpu_steward_mig_mode", Keep::Full)];
    out.extend(ACTIVITY.iter().map(|(name, _, _)| (*name, Keep::Dup)));
    out
}

pub(super) fn render(snapshot: &Snapshot, view: super::View, out: &mut Families) {
    let mut mode = Family::gauge(
        "gpu_steward_mig_mode",
        "1 if MIG mode is enabled, by state: current (in effect) or pending (after the next GPU reset).",
    );
    let mut info = Family::gauge(
        "gpu_steward_mig_instance_info",
        "One per MIG compute instance: its GPU instance, profile, memory-slice placement and MIG UUID.",
    );
    for g in snapshot.gpus.iter().filter(|g| g.status == GpuStatus::Up) {
        let (gpu, uuid) = (g.index.to_string(), g.uuid().to_string());
        let r = &g.reading;
        for (state, value) in [
            ("current", r.mig_mode_current),
            ("pending", r.mig_mode_pending),
        ] {
            mode.add_opt(
                &[
                    ("gpu", gpu.as_str()),
                    ("uuid", uuid.as_str()),
                    ("state", state),
                ],
                value.map(flag),
            );
        }
        for gi in r.mig_instances.iter().flatten() {
            for ci in &gi.compute_instances {
                let labels = [
                    ("gpu", gpu.clone()),
                    ("uuid", uuid.clone()),
                    ("gpu_instance", gi.gpu_instance_id.to_string()),
                    ("compute_instance", ci.compute_instance_id.to_string()),
                    ("profile", ci.profile.clone()),
                    ("placement", format!("{}:{}", gi.start, gi.size)),
                    ("mig_uuid", ci.uuid.clone().unwrap_or_default()),
                ];
                info.add(&labels, 1.0);
            }
        }
    }
    // MIG mode is read off gpu_steward_mig_instance_info on the lean page (a pending change is
    // the `mig_mode_pending` health condition).
    if view.full {
        out.push(mode);
    }
    out.push(info);
    // The same values as the dcgm family's per-instance DCGM_FI_PROF_* series.
    if !view.duplicates {
        return;
    }
    for (name, help, value) in ACTIVITY {
        let mut f = Family::gauge(name, help);
        for g in snapshot.gpus.iter().filter(|g| g.status == GpuStatus::Up) {
            for (gi, m) in &g.reading.mig_gpm {
                let Some(inst) = g
                    .reading
                    .mig_instances
                    .iter()
                    .flatten()
                    .find(|i| i.gpu_instance_id == *gi)
                else {
                    continue;
                };
                let labels = [
                    ("gpu", g.index.to_string()),
                    ("uuid", g.uuid().to_string()),
                    ("gpu_instance", gi.to_string()),
                    ("profile", inst.profile.clone()),
                ];
                f.add_opt(&labels, value(m));
            }
        }
        out.push(f);
    }
}

/// dcgm-exporter's per-instance framebuffer series on MIG GPUs: for the field whose 4.8 name is
/// `name`, the extra labels (`GPU_I_PROFILE`, `GPU_I_ID`) and value (bytes; the caller converts
/// to the name set's unit) of each GPU instance of `g`.
pub(super) fn dcgm_instance_series(
    name: &str,
    g: &crate::snapshot::GpuSnapshot,
) -> Vec<([(&'static str, String); 2], f64)> {
    let pick: fn(&crate::snapshot::mig::GpuInstance) -> Option<u64> = match name {
        "DCGM_FI_DEV_FB_USED" => |gi| gi.memory_used_bytes,
        "DCGM_FI_DEV_FB_FREE" => |gi| gi.memory_free_bytes,
        _ => return Vec::new(),
    };
    g.reading
        .mig_instances
        .iter()
        .flatten()
        .filter_map(|gi| {
            let v = pick(gi)? as f64;
            Some((
                [
                    ("GPU_I_PROFILE", gi.profile.clone()),
                    ("GPU_I_ID", gi.gpu_instance_id.to_string()),
                ],
                v,
            ))
        })
        .collect()
}
