//! Fleet engines acting on the agent's verdicts, against the real things: a Slurm cluster
//! (`slurmctld`/`slurmd` started by the test) drained and resumed by the agent, an admin's drain
//! kept, Slurm failing in each way; and the journal outliving a restart.
//! NVSentinel: a platform connector built from its proto, down and up again, hanging, and a
//! path that is not a socket.

mod common;
#[path = "fleet_support/connector.rs"]
mod connector;
#[path = "fleet_support/slurm.rs"]
mod slurm;

use std::time::Duration;

use common::{first, scenario, wait_for, with_event, with_gpu, Agent};
use slurm::{Cluster, NODE};

const UUID: &str = "GPU-11111111-2222-3333-4444-555555555555";
const XID79: &str = "[[gpu.event]]\nid = 1\nxid = 79\n";

/// Two GPUs of the DGX scenario, GPU 1 with a known UUID.
fn two_gpus() -> String {
    with_gpu(
        first(&scenario("dgx-h100.toml"), 2),
        1,
        &format!("uuid = \"{UUID}\"\n"),
    )
}

/// The reason the agent writes for XID 79 on GPU 1: the catalog's XID 79 is RESTART_BM, which
/// is fail and `reboot_node` (src/health/xid-catalog.csv, docs/health.md).
fn our_reason() -> String {
    format!("gpu-steward: GPU 1 {UUID} xid_79 (reboot_node)")
}

fn slurm_config(dir: &std::path::Path, node: &str, scontrol: &str) -> String {
    slurm_config_window(dir, node, scontrol, "3s")
}

fn slurm_config_window(dir: &std::path::Path, node: &str, scontrol: &str, window: &str) -> String {
    format!(
        "[health]\nxid_window = \"{window}\"\n[audit]\nfile = \"{}/audit.jsonl\"\n\
         [slurm]\ndrain = true\nnode_name = \"{node}\"\nscontrol = \"{scontrol}\"\n",
        dir.display()
    )
}

fn polls(agent: &Agent) -> f64 {
    agent.metrics().get("gpu_steward_polls_total", &[])
}

fn requests(agent: &Agent, request: &str, result: &str) -> f64 {
    agent
        .metrics()
        .value(
            "gpu_steward_slurm_requests_total",
            &[("request", request), ("result", result)],
        )
        .unwrap_or(0.0)
}

#[test]
fn an_xid_79_drains_the_slurm_node_and_the_recovery_resumes_it() {
    if !slurm::available("an_xid_79_drains_the_slurm_node_and_the_recovery_resumes_it") {
        return;
    }
    let cluster = Cluster::start();
    let healthy = two_gpus();
    let agent = Agent::with_scenario(&with_event(&healthy, 1, XID79))
        .config(&slurm_config(cluster.dir.path(), NODE, "scontrol"))
        .env("SLURM_CONF", &cluster.conf.display().to_string())
        .start();
    wait_for(
        "the node drained by the agent",
        Duration::from_secs(30),
        || {
            let (state, reason) = cluster.node_state()?;
            (state.contains("DRAIN") && reason == our_reason()).then_some(())
        },
    );
    let listed = cluster.sinfo_reasons();
    assert!(
        listed.contains(&format!("{}|{NODE}", our_reason())),
        "sinfo -R: {listed}"
    );
    // Audited before it was done.
    let audit = std::fs::read_to_string(cluster.dir.path().join("audit.jsonl")).expect("audit log");
    let drain = audit
        .lines()
        .find(|l| l.contains("\"component\":\"slurm\"") && l.contains("\"event\":\"drain\""))
        .unwrap_or_else(|| panic!("no drain record: {audit}"));
    assert!(
        drain.contains(&our_reason()) && drain.contains(NODE),
        "{drain}"
    );

    // The XID ages out of the 3 s window: every GPU passes again, the node is resumed.
    agent.rewrite_scenario(&healthy);
    wait_for("the node resumed", Duration::from_secs(30), || {
        let (state, _) = cluster.node_state()?;
        (!state.contains("DRAIN")).then_some(())
    });
    let audit = std::fs::read_to_string(cluster.dir.path().join("audit.jsonl")).expect("audit log");
    assert!(
        audit.contains("\"component\":\"slurm\",\"event\":\"resume\""),
        "{audit}"
    );
    // Counted once the call returned (the node changes during it).
    wait_for(
        "one drain and one resume counted",
        Duration::from_secs(10),
        || {
            let counted = (
                requests(&agent, "drain", "changed"),
                requests(&agent, "resume", "changed"),
            );
            (counted == (1.0, 1.0)).then_some(())
        },
    );
}

