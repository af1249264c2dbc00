//! HTTP request handling on arbitrary bytes: whatever a client sends on a connection, hyper (with
//! the agent's head limits) and the agent's router must answer with well-formed HTTP/1.x or
//! close, never panic, and never take more than the head limit into memory for a request.
#![no_main]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use gpu_steward::health::{Evaluator, HealthConfig, Journal};
use gpu_steward::http::{api, router, server::MAX_HEAD_BYTES, AppFields, AppState};
use gpu_steward::metrics::{self, RenderConfig};
use gpu_steward::poller::Published;
use gpu_steward::snapshot::{
    GpuIdentity, GpuReading, GpuSnapshot, GpuStatus, NvmlStatus, Snapshot,
};
use gpu_steward::AgentCounters;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn state() -> AppState {
    let now = SystemTime::now();
    let mut snapshot = Snapshot::starting(now);
    snapshot.nvml = NvmlStatus::Up;
    snapshot.gpus = (0..2)
        .map(|index| GpuSnapshot {
            index,
            identity: Some(Arc::new(GpuIdentity {
                index,
                uuid: format!("GPU-{index:08}"),
                name: "NVIDIA H100 80GB HBM3".into(),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
                ..GpuIdentity::default()
            })),
            status: GpuStatus::Up,
            reading: GpuReading {
                gpu_util_percent: Some(50),
                ..GpuReading::default()
            },
            failed_calls: 0,
            failing_runs: 0,
            xids: BTreeMap::new(),
            last_xid: None,
        })
        .collect();
    let (health, _) = Evaluator::new(HealthConfig::default()).evaluate(&snapshot, now);
    let render = RenderConfig {
        dcgm: true,
        native: true,
        hostname: "node-1".into(),
        hostname_label: "Hostname".into(),
    };
    let metrics = metrics::render(&snapshot, &health, &render, &AgentCounters::new());
    let published = Published {
        snapshot: Arc::new(snapshot),
        health: Arc::new(health),
        journal: Arc::new(Mutex::new(Journal::default())),
        metrics,
        interval: Duration::from_secs(5),
        reclaim: None,
    };
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(published));
    std::mem::forget(tx);
    AppState::new(AppFields {
        published: rx,
        api: api::ApiConfig::disabled(),
        mig: None,
        sharing: None,
        rules: None,
        remediation: None,
    })
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    static STATE: OnceLock<AppState> = OnceLock::new();
    let state = STATE.get_or_init(state).clone();
    runtime().block_on(async move {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .max_buf_size(MAX_HEAD_BYTES)
            .max_header_size(MAX_HEAD_BYTES);
        let service = TowerToHyperService::new(router(state));
        let conn = tokio::spawn(async move {
            let _ = builder
                .serve_connection(TokioIo::new(server), service)
                .await;
        });
        let _ = client.write_all(data).await;
        let _ = client.shutdown().await;
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "the server neither answered nor closed");
        if !out.is_empty() {
            assert!(
                out.starts_with(b"HTTP/1.1 ") || out.starts_with(b"HTTP/1.0 "),
                "not an HTTP answer: {:?}",
                String::from_utf8_lossy(&out[..out.len().min(80)])
            );
        }
        let _ = conn.await;
    });
});
