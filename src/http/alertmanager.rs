//! `POST /api/v1/alertmanager`: Alertmanager's webhook (payload version 4). Behind the API
//! token ([`super::api::mutating`]); answers 202 as soon as the alerts are queued, and the
//! routes run asynchronously, so that Alertmanager's own timeout never waits on a hook.
//! A malformed body gets 400 with the reason and nothing is queued. A batch is queued whole or
//! not at all: 503 while the queue is busy (Alertmanager retries the whole batch), 413 for a
//! batch larger than the queue (set `max_alerts` in Alertmanager's `webhook_config`), 503 when
//! its receipt cannot be recorded in the audit log (a full disk: nothing it asks for could be).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::remediation::alert::WebhookPayload;
use crate::remediation::dispatch::Refused;
use crate::remediation::Source;

use super::AppState;

pub async fn receive(State(state): State<AppState>, body: Bytes) -> Response {
    let alerts = match WebhookPayload::parse(&body) {
        Ok(a) => a,
        Err(reason) => return (StatusCode::BAD_REQUEST, format!("{reason}\n")).into_response(),
    };
    let Some(remediation) = &state.remediation else {
        return (
            StatusCode::NOT_FOUND,
            "remediation is not running in this agent\n",
        )
            .into_response();
    };
    let n = alerts.len();
    // Recording the batch's receipt syncs the audit log: off the async workers.
    let handle = remediation.clone();
    let submitted =
        tokio::task::spawn_blocking(move || handle.submit(alerts, Source::Alertmanager)).await;
    let Ok(submitted) = submitted else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the webhook batch could not be handed to remediation; retry\n",
        )
            .into_response();
    };
    match submitted {
        Ok(()) => (StatusCode::ACCEPTED, Json(json!({ "accepted": n }))).into_response(),
        Err(e) => {
            let code = match e {
                Refused::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                Refused::Full { .. } | Refused::Unrecorded { .. } => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
            };
            tracing::warn!(
                alerts = n,
                status = code.as_u16(),
                "webhook batch refused: {e}"
            );
            (code, format!("{e}\n")).into_response()
        }
    }
}
