//! The simulator's cost table prices every NVML function the agent calls.
//!
//! The cost benches (benches/poll_cost.py) are only as true as `nvml-sim/costs/` is whole: a
//! function the agent calls that the table leaves out costs nothing there, as
//! `nvmlGpmMetricsGet` (1.0-1.45 ms of CPU on a real H200) did. Each test runs the real agent on
//! a node with `NVML_SIM_STATS`, stops it (the simulator writes its counts at the last
//! `nvmlShutdown`), and compares the functions called with the table's keys. It must not
//! exercise the mutating API: only what an agent does on its own is priced here.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::{scenario, wait_for, Agent};

/// The table the benches load (`NVML_SIM_COST`).
fn priced() -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("nvml-sim/costs/h100-driver-580.json");
    let text = std::fs::read_to_string(&path).expect("read the cost table");
    let v: serde_json::Value = serde_json::from_str(&text).expect("cost table is JSON");
    v["functions"]
        .as_object()
        .expect("a 'functions' object")
        .keys()
        .cloned()
        .collect()
}

/// Runs the agent on `text` (a scenario) for `polls` polls of 200 ms, every tier and the
/// profiling window at every poll, then stops it; returns the functions NVML counted.
fn called(agent: common::AgentBuilder, polls: u64) -> BTreeSet<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let stats = dir.path().join("stats.json");
    let mut agent = agent
        .env("NVML_SIM_STATS", &stats.display().to_string())
        .start();
    let count = |f: &str| -> u64 {
        let read = || -> Option<u64> {
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&stats).ok()?).ok()?;
            v.get(f)?.as_u64()
        };
        read().unwrap_or(0)
    };
    // The count file is written at most once a second: wait until it shows enough polls.
    wait_for("polls counted", Duration::from_secs(30), || {
        (count("nvmlDeviceGetCount_v2") >= polls).then_some(())
    });
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(agent.wait_exit(Duration::from_secs(15)).success());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).expect("stats written"))
            .expect("stats are JSON");
    v.as_object()
        .expect("an object of counts")
        .iter()
        .filter(|(_, n)| n.as_u64().unwrap_or(0) > 0)
        .map(|(f, _)| f.clone())
        .collect()
}

fn assert_priced(node: &str, calls: &BTreeSet<String>) {
    let table = priced();
    let missing: Vec<&String> = calls.iter().filter(|f| !table.contains(*f)).collect();
    assert!(
        missing.is_empty(),
        "on {node} the agent calls NVML functions nvml-sim/costs/h100-driver-580.json does not \
         price: {missing:?}; add each with its measured cost (see nvml-sim/costs/README.md)"
    );
}

#[test]
fn every_call_on_the_demo_node_is_priced() {
    // The default configuration but a profiling window of one poll, so that two GPM samples
    // fall in the run (everything else is read at the first poll).
    let demo = Agent::with_scenario("")
        .demo()
        .config("[poller]\nprofiling_interval = \"200ms\"\n");
    let calls = called(demo, 10);
    // What the table was missing before: it must be both called and priced now.
    assert!(calls.contains("nvmlGpmMetricsGet"), "{calls:?}");
    assert_priced("the demo (8×H100)", &calls);
}

#[test]
fn every_call_on_the_hgx_node_is_priced() {
    let calls = called(Agent::with_scenario(&scenario("hgx-h100.toml")), 10);
    assert!(calls.contains("nvmlDeviceGetFieldValues"), "{calls:?}");
    assert_priced("the HGX H100 node (NVLink)", &calls);
}

#[test]
fn every_call_on_mig_nodes_is_priced() {
    let calls = called(Agent::with_scenario(&scenario("a100-mig.toml")), 10);
    assert_priced("the A100 MIG node", &calls);
    let h100 = "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nmig_mode = true\n\
                mig_devices = [\"3g.40gb\", \"2g.20gb\"]\n";
    let calls = called(Agent::with_scenario(h100), 10);
    assert!(calls.contains("nvmlGpmMigSampleGet"), "{calls:?}");
    assert_priced("an H100 in MIG mode", &calls);
}
