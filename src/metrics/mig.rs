//! MIG series: the mode per GPU (`gpu_steward_mig_mode{gpu,uuid,state}`, `state` = `current`
//! or `pending`, 1 = enabled) and one identity series per compute instance
//! (`gpu_steward_mig_instance_info{gpu,uuid,gpu_instance,compute_instance,profile,placement,
//! mig_uuid} 1`) that joins MIG UUIDs (what the kubelet hands pods) to their instance. Absent
//! where NVML gave nothing: a GPU without MIG has no `gpu_steward_mig_mode` series.

use super::{flag, Families, Family};
use crate::snapshot::{GpuStatus, Snapshot};

pub(super) fn render(snapshot: &Snapshot, out: &mut Families) {
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
    out.push(mode);
    out.push(info);
}
