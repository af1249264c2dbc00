//! The daemon's life: NVML missing then back without a restart, a GPU lost and found, config
//! reload on SIGHUP, graceful exit on SIGTERM and SIGINT, and the demo command.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{bin, scenario, wait_for, Agent};

use nix::sys::signal::Signal;

#[test]
fn nvml_init_failure_is_served_as_data_and_recovers_without_restart() {
    let text = scenario("dgx-h100.toml");
    let broken = text.replacen(
        "cuda_version = 13000",
        "cuda_version = 13000\ninit_error = \"DRIVER_NOT_LOADED\"",
        1,
    );
    let agent = Agent::with_scenario(&broken).no_wait_ready().start();
    // Not ready, with the reason; alive; metrics served with nvml_up 0 and the error counted.
    let ready = wait_for(
        "a failed init to be reported",
        Duration::from_secs(10),
        || {
            let r = agent.get("/readyz");
            (r.status == 503 && r.text().contains("not initialised")).then_some(r)
        },
    );
    assert!(
        ready.text().contains("driver is not loaded"),
        "{}",
        ready.text()
    );
    assert_eq!(agent.get("/livez").status, 200);
    let m = agent.metrics();
    assert_eq!(m.get("gpu_steward_nvml_up", &[]), 0.0);
    assert!(
        m.get(
            "gpu_steward_nvml_init_errors_total",
            &[("error", "driver_not_loaded")]
        ) >= 1.0
    );
    assert!(m.find("DCGM_FI_DEV_GPU_UTIL", &[]).is_empty());
    let health = agent.get("/health");
    assert_eq!(health.status, 503);
    assert_eq!(health.json()["status"], "fail");
    assert_eq!(health.json()["agent"]["nvml"]["error"], "driver_not_loaded");
    assert_eq!(agent.get("/health/gpus").status, 503);

    // The driver "loads": the next retry succeeds, no restart.
    agent.rewrite_scenario(&text);
    wait_for("readiness after recovery", Duration::from_secs(20), || {
        (agent.get("/readyz").status == 200).then_some(())
    });
    let m = agent.metrics();
    assert_eq!(m.get("gpu_steward_nvml_up", &[]), 1.0);
    assert_eq!(m.find("DCGM_FI_DEV_GPU_UTIL", &[]).len(), 8);
    assert_eq!(agent.get("/health/gpus").status, 200);
}

#[test]
fn a_missing_library_keeps_the_agent_serving() {
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .nvml_lib("/nonexistent/libnvidia-ml.so.1")
        .no_wait_ready()
        .start();
    let r = wait_for("the load failure", Duration::from_secs(10), || {
        let r = agent.get("/readyz");
        (r.status == 503 && r.text().contains("cannot load")).then_some(r)
    });
    assert!(
        r.text().contains("/nonexistent/libnvidia-ml.so.1"),
        "{}",
        r.text()
    );
    assert_eq!(
        agent.metrics().get(
            "gpu_steward_nvml_init_errors_total",
            &[("error", "library_not_found")]
        ),
        1.0
    );
}

#[test]
fn a_lost_gpu_is_reported_while_the_others_keep_reporting() {
    let text = scenario("dgx-h100.toml");
    let agent = Agent::with_scenario(&text).start();
    let uuid = agent
        .metrics()
        .find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "2")])[0]
        .labels["UUID"]
        .clone();
    let at = text.match_indices("[[gpu]]").nth(2).expect("GPU 2").0 + "[[gpu]]".len();
    let lost = format!("{}\nlost = true{}", &text[..at], &text[at..]);
    agent.rewrite_scenario(&lost);
    let m = wait_for("GPU 2 to be lost", Duration::from_secs(5), || {
        let m = agent.metrics();
        (m.value("gpu_steward_gpu_up", &[("gpu", "2")]) == Some(0.0)).then_some(m)
    });
    // Known identity stays on the up series; the telemetry of GPU 2 is gone, the rest stays.
    assert_eq!(
        m.get("gpu_steward_gpu_up", &[("gpu", "2"), ("uuid", &uuid)]),
        0.0
    );
    assert!(m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "2")]).is_empty());
    assert_eq!(m.find("DCGM_FI_DEV_GPU_UTIL", &[]).len(), 7);
    assert!(m.get("gpu_steward_nvml_errors_total", &[("error", "gpu_is_lost")]) >= 1.0);
    // Health: the agent is fine (200), the node is not (503), GPU 2 fails with an action.
    assert_eq!(agent.get("/readyz").status, 200);
    let health = agent.get("/health");
    assert_eq!(health.status, 200);
    assert_eq!(
        health.header("content-type"),
        Some("application/health+json")
    );
    let gpus = agent.get("/health/gpus");
    assert_eq!(gpus.status, 503);
    let check = &gpus.json()["checks"]["gpu:2"][0];
    assert_eq!(check["status"], "fail");
    assert_eq!(check["componentId"], uuid.as_str());
    assert_eq!(check["conditions"][0]["name"], "gpu_lost");
    assert_eq!(gpus.json()["checks"]["gpu:1"][0]["status"], "pass");
    assert_eq!(agent.get("/health/gpus/2").status, 503);
    assert_eq!(agent.get(&format!("/health/gpus/{uuid}")).status, 503);
    assert_eq!(agent.get("/health/gpus/1").status, 200);

    // Back on the bus.
    agent.rewrite_scenario(&text);
    wait_for("GPU 2 to come back", Duration::from_secs(5), || {
        (agent.metrics().value("gpu_steward_gpu_up", &[("gpu", "2")]) == Some(1.0)).then_some(())
    });
    assert_eq!(agent.get("/health/gpus").status, 200);
}

