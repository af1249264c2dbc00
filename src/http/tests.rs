//! Router tests through `Router::oneshot`: hand-built snapshots, no socket, no NVML.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

use super::fixture::{fields, gpu, state};
use super::{api, router, AppState};
use crate::snapshot::{GpuStatus, NvmlStatus};

async fn call(state: AppState, method: &str, path: &str) -> (StatusCode, String) {
    let response = router(state)
        .oneshot(
            Request::builder()
                .method(method)
                .uri(path)
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("infallible");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 24)
        .await
        .expect("body");
    (status, String::from_utf8_lossy(&bytes).to_string())
}

pub(super) fn healthy() -> AppState {
    state(
        NvmlStatus::Up,
        vec![gpu(0, GpuStatus::Up), gpu(1, GpuStatus::Up)],
        Duration::ZERO,
    )
}

#[tokio::test]
async fn metrics_serve_the_page_rendered_at_the_poll() {
    let state = healthy();
    let (status, body) = call(state.clone(), "GET", "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("DCGM_FI_DEV_GPU_UTIL{gpu=\"1\""), "{body}");
    assert!(body.contains("gpu_steward_gpu_utilization_ratio{gpu=\"0\",uuid=\"GPU-00000000\"} 0.5"));
    assert!(body.ends_with('\n'));
    // Byte for byte the publication's page: nothing is added per scrape.
    assert_eq!(body.as_bytes(), &state.latest().page.text[..]);
    assert!(body.contains("\ngpu_steward_snapshot_timestamp_seconds "));
}

#[tokio::test]
async fn a_gzip_scrape_gets_the_same_page_compressed_once_per_publication() {
    use std::io::Read;
    let state = healthy();
    assert!(!state.latest().page.gzip_ready());
    let ask = || {
        Request::builder()
            .uri("/metrics")
            .header("accept-encoding", "gzip, deflate")
            .body(Body::empty())
            .expect("request")
    };
    let first = router(state.clone())
        .oneshot(ask())
        .await
        .expect("infallible");
    assert_eq!(first.headers()["content-encoding"], "gzip");
    let first = axum::body::to_bytes(first.into_body(), 1 << 24)
        .await
        .expect("body");
    assert!(state.latest().page.gzip_ready());
    let second = router(state.clone())
        .oneshot(ask())
        .await
        .expect("infallible");
    let second = axum::body::to_bytes(second.into_body(), 1 << 24)
        .await
        .expect("body");
    assert_eq!(
        first.as_ptr(),
        second.as_ptr(),
        "the second scrape shares the first's copy"
    );
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(&first[..])
        .read_to_end(&mut text)
        .expect("valid gzip");
    assert_eq!(text, state.latest().page.text);
}

