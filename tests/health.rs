//! GPU health end to end: the real binary against the simulated NVML, with scenario rewrites
//! to raise and clear conditions and inject XIDs mid-run.

mod common;
mod health_support;

use health_support::Agent;

const HEALTHY: &str = r#"
version = 1
[driver]
version = "580.95.05"
[[gpu]]
model = "H100-SXM5-80GB"
temperature_c = 40
"#;

fn with_events(events: &[(u64, u64)]) -> String {
    let mut s = HEALTHY.to_string();
    for (id, xid) in events {
        s.push_str(&format!("[[gpu.event]]\nid = {id}\nxid = {xid}\n"));
    }
    s
}

#[test]
fn faults_scenario_fails_gpus_while_health_stays_200() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/scenarios/faults.toml"
    ))
    .expect("faults.toml");
    let a = Agent::start(&text, "");
    a.wait_for("the XID 48 on GPU 1", |a| {
        a.conditions(1).contains(&"xid_48".to_string())
    });
    assert_eq!(a.get("/health").0, 200, "agent readiness, not GPU health");
    let (code, v) = a.json("/health/gpus");
    assert_eq!(code, 503);
    assert_eq!(v["status"], "fail");
    assert_eq!(a.conditions(0), vec!["gpu_lost"]);
    let gpu1 = a.conditions(1);
    for c in [
        "driver_recovery_action",
        "ecc_dbe",
        "row_remap_pending",
        "xid_48",
    ] {
        assert!(gpu1.contains(&c.to_string()), "{c} in {gpu1:?}");
    }
    assert!(
        !gpu1.contains(&"xid_63".to_string()),
        "63 is IGNORE in the catalog"
    );
    assert!(a.conditions(2).contains(&"thermal_slowdown".to_string()));
    let (code, one) = a.json("/health/gpus/1");
    assert_eq!((code, one["action"].as_str()), (503, Some("reset_gpu")));
    assert!(one["conditions"][0]["since"]
        .as_str()
        .is_some_and(|s| s.ends_with('Z')));
    a.wait_for("failing calls on GPU 3", |a| {
        a.conditions(3) == vec!["nvml_calls_failing".to_string()]
    });
    let (code, three) = a.json("/health/gpus/3");
    assert_eq!((code, three["status"].as_str()), (200, Some("warn")));
    assert_eq!(a.metric("gpu_steward_gpu_health{gpu=\"1\""), Some(2.0));
    assert_eq!(a.metric("gpu_steward_gpu_health{gpu=\"2\""), Some(1.0));
    let (_, metrics) = a.get("/metrics");
    assert!(
        metrics.contains("err_code=\"INFOROM_DRAM_RETIREMENT_EVENT\""),
        "last XID is 63"
    );
}

/// An H100 (row remapping) and a T4 (page retirement: pre-Ampere), with `h100` and `t4` fields.
fn two_gpus(h100: &str, t4: &str) -> String {
    format!(
        "version = 1\n[driver]\nversion = \"580.95.05\"\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\n{h100}\n[[gpu]]\nmodel = \"T4\"\n{t4}\n"
    )
}

