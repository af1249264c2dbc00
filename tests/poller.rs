//! The poller against the simulated driver: what a device lacks is learned once and is no
//! alarm, a call that worked and then fails is; reads are tiered by cost and the slow tier's
//! values stay published between its reads; every XID is counted, NVML's "unknown" (999)
//! included; a GPU lost while the GPU count changes keeps its identity and counters.

mod common;

use std::time::Duration;

use common::{first, scenario, wait_for, with_event, with_gpu, Agent, Metrics};

fn polls(m: &Metrics) -> f64 {
    m.get("gpu_steward_polls_total", &[])
}

fn calls(m: &Metrics, function: &str) -> f64 {
    m.value("gpu_steward_nvml_calls_total", &[("function", function)])
        .unwrap_or(0.0)
}

fn errors(m: &Metrics, function: &str) -> usize {
    m.find("gpu_steward_nvml_errors_total", &[("function", function)])
        .len()
}

/// Waits until `n` more polls have been published, and returns the metrics then.
fn after_polls(agent: &Agent, n: f64) -> Metrics {
    let start = polls(&agent.metrics());
    wait_for("more polls", Duration::from_secs(20), || {
        let m = agent.metrics();
        (polls(&m) >= start + n).then_some(m)
    })
}

#[test]
fn a_sensor_the_board_lacks_is_asked_once_and_is_no_alarm() {
    // What a real H100 answers for fan 0 of a fanless board: INVALID_ARGUMENT. Power usage
    // answers NOT_SUPPORTED on one GPU from the start.
    let text = (0..8).fold(scenario("dgx-h100.toml"), |t, i| {
        with_gpu(
            &t,
            i,
            "errors = { nvmlDeviceGetFanSpeed_v2 = \"INVALID_ARGUMENT\" }",
        )
    });
    let text = with_gpu(&text, 3, "unsupported = [\"nvmlDeviceGetPowerUsage\"]");
    let agent = Agent::with_scenario(&text).start();
    let m = after_polls(&agent, 5.0);
    assert_eq!(errors(&m, "nvmlDeviceGetFanSpeed_v2"), 0);
    assert_eq!(errors(&m, "nvmlDeviceGetPowerUsage"), 0);
    assert!(
        calls(&m, "nvmlDeviceGetFanSpeed_v2") <= 8.0,
        "once per GPU at most"
    );
    assert_eq!(calls(&m, "nvmlDeviceGetNumFans"), 8.0, "once per GPU");
    let power = calls(&m, "nvmlDeviceGetPowerUsage");
    assert!(m.find("gpu_steward_fan_speed_ratio", &[]).is_empty());
    assert!(m
        .find("gpu_steward_power_watts", &[("gpu", "3")])
        .is_empty());
    let health = agent.get("/health");
    assert_eq!(health.json()["status"], "pass", "{}", health.text());
    assert_eq!(agent.get("/health/gpus").status, 200);
    for source in ["thermal", "power"] {
        assert_eq!(
            m.get("gpu_steward_poll_source_success", &[("source", source)]),
            1.0
        );
    }
    // Seven GPUs ask for power every poll; GPU 3 never again.
    let later = after_polls(&agent, 3.0);
    let asked = calls(&later, "nvmlDeviceGetPowerUsage") - power;
    let polled = polls(&later) - polls(&m);
    assert!(
        asked <= 7.0 * (polled + 1.0),
        "{asked} power calls in {polled} polls"
    );
}

#[test]
fn a_call_that_worked_and_then_fails_is_a_real_failure() {
    let text = scenario("dgx-h100.toml");
    let agent = Agent::with_scenario(&text).start();
    after_polls(&agent, 2.0);
    agent.rewrite_scenario(&with_gpu(
        &text,
        2,
        "unsupported = [\"nvmlDeviceGetPowerUsage\"]",
    ));
    let m = wait_for("the power failure counted", Duration::from_secs(10), || {
        let m = agent.metrics();
        (m.value(
            "gpu_steward_nvml_errors_total",
            &[
                ("function", "nvmlDeviceGetPowerUsage"),
                ("error", "not_supported"),
            ],
        )
        .is_some_and(|n| n >= 3.0))
        .then_some(m)
    });
    assert_eq!(
        m.get("gpu_steward_poll_source_success", &[("source", "power")]),
        0.0
    );
    assert!(m
        .find("gpu_steward_power_watts", &[("gpu", "2")])
        .is_empty());
    let gpu = wait_for(
        "nvml_calls_failing on GPU 2",
        Duration::from_secs(10),
        || {
            let h = agent.get("/health/gpus/2").json();
            h["output"]
                .as_str()
                .is_some_and(|o| o.contains("NVML call"))
                .then_some(h)
        },
    );
    assert_eq!(gpu["status"], "warn", "{gpu}");
}