#[test]
fn an_admins_drain_is_kept_through_a_gpu_failure_and_recovery() {
    if !slurm::available("an_admins_drain_is_kept_through_a_gpu_failure_and_recovery") {
        return;
    }
    let cluster = Cluster::start();
    let name = format!("NodeName={NODE}");
    cluster
        .scontrol(&[
            "update",
            &name,
            "State=DRAIN",
            "Reason=admin: fan 3 replaced",
        ])
        .expect("admin drain");
    let healthy = two_gpus();
    let agent = Agent::with_scenario(&with_event(&healthy, 1, XID79))
        .config(&slurm_config(cluster.dir.path(), NODE, "scontrol"))
        .env("SLURM_CONF", &cluster.conf.display().to_string())
        .start();
    // Each failure and each recovery is a request the agent makes and finds not its own.
    let step = |what: &str, request: &str, scenario: &str| {
        let before = requests(&agent, request, "not_ours");
        agent.rewrite_scenario(scenario);
        wait_for(what, Duration::from_secs(30), || {
            (requests(&agent, request, "not_ours") > before).then_some(())
        });
    };
    wait_for(
        "the agent to find the admin's drain",
        Duration::from_secs(30),
        || (requests(&agent, "drain", "not_ours") >= 1.0).then_some(()),
    );
    step("the recovery seen", "resume", &healthy);
    let again = with_event(&healthy, 1, "[[gpu.event]]\nid = 2\nxid = 79\n");
    step("the second failure seen", "drain", &again);
    step("the second recovery seen", "resume", &healthy);
    let (state, reason) = cluster.node_state().expect("node");
    assert!(state.contains("DRAIN"), "{state}");
    assert_eq!(reason, "admin: fan 3 replaced");
    assert_eq!(requests(&agent, "drain", "changed"), 0.0);
    assert_eq!(requests(&agent, "resume", "changed"), 0.0);
    let audit = std::fs::read_to_string(cluster.dir.path().join("audit.jsonl")).unwrap_or_default();
    assert!(
        !audit.contains("\"component\":\"slurm\""),
        "nothing changed, nothing audited: {audit}"
    );
}

/// Starts an agent whose Slurm side fails, and checks the failure is a log line, a series and
/// a /health agent warning while the poller goes on.
fn fails_visibly(config: String, env: Option<&str>, results: &[&str], words: &[&str]) {
    let text = with_event(&two_gpus(), 1, XID79);
    let mut builder = Agent::with_scenario(&text).config(&config);
    if let Some(conf) = env {
        builder = builder.env("SLURM_CONF", conf);
    }
    let agent = builder.start();
    // Each call ends within its 10 s timeout: a controller that does not answer is a failure
    // (scontrol gives up after its own retries, ~9 s) or a timeout.
    wait_for(
        "a failed Slurm request counted",
        Duration::from_secs(40),
        || {
            let n: f64 = results.iter().map(|r| requests(&agent, "drain", r)).sum();
            (n >= 1.0).then_some(())
        },
    );
    let log = agent.log();
    let said = |l: &str| words.iter().any(|w| l.contains(w));
    let line = log
        .lines()
        .find(|l| l.contains("slurm:") && said(l))
        .unwrap_or_else(|| panic!("no log line with {words:?}: {log}"));
    assert!(line.contains("WARN"), "{line}");
    let health = agent.get("/health").json();
    assert_eq!(health["status"], "warn", "{health}");
    let warning = health["agent"]["warnings"]["slurm"]
        .as_str()
        .unwrap_or_default();
    assert!(said(warning), "{health}");
    assert_eq!(agent.metrics().get("gpu_steward_slurm_up", &[]), 0.0);
    let before = polls(&agent);
    wait_for("the poller going on", Duration::from_secs(10), || {
        (polls(&agent) >= before + 3.0).then_some(())
    });
}

#[test]
fn a_missing_scontrol_is_logged_counted_and_warned_and_the_poller_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    fails_visibly(
        slurm_config_window(dir.path(), NODE, "/nonexistent/bin/scontrol", "1h"),
        None,
        &["error"],
        &["set [slurm] scontrol"],
    );
}

