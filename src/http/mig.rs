//! `GET /api/v1/mig` (read-only: the MIG mode and instances per GPU from the published snapshot,
//! no token) and `POST /api/v1/mig/apply` (behind `api::mutating`: off unless `[api] enabled`,
//! then a bearer token). The apply body is `{"layout": "NAME", "dry_run": false, "force":
//! false}`; the answer is the apply report: 200 done or nothing to do (also for a dry run), 202
//! applied but a MIG mode change waits for a GPU reset, 400 bad body or unknown layout, 422
//! infeasible layout, 409 refused (processes in the way, a failed pre-apply hook), 500 a step
//! failed (`restored` says whether the found layout was put back).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use crate::changes::{MigApply, MigOutcome, MigReport};
use crate::snapshot::GpuStatus;

pub(super) async fn state(State(state): State<AppState>) -> Response {
    let published = state.latest();
    let gpus: Vec<_> = published
        .snapshot
        .gpus
        .iter()
        .filter(|g| g.status == GpuStatus::Up)
        .map(|g| {
            let r = &g.reading;
            let mig = match (r.mig_mode_current, r.mig_mode_pending) {
                (Some(current), Some(pending)) => json!({"current": current, "pending": pending}),
                _ => serde_json::Value::Null,
            };
            json!({
                "index": g.index,
                "uuid": g.uuid(),
                "mig": mig,
                "instances": r.mig_instances.clone().unwrap_or_default(),
            })
        })
        .collect();
    Json(json!({ "taken_at": humantime::format_rfc3339_millis(published.snapshot.taken_at).to_string(), "gpus": gpus }))
        .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApplyBody {
    layout: String,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    force: bool,
}

pub(super) async fn apply(State(state): State<AppState>, body: Bytes) -> Response {
    let Some(owner) = state.changes.clone() else {
        return (StatusCode::NOT_FOUND, "MIG management is not running\n").into_response();
    };
    let req: ApplyBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!(
                    "bad body: {e}; send {{\"layout\": \"NAME\", \"dry_run\": false, \"force\": false}}\n"
                ),
            )
                .into_response()
        }
    };
    let change = MigApply::configured(&req.layout, req.dry_run, req.force, "api");
    let report = match owner.call(change).await {
        Some(r) => MigReport::new(&req.layout, r),
        None => {
            return (StatusCode::INTERNAL_SERVER_ERROR, "the apply task failed\n").into_response()
        }
    };
    let status = match report.outcome {
        MigOutcome::NothingToDo | MigOutcome::DryRun | MigOutcome::Applied => StatusCode::OK,
        MigOutcome::PendingReset => StatusCode::ACCEPTED,
        MigOutcome::BadRequest => StatusCode::BAD_REQUEST,
        MigOutcome::Infeasible => StatusCode::UNPROCESSABLE_ENTITY,
        MigOutcome::Refused | MigOutcome::Busy => StatusCode::CONFLICT,
        // The agent's disk, not the request: retry once the audit log can be written.
        MigOutcome::AuditFailed => StatusCode::SERVICE_UNAVAILABLE,
        MigOutcome::Failed => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, Json(report)).into_response()
}