#[tokio::test]
async fn a_lost_gpu_fails_the_node_gate_but_not_the_agent() {
    let s = state(
        NvmlStatus::Up,
        vec![gpu(0, GpuStatus::Up), gpu(1, GpuStatus::Lost)],
        Duration::ZERO,
    );
    assert_eq!(call(s.clone(), "GET", "/readyz").await.0, StatusCode::OK);
    assert_eq!(call(s.clone(), "GET", "/health").await.0, StatusCode::OK);
    let (status, body) = call(s.clone(), "GET", "/health/gpus").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("gpu_lost"), "{body}");
    assert_eq!(
        call(s.clone(), "GET", "/health/gpus/0").await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(s, "GET", "/health/gpus/GPU-00000001").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn a_stale_snapshot_or_nvml_down_makes_the_agent_unready() {
    let stale = state(
        NvmlStatus::Up,
        vec![gpu(0, GpuStatus::Up)],
        Duration::from_secs(16),
    );
    let (status, body) = call(stale.clone(), "GET", "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("older than 3 poll intervals"), "{body}");
    assert_eq!(
        call(stale, "GET", "/health").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );

    let down = state(
        NvmlStatus::Down {
            reason: "driver not loaded".into(),
            error: crate::snapshot::NvmlCode::DriverNotLoaded,
            since: SystemTime::now(),
            attempts: 2,
        },
        Vec::new(),
        Duration::ZERO,
    );
    let (status, body) = call(down.clone(), "GET", "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("driver not loaded"), "{body}");
    assert_eq!(call(down.clone(), "GET", "/livez").await.0, StatusCode::OK);
    assert_eq!(
        call(down, "GET", "/health/gpus").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn unknown_paths_and_methods_get_reasons() {
    let (status, body) = call(healthy(), "GET", "/metricz").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("'/metricz'"), "{body}");
    let (status, body) = call(healthy(), "DELETE", "/health").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(body.contains("use GET"), "{body}");
    let (status, body) = call(healthy(), "GET", "/health/gpus/7").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("no GPU '7'"), "{body}");
}

#[test]
fn gzip_is_negotiated_from_accept_encoding() {
    let with = |v: &'static str| super::accepts_gzip(std::iter::once(v.as_bytes()));
    assert!(with("gzip"));
    assert!(with("deflate, gzip;q=0.5"));
    assert!(with("*"));
    assert!(!with("gzip;q=0"));
    assert!(!with("identity"));
    // Not visible ASCII: ignored, as `HeaderValue::to_str` refuses it.
    assert!(!with("gzip\u{e9}"));
    assert!(!super::accepts_gzip(std::iter::empty()));
    // Several headers are read together.
    assert!(super::accepts_gzip(
        [b"identity".as_slice(), b"gzip".as_slice()].into_iter()
    ));
}

/// One route that would change the node, behind the API guard, wired as `router` wires it.
fn guarded_app(config: Arc<api::ApiConfig>) -> axum::Router {
    let mut fields = fields(
        NvmlStatus::Up,
        vec![gpu(0, GpuStatus::Up), gpu(1, GpuStatus::Up)],
        Duration::ZERO,
    );
    fields.api = config.clone();
    axum::Router::new()
        .merge(api::mutating(axum::Router::new().route(
            "/api/v1/test/apply",
            axum::routing::post(|| async { "applied" }),
        )))
        .layer(axum::Extension(config))
        .with_state(AppState::new(fields))
}

/// The guard of docs/http.md ("The API token") on a route that would change the node: off → 404,
/// unusable token file → 503 with the reason, no or wrong token → 401, the right one → the
/// handler.
#[tokio::test]
async fn mutating_routes_need_the_api_switch_and_the_token() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "0123456789abcdef\n").expect("write");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let ask = |enabled: bool, auth: Option<&'static str>| {
        let config = Arc::new(api::ApiConfig {
            enabled,
            token_file: token_file.clone(),
            tcp: true,
            recorder: None,
        });
        let app = guarded_app(config);
        async move {
            let mut req = Request::builder().method("POST").uri("/api/v1/test/apply");
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let response = app
                .oneshot(req.body(Body::empty()).expect("request"))
                .await
                .expect("response");
            let status = response.status();
            let www = response.headers().get("www-authenticate").cloned();
            let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .expect("body");
            (status, String::from_utf8_lossy(&body).into_owned(), www)
        }
    };
    let (s, body, _) = ask(false, Some("Bearer 0123456789abcdef")).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains("[api] enabled"), "{body}");
    let (s, _, www) = ask(true, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(www.is_some(), "401 without WWW-Authenticate");
    let (s, body, _) = ask(true, Some("Bearer 0123456789abcdeF")).await;
    assert_eq!(
        (s, body.as_str()),
        (StatusCode::UNAUTHORIZED, "wrong token\n")
    );
    let (s, _, _) = ask(true, Some("Basic 0123456789abcdef")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, body, _) = ask(true, Some("bearer 0123456789abcdef")).await;
    assert_eq!((s, body.as_str()), (StatusCode::OK, "applied"));
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o604)).expect("chmod");
    let (s, body, _) = ask(true, Some("Bearer 0123456789abcdef")).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("chmod 600"), "{body}");
}