#[test]
fn sighup_reloads_a_valid_config_and_rejects_an_invalid_one() {
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .config("[metrics]\ndcgm = true\nprofile = \"full\"\n")
        .start();
    assert!(!agent.metrics().find("DCGM_FI_DEV_GPU_UTIL", &[]).is_empty());

    agent.rewrite_config("[metrics]\ndcgm = false\nprofile = \"full\"\n");
    agent.signal(Signal::SIGHUP);
    let m = wait_for("the dcgm family to go", Duration::from_secs(5), || {
        let m = agent.metrics();
        m.find("DCGM_FI_DEV_GPU_UTIL", &[]).is_empty().then_some(m)
    });
    assert_eq!(
        m.get("gpu_steward_config_reloads_total", &[("result", "success")]),
        1.0
    );
    assert_eq!(
        m.get("gpu_steward_config_reloads_total", &[("result", "failure")]),
        0.0
    );

    // An invalid file is rejected, logged with its position, counted; the old config stays.
    // (The profile is named, last, so that the harness adds nothing above the bad line.)
    agent.rewrite_config("[metrics]\ndcgm = true\nbogus = 1\nprofile = \"full\"\n");
    agent.signal(Signal::SIGHUP);
    let m = wait_for(
        "the rejected reload to be counted",
        Duration::from_secs(5),
        || {
            let m = agent.metrics();
            (m.get("gpu_steward_config_reloads_total", &[("result", "failure")]) == 1.0)
                .then_some(m)
        },
    );
    assert!(
        m.find("DCGM_FI_DEV_GPU_UTIL", &[]).is_empty(),
        "old config kept"
    );
    let log = agent.log();
    assert!(
        log.contains("config.toml:3:1: unknown field `bogus`"),
        "{log}"
    );
    assert_eq!(agent.get("/readyz").status, 200, "still serving");
}

#[test]
fn sigterm_and_sigint_exit_cleanly() {
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        let mut agent = Agent::with_scenario(&scenario("dgx-h100.toml")).start();
        // Keep a scrape connection open, as Prometheus does, to check it does not block exit.
        let idle = std::net::TcpStream::connect(("127.0.0.1", agent.port)).expect("connect");
        agent.signal(sig);
        let status = agent.wait_exit(Duration::from_secs(10));
        assert_eq!(status.code(), Some(0), "{sig:?}: {}", agent.log());
        // The test's reader thread may still be copying the last lines of stderr.
        wait_for("the last log line", Duration::from_secs(5), || {
            agent.log().contains("stopped").then_some(())
        });
        drop(idle);
    }
}

#[test]
fn demo_serves_the_bundled_eight_gpu_node() {
    let mut child = Command::new(bin())
        .args(["demo", "--listen", "127.0.0.1:0", "--interval", "200ms"])
        // `cargo test` may leave the fresh simulator only in deps/ (see common::sim_lib); the
        // lookup beside the executable is unit-tested in src/demo.rs.
        .arg("--nvml-lib")
        .arg(common::sim_lib())
        .env_remove("NVML_SIM_SCENARIO")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn demo");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(port) = line
                .split("listening on 127.0.0.1:")
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|p| p.parse::<u16>().ok())
            {
                let _ = tx.send(port);
            }
        }
    });
    let port = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("demo listens");
    let get = |path: &str| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let _ = write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    wait_for("demo readiness", Duration::from_secs(20), || {
        get("/readyz").starts_with("HTTP/1.1 200").then_some(())
    });
    let metrics = get("/metrics");
    let gpus = metrics
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{"))
        .count();
    assert_eq!(gpus, 8);
    assert!(metrics.contains("modelName=\"NVIDIA H100 80GB HBM3\""));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGTERM,
    );
    let status = wait_for("demo exit", Duration::from_secs(10), || {
        child.try_wait().expect("try_wait")
    });
    assert_eq!(status.code(), Some(0));
}

