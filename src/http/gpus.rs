//! `GET /api/v1/gpus`: each GPU as plain JSON data for a person's tools (`gpu-steward status`),
//! so that none of them parses the Prometheus exposition: identity (index, UUID, model, PCI bus
//! id), health verdict with its conditions, utilization, memory (used, free, reserved, total in
//! bytes), temperature, power, idle time, MIG mode and instances, and the processes with their
//! user and owner. Read-only, so it needs no token (docs/http.md).
//!
//! Everything comes from the latest publication (and the reclaim actor's latest view for the
//! idle time), as read: a value the agent does not have is `null`, never 0. Must not: call NVML,
//! compute anything the poller or the health evaluator did not, or rename a field once shipped
//! (CONTRACT: tools read it).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::AppState;
use crate::health::GpuVerdict;
use crate::reclaim::idle::UnitState;
use crate::snapshot::{GpuProcess, GpuSnapshot, GpuStatus, PodRef};

pub(super) async fn gpus(State(state): State<AppState>) -> Response {
    let p = state.latest();
    let view = state.reclaim.as_ref().and_then(|r| r.borrow().clone());
    let gpus: Vec<Value> = p
        .snapshot
        .gpus
        .iter()
        .map(|g| {
            let verdict = p
                .health
                .gpu(g.index)
                .map_or_else(|| GpuVerdict::new(Vec::new()), |x| x.verdict.clone());
            // Idle time of the whole GPU (not of one MIG instance), 0 while busy or not held.
            let idle = view.as_deref().map(|v| {
                v.units
                    .iter()
                    .find(|u| u.key.gpu_instance.is_none() && u.key.uuid == g.uuid())
                    .filter(|u| matches!(u.state, UnitState::Idle { .. }))
                    .map_or(0.0, |u| u.idle_for(v.taken_at).as_secs_f64())
            });
            gpu(g, &verdict, idle)
        })
        .collect();
    Json(json!({
        "taken_at": humantime::format_rfc3339_millis(p.snapshot.taken_at).to_string(),
        "gpus": gpus,
    }))
    .into_response()
}

fn gpu(g: &GpuSnapshot, v: &GpuVerdict, idle_seconds: Option<f64>) -> Value {
    let id = g.identity.as_deref();
    let r = &g.reading;
    let state = match &g.status {
        GpuStatus::Up => json!("up"),
        GpuStatus::Lost => json!("lost"),
        GpuStatus::Unreadable(why) => json!({"unreadable": why}),
    };
    // The pod is named only when the GPU is allocated to exactly one container, as on the page.
    let only_pod = match r.pods.as_slice() {
        [only] => Some(only),
        _ => None,
    };
    json!({
        "index": g.index,
        // Known from before a GPU was lost; null only if it was never readable.
        "uuid": id.map(|i| i.uuid.clone()),
        "model": id.filter(|i| i.labels_known()).map(|i| i.name.clone()),
        "pci_bus_id": id.filter(|i| i.labels_known()).map(|i| i.pci_bus_id.clone()),
        "state": state,
        "health": {
            "status": v.status,
            "action": v.action,
            "conditions": v.conditions,
        },
        "utilization_percent": r.gpu_util_percent,
        "memory": r.memory.as_ref().map(|m| json!({
            "used_bytes": m.used,
            "free_bytes": m.free,
            "reserved_bytes": m.reserved,
            "total_bytes": m.total,
        })),
        "temperature_celsius": r.temperature_c,
        "power_watts": r.power_mw.map(|mw| f64::from(mw) / 1000.0),
        "idle_seconds": idle_seconds,
        "mig": r.mig_mode_current.map(|current| json!({
            "current": current,
            "pending": r.mig_mode_pending,
            "instances": r.mig_instances.iter().flatten().map(|i| i.profile.clone()).collect::<Vec<_>>(),
        })),
        "processes": r.processes.as_ref().map(|ps| {
            ps.iter().map(|p| process(p, only_pod)).collect::<Vec<_>>()
        }),
    })
}

fn process(p: &GpuProcess, pod: Option<&PodRef>) -> Value {
    let info = p.info.as_deref();
    let a = info.map(|i| &i.attribution);
    json!({
        "pid": p.pid,
        "type": p.kind.as_str(),
        "name": info.map(|i| i.name.clone()),
        "user": info.map(|i| i.user.clone()),
        "memory_bytes": p.used_memory_bytes,
        "gpu_instance": p.gpu_instance_id,
        "container_id": a.and_then(|a| a.container_id.clone()),
        "pod_uid": a.and_then(|a| a.pod_uid.clone()),
        "systemd_unit": a.and_then(|a| a.systemd_unit.clone()),
        "slurm_job": a.and_then(|a| a.slurm_job.clone()),
        "namespace": pod.map(|p| p.namespace.clone()),
        "pod": pod.map(|p| p.pod.clone()),
        "container": pod.map(|p| p.container.clone()),
    })
}