#[test]
fn each_condition_is_raised_and_cleared_by_scenario_rewrites() {
    let config = "[health]\npcie_replay_window = \"1s\"\n";
    let healthy = two_gpus("temperature_c = 40", "temperature_c = 40");
    let a = Agent::start(&healthy, config);
    assert!(a.conditions(0).is_empty() && a.conditions(1).is_empty());
    // The replay rate needs a full window (1 s here) of samples before it says anything.
    a.wait_for("a full PCIe replay window", |a| {
        a.metric("gpu_steward_polls_total").unwrap_or(0.0) >= 8.0
    });
    let start = a.json("/api/v1/events").1["events"]
        .as_array()
        .map_or(0, Vec::len);
    a.rewrite(&two_gpus(
        r#"temperature_c = 88
recovery_action = "node_reboot"
ecc = { sbe_volatile = 0, dbe_volatile = 2, sbe_aggregate = 0, dbe_aggregate = 2 }
remapped_rows = { correctable = 0, uncorrectable = 600, pending = true, failure = true }
throttle_reasons = ["hw_thermal_slowdown", "hw_power_brake_slowdown"]
pcie_replay_count = 100000
errors = { nvmlDeviceGetPowerUsage = "UNKNOWN" }"#,
        "retired_pages = { sbe = 40, dbe = 30, pending = true }",
    ));
    let expected = [
        "driver_recovery_action",
        "ecc_dbe",
        "row_remap_pending",
        "row_remap_failed",
        "row_remap_uncorrectable",
        "thermal_slowdown",
        "power_brake_slowdown",
        "temperature_margin",
        "pcie_replay_rate",
        "nvml_calls_failing",
    ];
    let expected_t4 = ["retired_pages_pending", "retired_pages_limit"];
    // The replay rate is high only while the window covers the jump, so collect what was seen.
    let seen = std::cell::RefCell::new(std::collections::BTreeSet::new());
    a.wait_for("every condition", |a| {
        let mut seen = seen.borrow_mut();
        seen.extend(a.conditions(0).into_iter().map(|c| format!("0:{c}")));
        seen.extend(a.conditions(1).into_iter().map(|c| format!("1:{c}")));
        expected.iter().all(|c| seen.contains(&format!("0:{c}")))
            && expected_t4.iter().all(|c| seen.contains(&format!("1:{c}")))
    });
    let (_, one) = a.json("/health/gpus/0");
    assert_eq!(one["action"], "reboot_node", "the driver's action wins");
    a.rewrite(&two_gpus("pcie_replay_count = 100000", ""));
    a.wait_for("everything cleared", |a| {
        a.conditions(0).is_empty() && a.conditions(1).is_empty()
    });
    a.rewrite(&two_gpus("pcie_replay_count = 100000\nlost = true", ""));
    a.wait_for("the GPU lost", |a| {
        a.conditions(0) == vec!["gpu_lost".to_string()]
    });
    a.rewrite(&two_gpus("pcie_replay_count = 100000", ""));
    a.wait_for("the GPU back", |a| a.conditions(0).is_empty());

    let (code, v) = a.json("/api/v1/events");
    assert_eq!(code, 200);
    let events = v["events"].as_array().expect("events");
    let count = |kind: &str, cond: &str| {
        events[..events.len() - start]
            .iter()
            .filter(|e| e["kind"] == kind && e["condition"] == cond)
            .count()
    };
    for c in expected.iter().chain(&expected_t4).chain(&["gpu_lost"]) {
        assert_eq!(count("raised", c), 1, "{c} raised once");
        assert_eq!(count("cleared", c), 1, "{c} cleared once");
    }
    let first = events[0]["time"].as_str().expect("time");
    let (code, newest) = a.json(&format!("/api/v1/events?since={first}"));
    assert_eq!(code, 200);
    assert!(!newest["events"].as_array().expect("events").is_empty());
    let (code, body) = a.get("/api/v1/events?since=yesterday");
    assert_eq!(code, 400);
    assert!(body.contains("invalid since 'yesterday'"), "{body}");
    // Out-of-range numbers are a 400 too, not a handler that dies without an answer.
    let (code, body) = a.get("/api/v1/events?since=1e20");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("invalid since '1e20'"), "{body}");
}