#[test]
fn a_controller_that_does_not_answer_is_logged_counted_and_warned() {
    if !slurm::available("a_controller_that_does_not_answer_is_logged_counted_and_warned") {
        return;
    }
    // A cluster whose controller was never started: nothing listens on its port.
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let conf = dir.path().join("slurm.conf");
    std::fs::write(
        &conf,
        format!(
            "ClusterName=down\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={port}\n\
             AuthType=auth/none\nCredType=cred/none\nNodeName={NODE} CPUs=1\n\
             PartitionName=main Nodes={NODE} Default=YES\n"
        ),
    )
    .expect("conf");
    fails_visibly(
        // The XID stays for the whole test: each call takes up to 10 s here.
        slurm_config_window(dir.path(), NODE, "scontrol", "1h"),
        Some(&conf.display().to_string()),
        &["failure", "timeout"],
        &["Unable to contact slurm controller", "is slurmctld up"],
    );
}

#[test]
fn an_unknown_node_name_is_logged_counted_and_warned() {
    if !slurm::available("an_unknown_node_name_is_logged_counted_and_warned") {
        return;
    }
    let cluster = Cluster::start();
    fails_visibly(
        slurm_config_window(cluster.dir.path(), "no-such-node", "scontrol", "1h"),
        Some(&cluster.conf.display().to_string()),
        &["failure"],
        &["set [slurm] node_name"],
    );
}

/// An XID before a restart is in /api/v1/events after it, marked; the agent's state
/// directory is `$STATE_DIRECTORY`, as systemd sets it.
#[test]
fn the_journal_outlives_a_restart_and_a_damaged_one_is_set_aside() {
    let state = tempfile::tempdir().expect("tempdir");
    let dir = state.path().display().to_string();
    let text = with_event(&two_gpus(), 1, XID79);
    let config = "[health]\nxid_window = \"1h\"\n";
    let mut agent = Agent::with_scenario(&text)
        .config(config)
        .env("STATE_DIRECTORY", &dir)
        .start();
    let xid_79 = |v: &serde_json::Value| {
        v["events"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["condition"] == "xid_79" && e["kind"] == "raised")
            .cloned()
    };
    let before = wait_for("XID 79 journalled", Duration::from_secs(10), || {
        xid_79(&agent.get("/api/v1/events").json())
    });
    assert_eq!(before["uuid"], UUID);
    assert_eq!(before.get("before_restart"), None, "{before}");
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(agent.wait_exit(Duration::from_secs(5)).success());

    // The same node after a restart, the XID long delivered: the event is back, marked.
    let after = Agent::with_scenario(&two_gpus())
        .config(config)
        .env("STATE_DIRECTORY", &dir)
        .start();
    let events = after.get("/api/v1/events").json();
    let back = xid_79(&events).unwrap_or_else(|| panic!("not read back: {events}"));
    assert_eq!(back["before_restart"], true, "{back}");
    assert_eq!(back["time"], before["time"]);
    assert_eq!(back["reason"], before["reason"]);
    // `status` shows it too, marked (issue 32: the operator sees what happened before).
    let empty = state.path().join("empty.toml");
    std::fs::write(&empty, "").expect("an empty config");
    let out = std::process::Command::new(common::bin())
        .args([
            "status",
            "--url",
            &format!("http://127.0.0.1:{}", after.port),
        ])
        .arg("--config")
        .arg(&empty)
        .output()
        .expect("status");
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{screen}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        screen
            .lines()
            .any(|l| l.contains("GPU 1 raised xid_79 [fail")
                && l.starts_with("  (before the agent's restart) ")),
        "{screen}"
    );
    drop(after);

    // A damaged journal: set aside, reported, and the agent starts.
    let file = state.path().join("journal.jsonl");
    let mut damaged = std::fs::read(&file).expect("journal file");
    damaged.extend_from_slice(b"{\"time\": \"torn\n\x00\x01\n");
    std::fs::write(&file, damaged).expect("damage");
    let third = Agent::with_scenario(&two_gpus())
        .config(config)
        .env("STATE_DIRECTORY", &dir)
        .start();
    assert!(state.path().join("journal.jsonl.damaged").is_file());
    let log = third.log();
    assert!(
        log.contains("journal.jsonl' is damaged") && log.contains("set aside"),
        "{log}"
    );
    let health = third.get("/health").json();
    assert!(
        health["agent"]["warnings"]["journal"]
            .as_str()
            .is_some_and(|w| w.contains("damaged")),
        "{health}"
    );
    let events = third.get("/api/v1/events").json();
    assert!(
        xid_79(&events).is_some(),
        "the readable events are kept: {events}"
    );
}

