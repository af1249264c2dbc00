//! XIDs and identity across the GPU set changing under the agent: counts follow the board (its
//! UUID) through re-enumeration, one event set per NVML session takes GPUs that become
//! reachable, "not supported" registration is not a failure, and identity fields that failed
//! are read again.

mod common;

use std::time::Duration;

use common::{first, scenario, wait_for, with_event, with_gpu, Agent, Metrics};

const XID48: &str = "[[gpu.event]]\nid = 1\nxid = 48\n";

fn xid_total(m: &Metrics, gpu: &str, xid: &str) -> Option<f64> {
    m.value(
        "gpu_steward_xid_errors_total",
        &[("gpu", gpu), ("xid", xid)],
    )
}

fn polls(agent: &Agent) -> f64 {
    agent.metrics().get("gpu_steward_polls_total", &[])
}

/// Call counts from the simulator's stats file, once it shows at least `registrations`.
fn call_counts(stats: &std::path::Path, registrations: u64) -> (u64, u64) {
    wait_for("call statistics", Duration::from_secs(5), || {
        let text = std::fs::read_to_string(stats).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        let created = v.get("nvmlEventSetCreate")?.as_u64()?;
        let registered = v.get("nvmlDeviceRegisterEvents")?.as_u64()?;
        (registered >= registrations).then_some((created, registered))
    })
}

