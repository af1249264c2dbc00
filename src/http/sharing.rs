//! `/api/v1/sharing`: the sharing settings and the last apply (read-only), and
//! `POST /api/v1/sharing/apply[?dry_run=true]` (mutating: behind `[api]` and its token).

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::AppState;

/// The configuration in force and the last apply's report.
pub(super) async fn show(State(state): State<AppState>) -> Response {
    let Some(sharing) = &state.sharing else {
        return (
            StatusCode::NOT_FOUND,
            "sharing is not running in this agent\n",
        )
            .into_response();
    };
    let status = sharing.status();
    let over: Vec<_> = status
        .over_limit
        .iter()
        .map(|o| {
            json!({"condition": "replica_memory_over_limit", "gpu": o.gpu, "uuid": o.uuid,
                   "pid": o.pid, "used_bytes": o.used_bytes, "limit_bytes": o.limit_bytes})
        })
        .collect();
    let plugin: Vec<_> = status
        .plugin
        .iter()
        .map(|p| {
            json!({"resource": p.resource, "registered": p.registered,
                   "healthy_devices": p.healthy_devices, "unhealthy_devices": p.unhealthy_devices})
        })
        .collect();
    Json(json!({
        "config": sharing.config(),
        "last_apply": sharing.last_report().as_deref(),
        "device_plugin": plugin,
        "device_plugin_mig_problem": status.plugin_notes.mig_problem,
        "cdi": status.plugin_notes.cdi,
        "over_limit": over,
    }))
    .into_response()
}

/// Observe → diff → apply now; 200 with the report when the node matches afterwards (or the
/// dry run could plan), 503 when its decision could not be written to the audit log (nothing
/// was changed), 500 with the report when it does not match.
pub(super) async fn apply(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let Some(sharing) = &state.sharing else {
        return (
            StatusCode::NOT_FOUND,
            "sharing is not running in this agent\n",
        )
            .into_response();
    };
    if let Some(key) = query.keys().find(|k| k.as_str() != "dry_run") {
        return (
            StatusCode::BAD_REQUEST,
            format!("unknown parameter '{key}'; the only one is dry_run=true|false\n"),
        )
            .into_response();
    }
    let dry_run = match query.get("dry_run").map(String::as_str) {
        None | Some("false") => false,
        Some("true") | Some("") => true,
        Some(other) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("invalid dry_run '{other}'; use true or false\n"),
            )
                .into_response()
        }
    };
    let report = sharing.apply("api", dry_run).await;
    let status = if report.ok {
        StatusCode::OK
    } else if report.busy {
        StatusCode::CONFLICT
    } else if report.audit_failed {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    (status, Json(report.as_ref().clone())).into_response()
}