#[test]
fn slow_reads_run_at_their_cadence_and_their_values_stay_published() {
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .config("[poller]\nslow_interval = \"1s\"\nexpensive_interval = \"2s\"\n")
        .start();
    let first = agent.metrics();
    let mut last = first.clone();
    // Two seconds of scrapes at the poll rate: every value of every tier, every scrape.
    for _ in 0..20 {
        let m = agent.metrics();
        for name in [
            "gpu_steward_energy_joules_total",
            "gpu_steward_bar1_memory_used_bytes",
            "gpu_steward_power_limit_watts",
            "gpu_steward_ecc_enabled",
            "gpu_steward_pcie_replays_total",
            "gpu_steward_mig_mode_enabled",
            "gpu_steward_power_watts",
            "gpu_steward_gpu_utilization_ratio",
        ] {
            assert_eq!(m.find(name, &[]).len(), 8, "{name}");
        }
        for s in m.find("gpu_steward_poll_source_success", &[]) {
            assert_eq!(s.value, 1.0, "{:?}", s.labels);
        }
        last = m;
        std::thread::sleep(Duration::from_millis(100));
    }
    let polled = polls(&last) - polls(&first);
    let grew = |f: &str| calls(&last, f) - calls(&first, f);
    assert!(polled >= 5.0, "{polled} polls");
    assert_eq!(
        grew("nvmlDeviceGetPowerUsage"),
        8.0 * polled,
        "power every poll on every GPU"
    );
    // Staggered across GPUs: about 8 reads per period, never 8 per poll.
    for (function, period) in [
        ("nvmlDeviceGetEccMode", 1.0),
        ("nvmlDeviceGetTotalEnergyConsumption", 2.0),
    ] {
        let expected = 8.0 * polled * 0.2 / period;
        let n = grew(function);
        assert!(
            n <= expected + 8.0 && n >= expected - 8.0,
            "{n} {function} reads in {polled} polls (expected about {expected})"
        );
    }
}

#[test]
fn every_xid_is_counted_nvml_unknown_999_included() {
    let text = with_event(
        &scenario("dgx-h100.toml"),
        4,
        "[[gpu.event]]\nid = 1\nxid = 999\n",
    );
    let agent = Agent::with_scenario(&text).start();
    wait_for("XID 999 on GPU 4", Duration::from_secs(10), || {
        agent
            .metrics()
            .value(
                "gpu_steward_xid_errors_total",
                &[("gpu", "4"), ("xid", "999")],
            )
            .filter(|n| *n == 1.0)
    });
    let events = agent.get("/api/v1/events").json();
    assert!(
        events["events"]
            .as_array()
            .expect("events")
            .iter()
            .any(|e| e["condition"] == "xid_999" && e["gpu"] == 4),
        "{events}"
    );
    assert!(agent.log().contains("xid=999"), "logged");
}

#[test]
fn a_gpu_lost_while_the_gpu_count_changes_keeps_its_identity_and_counts() {
    let text = with_event(
        &scenario("dgx-h100.toml"),
        3,
        "[[gpu.event]]\nid = 1\nxid = 48\n",
    );
    let agent = Agent::with_scenario(&text).start();
    let xid = |m: &Metrics| {
        m.value(
            "gpu_steward_xid_errors_total",
            &[("gpu", "3"), ("xid", "48")],
        )
    };
    wait_for("XID 48 on GPU 3", Duration::from_secs(10), || {
        (xid(&agent.metrics()) == Some(1.0)).then_some(())
    });
    let uuid =
        agent.metrics().find("gpu_steward_gpu_up", &[("gpu", "3")])[0].labels["uuid"].clone();
    let lost = with_gpu(&text, 3, "lost = true");
    agent.rewrite_scenario(&lost);
    wait_for("GPU 3 lost", Duration::from_secs(10), || {
        (agent.metrics().value("gpu_steward_gpu_up", &[("gpu", "3")]) == Some(0.0)).then_some(())
    });
    // A ninth GPU appears while GPU 3 stays lost.
    let nine =
        format!("{lost}\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\npci_bus_id = \"00000000:E0:00.0\"\n");
    agent.rewrite_scenario(&nine);
    wait_for("nine GPUs", Duration::from_secs(10), || {
        (agent.metrics().value("gpu_steward_gpus", &[]) == Some(9.0)).then_some(())
    });
    for _ in 0..5 {
        let m = agent.metrics();
        let up = m.find("gpu_steward_gpu_up", &[("gpu", "3")]);
        assert_eq!(up.len(), 1);
        assert_eq!(up[0].labels["uuid"], uuid, "identity kept while lost");
        assert_eq!(up[0].value, 0.0);
        assert_eq!(xid(&m), Some(1.0), "counter kept while lost");
        assert!(m.find("gpu_steward_gpu_up", &[("uuid", "")]).is_empty());
        std::thread::sleep(Duration::from_millis(200));
    }
    let events = agent.get("/api/v1/events").json();
    let lost_events: Vec<_> = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["condition"] == "gpu_lost")
        .collect();
    assert!(!lost_events.is_empty(), "{events}");
    for e in lost_events {
        assert_eq!(e["uuid"], uuid.as_str(), "{e}");
    }
}

