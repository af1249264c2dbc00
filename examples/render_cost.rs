//! What keeping the rules' label pairs on the page costs: render time and bytes per
//! publication, keeping none, the shipped rules' names, or every name on the page. The page is
//! the demo's GPUs without NVLink (8×H100 `tests/scenarios/dgx-h100.toml`, through the simulated
//! NVML and the real poller), at the default lean profile, or the full one with `-- --full`.
//!
//! `cargo build -p nvml-sim && cargo run --release --features fixture --example render_cost`
//! (BENCHMARKS.md).

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_steward::health::Journal;
use gpu_steward::metrics::{self, RenderConfig};
use gpu_steward::poller::{self, FromActors, PollerConfig};
use gpu_steward::rules::RuleSet;
use gpu_steward::AgentCounters;

fn main() {
    let state = tempfile::tempdir().expect("a temporary folder");
    let scenario = state.path().join("dgx-h100.toml");
    // The demo's GPUs without NVLink, as the BENCHMARKS.md table was measured.
    std::fs::write(&scenario, include_str!("../tests/scenarios/dgx-h100.toml"))
        .expect("the scenario");
    let sim = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debug/libnvml_sim.so");
    let sim = gpu_steward::demo::simulate(&scenario, Some(&sim.display().to_string()))
        .expect("the simulator (cargo build -p nvml-sim)");
    let base = RenderConfig {
        dcgm: true,
        native: true,
        hostname: "node-1".into(),
        hostname_label: "Hostname".into(),
        nvlink_links: false,
        profile: if std::env::args().any(|a| a == "--full") {
            metrics::Profile::Full
        } else {
            metrics::Profile::default()
        },
        names: metrics::DcgmNames::default(),
        labelled: Arc::default(),
    };
    let config = PollerConfig {
        nvml_lib: sim.nvml_lib.clone(),
        interval: Duration::from_millis(200),
        slow_interval: Duration::from_millis(200),
        expensive_interval: Duration::from_millis(200),
        profiling_interval: Duration::from_millis(200),
        render: base.clone(),
        health: Default::default(),
        processes: Default::default(),
        kubelet: None,
        sharing: None,
    };
    let counters = Arc::new(AgentCounters::new());
    let journal = Arc::new(Mutex::new(Journal::default()));
    let first = {
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(dummy(&base, &counters)));
        let handle = poller::spawn(config, counters.clone(), journal, FromActors::default(), tx)
            .expect("the poller");
        // A few polls: the slow and expensive tiers and the GPM window are filled.
        std::thread::sleep(Duration::from_secs(3));
        let p = rx.borrow().clone();
        handle.stop();
        p
    };
    // Every shipped alerting file (the recording rules are Prometheus's).
    let files = [
        "gpu-steward",
        "gpu-steward-nvlink",
        "gpu-steward-operations",
    ]
    .map(|f| format!("{}/alerts/{f}.rules.yml", env!("CARGO_MANIFEST_DIR")));
    let rules = RuleSet::load(&files).expect("the shipped rules");
    let render =
        |c: &RenderConfig| metrics::render(&first.snapshot, &first.health, c, &counters, &[]);
    let all: HashSet<String> = render(&base)
        .samples()
        .map(|s| s.name.to_string())
        .collect();
    for (what, names) in [
        ("none", HashSet::new()),
        ("the shipped rules' names", rules.needs.names.clone()),
        ("every name", all),
    ] {
        let c = RenderConfig {
            labelled: Arc::new(names),
            ..base.clone()
        };
        let page = render(&c);
        let kept = page.label_sets();
        const N: usize = 2000;
        let mut times: Vec<Duration> = Vec::with_capacity(N);
        for _ in 0..N {
            let t = Instant::now();
            std::hint::black_box(render(&c));
            times.push(t.elapsed());
        }
        times.sort();
        println!(
            "labels kept for {what}: {} of {} series, {} bytes ({} page bytes); render median {:?}, p90 {:?} ({N} renders)",
            kept.len(),
            page.series,
            kept.heap_bytes(),
            page.text.len(),
            times[N / 2],
            times[N * 9 / 10],
        );
    }
}

/// The publication before the first poll.
fn dummy(c: &RenderConfig, counters: &AgentCounters) -> gpu_steward::publication::Published {
    let snapshot = gpu_steward::snapshot::Snapshot::starting(std::time::SystemTime::now());
    let health = gpu_steward::health::NodeHealth::default();
    gpu_steward::publication::Published {
        page: metrics::render(&snapshot, &health, c, counters, &[]),
        snapshot: Arc::new(snapshot),
        health: Arc::new(health),
        journal: Arc::new(Mutex::new(Journal::default())),
        interval: Duration::from_secs(1),
    }
}