fn nvsentinel_series(agent: &Agent, name: &str) -> f64 {
    agent.metrics().value(name, &[]).unwrap_or(-1.0)
}

#[test]
fn verdict_changes_reach_nvsentinel_in_order_through_a_connector_down_and_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("platform-connector.sock");
    let healthy = two_gpus();
    let agent = Agent::with_scenario(&with_event(&healthy, 1, XID79))
        .config(&format!(
            "[health]\nxid_window = \"3s\"\n[nvsentinel]\nsocket = \"{}\"\n",
            socket.display()
        ))
        .env("NODE_NAME", "node-a")
        .start();
    // Down from the start: logged, counted, warned; the poller goes on.
    wait_for("a failed send", Duration::from_secs(20), || {
        (nvsentinel_series(&agent, "gpu_steward_nvsentinel_send_failures_total") >= 1.0)
            .then_some(())
    });
    let health = agent.get("/health").json();
    assert!(
        health["agent"]["warnings"]["nvsentinel"]
            .as_str()
            .is_some_and(|w| w.contains(&socket.display().to_string())),
        "{health}"
    );
    assert!(agent
        .log()
        .contains("nvsentinel: cannot reach the platform connector"));

    // Up: the current state (XID 79 on GPU 1) arrives once the retry finds it.
    let mut connector = connector::Connector::new(&socket);
    connector.start();
    let fatal = wait_for("the XID 79 event", Duration::from_secs(40), || {
        connector
            .events()
            .into_iter()
            .find(|e| e.check_name == "xid_79" && e.is_fatal)
    });
    assert_eq!(fatal.version, 1);
    assert_eq!(fatal.agent, "gpu-steward");
    assert_eq!(fatal.component_class, "GPU");
    assert!(!fatal.is_healthy);
    assert!(fatal.message.contains("79"), "{}", fatal.message);
    // XID 79's catalog bucket RESTART_BM, NVSentinel's RESTART_BM = 24 in health_event.proto.
    assert_eq!(fatal.recommended_action, 24);
    assert_eq!(fatal.error_code, ["79"]);
    let entities: Vec<(String, String)> = fatal
        .entities_impacted
        .iter()
        .map(|e| (e.entity_type.clone(), e.entity_value.clone()))
        .collect();
    // GPU 1 of the DGX scenario: pci_bus_id "00000000:2A:00.0".
    assert_eq!(
        entities,
        [
            ("GPU".to_string(), "1".to_string()),
            ("PCI".into(), "00000000:2A:00.0".into()),
            ("GPU_UUID".into(), UUID.into())
        ]
    );
    assert_eq!(fatal.node_name, "node-a");
    let ts = fatal.generated_timestamp.clone().expect("timestamp");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    assert!((now - 120..=now).contains(&ts.seconds), "{ts:?}");
    wait_for("the warning cleared", Duration::from_secs(10), || {
        agent.get("/health").json()["agent"]["warnings"]
            .get("nvsentinel")
            .is_none()
            .then_some(())
    });

    // Down again while the GPU recovers: the healthy event waits in the queue.
    connector.stop();
    agent.rewrite_scenario(&healthy);
    wait_for("the recovery queued", Duration::from_secs(30), || {
        (nvsentinel_series(&agent, "gpu_steward_nvsentinel_queued_events") >= 1.0).then_some(())
    });
    connector.start();
    wait_for("the recovery sent", Duration::from_secs(40), || {
        let events = connector.events();
        let fatal_at = events
            .iter()
            .position(|e| e.check_name == "xid_79" && e.is_fatal)?;
        let healthy_at = events
            .iter()
            .position(|e| e.check_name == "xid_79" && e.is_healthy)?;
        assert!(fatal_at < healthy_at, "in order: {events:?}");
        let cleared = &events[healthy_at];
        assert!(!cleared.is_fatal);
        assert_eq!(cleared.recommended_action, 0, "NONE");
        Some(())
    });
    assert_eq!(
        nvsentinel_series(&agent, "gpu_steward_nvsentinel_events_dropped_total"),
        0.0
    );
}