#[test]
fn a_gpu_whose_calls_hang_does_not_hold_the_others_nor_shutdown() {
    // GPU 5's power reading hangs from its first poll on, after its identity was read.
    const UUID: &str = "GPU-5a5a5a5a-0000-4000-8000-000000000005";
    let text = with_gpu(
        &scenario("dgx-h100.toml"),
        5,
        &format!("uuid = \"{UUID}\"\ndelay_ms = {{ nvmlDeviceGetPowerUsage = 600000 }}"),
    );
    let mut agent = Agent::with_scenario(&text).no_wait_ready().start();
    let m = wait_for("GPU 5 reported unreadable", Duration::from_secs(20), || {
        let m = agent.metrics();
        (m.value("gpu_steward_gpu_up", &[("gpu", "5")]) == Some(0.0)).then_some(m)
    });
    // The others were read all along, and keep being read.
    let later = after_polls(&agent, 5.0);
    for gpu in ["0", "1", "2", "3", "4", "6", "7"] {
        assert_eq!(
            later.get("gpu_steward_gpu_up", &[("gpu", gpu)]),
            1.0,
            "{gpu}"
        );
        assert!(later
            .value("gpu_steward_power_watts", &[("gpu", gpu)])
            .is_some());
    }
    assert!(polls(&later) > polls(&m));
    // Their cadence: a poll does not wait for the hung GPU (it would take the whole 200 ms
    // interval if it did).
    let poll = later.get("gpu_steward_poll_duration_seconds", &[]);
    assert!(poll < 0.2, "a poll took {poll} s");
    // The UUID read before the hang is kept in every answer.
    let up = later.find("gpu_steward_gpu_up", &[("gpu", "5")]);
    assert_eq!(up[0].labels["uuid"], UUID);
    let condition = later.find(
        "gpu_steward_health_condition",
        &[("gpu", "5"), ("condition", "gpu_unreadable")],
    );
    assert_eq!(condition.len(), 1, "{condition:?}");
    assert_eq!(condition[0].labels["uuid"], UUID);
    let anywhere = later.find("gpu_steward_health_condition", &[]);
    assert_eq!(
        anywhere.len(),
        1,
        "no other condition anywhere: {anywhere:?}"
    );
    assert!(later.find("gpu_steward_gpu_up", &[("uuid", "")]).is_empty());
    assert_eq!(agent.get("/readyz").status, 200);
    // The reason names the call that hangs and for how long.
    let gpu = agent.get("/health/gpus/5").json();
    assert_eq!(gpu["componentId"], UUID, "{gpu}");
    let output = gpu["output"].as_str().unwrap_or_default();
    let prefix = "NVML has not answered nvmlDeviceGetPowerUsage on this GPU for ";
    let secs: u64 = output
        .strip_prefix(prefix)
        .and_then(|rest| rest.split_once("s "))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("{gpu}"));
    assert!(secs >= 5, "reported after stall_after (5 s): {output}");
    // The hung call does not keep the agent from stopping.
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    let status = agent.wait_exit(Duration::from_secs(5));
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_gpu_whose_call_stops_hanging_is_readable_again_with_all_clear() {
    // GPU 2's temperature read takes 10 s (past stall_after, 5 s) until the scenario drops it.
    let text = scenario("dgx-h100.toml");
    let agent = Agent::with_scenario(&text).start();
    let uuid =
        agent.metrics().find("gpu_steward_gpu_up", &[("gpu", "2")])[0].labels["uuid"].clone();
    agent.rewrite_scenario(&with_gpu(
        &text,
        2,
        "delay_ms = { nvmlDeviceGetTemperature = 10000 }",
    ));
    let unreadable = |m: &Metrics| {
        m.find(
            "gpu_steward_health_condition",
            &[("gpu", "2"), ("condition", "gpu_unreadable")],
        )
        .len()
    };
    let m = wait_for("GPU 2 reported unreadable", Duration::from_secs(20), || {
        let m = agent.metrics();
        (unreadable(&m) == 1).then_some(m)
    });
    assert_eq!(
        m.find("gpu_steward_gpu_up", &[("gpu", "2")])[0].labels["uuid"],
        uuid
    );
    let output = agent.get("/health/gpus/2").json()["output"].to_string();
    assert!(output.contains("nvmlDeviceGetTemperature"), "{output}");
    agent.rewrite_scenario(&text);
    // The call in flight returns within 10 s; the next ones are quick.
    wait_for("GPU 2 readable again", Duration::from_secs(20), || {
        let m = after_polls(&agent, 1.0);
        (m.get("gpu_steward_gpu_up", &[("gpu", "2")]) == 1.0).then_some(())
    });
    let m = after_polls(&agent, 2.0);
    assert_eq!(m.get("gpu_steward_gpu_up", &[("gpu", "2")]), 1.0);
    assert!(
        m.find("gpu_steward_health_condition", &[]).is_empty(),
        "all clear"
    );
    assert_eq!(agent.get("/health/gpus/2").json()["status"], "pass");
}