/// Over the Unix socket the kernel vouches for the peer: the agent's own user needs no token,
/// another user still does; with `tcp = false` the mutating routes are not on TCP at all.
#[tokio::test]
async fn the_socket_peer_and_the_tcp_switch_decide_like_the_token() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "0123456789abcdef\n").expect("write");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let me = nix::unistd::geteuid().as_raw();
    let ask = |tcp: bool, peer: Option<u32>, auth: Option<&'static str>| {
        let config = Arc::new(api::ApiConfig {
            enabled: true,
            token_file: token_file.clone(),
            tcp,
            recorder: None,
        });
        let app = guarded_app(config);
        async move {
            let mut req = Request::builder().method("POST").uri("/api/v1/test/apply");
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let mut req = req.body(Body::empty()).expect("request");
            if let Some(uid) = peer {
                req.extensions_mut().insert(api::SocketPeer { uid });
            }
            app.oneshot(req).await.expect("response").status()
        }
    };
    assert_eq!(ask(true, Some(me), None).await, StatusCode::OK);
    let stranger = me.wrapping_add(4242).max(1);
    assert_eq!(
        ask(true, Some(stranger), None).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        ask(true, Some(stranger), Some("Bearer 0123456789abcdef")).await,
        StatusCode::OK
    );
    assert_eq!(
        ask(false, None, Some("Bearer 0123456789abcdef")).await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(ask(false, Some(me), None).await, StatusCode::OK);
}

#[tokio::test]
async fn api_gpus_serves_each_gpu_as_plain_data_and_a_lost_one_keeps_its_uuid() {
    use crate::snapshot::{Attribution, GpuProcess, Memory, ProcessInfo, ProcessKind};
    let mut busy = gpu(0, GpuStatus::Up);
    busy.reading.memory = Some(Memory {
        total: 85_520_809_984,
        reserved: 555_745_280,
        used: 74_742_497_280,
        free: 10_222_567_424,
    });
    busy.reading.temperature_c = Some(64);
    busy.reading.power_mw = Some(618_250);
    busy.reading.processes = Some(vec![GpuProcess {
        pid: 31001,
        kind: ProcessKind::Compute,
        used_memory_bytes: Some(74_088_185_856),
        sm_util_percent: None,
        mem_util_percent: None,
        gpu_instance_id: None,
        compute_instance_id: None,
        info: Some(Arc::new(ProcessInfo {
            name: "python3".into(),
            user: "alice".into(),
            attribution: Attribution {
                slurm_job: Some("4242".into()),
                ..Attribution::default()
            },
        })),
    }]);
    let s = state(
        NvmlStatus::Up,
        vec![busy, gpu(1, GpuStatus::Lost)],
        Duration::ZERO,
    );
    let (status, body) = call(s, "GET", "/api/v1/gpus").await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let g0 = &v["gpus"][0];
    // The fixture's values, as set above and in `fixture::gpu`.
    assert_eq!(g0["index"], 0);
    assert_eq!(g0["uuid"], "GPU-00000000");
    assert_eq!(g0["model"], "NVIDIA H100 80GB HBM3");
    assert_eq!(g0["pci_bus_id"], "00000000:18:00.0");
    assert_eq!(g0["state"], "up");
    assert_eq!(g0["health"]["status"], "pass");
    assert_eq!(g0["utilization_percent"], 50);
    assert_eq!(g0["memory"]["total_bytes"], 85_520_809_984_u64);
    assert_eq!(g0["memory"]["used_bytes"], 74_742_497_280_u64);
    assert_eq!(g0["memory"]["free_bytes"], 10_222_567_424_u64);
    assert_eq!(g0["memory"]["reserved_bytes"], 555_745_280);
    assert_eq!(g0["temperature_celsius"], 64);
    assert_eq!(g0["power_watts"], 618.25);
    // Not read is null, never 0; no reclaim view, no idle time.
    assert!(g0["idle_seconds"].is_null() && g0["mig"].is_null(), "{g0}");
    let p = &g0["processes"][0];
    assert_eq!(
        (&p["pid"], &p["name"], &p["user"], &p["slurm_job"]),
        (
            &serde_json::json!(31001),
            &serde_json::json!("python3"),
            &serde_json::json!("alice"),
            &serde_json::json!("4242")
        )
    );
    assert_eq!(p["memory_bytes"], 74_088_185_856_u64);
    assert!(p["pod"].is_null(), "{p}");
    let g1 = &v["gpus"][1];
    assert_eq!(g1["state"], "lost");
    assert_eq!(g1["uuid"], "GPU-00000001");
    assert_eq!(g1["health"]["status"], "fail");
    assert_eq!(g1["health"]["conditions"][0]["name"], "gpu_lost");
}