#[test]
fn demo_takes_the_listen_address_from_its_config_file() {
    // Flag > environment > config file > the demo's 127.0.0.1:9400: port 0 in the file gives a
    // free port, not 9400.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[server]\nlisten = \"127.0.0.1:0\"\n").expect("write config");
    let mut child = Command::new(bin())
        .args(["demo", "--interval", "200ms", "--config"])
        .arg(&config)
        .arg("--nvml-lib")
        .arg(common::sim_lib())
        .env_remove("NVML_SIM_SCENARIO")
        .env_remove("GPU_STEWARD_LISTEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn demo");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(addr) = line.split("listening on ").nth(1) {
                let _ = tx.send(addr.trim().to_string());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(20));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGTERM,
    );
    let _ = wait_for("demo exit", Duration::from_secs(10), || {
        child.try_wait().expect("try_wait")
    });
    let addr = addr.expect("demo listens");
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    assert!(!addr.starts_with("127.0.0.1:9400"), "{addr}");
}

#[test]
fn demo_help_shows_the_demo_defaults_not_runs() {
    let out = Command::new(bin())
        .args(["demo", "--help"])
        .output()
        .expect("demo --help");
    let help = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{help}");
    assert!(help.contains("127.0.0.1:9400"), "{help}");
    assert!(!help.contains("0.0.0.0:9400"), "{help}");
    assert!(help.contains("simulator"), "{help}");
    assert!(!help.contains("libnvidia-ml.so.1"), "{help}");
    let run = Command::new(bin())
        .args(["run", "--help"])
        .output()
        .expect("run --help");
    let help = String::from_utf8_lossy(&run.stdout);
    assert!(help.contains("0.0.0.0:9400"), "{help}");
}

#[test]
fn a_gpu_refusing_xid_registration_does_not_churn_the_event_waiter() {
    let text = scenario("dgx-h100.toml");
    // GPU 0 answers NOT_SUPPORTED to nvmlDeviceRegisterEvents.
    let at = text.find("[[gpu]]").expect("a GPU") + "[[gpu]]".len();
    let refusing = format!(
        "{}\nunsupported = [\"nvmlDeviceRegisterEvents\"]{}",
        &text[..at],
        &text[at..]
    );
    let stats = tempfile::NamedTempFile::new().expect("stats file");
    let agent = Agent::with_scenario(&refusing)
        .env("NVML_SIM_STATS", &stats.path().display().to_string())
        .start();
    let polls = agent.metrics().get("gpu_steward_polls_total", &[]);
    wait_for("ten more polls", Duration::from_secs(10), || {
        (agent.metrics().get("gpu_steward_polls_total", &[]) >= polls + 10.0).then_some(())
    });
    // The simulator rewrites its stats file at most once a second while calls are made.
    let counts = wait_for("call statistics", Duration::from_secs(5), || {
        let text = std::fs::read_to_string(stats.path()).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        let created = v.get("nvmlEventSetCreate")?.as_u64()?;
        let registered = v.get("nvmlDeviceRegisterEvents")?.as_u64()?;
        Some((created, registered))
    });
    assert_eq!(counts, (1, 8), "one event set, eight registration attempts");
    let m = agent.metrics();
    assert_eq!(
        m.get("gpu_steward_poll_source_success", &[("source", "events")]),
        1.0
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    let mut agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .arg("--log-format")
        .arg("json")
        .start();
    agent.signal(Signal::SIGTERM);
    assert_eq!(agent.wait_exit(Duration::from_secs(10)).code(), Some(0));
    // The reader thread may still be draining the pipe.
    let log = wait_for("the final log line", Duration::from_secs(5), || {
        let log = agent.log();
        log.contains("stopped").then_some(log)
    });
    let mut messages = Vec::new();
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
        messages.push(
            v["fields"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("listening on 127.0.0.1:")),
        "{messages:?}"
    );
    assert!(
        messages.iter().any(|m| m == "NVML initialised"),
        "{messages:?}"
    );
}

#[test]
fn a_changed_device_count_is_re_enumerated() {
    let text = scenario("dgx-h100.toml");
    let agent = Agent::with_scenario(&text).start();
    assert_eq!(agent.metrics().get("gpu_steward_gpus", &[]), 8.0);
    // Keep the first four GPUs only (as after unbinding four from the driver).
    let cut = text.match_indices("[[gpu]]").nth(4).expect("eight GPUs").0;
    agent.rewrite_scenario(&text[..cut]);
    let m = wait_for("four GPUs", Duration::from_secs(5), || {
        let m = agent.metrics();
        (m.value("gpu_steward_gpus", &[]) == Some(4.0)).then_some(m)
    });
    assert_eq!(m.find("DCGM_FI_DEV_GPU_UTIL", &[]).len(), 4);
    assert_eq!(m.find("gpu_steward_gpu_up", &[]).len(), 4);
    assert!(
        agent.log().contains("GPU count changed, re-enumerating"),
        "{}",
        agent.log()
    );
    // And back: the returning GPUs get their identity read again.
    agent.rewrite_scenario(&text);
    let m = wait_for("eight GPUs again", Duration::from_secs(5), || {
        let m = agent.metrics();
        (m.find("DCGM_FI_DEV_GPU_UTIL", &[]).len() == 8).then_some(m)
    });
    assert_eq!(
        m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "7")])[0].labels["pci_bus_id"],
        "00000000:DB:00.0"
    );
    assert_eq!(agent.get("/health/gpus").status, 200);
}