#[test]
fn gpus_are_read_in_parallel() {
    // Each GPU's temperature takes 100 ms of wall time (sleeping, as a driver waiting on the
    // device does): read one after the other, eight GPUs would take 800 ms a poll.
    let dir = tempfile::tempdir().expect("tempdir");
    let cost = dir.path().join("cost.json");
    std::fs::write(
        &cost,
        r#"{"functions": {"nvmlDeviceGetTemperature": {"wall_us": 100000, "cpu_us": 0}}}"#,
    )
    .expect("write cost table");
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .env("NVML_SIM_COST", &cost.display().to_string())
        .start();
    let before = after_polls(&agent, 1.0);
    let after = after_polls(&agent, 5.0);
    let polled = polls(&after) - polls(&before);
    let spent = after.get(
        "gpu_steward_nvml_call_seconds_total",
        &[("function", "nvmlDeviceGetTemperature")],
    ) - before.get(
        "gpu_steward_nvml_call_seconds_total",
        &[("function", "nvmlDeviceGetTemperature")],
    );
    assert!(
        spent >= 0.1 * 8.0 * polled * 0.9,
        "{spent} s in {polled} polls"
    );
    let poll = after.get("gpu_steward_poll_duration_seconds", &[]);
    assert!(
        poll < 0.5 * 0.8,
        "a poll took {poll} s; read in turn, the GPUs would take 0.8 s"
    );
}

#[test]
fn a_gpu_hung_in_a_background_read_is_left_behind_when_it_goes() {
    // T4s have no GPM: their PCIe rates come from nvmlDeviceGetPcieThroughput, read after the
    // poll's reply. GPU 1's starts hanging, then GPU 1 disappears from the enumeration.
    let two = "version = 1\n[[gpu]]\nmodel = \"T4\"\n[[gpu]]\nmodel = \"T4\"\n";
    let agent = Agent::with_scenario(two).start();
    agent.rewrite_scenario(&with_gpu(
        two,
        1,
        "delay_ms = { nvmlDeviceGetPcieThroughput = 600000 }",
    ));
    wait_for("GPU 1 reported unreadable", Duration::from_secs(20), || {
        (agent.metrics().value("gpu_steward_gpu_up", &[("gpu", "1")]) == Some(0.0)).then_some(())
    });
    let m = after_polls(&agent, 3.0);
    assert_eq!(m.get("gpu_steward_gpu_up", &[("gpu", "0")]), 1.0);
    agent.rewrite_scenario(first(two, 1));
    wait_for("one GPU left", Duration::from_secs(10), || {
        (agent.metrics().value("gpu_steward_gpus", &[]) == Some(1.0)).then_some(())
    });
    after_polls(&agent, 3.0);
    assert_eq!(agent.get("/readyz").status, 200);
}