/// XID 13 is an application fault (catalog RESTART_APP: warn, `restart_app`). NVSentinel's main
/// line has no app-restart action, so it goes as `NONE` and not fatal, with the configured
/// `processingStrategy`; the connector built from the main line refuses any value its enums
/// lack (as it would have refused the old 39).
#[test]
fn an_application_fault_reaches_a_main_line_connector_as_none_and_store_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("platform-connector.sock");
    let mut connector = connector::Connector::new(&socket);
    connector.start();
    let xid13 = "[[gpu.event]]\nid = 1\nxid = 13\n";
    let agent = Agent::with_scenario(&with_event(&two_gpus(), 1, xid13))
        .config(&format!(
            "[nvsentinel]\nsocket = \"{}\"\nprocessing_strategy = \"store_only\"\n",
            socket.display()
        ))
        .start();
    let event = wait_for("the XID 13 event", Duration::from_secs(40), || {
        assert!(
            connector.rejected().is_empty(),
            "{:?}",
            connector.rejected()
        );
        connector
            .events()
            .into_iter()
            .find(|e| e.check_name == "xid_13" && !e.is_healthy)
    });
    assert_eq!(event.recommended_action, 0, "NONE");
    assert!(!event.is_fatal);
    assert_eq!(event.processing_strategy, 2, "STORE_ONLY");
    assert!(event.id.is_empty(), "the connector assigns it");
    assert!(event.custom_recommended_action.is_empty());
    assert_eq!(event.error_code, ["13"]);
    assert_eq!(
        event
            .entities_impacted
            .last()
            .map(|e| e.entity_value.as_str()),
        Some(UUID)
    );
    assert!(
        connector.rejected().is_empty(),
        "{:?}",
        connector.rejected()
    );
    drop(agent);
}

#[test]
fn a_hanging_connector_and_a_path_that_is_not_a_socket_cost_a_timeout_not_the_poller() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Accepts connections and never answers.
    let hang = dir.path().join("hang.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&hang).expect("bind");
    let file = dir.path().join("file.sock");
    std::fs::write(&file, "").expect("file");
    for (socket, words) in [
        (&hang, "did not answer within 5s"),
        (&file, "is not a socket"),
    ] {
        let agent = Agent::with_scenario(&with_event(&two_gpus(), 1, XID79))
            .config(&format!(
                "[nvsentinel]\nsocket = \"{}\"\n",
                socket.display()
            ))
            .start();
        wait_for("a failed send", Duration::from_secs(20), || {
            (nvsentinel_series(&agent, "gpu_steward_nvsentinel_send_failures_total") >= 1.0)
                .then_some(())
        });
        assert!(agent.log().contains(words), "{words}: {}", agent.log());
        let health = agent.get("/health").json();
        assert_eq!(health["status"], "warn", "{health}");
        assert!(
            health["agent"]["warnings"]["nvsentinel"]
                .as_str()
                .is_some_and(|w| w.contains(words)),
            "{health}"
        );
        assert_eq!(nvsentinel_series(&agent, "gpu_steward_nvsentinel_up"), 0.0);
        let before = polls(&agent);
        wait_for("the poller going on", Duration::from_secs(10), || {
            (polls(&agent) >= before + 3.0).then_some(())
        });
    }
}

/// A GPU process of a running `sbatch` job on a node without Slurm cgroups
/// (`proctrack/linuxproc`): its job id comes from the process's environment.
#[test]
fn a_gpu_process_of_an_sbatch_job_is_labelled_with_its_job() {
    if !slurm::available("a_gpu_process_of_an_sbatch_job_is_labelled_with_its_job") {
        return;
    }
    let cluster = Cluster::start();
    let out = cluster
        .command("sbatch")
        .arg("--parsable")
        .arg("-o")
        .arg(cluster.dir.path().join("job.out"))
        .args(["--wrap", "exec sleep 300"])
        .output()
        .expect("sbatch");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = String::from_utf8_lossy(&out.stdout)
        .trim()
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    // Slurm's own answer: the job's processes on this node.
    let pid = wait_for("the job's sleep process", Duration::from_secs(30), || {
        let list = cluster.scontrol(&["listpids", &job])?;
        list.lines().skip(1).find_map(|l| {
            let pid: u32 = l.split_whitespace().next()?.parse().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            (comm.trim() == "sleep").then_some(pid)
        })
    });
    let text = format!(
        "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\n[[gpu.process]]\npid = {pid}\nused_memory_mib = 1000\n"
    );
    let agent = Agent::with_scenario(&text).start();
    let pid_s = pid.to_string();
    let labels = wait_for("the job's GPU process", Duration::from_secs(20), || {
        let m = agent.metrics();
        m.find("gpu_steward_process_memory_used_bytes", &[("pid", &pid_s)])
            .first()
            .map(|s| s.labels.clone())
    });
    let _ = cluster.command("scancel").arg(&job).status();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert_eq!(labels.get("slurm_job"), Some(&job), "{labels:?}");
    assert_eq!(labels.get("process").map(String::as_str), Some("sleep"));
}

