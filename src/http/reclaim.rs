//! `GET /api/v1/reclaim`: the idle-GPU candidates, what is exempt and what happens when.
//! Read-only, so it needs no token (docs/http.md); reclaim itself is configured, not requested.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::AppState;

pub(super) async fn reclaim(State(state): State<AppState>) -> Response {
    let view = state.reclaim.as_ref().and_then(|r| r.borrow().clone());
    let Some(view) = view.as_deref() else {
        return Json(json!({"enabled": false, "reason": "no poll yet", "candidates": []}))
            .into_response();
    };
    let c = &view.config;
    Json(json!({
        "enabled": c.enabled,
        "dry_run": view.dry_run,
        "taken_at": humantime::format_rfc3339_millis(view.taken_at).to_string(),
        "action": c.action.as_str(),
        "idle_after_seconds": c.idle_after.as_secs_f64(),
        "utilization_threshold": c.utilization_threshold,
        "min_memory_mib": c.min_memory_mib,
        "grace_seconds": c.grace.as_secs_f64(),
        "warn_grace_seconds": c.warn.as_ref().map(|w| w.grace.as_secs_f64()),
        "max_reclaims_per_hour": c.max_reclaims_per_hour,
        "reclaims_last_hour": view.reclaims_last_hour,
        "audit_log": match &view.audit {
            Ok(path) => json!({"path": path}),
            Err(e) => json!({"error": e}),
        },
        "pod_labels": view.pod_labels.as_ref().map(|(up, errors, socket)| {
            json!({"up": up, "errors": errors, "socket": socket})
        }),
        "candidates": view.candidates,
    }))
    .into_response()
}