#[test]
fn xids_injected_mid_run_count_once_escalate_and_expire() {
    let config = "[health]\nxid_window = \"5s\"\nxid_escalate_after = 3\n";
    let a = Agent::start(HEALTHY, config);
    let total = "gpu_steward_xid_errors_total{gpu=\"0\",uuid=";
    // Critical XIDs exist at 0 from the start; XID 13 (an application fault) does not.
    let (_, m) = a.get("/metrics");
    assert!(m
        .lines()
        .any(|l| l.starts_with(total) && l.contains("xid=\"48\"} 0")));
    assert!(!m.contains("xid=\"13\""));

    a.rewrite(&with_events(&[(1, 13)]));
    a.wait_for("XID 13 counted", |a| {
        a.conditions(0) == vec!["xid_13".to_string()]
    });
    let count13 = |a: &Agent| {
        let (_, m) = a.get("/metrics");
        m.lines()
            .find(|l| l.starts_with(total) && l.contains("xid=\"13\""))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    assert_eq!(count13(&a), Some(1.0));
    let (code, one) = a.json("/health/gpus/0");
    assert_eq!((code, one["status"].as_str()), (200, Some("warn")));
    let polls = a.metric("gpu_steward_polls_total").unwrap_or(0.0);
    a.wait_for("a few more polls", |a| {
        a.metric("gpu_steward_polls_total").unwrap_or(0.0) >= polls + 3.0
    });
    assert_eq!(count13(&a), Some(1.0), "counted exactly once");
    let (_, m) = a.get("/metrics");
    assert!(
        m.contains("xid=\"13\",window_size_in_ms=\"300000\"} 1"),
        "dcgm window count"
    );

    a.rewrite(&with_events(&[(1, 13), (2, 13), (3, 13)]));
    a.wait_for("escalation to fail", |a| a.get("/health/gpus").0 == 503);
    assert_eq!(count13(&a), Some(3.0));
    let (_, one) = a.json("/health/gpus/0");
    assert_eq!(
        one["action"], "reset_gpu",
        "restart_app escalated one level"
    );
    assert_eq!(a.get("/health").0, 200);

    a.wait_for("the window to expire", |a| {
        a.get("/health/gpus").0 == 200 && a.conditions(0).is_empty()
    });
    assert_eq!(count13(&a), Some(3.0), "the counter never goes down");
    let (_, v) = a.json("/api/v1/events");
    let kinds: Vec<&str> = v["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["condition"] == "xid_13")
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert_eq!(kinds.first(), Some(&"cleared"), "{kinds:?}");
    for kind in ["raised", "escalated", "cleared"] {
        assert_eq!(
            kinds.iter().filter(|k| **k == kind).count(),
            1,
            "{kind} once: {kinds:?}"
        );
    }
}

#[test]
fn a_catalog_override_changes_the_verdict() {
    let config = r#"
[health.xid_overrides]
"13" = { severity = "fail", action = "reset_gpu" }
"48" = "ignore"
"#;
    let a = Agent::start(HEALTHY, config);
    a.rewrite(&with_events(&[(1, 48), (2, 13)]));
    a.wait_for("XID 13 as a failure", |a| a.get("/health/gpus").0 == 503);
    assert_eq!(
        a.conditions(0),
        vec!["xid_13"],
        "48 is ignored by the config"
    );
    let (_, one) = a.json("/health/gpus/0");
    assert_eq!(one["action"], "reset_gpu");
}

/// Runs `gpu-steward check-health ARGS`: (exit status, stdout, how long it took).
fn check_health(args: &[&str]) -> (i32, String, std::time::Duration) {
    let started = std::time::Instant::now();
    let out = std::process::Command::new(common::bin())
        .arg("check-health")
        .args(args)
        .output()
        .expect("run check-health");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        started.elapsed(),
    )
}

/// node-problem-detector's custom plugin contract: 0 while every GPU passes or warns, 1 with one
/// short line naming the failing GPU, its condition and the action, 2 when the agent cannot be
/// asked (nothing listening, a server that hangs, one that answers garbage); over HTTP and the
/// API socket alike.
#[test]
fn check_health_follows_the_node_problem_detector_contract() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let socket = dir.path().join("api.sock");
    let config = format!(
        "[health]\nxid_window = \"1h\"\n[api]\nenabled = true\ntoken_file = \"{}\"\nsocket = \"{}\"\nsocket_mode = \"0600\"\n",
        token.display(),
        socket.display()
    );
    let two = format!("{HEALTHY}[[gpu]]\nmodel = \"H100-SXM5-80GB\"\n");
    let agent = common::Agent::with_scenario(&two).config(&config).start();
    let url = format!("http://127.0.0.1:{}", agent.port);
    let (code, line, _) = check_health(&["--url", &url]);
    assert_eq!((code, line.trim()), (0, "all 2 GPUs pass"));

    agent.rewrite_scenario(&common::with_event(
        &two,
        1,
        "[[gpu.event]]\nid = 1\nxid = 48\n",
    ));
    let (line, _) = common::wait_for("GPU 1 failing", std::time::Duration::from_secs(20), || {
        let (code, line, _) = check_health(&["--url", &url]);
        (code == 1).then_some((line, ()))
    });
    let line = line.trim_end_matches('\n');
    assert!(!line.contains('\n') && line.len() < 256, "{line:?}");
    assert!(
        line.starts_with("GPU 1 (") && line.contains("fails, action reset_gpu: xid_48 ("),
        "{line}"
    );
    let sock = socket.display().to_string();
    let (code, line, _) = check_health(&["--socket", &sock]);
    assert_eq!(code, 1, "{line}");
    let (code, line, _) = check_health(&["--socket", &sock, "--gpu", "0"]);
    assert_eq!(code, 0, "{line}");
    assert!(line.contains("passes"), "{line}");
    let (code, line, _) = check_health(&["--url", &url, "--gpu", "7"]);
    assert_eq!(code, 2, "{line}");
    assert!(line.contains("no GPU '7'"), "{line}");

    // Nobody there; a server that never answers; one that answers garbage.
    let (code, line, _) = check_health(&["--socket", "/nonexistent/api.sock"]);
    assert_eq!(code, 2, "{line}");
    assert!(
        line.starts_with(
            "cannot ask the agent at unix:/nonexistent/api.sock/health/gpus: cannot connect"
        ),
        "{line}"
    );
    let hang = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hang_url = format!("http://{}", hang.local_addr().expect("addr"));
    let (code, line, took) = check_health(&["--url", &hang_url, "--timeout", "1s"]);
    assert_eq!(code, 2, "{line}");
    assert!(line.contains("no answer within 1s"), "{line}");
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    let garbage = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let garbage_url = format!("http://{}", garbage.local_addr().expect("addr"));
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = garbage.accept().expect("accept");
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello");
    });
    let (code, line, _) = check_health(&["--url", &garbage_url]);
    server.join().expect("server");
    assert_eq!(code, 2, "{line}");
    assert!(line.contains("with no JSON"), "{line}");
    drop(hang);
}

