//! A hand-built agent state for tests that go through the router without a poller: fixed
//! GPUs, health evaluated over them, the page rendered. The crate's own HTTP tests and the fuzz
//! targets (`fuzz/`, with the `fixture` feature) share it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::{api, AppFields, AppState};
use crate::health::{Evaluator, HealthConfig, Journal};
use crate::metrics::{self, RenderConfig};
use crate::publication::Published;
use crate::snapshot::{GpuIdentity, GpuReading, GpuSnapshot, GpuStatus, NvmlStatus, Snapshot};
use crate::AgentCounters;

/// An H100 at `index`, 50 % busy.
pub fn gpu(index: u32, status: GpuStatus) -> GpuSnapshot {
    GpuSnapshot {
        index,
        identity: Some(Arc::new(GpuIdentity {
            index,
            uuid: format!("GPU-{index:08}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
            ..GpuIdentity::default()
        })),
        status,
        reading: GpuReading {
            gpu_util_percent: Some(50),
            ..GpuReading::default()
        },
        failed_calls: 0,
        failing_runs: 0,
        xids: BTreeMap::new(),
        last_xid: None,
    }
}

/// The state of an agent whose newest snapshot is `age` old.
pub fn state(nvml: NvmlStatus, gpus: Vec<GpuSnapshot>, age: Duration) -> AppState {
    AppState::new(fields(nvml, gpus, age))
}

/// The fields of [`state`], for tests that set more of them. The publication's sender is leaked: it
/// stays open, as the poller's does, for the life of the process.
pub fn fields(nvml: NvmlStatus, gpus: Vec<GpuSnapshot>, age: Duration) -> AppFields {
    let now = SystemTime::now();
    let mut snapshot = Snapshot::starting(now - age);
    snapshot.nvml = nvml;
    snapshot.gpus = gpus;
    let (health, _) = Evaluator::new(HealthConfig::default()).evaluate(&snapshot, now - age);
    let render = RenderConfig {
        dcgm: true,
        native: true,
        hostname: "node-1".into(),
        hostname_label: "Hostname".into(),
        nvlink_links: false,
        // Everything on the page, as the router and fuzz tests were written against.
        profile: metrics::Profile::Full,
        names: metrics::DcgmNames::V48,
        labelled: Default::default(),
    };
    let page = metrics::render(&snapshot, &health, &render, &AgentCounters::new(), &[]);
    let published = Published {
        snapshot: Arc::new(snapshot),
        health: Arc::new(health),
        journal: Arc::new(Mutex::new(Journal::default())),
        page,
        interval: Duration::from_secs(5),
    };
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(published));
    std::mem::forget(tx);
    AppFields {
        published: rx,
        api: api::ApiConfig::disabled(),
        changes: None,
        sharing: None,
        remediation: None,
        reclaim: None,
        jobs: None,
        audit_file: None,
    }
}
