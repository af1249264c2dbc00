//! `POST /api/v1/alertmanager`: Alertmanager's webhook (payload version 4). Behind the API
//! token ([`super::api::mutating`]); answers 202 as soon as the alerts are queued, and the
//! routes run asynchronously, so that Alertmanager's own timeout never waits on a hook.
//! A malformed body gets 400 with the reason and nothing is queued.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::remediation::alert::WebhookPayload;
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
    match remediation.submit(alerts, Source::Alertmanager) {
        Ok(()) => (StatusCode::ACCEPTED, Json(json!({ "accepted": n }))).into_response(),
        Err(dropped) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("remediation queue full: {dropped} of {n} alerts not accepted; retry later\n"),
        )
            .into_response(),
    }
}
