//! Native health and XID series: `gpu_steward_gpu_health` (0 pass, 1 warn, 2 fail),
//! `gpu_steward_health_condition` (1 per active condition), `gpu_steward_xid_errors_total` and
//! `gpu_steward_xid_last_timestamp_seconds`.
//!
//! On the full page the XID counter exists at 0 for every known GPU and every XID whose catalog
//! verdict is fail (DCGM's devastating set, RESET_GPU, ...): `increase(...[5m]) > 0` then fires
//! on the first occurrence. On the lean page (19 series per GPU saved) a counter appears when its
//! XID is first seen, at 1; `(x > 0) unless (x offset 10m)` sees that first one (the shipped
//! GpuStewardXidCritical rule has both arms). The last-seen timestamp exists only for XIDs that were seen (absent, never a made-up 0).

use super::{unix_seconds, Families, Family};
use crate::health::{catalog, NodeHealth};
use crate::snapshot::Snapshot;

pub(super) fn render(
    snapshot: &Snapshot,
    health: &NodeHealth,
    view: super::View,
    out: &mut Families,
) {
    let mut total = Family::counter(
        "gpu_steward_xid_errors_total",
        "XID errors received from the NVML event stream since the agent started; critical XIDs \
         start at 0.",
    );
    let mut last = Family::gauge(
        "gpu_steward_xid_last_timestamp_seconds",
        "When the XID was last received (Unix time).",
    );
    for g in snapshot.gpus.iter().filter(|g| g.identity.is_some()) {
        let (gpu, uuid) = (g.index.to_string(), g.uuid().to_string());
        // Full: every critical XID from 0, so that increase() sees the first one. Lean: the
        // codes seen, and alerts catch a new series with `unless ... offset` (docs/metrics.md).
        let mut xids: Vec<u64> = if view.full {
            catalog::critical_xids().to_vec()
        } else {
            Vec::new()
        };
        xids.extend(g.xids.keys());
        xids.sort_unstable();
        xids.dedup();
        for xid in xids {
            let labels = [
                ("gpu", gpu.clone()),
                ("uuid", uuid.clone()),
                ("xid", xid.to_string()),
            ];
            let stat = g.xids.get(&xid);
            total.add(&labels, stat.map_or(0, |s| s.count) as f64);
            if let Some(s) = stat {
                last.add(&labels, unix_seconds(s.last_seen));
            }
        }
    }
    out.push(total);
    out.push(last);

    let mut status = Family::gauge(
        "gpu_steward_gpu_health",
        "GPU health verdict: 0 pass, 1 warn, 2 fail (details at /health/gpus).",
    );
    let mut condition = Family::gauge(
        "gpu_steward_health_condition",
        "1 while the health condition is active on the GPU, labelled with its severity.",
    );
    for h in &health.gpus {
        let (gpu, uuid) = (h.index.to_string(), h.uuid.clone());
        status.add(
            &[("gpu", gpu.as_str()), ("uuid", uuid.as_str())],
            f64::from(h.verdict.status.code()),
        );
        for c in &h.verdict.conditions {
            condition.add(
                &[
                    ("gpu", gpu.as_str()),
                    ("uuid", uuid.as_str()),
                    ("condition", c.name.as_str()),
                    ("severity", c.severity.as_str()),
                ],
                1.0,
            );
        }
    }
    out.push(status);
    out.push(condition);
}
