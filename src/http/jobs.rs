//! `GET /api/v1/jobs/{kind}/...`: what one owner used of its GPUs (src/jobs). Read-only, so
//! it needs no token (docs/http.md). Paths: `slurm/{id}`, `pod/{namespace}/{name}` (`-` as the
//! namespace for a pod known only by its UID), `unit/{unit}`, `user/{user}`. An owner this agent
//! has no report of answers 404 with one line of JSON saying so.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::AppState;
use crate::reclaim::accounting::OwnerKind;
use crate::reclaim::jobs::Key;

fn answer(state: &AppState, key: Key) -> Response {
    let Some(jobs) = &state.jobs else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "job reports are not kept by this agent"})),
        )
            .into_response();
    };
    match jobs.get(&key) {
        Some(r) => Json(r).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": format!(
                "no report of {} on this node: it held none of this node's GPUs while the agent \
                 watched in the last {} days (the agent keeps up to {} reports)",
                key.describe(),
                crate::reclaim::jobs::KEEP.as_secs() / 86_400,
                crate::reclaim::jobs::MAX_REPORTS
            )})),
        )
            .into_response(),
    }
}

fn key(kind: OwnerKind, namespace: &str, id: String) -> Key {
    Key {
        kind,
        namespace: namespace.to_string(),
        id,
    }
}

pub(super) async fn slurm(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    answer(&state, key(OwnerKind::SlurmJob, "", id))
}

pub(super) async fn pod(
    State(state): State<AppState>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let namespace = if namespace == "-" { "" } else { &namespace };
    answer(&state, key(OwnerKind::Pod, namespace, name))
}

pub(super) async fn unit(State(state): State<AppState>, Path(unit): Path<String>) -> Response {
    answer(&state, key(OwnerKind::SystemdUnit, "", unit))
}

pub(super) async fn user(State(state): State<AppState>, Path(user): Path<String>) -> Response {
    answer(&state, key(OwnerKind::User, "", user))
}