/// Issue [26/28], defect 1: a MIG apply hung in the driver (a GPU instance creation that
/// takes 120 s) and a storm of reloads flipping `[mig] layout` behind it, then an XID 79: the
/// node is drained in Slurm promptly all the same (changes of each kind have their own bounded
/// threads; the reloads leave one apply pending, not one blocked thread each).
#[test]
fn a_drain_is_prompt_during_a_reload_storm_behind_a_hung_mig_apply() {
    if !slurm::available("a_drain_is_prompt_during_a_reload_storm_behind_a_hung_mig_apply") {
        return;
    }
    let cluster = Cluster::start();
    let dir = cluster.dir.path();
    let cost = dir.join("cost.json");
    let table = serde_json::json!({"functions": {
        "nvmlDeviceCreateGpuInstanceWithPlacement": {"wall_us": 120_000_000u64, "cpu_us": 0},
    }});
    std::fs::write(&cost, table.to_string()).expect("cost table");
    let layouts = "[[mig.layouts.seven]]\ndevices = \"all\"\nmig-enabled = true\n\
                   mig-devices = { \"1g.10gb\" = 7 }\n\
                   [[mig.layouts.balanced]]\ndevices = \"all\"\nmig-enabled = true\n\
                   mig-devices = { \"3g.40gb\" = 2 }\n";
    // Two idle H100s (no process in the way of a MIG apply), GPU 1 with the known UUID.
    let healthy = format!(
        "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"{UUID}\"\n"
    );
    let agent = Agent::with_scenario(&healthy)
        .config(&format!("{}{layouts}", slurm_config(dir, NODE, "scontrol")))
        .env("SLURM_CONF", &cluster.conf.display().to_string())
        .env(
            "NVML_SIM_STATE",
            &dir.join("state.json").display().to_string(),
        )
        .env("NVML_SIM_COST", &cost.display().to_string())
        .start();
    let dropins = agent.dir.path().join("config.d");
    std::fs::create_dir_all(&dropins).expect("config.d");
    let set_layout = |layout: &str| {
        let tmp = dropins.join(".layout.tmp");
        std::fs::write(&tmp, format!("[mig]\nlayout = \"{layout}\"\n")).expect("drop-in");
        std::fs::rename(&tmp, dropins.join("50-layout.toml")).expect("rename");
    };
    let audit = dir.join("audit.jsonl");
    set_layout("seven");
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for(
        "the apply hung in the driver",
        Duration::from_secs(20),
        || {
            if agent.log().contains("MIG layout not reached") {
                panic!("{}", agent.log());
            }
            std::fs::read_to_string(&audit)
                .unwrap_or_default()
                .contains(r#""event":"apply.start""#)
                .then_some(())
        },
    );
    // More reloads than the runtime's blocking pool has threads (512).
    for i in 0..700 {
        set_layout(["balanced", "seven"][i % 2]);
        agent.signal(nix::sys::signal::Signal::SIGHUP);
        std::thread::sleep(Duration::from_millis(10));
    }
    agent.rewrite_scenario(&with_event(&healthy, 1, XID79));
    let asked = std::time::Instant::now();
    wait_for(
        "the node drained during the storm",
        Duration::from_secs(30),
        || {
            let (state, reason) = cluster.node_state()?;
            (state.contains("DRAIN") && reason == our_reason()).then_some(())
        },
    );
    eprintln!(
        "drained {:?} after the XID, {} reloads",
        asked.elapsed(),
        agent.log().matches("configuration reloaded").count()
    );
}
