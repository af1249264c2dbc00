//! What the HTTP fuzz targets share: the agent's state over a fixed 2-GPU snapshot.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use gpu_steward::health::{Evaluator, HealthConfig, Journal};
use gpu_steward::http::{api, AppFields, AppState};
use gpu_steward::metrics::{self, RenderConfig};
use gpu_steward::poller::Published;
use gpu_steward::snapshot::{
    GpuIdentity, GpuReading, GpuSnapshot, GpuStatus, NvmlStatus, Snapshot,
};
use gpu_steward::AgentCounters;

pub fn state() -> AppState {
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
        ahead: Arc::new(gpu_steward::http::ahead::Ahead::new(Arc::default())),
    })
}
