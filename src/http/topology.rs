//! `GET /api/v1/topology`: how the GPUs connect, pair by pair (`nvlink`, `pcie_switch`,
//! `host_bridge`, `system`), with each GPU's NVLink peers, from the published snapshot. For a
//! scheduler extension choosing GPUs that train fast together. Read-only, so it needs no token.
//! 503 with the reason until the topology has been read.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::AppState;

pub(super) async fn topology(State(state): State<AppState>) -> Response {
    let latest = state.latest();
    let Some(t) = latest.snapshot.topology.clone() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the GPU topology has not been read yet (NVML not up, or no GPU readable)\n",
        )
            .into_response();
    };
    let gpus: Vec<serde_json::Value> = t
        .gpus
        .iter()
        .map(|g| {
            json!({
                "index": g.index,
                "uuid": g.uuid,
                "nvlink_peers": t.nvlink_peers(g.index),
            })
        })
        .collect();
    let pairs: Vec<serde_json::Value> = t
        .pairs
        .iter()
        .map(|p| json!({ "gpus": [p.a, p.b], "link": p.link }))
        .collect();
    Json(json!({ "gpus": gpus, "pairs": pairs })).into_response()
}
