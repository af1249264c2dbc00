//! The kubelet pod-resources client's own series and the GPU → pod allocation, rendered only
//! when `[kubernetes] enabled`: `gpu_steward_kubelet_up`, `_refresh_errors_total`,
//! `_last_refresh_timestamp_seconds`, and `gpu_steward_gpu_pod_info` (one series per container
//! allocated a GPU or a time-slicing replica of it, value 1, to join on `gpu` and `uuid`), and
//! `gpu_steward_mig_pod_info` (the same for MIG devices, with their GPU and compute instance).

use super::{unix_seconds, Families, Family};
use crate::snapshot::Snapshot;

pub(super) fn render(snapshot: &Snapshot, out: &mut Families) {
    let Some(k) = &snapshot.kubernetes else {
        return;
    };
    let mut up = Family::gauge(
        "gpu_steward_kubelet_up",
        "1 if the last List call to the kubelet pod-resources API succeeded.",
    );
    up.add::<&str>(&[], if k.up { 1.0 } else { 0.0 });
    out.push(up);
    let mut errors = Family::counter(
        "gpu_steward_kubelet_refresh_errors_total",
        "Failed List calls to the kubelet pod-resources API.",
    );
    errors.add::<&str>(&[], k.refresh_errors as f64);
    out.push(errors);
    let mut last = Family::gauge(
        "gpu_steward_kubelet_last_refresh_timestamp_seconds",
        "When the pod mapping was last refreshed from the kubelet (Unix time).",
    );
    last.add_opt::<&str, f64>(&[], k.last_refresh.map(unix_seconds));
    out.push(last);

    let mut info = Family::gauge(
        "gpu_steward_gpu_pod_info",
        "1 per container the kubelet allocated the GPU (or a time-slicing replica of it) to.",
    );
    let n = &k.labels;
    for g in snapshot.gpus.iter().filter(|g| g.identity.is_some()) {
        for p in &g.reading.pods {
            info.add(
                &[
                    ("gpu", g.index.to_string()),
                    ("uuid", g.uuid().to_string()),
                    (n.pod.as_str(), p.pod.clone()),
                    (n.namespace.as_str(), p.namespace.clone()),
                    (n.container.as_str(), p.container.clone()),
                    ("replica", p.replica.clone().unwrap_or_default()),
                ],
                1.0,
            );
        }
    }
    out.push(info);

    let mut mig = Family::gauge(
        "gpu_steward_mig_pod_info",
        "1 per container the kubelet allocated a MIG device to, joined to its GPU and compute instance.",
    );
    for g in snapshot.gpus.iter().filter(|g| g.identity.is_some()) {
        for m in &g.reading.mig_pods {
            mig.add(
                &[
                    ("gpu", g.index.to_string()),
                    ("uuid", g.uuid().to_string()),
                    ("gpu_instance", m.gpu_instance_id.to_string()),
                    ("compute_instance", m.compute_instance_id.to_string()),
                    ("mig_uuid", m.mig_uuid.clone()),
                    (n.pod.as_str(), m.pod.pod.clone()),
                    (n.namespace.as_str(), m.pod.namespace.clone()),
                    (n.container.as_str(), m.pod.container.clone()),
                ],
                1.0,
            );
        }
    }
    out.push(mig);
}
