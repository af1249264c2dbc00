//! `/readyz`, `/health`, `/health/gpus` and `/health/gpus/{gpu}`.
//!
//! Body format: the draft RFC "Health Check Response Format for HTTP APIs"
//! (`application/health+json`). `/health` answers with the agent's readiness as its HTTP status,
//! never a GPU's health, so that a sick GPU keeps being scraped; `/health/gpus` answers 503 when
//! any GPU fails, for node gating.

use std::time::SystemTime;

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::AppState;
use crate::health::{self, GpuVerdict, NodeHealth, Status};
use crate::snapshot::{GpuSnapshot, NvmlStatus, Snapshot};

const HEALTH_JSON: &str = "application/health+json";

pub(super) async fn readyz(State(state): State<AppState>) -> Response {
    let p = state.latest();
    let r = health::readiness(&p.snapshot, p.interval, SystemTime::now());
    let code = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, format!("{}\n", r.reason)).into_response()
}

pub(super) async fn health(State(state): State<AppState>) -> Response {
    let p = state.latest();
    let now = SystemTime::now();
    let mut r = health::readiness(&p.snapshot, p.interval, now);
    let audit = crate::audit::health();
    // Ready still (the metrics are right), but every change to the node is being refused.
    if let Some(reason) = audit.failing.as_ref().filter(|_| r.status == Status::Pass) {
        r.status = Status::Warn;
        r.reason.clone_from(reason);
    } else if let Some(reason) = audit.failing.as_ref().filter(|_| r.status == Status::Warn) {
        r.reason = format!("{}; {reason}", r.reason);
    }
    // What a component that talks to the outside cannot do now (Slurm, NVSentinel, the
    // journal file): ready still, but said.
    let warnings = crate::warnings::all();
    for w in warnings.values() {
        match r.status {
            Status::Pass => {
                r.status = Status::Warn;
                r.reason.clone_from(w);
            }
            Status::Warn => r.reason = format!("{}; {w}", r.reason),
            Status::Fail => {}
        }
    }
    let mut body = json!({
        "status": r.status,
        "version": "1",
        "releaseId": env!("CARGO_PKG_VERSION"),
        "serviceId": "gpu-steward",
        "description": "gpu-steward node GPU agent: agent status, with one check per GPU",
        "output": r.reason,
        "agent": agent(&p.snapshot, r.snapshot_age.as_secs_f64(), p.interval.as_secs_f64(), &audit, &p.page),
        "checks": checks(&p.snapshot, &p.health),
    });
    if let Some(a) = body.get_mut("agent").and_then(Value::as_object_mut) {
        a.insert("warnings".into(), json!(warnings));
    }
    if r.status == Status::Pass {
        if let Some(o) = body.as_object_mut() {
            o.remove("output");
        }
    }
    let code = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    health_json(code, &body)
}

pub(super) async fn gpus(State(state): State<AppState>) -> Response {
    let p = state.latest();
    let s = &p.snapshot;
    let (status, output) = if s.nvml != NvmlStatus::Up {
        (
            Status::Fail,
            Some("NVML is not initialised: no GPU can be vouched for".to_string()),
        )
    } else if s.gpus.is_empty() {
        (
            Status::Fail,
            Some("NVML reports no GPU on this node".to_string()),
        )
    } else {
        (p.health.worst(), None)
    };
    let mut body = json!({
        "status": status,
        "version": "1",
        "serviceId": "gpu-steward",
        "description": "per-GPU health; 503 when any GPU fails",
        "checks": checks(s, &p.health),
    });
    if let (Some(o), Some(out)) = (body.as_object_mut(), output) {
        o.insert("output".into(), Value::String(out));
    }
    let code = if status == Status::Fail {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    health_json(code, &body)
}

pub(super) async fn gpu(State(state): State<AppState>, Path(key): Path<String>) -> Response {
    let p = state.latest();
    let Some(g) = p.snapshot.gpu(&key) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no GPU '{key}' on this node; use an index (0, 1, ...) or a UUID (GPU-...)\n"),
        )
            .into_response();
    };
    let verdict = gpu_verdict(&p.health, g);
    let code = if verdict.status == Status::Fail {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let mut body = gpu_check(g, &verdict, p.snapshot.taken_at);
    if let Some(o) = body.as_object_mut() {
        o.insert("version".into(), json!("1"));
        o.insert("serviceId".into(), json!("gpu-steward"));
    }
    health_json(code, &body)
}

fn health_json(code: StatusCode, body: &Value) -> Response {
    let mut text = body.to_string();
    text.push('\n');
    (
        code,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(HEALTH_JSON)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        text,
    )
        .into_response()
}

fn agent(
    s: &Snapshot,
    age: f64,
    interval: f64,
    audit: &crate::audit::AuditHealth,
    page: &crate::publication::Page,
) -> Value {
    let nvml = match &s.nvml {
        NvmlStatus::Starting => json!({"status": "starting"}),
        NvmlStatus::Up => json!({"status": "up"}),
        NvmlStatus::Down {
            reason,
            error,
            since,
            attempts,
        } => json!({
            "status": "down",
            "error": error,
            "reason": reason,
            "since": rfc3339(*since),
            "attempts": attempts,
        }),
    };
    json!({
        "nvml": nvml,
        "driverVersion": s.driver.as_ref().map(|d| d.driver_version.clone()),
        "gpuCount": s.gpu_count.map_or(s.gpus.len(), |n| n as usize),
        "snapshotTime": rfc3339(s.taken_at),
        "snapshotAgeSeconds": (age * 1000.0).round() / 1000.0,
        "pollIntervalSeconds": interval,
        // What a scrape costs Prometheus and the network (uncompressed bytes).
        "pageSeries": page.series,
        "pageBytes": page.text.len(),
        "audit": match &audit.failing {
            None => json!({"status": "ok"}),
            Some(reason) => json!({"status": "failing", "reason": reason}),
        },
    })
}

fn checks(s: &Snapshot, h: &NodeHealth) -> Value {
    let mut map = Map::new();
    for g in &s.gpus {
        map.insert(
            format!("gpu:{}", g.index),
            Value::Array(vec![gpu_check(g, &gpu_verdict(h, g), s.taken_at)]),
        );
    }
    Value::Object(map)
}

/// The evaluator's verdict for `g`; a GPU it has not judged (cannot happen once NVML is up,
/// since both come from the same poll) passes with no conditions.
fn gpu_verdict(h: &NodeHealth, g: &GpuSnapshot) -> GpuVerdict {
    h.gpu(g.index)
        .map_or_else(|| GpuVerdict::new(Vec::new()), |x| x.verdict.clone())
}

fn gpu_check(g: &GpuSnapshot, v: &GpuVerdict, at: SystemTime) -> Value {
    let mut check = json!({
        "componentId": g.uuid(),
        "componentType": "gpu",
        "status": v.status,
        "time": rfc3339(at),
        "action": v.action,
        "conditions": v.conditions,
    });
    // Left out until read (see `GpuIdentity::labels_known`), rather than shown as "".
    if let Some(id) = g.identity.as_ref().filter(|id| id.labels_known()) {
        check["name"] = json!(id.name);
        check["pciBusId"] = json!(id.pci_bus_id);
    }
    if v.status != Status::Pass {
        let output: Vec<&str> = v.conditions.iter().map(|c| c.reason.as_str()).collect();
        check["output"] = json!(output.join("; "));
    }
    check
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}
