//! Per-process series: memory and utilization of every process on a GPU (up to
//! `[processes] max_per_gpu`), labelled with the process's name, user and owner, and the
//! counter of processes the cap left out.
//!
//! Labels: `gpu`, `uuid`, `pid`, `process`, `user`, `type` (`C`, `G`, `C+G` as nvidia-smi),
//! then those known of `gpu_instance` (MIG), `container_id`, `pod_uid`, `systemd_unit`,
//! `slurm_job`, and the kubelet's pod, namespace and container when the GPU is allocated to
//! exactly one container. On a GPU shared by several pods (time-slicing) the split is in
//! `pod_uid` and `container_id`, which join with kube-state-metrics.

use super::{Families, Family};
use crate::kubernetes::PodRef;
use crate::snapshot::{GpuProcess, GpuSnapshot, GpuStatus, Snapshot};

type Value = fn(&GpuProcess) -> Option<f64>;

const GAUGES: &[(&str, &str, Value)] = &[
    (
        "gpu_steward_process_memory_used_bytes",
        "GPU memory used by the process (nvmlDeviceGetComputeRunningProcesses_v3 and GraphicsRunningProcesses_v3 usedGpuMemory).",
        |p| p.used_memory_bytes.map(|b| b as f64),
    ),
    (
        "gpu_steward_process_sm_utilization_ratio",
        "Fraction of time the process's kernels ran on the SMs, newest sample (nvmlDeviceGetProcessUtilization smUtil).",
        |p| p.sm_util_percent.map(|v| f64::from(v) / 100.0),
    ),
    (
        "gpu_steward_process_memory_utilization_ratio",
        "Fraction of time the process read or wrote device memory, newest sample (nvmlDeviceGetProcessUtilization memUtil).",
        |p| p.mem_util_percent.map(|v| f64::from(v) / 100.0),
    ),
];

pub(super) fn render(snapshot: &Snapshot, view: super::View, out: &mut Families) {
    let up: Vec<&GpuSnapshot> = snapshot
        .gpus
        .iter()
        .filter(|g| g.status == GpuStatus::Up)
        .collect();
    let names = snapshot.kubernetes.as_ref().map(|k| &k.labels);
    for (name, help, value) in GAUGES {
        let mut f = Family::gauge(name, help);
        for g in &up {
            let pod = match (names, g.reading.pods.as_slice()) {
                (Some(n), [only]) => Some((n, only)),
                _ => None,
            };
            for p in g.reading.processes.iter().flatten() {
                let labels = labels(g, p, pod);
                f.add_opt(&labels, value(p));
            }
        }
        out.push(f);
    }
    let mut dropped = Family::counter(
        "gpu_steward_processes_dropped_total",
        "Processes left out of the per-process series by [processes] max_per_gpu, summed over polls.",
    );
    for g in &up {
        if g.reading.process_count.is_some() {
            dropped.add(
                &[("gpu", g.index.to_string()), ("uuid", g.uuid().to_string())],
                g.reading.processes_dropped_total as f64,
            );
        }
    }
    // Counts what max_per_gpu left out; 0 on nearly every node, so the full page only.
    if view.full {
        out.push(dropped);
    }
}

fn labels<'a>(
    g: &GpuSnapshot,
    p: &GpuProcess,
    pod: Option<(&'a crate::kubernetes::LabelNames, &PodRef)>,
) -> Vec<(&'a str, String)> {
    let info = p.info.as_deref();
    let mut l = vec![
        ("gpu", g.index.to_string()),
        ("uuid", g.uuid().to_string()),
        ("pid", p.pid.to_string()),
        ("process", info.map(|i| i.name.clone()).unwrap_or_default()),
        ("user", info.map(|i| i.user.clone()).unwrap_or_default()),
        ("type", p.kind.as_str().to_string()),
    ];
    let optional = [
        ("gpu_instance", p.gpu_instance_id.map(|i| i.to_string())),
        (
            "container_id",
            info.and_then(|i| i.attribution.container_id.clone()),
        ),
        ("pod_uid", info.and_then(|i| i.attribution.pod_uid.clone())),
        (
            "systemd_unit",
            info.and_then(|i| i.attribution.systemd_unit.clone()),
        ),
        (
            "slurm_job",
            info.and_then(|i| i.attribution.slurm_job.clone()),
        ),
    ];
    l.extend(optional.into_iter().filter_map(|(k, v)| Some((k, v?))));
    if let Some((names, pod)) = pod {
        l.push((names.pod.as_str(), pod.pod.clone()));
        l.push((names.namespace.as_str(), pod.namespace.clone()));
        l.push((names.container.as_str(), pod.container.clone()));
    }
    l
}