#[test]
fn xid_counts_follow_the_board_across_re_enumeration() {
    let text = with_event(&scenario("dgx-h100.toml"), 1, XID48);
    let agent = Agent::with_scenario(&text).start();
    wait_for("XID 48 on GPU 1", Duration::from_secs(10), || {
        (xid_total(&agent.metrics(), "1", "48") == Some(1.0)).then_some(())
    });
    let uuid =
        agent.metrics().find("gpu_steward_gpu_up", &[("gpu", "1")])[0].labels["uuid"].clone();
    // The log line names the GPU by its index, not the Rust `Option` around it.
    let log = agent.log();
    let line = log
        .lines()
        .find(|l| l.contains("XID event"))
        .unwrap_or_default();
    assert!(line.contains("gpu=1"), "{log}");
    assert!(!line.contains("Some("), "{line}");

    // Four GPUs unbound, then back: GPU 1 stays the same board throughout.
    for (step, gpus) in [("four GPUs", 4usize), ("eight GPUs", 8)] {
        let text = if gpus == 4 { first(&text, 4) } else { &text };
        agent.rewrite_scenario(text);
        wait_for(step, Duration::from_secs(5), || {
            (agent.metrics().value("gpu_steward_gpus", &[]) == Some(gpus as f64)).then_some(())
        });
        let start = polls(&agent);
        while polls(&agent) < start + 5.0 {
            let m = agent.metrics();
            assert_eq!(
                m.value(
                    "gpu_steward_xid_errors_total",
                    &[("gpu", "1"), ("uuid", &uuid), ("xid", "48")]
                ),
                Some(1.0),
                "{step}: the counter never goes back or up"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let one = agent.get("/health/gpus/1").json();
    let output = one["output"].as_str().unwrap_or_default().to_string();
    assert!(
        output.contains("XID 48") && output.contains("seen 1 time(s)"),
        "{one}"
    );
    assert!(!output.contains("escalated"), "{one}");
    let events = agent.get("/api/v1/events").json();
    let observed = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["condition"] == "xid_48" && e["kind"] == "observed")
        .count();
    assert_eq!(observed, 1, "{events}");
}

#[test]
fn gpus_that_become_reachable_join_the_one_event_set() {
    let text = scenario("dgx-h100.toml");
    let unreachable = with_gpu(
        &text,
        2,
        "errors = { nvmlDeviceGetHandleByIndex_v2 = \"UNKNOWN\" }",
    );
    let stats = tempfile::NamedTempFile::new().expect("stats file");
    let agent = Agent::with_scenario(&unreachable)
        .env("NVML_SIM_STATS", &stats.path().display().to_string())
        .start();
    assert_eq!(
        agent.metrics().value("gpu_steward_gpu_up", &[("gpu", "2")]),
        Some(0.0)
    );
    // GPU 2 answers again, and has an XID: it is registered on the existing set.
    let text = with_event(&text, 2, "[[gpu.event]]\nid = 1\nxid = 13\n");
    agent.rewrite_scenario(&text);
    wait_for("XID 13 on GPU 2", Duration::from_secs(10), || {
        (xid_total(&agent.metrics(), "2", "13") == Some(1.0)).then_some(())
    });
    // Four GPUs go and come back: the set stays, and still delivers for GPU 5.
    agent.rewrite_scenario(first(&text, 4));
    wait_for("four GPUs", Duration::from_secs(5), || {
        (agent.metrics().value("gpu_steward_gpus", &[]) == Some(4.0)).then_some(())
    });
    agent.rewrite_scenario(&text);
    wait_for("eight GPUs", Duration::from_secs(5), || {
        (agent.metrics().find("DCGM_FI_DEV_GPU_UTIL", &[]).len() == 8).then_some(())
    });
    agent.rewrite_scenario(&with_event(&text, 5, XID48));
    wait_for("XID 48 on GPU 5", Duration::from_secs(10), || {
        (xid_total(&agent.metrics(), "5", "48") == Some(1.0)).then_some(())
    });
    let (created, registered) = call_counts(stats.path(), 8);
    assert_eq!(
        (created, registered),
        (1, 8),
        "one event set for the session, each GPU registered once"
    );
    assert_eq!(xid_total(&agent.metrics(), "2", "13"), Some(1.0));
}

#[test]
fn xid_registration_not_supported_anywhere_is_not_a_failure() {
    let text = scenario("dgx-h100.toml");
    let refusing = (0..8).fold(text.clone(), |t, i| {
        with_gpu(&t, i, "unsupported = [\"nvmlDeviceRegisterEvents\"]")
    });
    let stats = tempfile::NamedTempFile::new().expect("stats file");
    let agent = Agent::with_scenario(&refusing)
        .env("NVML_SIM_STATS", &stats.path().display().to_string())
        .start();
    let start = polls(&agent);
    wait_for("five more polls", Duration::from_secs(10), || {
        (polls(&agent) >= start + 5.0).then_some(())
    });
    let m = agent.metrics();
    assert_eq!(
        m.get("gpu_steward_poll_source_success", &[("source", "events")]),
        1.0
    );
    let health = agent.get("/health");
    assert_eq!(health.json()["status"], "pass", "{}", health.text());
    assert_eq!(call_counts(stats.path(), 8), (1, 8), "asked once each");
}

#[test]
fn identity_that_failed_is_read_again_and_never_rendered_empty() {
    let text = scenario("dgx-h100.toml");
    let failing = with_gpu(
        &text,
        0,
        "errors = { nvmlDeviceGetName = \"UNKNOWN\", nvmlDeviceGetPciInfo_v3 = \"UNKNOWN\" }",
    );
    let agent = Agent::with_scenario(&failing).start();
    let m = agent.metrics();
    assert_eq!(m.get("gpu_steward_gpu_up", &[("gpu", "0")]), 1.0);
    assert!(m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")]).is_empty());
    assert!(m.find("gpu_steward_gpu_info", &[("gpu", "0")]).is_empty());
    assert_eq!(m.find("DCGM_FI_DEV_GPU_UTIL", &[]).len(), 7);
    assert!(m
        .find("DCGM_FI_DEV_GPU_UTIL", &[("modelName", "")])
        .is_empty());
    assert!(
        m.get(
            "gpu_steward_nvml_errors_total",
            &[("function", "nvmlDeviceGetName"), ("error", "unknown")]
        ) >= 1.0
    );

    agent.rewrite_scenario(&text);
    let m = wait_for("GPU 0 in the dcgm family", Duration::from_secs(10), || {
        let m = agent.metrics();
        (!m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")]).is_empty()).then_some(m)
    });
    let util = m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")]);
    assert_eq!(util[0].labels["modelName"], "NVIDIA H100 80GB HBM3");
    assert_eq!(util[0].labels["pci_bus_id"], "00000000:18:00.0");
    let info = m.find("gpu_steward_gpu_info", &[("gpu", "0")]);
    assert_eq!(info[0].labels["name"], "NVIDIA H100 80GB HBM3");
    // Read again until it succeeded, then no more.
    let errors = |m: &Metrics| {
        m.get(
            "gpu_steward_nvml_errors_total",
            &[("function", "nvmlDeviceGetName"), ("error", "unknown")],
        )
    };
    let before = errors(&m);
    let start = polls(&agent);
    wait_for("three more polls", Duration::from_secs(5), || {
        (polls(&agent) >= start + 3.0).then_some(())
    });
    assert_eq!(errors(&agent.metrics()), before);
}