/// Two H100s (Gen5 x16, as the real one: shared/reference/real-h100), GPU 1 given `gpu1`.
fn h100s(gpu1: &str) -> String {
    format!(
        "version = 1\n[driver]\nversion = \"580.95.05\"\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\ntemperature_c = 40\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\ntemperature_c = 40\n{gpu1}\n"
    )
}

/// Windows of 3 s instead of a minute, so that each test takes seconds.
const DEGRADED: &str = "[health]\necc_correctable_window = \"3s\"\npcie_busy_for = \"3s\"\n\
                        pcie_replay_window = \"3s\"\n";

/// Rewrites GPU 1's scenario to `cause`; expects exactly `condition` on GPU 1 and nothing on
/// GPU 0 within `within`, then, with the cause dropped, everything clear. Returns how long
/// the raise took.
fn raised_alone_and_cleared(
    a: &Agent,
    cause: &str,
    condition: &str,
    within: std::time::Duration,
) -> std::time::Duration {
    assert!(a.conditions(0).is_empty() && a.conditions(1).is_empty());
    let journalled = |a: &Agent| {
        a.json("/api/v1/events").1["events"]
            .as_array()
            .map_or(0, Vec::len)
    };
    let before = journalled(a);
    let started = std::time::Instant::now();
    a.rewrite(&h100s(cause));
    a.wait_for(condition, |a| !a.conditions(1).is_empty());
    let took = started.elapsed();
    assert_eq!(a.conditions(1), [condition], "exactly {condition} on GPU 1");
    assert!(a.conditions(0).is_empty(), "nothing on GPU 0");
    assert!(
        took <= within,
        "{condition} after {took:?}, more than {within:?}"
    );
    // Everywhere a condition is shown: the metric, the journal, check-health (a warn: exit 0).
    assert_eq!(
        a.metric("gpu_steward_health_condition{gpu=\"1\",uuid=\"GPU-"),
        Some(1.0)
    );
    let (_, m) = a.get("/metrics");
    let series: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("gpu_steward_health_condition{"))
        .collect();
    assert_eq!(series.len(), 1, "{series:?}");
    assert!(
        series[0].contains(&format!("condition=\"{condition}\",severity=\"warn\"")),
        "{series:?}"
    );
    let (_, v) = a.json("/api/v1/events");
    let events = v["events"].as_array().expect("events");
    // Newest first: what was journalled since the rewrite.
    let raised: Vec<&serde_json::Value> = events[..events.len() - before]
        .iter()
        .filter(|e| e["kind"] == "raised")
        .collect();
    assert_eq!(raised.len(), 1, "{raised:?}");
    assert_eq!(
        (raised[0]["condition"].as_str(), raised[0]["gpu"].as_u64()),
        (Some(condition), Some(1))
    );
    let (_, one) = a.json("/health/gpus/1");
    assert_eq!(one["status"], "warn", "{one}");
    assert!(one["conditions"][0]["since"]
        .as_str()
        .is_some_and(|s| s.ends_with('Z')));
    a.rewrite(&h100s(""));
    a.wait_for("all clear", |a| {
        a.conditions(0).is_empty() && a.conditions(1).is_empty()
    });
    took
}

#[test]
fn a_correctable_ecc_storm_on_one_gpu_warns_there_and_clears() {
    let a = Agent::start(&h100s(""), DEGRADED);
    a.wait_for("a full window", |a| {
        a.metric("gpu_steward_polls_total").unwrap_or(0.0) >= 20.0
    });
    // NVIDIA/NVSentinel#1748's GB200: ~17,700 a second; over DCGM's 10 a minute in one poll.
    raised_alone_and_cleared(
        &a,
        "ecc = { correctable_per_s = 17700 }",
        "ecc_sbe_rate",
        std::time::Duration::from_secs(3 + 2),
    );
    let (_, v) = a.json("/api/v1/events");
    let reason = v["events"]
        .as_array()
        .expect("events")
        .iter()
        .find(|e| e["kind"] == "raised")
        .and_then(|e| e["reason"].as_str())
        .expect("reason")
        .to_string();
    assert!(
        reason.contains("correctable (single-bit) ECC errors per minute")
            && reason.contains("at or above the limit of 10/min"),
        "{reason}"
    );
}

