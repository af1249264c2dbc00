//! `GET /api/v1/events`: the health event journal, newest first, optionally `?since=` an
//! RFC 3339 time or Unix seconds, and the path of the agent's audit log (`audit_log`).
//! Read-only, so it needs no token (docs/http.md).

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::AppState;
use crate::health::journal::parse_since;

pub(super) async fn events(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let since = match query.get("since").map(|s| parse_since(s)) {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(reason)) => {
            return (StatusCode::BAD_REQUEST, format!("{reason}\n")).into_response()
        }
    };
    let journal = state.latest().journal.clone();
    // The lock is held only to copy the entries out.
    let events = journal
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .since(since);
    // Where this agent's changes are recorded, for `gpu-steward status` on the same machine.
    Json(json!({ "events": events, "audit_log": state.audit_file })).into_response()
}