#[test]
fn an_unreadable_gpu_is_reported_with_the_nvml_error() {
    let text = scenario("dgx-h100.toml");
    let agent = Agent::with_scenario(&text).start();
    let at = text.match_indices("[[gpu]]").nth(6).expect("GPU 6").0 + "[[gpu]]".len();
    let broken = format!(
        "{}\nerrors = {{ nvmlDeviceGetHandleByIndex_v2 = \"UNKNOWN\" }}{}",
        &text[..at],
        &text[at..]
    );
    agent.rewrite_scenario(&broken);
    let m = wait_for("GPU 6 to be unreadable", Duration::from_secs(5), || {
        let m = agent.metrics();
        (m.value("gpu_steward_gpu_up", &[("gpu", "6")]) == Some(0.0)).then_some(m)
    });
    assert!(
        m.get(
            "gpu_steward_nvml_errors_total",
            &[
                ("function", "nvmlDeviceGetHandleByIndex_v2"),
                ("error", "unknown")
            ]
        ) >= 1.0
    );
    assert_eq!(m.find("DCGM_FI_DEV_GPU_UTIL", &[]).len(), 7);
    let check = &agent.get("/health/gpus/6").json();
    assert_eq!(check["status"], "fail");
    assert_eq!(check["conditions"][0]["name"], "gpu_unreadable");
    assert!(
        check["output"]
            .as_str()
            .is_some_and(|o| o.contains("unknown")),
        "{check}"
    );
    agent.rewrite_scenario(&text);
    wait_for("GPU 6 back", Duration::from_secs(5), || {
        (agent.metrics().value("gpu_steward_gpu_up", &[("gpu", "6")]) == Some(1.0)).then_some(())
    });
}

/// Issue 26 deliver 4: the demo sets the time-slice through the stand-in nvidia-smi shipped
/// with the simulator, and removes the stand-in's state with the bundled scenario on exit.
#[test]
fn demo_applies_a_time_slice_through_the_stand_in_nvidia_smi() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[audit]\nfile = \"{}/audit.jsonl\"\n\
             [sharing]\ntimeslice = \"long\"\n",
            dir.path().display()
        ),
    )
    .expect("write config");
    let mut child = Command::new(bin())
        .args(["demo", "--interval", "200ms", "--config"])
        .arg(&config)
        .arg("--nvml-lib")
        .arg(common::sim_lib())
        .env_remove("NVML_SIM_SCENARIO")
        .env_remove("NVIDIA_SMI_SIM_DIR")
        .env_remove("GPU_STEWARD_LISTEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn demo");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            // The apply's summary (`sharing: applied …`), not the per-change lines before it
            // nor a log target (`gpu_steward::sharing::apply:`).
            if line.contains(" sharing: ") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(20));
    // The demo's scenario is `gpu-steward-demo-PID-N.toml`, the stand-in's state beside it.
    let prefix = format!("gpu-steward-demo-{}-", child.id());
    let stand_in = std::fs::read_dir(std::env::temp_dir())
        .expect("the temporary directory")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".toml.nvidia-smi"))
        })
        .expect("the stand-in nvidia-smi's state");
    let set_by_stand_in =
        std::fs::read_to_string(stand_in.join("nvidia-smi.args")).unwrap_or_default();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGTERM,
    );
    let _ = wait_for("demo exit", Duration::from_secs(10), || {
        child.try_wait().expect("try_wait")
    });
    let line = line.expect("the start apply is logged");
    assert!(line.contains("applied 8 change(s)"), "{line}");
    assert_eq!(
        set_by_stand_in.matches("--set-timeslice 3").count(),
        8,
        "{set_by_stand_in}"
    );
    assert!(
        !stand_in.exists(),
        "the stand-in's state goes with the demo"
    );
}