#[test]
fn a_pcie_link_trained_narrow_warns_at_once_and_a_slow_one_only_when_busy() {
    let a = Agent::start(&h100s(""), DEGRADED);
    raised_alone_and_cleared(
        &a,
        "pcie = { width = 8 }",
        "pcie_link_degraded",
        std::time::Duration::from_secs(3),
    );
    // Idle at Gen1 (power saving): nothing, for longer than pcie_busy_for.
    a.rewrite(&h100s("pcie = { gen = 1 }\ngpu_util_percent = 0"));
    let polls = a.metric("gpu_steward_polls_total").unwrap_or(0.0);
    a.wait_for("5 s of polls", |a| {
        a.metric("gpu_steward_polls_total").unwrap_or(0.0) >= polls + 25.0
    });
    assert!(a.conditions(0).is_empty() && a.conditions(1).is_empty());
    // Busy at Gen4 of 5: raised only after pcie_busy_for (3 s).
    let took = raised_alone_and_cleared(
        &a,
        "pcie = { gen = 4 }\ngpu_util_percent = 100",
        "pcie_link_degraded",
        std::time::Duration::from_secs(3 + 3),
    );
    assert!(
        took >= std::time::Duration::from_secs(3),
        "raised after {took:?}, before pcie_busy_for"
    );
}

#[test]
fn a_pcie_replay_rate_from_the_simulator_raises_pcie_replay_rate() {
    let a = Agent::start(&h100s(""), DEGRADED);
    a.wait_for("a full window", |a| {
        a.metric("gpu_steward_polls_total").unwrap_or(0.0) >= 20.0
    });
    // 10 a second = 600 a minute, over the 31 a minute of a Gen5 x16 link (DCGM's limit).
    raised_alone_and_cleared(
        &a,
        "pcie = { replays_per_s = 10.0 }",
        "pcie_replay_rate",
        std::time::Duration::from_secs(3 + 2),
    );
}

#[test]
fn the_imex_domain_recovery_action_fails_that_gpu_and_clears() {
    let a = Agent::start(&h100s(""), "");
    a.rewrite(&h100s("recovery_action = \"recover_imex_domain\""));
    a.wait_for("the recovery action", |a| !a.conditions(1).is_empty());
    assert_eq!(a.conditions(1), ["driver_recovery_action"]);
    assert!(a.conditions(0).is_empty());
    let (code, one) = a.json("/health/gpus/1");
    assert_eq!((code, one["status"].as_str()), (503, Some("fail")), "{one}");
    assert_eq!(one["action"], "drain_and_reset");
    let reason = one["conditions"][0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("IMEX domain") && !reason.contains("unknown"),
        "{reason}"
    );
    a.rewrite(&h100s(""));
    a.wait_for("all clear", |a| a.conditions(1).is_empty());
}

/// The driver's recovery action arrives as an event (`nvmlEventTypeGpuRecoveryAction`, 0x8000,
/// which the simulated H100 offers as the real one does): the poller polls at once, not at its
/// next tick a minute later.
#[test]
fn a_recovery_action_event_wakes_the_poller() {
    let agent = common::Agent::with_scenario(&h100s(""))
        .interval("60s")
        .start();
    let conditions = |i: u32| {
        let v = agent.get("/health/gpus").json();
        v["checks"][format!("gpu:{i}")][0]["conditions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c["name"].as_str().map(String::from))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    common::wait_for("the first poll", std::time::Duration::from_secs(20), || {
        (agent.get("/health/gpus").json()["checks"]["gpu:1"].is_array()).then_some(())
    });
    // The watcher registers after the first poll: give it a moment before the change.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let started = std::time::Instant::now();
    agent.rewrite_scenario(&h100s("recovery_action = \"recover_imex_domain\""));
    common::wait_for(
        "the recovery action",
        std::time::Duration::from_secs(30),
        || (conditions(1) == ["driver_recovery_action"]).then_some(()),
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "waited for the next poll: {:?}",
        started.elapsed()
    );
    assert!(conditions(0).is_empty());
}
