//! Compute mode and time-slice, applied by the real binary against the simulated NVML and a
//! stand-in `nvidia-smi` that records its arguments (tests/sharing_support/nvidia-smi).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::fullfs::SmallFs;
use common::{bin, sim_lib, wait_for, Agent};

const GPU0: &str = "GPU-5a000000-1111-2222-3333-444444444444";
const GPU1: &str = "GPU-5a000001-1111-2222-3333-444444444444";

fn scenario(extra1: &str) -> String {
    format!(
        "version = 1\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"{GPU0}\"\ncompute_mode = \"prohibited\"\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"{GPU1}\"\n{extra1}"
    )
}

/// A temporary directory with the stand-in nvidia-smi, the scenario and a config.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new(scenario: &str) -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sharing_support/nvidia-smi");
        std::fs::copy(&src, dir.path().join("nvidia-smi")).expect("copy stand-in");
        std::fs::write(dir.path().join("uuids"), format!("{GPU0}\n{GPU1}\n")).expect("uuids");
        std::fs::write(dir.path().join("scenario.toml"), scenario).expect("scenario");
        Node { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn config(&self, sharing: &str) -> String {
        format!(
            "[audit]\nfile = \"{}\"\n[sharing]\nnvidia_smi = \"{}\"\n{sharing}",
            self.path("audit.jsonl").display(),
            self.path("nvidia-smi").display()
        )
    }

    fn write_config(&self, sharing: &str) -> PathBuf {
        let p = self.path("config.toml");
        std::fs::write(&p, self.config(sharing)).expect("config");
        p
    }

    fn args_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("nvidia-smi.args"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn timeslice(&self, uuid: &str) -> String {
        std::fs::read_to_string(self.path(&format!("ts.{uuid}")))
            .map_or("Default".into(), |s| s.trim().to_string())
    }

    fn audit(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.path("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
            .collect()
    }

    /// Runs `gpu-steward sharing <args> --json`; returns the exit code and the report.
    fn cli(&self, args: &[&str]) -> (i32, serde_json::Value) {
        self.cli_with(Command::new(bin()), args)
    }

    /// [`Node::cli`] with `cmd` (a `gpu-steward` command, perhaps run inside a namespace).
    fn cli_with(&self, mut cmd: Command, args: &[&str]) -> (i32, serde_json::Value) {
        let out = cmd
            .arg("sharing")
            .args(args)
            .arg("--config")
            .arg(self.path("config.toml"))
            .arg("--nvml-lib")
            .arg(sim_lib())
            .arg("--json")
            .env("NVML_SIM_SCENARIO", self.path("scenario.toml"))
            .output()
            .expect("run gpu-steward sharing");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let report = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {stdout}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), report)
    }
}

fn outcomes(report: &serde_json::Value) -> Vec<(u64, String, String)> {
    report["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (
                s["gpu"].as_u64().expect("gpu"),
                s["setting"].as_str().expect("setting").to_string(),
                s["outcome"].as_str().expect("outcome").to_string(),
            )
        })
        .collect()
}

const SETTINGS: &str = "compute_mode = \"default\"\ntimeslice = \"long\"\n\
                        [[sharing.gpu]]\nid = 1\ncompute_mode = \"exclusive_process\"\n";

#[test]
fn show_changes_nothing_and_apply_makes_the_node_match() {
    let node = Node::new(&scenario(""));
    node.write_config(SETTINGS);

    let (code, show) = node.cli(&["show"]);
    assert_eq!(code, 0, "{show}");
    assert_eq!(
        outcomes(&show),
        [
            (0, "compute_mode".into(), "planned".into()),
            (0, "timeslice".into(), "planned".into()),
            (1, "compute_mode".into(), "planned".into()),
            (1, "timeslice".into(), "planned".into()),
        ]
    );
    assert_eq!(
        show["observed"][0]["compute_mode"],
        serde_json::json!({"result": "ok", "value": "prohibited"}),
        "{show}"
    );
    assert!(
        node.args_log().iter().all(|a| a == "compute-policy -l"),
        "show only lists: {:?}",
        node.args_log()
    );
    assert!(
        node.audit().is_empty(),
        "a dry run is not audited as a change"
    );

    let (code, applied) = node.cli(&["apply"]);
    assert_eq!(code, 0, "{applied}");
    assert!(applied["ok"].as_bool().expect("ok"), "{applied}");
    assert!(outcomes(&applied).iter().all(|(_, _, o)| o == "applied"));
    // Verified by observing again in the same process (the simulator keeps the compute mode
    // while loaded, like a driver).
    assert_eq!(applied["after"][0]["compute_mode"]["value"], "default");
    assert_eq!(
        applied["after"][1]["compute_mode"]["value"],
        "exclusive_process"
    );
    assert_eq!(node.timeslice(GPU0), "Long");
    assert_eq!(node.timeslice(GPU1), "Long");
    let sets: Vec<String> = node
        .args_log()
        .into_iter()
        .filter(|a| a.contains("--set-timeslice"))
        .collect();
    assert_eq!(
        sets,
        [
            format!("compute-policy -i {GPU0} --set-timeslice 3"),
            format!("compute-policy -i {GPU1} --set-timeslice 3"),
        ]
    );
    let audit = node.audit();
    let events: Vec<&str> = audit
        .iter()
        .map(|r| r["event"].as_str().expect("event"))
        .collect();
    assert_eq!(
        events,
        [
            "apply.start",
            "apply.step",
            "apply.step",
            "apply.step",
            "apply.step",
            "apply.end"
        ]
    );
    // Every record, each step's included, says what started the apply.
    assert!(
        audit
            .iter()
            .all(|r| r["component"] == "sharing" && r["trigger"] == "cli"),
        "{audit:?}"
    );

    // The time-slices persist (nvidia-smi keeps them); a second apply only has the compute
    // modes to set again (the simulator forgets them between processes).
    let (code, again) = node.cli(&["apply"]);
    assert_eq!(code, 0, "{again}");
    assert!(
        outcomes(&again).iter().all(|(_, s, _)| s == "compute_mode"),
        "{again}"
    );
}

#[test]
fn a_failure_in_the_middle_is_reported_and_undone() {
    let node = Node::new(&scenario(""));
    node.write_config(SETTINGS);
    std::fs::write(node.path("fail"), format!("{GPU1}\n")).expect("fail file");

    let (code, report) = node.cli(&["apply"]);
    assert_eq!(code, 1, "{report}");
    assert!(!report["ok"].as_bool().expect("ok"));
    assert!(
        report["consistent"].as_bool().expect("consistent"),
        "{report}"
    );
    assert_eq!(
        outcomes(&report),
        [
            (0, "compute_mode".into(), "rolled_back".into()),
            (0, "timeslice".into(), "rolled_back".into()),
            (1, "compute_mode".into(), "rolled_back".into()),
            (1, "timeslice".into(), "failed".into()),
        ]
    );
    let error = report["steps"][3]["error"].as_str().expect("error");
    assert!(error.contains("Insufficient Permissions"), "{error}");
    // Left as it was found: GPU 0 back to prohibited and Default.
    assert_eq!(report["after"][0]["compute_mode"]["value"], "prohibited");
    assert_eq!(report["after"][1]["compute_mode"]["value"], "default");
    assert_eq!(node.timeslice(GPU0), "Default");
    assert!(node
        .args_log()
        .contains(&format!("compute-policy -i {GPU0} --set-timeslice 0")));
    let audit = node.audit();
    assert!(audit
        .iter()
        .any(|r| r["event"] == "apply.step" && r["outcome"] == "rolled_back"));
    assert!(audit
        .iter()
        .any(|r| r["event"] == "apply.end" && r["ok"] == false && r["consistent"] == true));
}

#[test]
fn an_nvml_refusal_is_reported_and_undone() {
    let node = Node::new(&scenario(
        "errors = { nvmlDeviceSetComputeMode = \"NO_PERMISSION\" }\n",
    ));
    node.write_config("compute_mode = \"default\"\n[[sharing.gpu]]\nid = 1\ncompute_mode = \"exclusive_process\"\n");
    let (code, report) = node.cli(&["apply"]);
    assert_eq!(code, 1, "{report}");
    assert_eq!(
        outcomes(&report),
        [
            (0, "compute_mode".into(), "rolled_back".into()),
            (1, "compute_mode".into(), "failed".into()),
        ]
    );
    let error = report["steps"][1]["error"].as_str().expect("error");
    assert!(
        error.contains("nvmlDeviceSetComputeMode answered"),
        "{error}"
    );
    assert_eq!(report["after"][0]["compute_mode"]["value"], "prohibited");
    assert!(
        node.args_log().is_empty(),
        "no time-slice configured: nvidia-smi is never run"
    );
}

/// Issue 26 bug 1: a time-slice is configured but nvidia-smi is missing. The compute modes are
/// read, applied and kept; the time-slices are left alone; the report, its text and the audit
/// log all say exactly that, and none of them claims an undo that never happened.
#[test]
fn a_missing_nvidia_smi_leaves_the_timeslice_and_reports_exactly_what_was_applied() {
    let node = Node::new(&scenario(""));
    std::fs::write(
        node.path("config.toml"),
        node.config(SETTINGS).replace(
            &node.path("nvidia-smi").display().to_string(),
            &node.path("no-such-nvidia-smi").display().to_string(),
        ),
    )
    .expect("config");

    let (code, report) = node.cli(&["apply"]);
    assert_eq!(
        code, 1,
        "the node does not match the configuration: {report}"
    );
    assert!(!report["ok"].as_bool().expect("ok"), "{report}");
    assert!(
        report["consistent"].as_bool().expect("consistent"),
        "{report}"
    );
    assert!(report.get("error").is_none(), "{report}");
    assert_eq!(
        outcomes(&report),
        [
            (0, "compute_mode".into(), "applied".into()),
            (1, "compute_mode".into(), "applied".into()),
        ]
    );
    assert_eq!(report["after"][0]["compute_mode"]["value"], "default");
    assert_eq!(
        report["after"][1]["compute_mode"]["value"],
        "exclusive_process"
    );
    let unread: Vec<&serde_json::Value> = report["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .filter(|s| s["setting"] == "timeslice" && s["error"] == true)
        .collect();
    assert_eq!(unread.len(), 2, "{report}");

    let end = node
        .audit()
        .into_iter()
        .find(|r| r["event"] == "apply.end")
        .expect("apply.end");
    assert_eq!(
        (
            &end["ok"],
            &end["consistent"],
            &end["applied"],
            &end["rolled_back"]
        ),
        (
            &serde_json::json!(false),
            &serde_json::json!(true),
            &serde_json::json!(2),
            &serde_json::json!(0)
        ),
        "{end}"
    );

    // The same run as text: what was applied, what was left, no undo.
    let out = Command::new(bin())
        .args(["sharing", "apply", "--config"])
        .arg(node.path("config.toml"))
        .arg("--nvml-lib")
        .arg(sim_lib())
        .env("NVML_SIM_SCENARIO", node.path("scenario.toml"))
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("undo"), "{text}");
    assert!(
        text.contains(
            "applied 2 change(s); 2 setting(s) could not be read and are left as they are"
        ),
        "{text}"
    );
}

#[test]
fn the_daemon_applies_at_start_and_on_sighup_only_what_differs() {
    let node = Node::new("");
    let agent = Agent::with_scenario(&scenario(""))
        .config(&node.config(SETTINGS))
        .start();
    let applied_at_start = || {
        node.audit()
            .iter()
            .filter(|r| r["event"] == "apply.end" && r["ok"] == true)
            .count()
    };
    wait_for("the start apply", Duration::from_secs(20), || {
        (applied_at_start() == 1).then_some(())
    });
    // The poller reads the compute mode (slow tier) and metrics show it.
    wait_for("compute mode metrics", Duration::from_secs(20), || {
        let m = agent.metrics();
        let mode = |uuid: &str, mode: &str| {
            m.value(
                "gpu_steward_compute_mode",
                &[("uuid", uuid), ("mode", mode)],
            )
        };
        (mode(GPU0, "default") == Some(1.0) && mode(GPU1, "exclusive_process") == Some(1.0))
            .then_some(())
    });
    let before = node.args_log().len();
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for("the reload's apply", Duration::from_secs(20), || {
        agent
            .log()
            .contains("sharing: the node matches the configuration")
            .then_some(())
    });
    let after = node.args_log();
    assert!(
        after[before..].iter().all(|a| a == "compute-policy -l"),
        "idempotent: {after:?}"
    );
    assert_eq!(
        applied_at_start(),
        1,
        "no second apply.start/end: nothing changed"
    );
}

/// Issue [25/28] item 4: sharing applies take the node lock, as MIG applies do. A CLI apply that
/// holds it makes the API's refused at once (409, naming the CLI's pid, nothing changed); the
/// daemon's start-time apply that holds it makes the CLI wait, saying for whom. Without the lock
/// the API's apply ran beside the CLI's (200).
#[test]
fn the_cli_and_the_daemon_never_apply_sharing_at_once() {
    use std::os::unix::fs::PermissionsExt;
    let node = Node::new(&scenario(""));
    let token = node.path("api-token");
    std::fs::write(&token, "s3cret\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let api = |sharing: &str| {
        format!(
            "[api]\nenabled = true\ntoken_file = \"{}\"\n{}",
            token.display(),
            node.config(sharing)
        )
    };
    // Each time-slice set takes 2 s: an apply holds the node lock for seconds.
    std::fs::write(node.path("slow"), "2").expect("slow");
    let set_calls = || {
        node.args_log()
            .iter()
            .filter(|a| a.starts_with("compute-policy -i"))
            .count()
    };

    // The daemon has nothing to apply at start; the CLI applies the time-slices, slowly.
    let agent = Agent::with_scenario(&scenario("")).config(&api("")).start();
    node.write_config(SETTINGS);
    let mut cli = Command::new(bin())
        .args(["sharing", "apply", "--config"])
        .arg(node.path("config.toml"))
        .arg("--nvml-lib")
        .arg(sim_lib())
        .env("NVML_SIM_SCENARIO", node.path("scenario.toml"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the CLI apply");
    let t0 = std::time::Instant::now();
    while set_calls() == 0 {
        let ended = cli.try_wait().ok().flatten();
        if ended.is_some() || t0.elapsed() > Duration::from_secs(20) {
            let _ = cli.kill();
            let out = cli.wait_with_output().expect("CLI");
            panic!(
                "no time-slice set by the CLI ({ended:?}): {}{}\nnvidia-smi: {:?}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                node.args_log()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let busy = post(&agent, "/api/v1/sharing/apply", Some("s3cret"));
    assert_eq!(busy.status, 409, "{}", busy.text());
    let report = busy.json();
    assert_eq!(report["busy"], true, "{report}");
    assert!(
        report["steps"].as_array().is_some_and(Vec::is_empty),
        "nothing was changed: {report}"
    );
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.contains(&format!("pid {}", cli.id())), "{error}");
    let out = cli.wait_with_output().expect("CLI");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(set_calls(), 2, "the CLI's two sets, none of the API's");
    drop(agent);

    // The daemon's start-time apply (time-slices back to the default) holds the lock; the CLI
    // waits for it, saying whose, then makes the node match its own configuration.
    let daemon_settings = "timeslice = \"default\"\n";
    let agent = Agent::with_scenario(&scenario(""))
        .config(&api(daemon_settings))
        .start();
    wait_for(
        "the daemon's first time-slice set",
        Duration::from_secs(20),
        || (set_calls() > 2).then_some(()),
    );
    let out = Command::new(bin())
        .args(["sharing", "apply", "--config"])
        .arg(node.path("config.toml"))
        .arg("--nvml-lib")
        .arg(sim_lib())
        .env("NVML_SIM_SCENARIO", node.path("scenario.toml"))
        .output()
        .expect("run the CLI apply");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "waiting for the apply of pid {} to release the node lock",
            agent.child.id()
        )),
        "{err}"
    );
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        (node.timeslice(GPU0), node.timeslice(GPU1)),
        ("Long".into(), "Long".into()),
        "the CLI's apply came after the daemon's"
    );
}

fn post(agent: &Agent, path: &str, token: Option<&str>) -> common::Response {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    agent.request(&format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    ))
}

#[test]
fn the_api_applies_only_when_on_and_authenticated() {
    use std::os::unix::fs::PermissionsExt;
    let node = Node::new("");
    let token = node.path("api-token");
    std::fs::write(&token, "s3cret\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    // Nothing to apply at start: only the per-GPU override, set through the API later.
    let off = Agent::with_scenario(&scenario(""))
        .config(&node.config(""))
        .start();
    assert_eq!(
        post(&off, "/api/v1/sharing/apply", Some("s3cret")).status,
        404
    );
    drop(off);

    let config = format!(
        "[api]\nenabled = true\ntoken_file = \"{}\"\n{}",
        token.display(),
        node.config("[[sharing.gpu]]\nid = 0\ncompute_mode = \"exclusive_process\"\n")
    );
    let agent = Agent::with_scenario(&scenario("")).config(&config).start();
    wait_for("the start apply", Duration::from_secs(20), || {
        node.audit()
            .iter()
            .any(|r| r["event"] == "apply.end")
            .then_some(())
    });
    assert_eq!(post(&agent, "/api/v1/sharing/apply", None).status, 401);
    assert_eq!(
        post(&agent, "/api/v1/sharing/apply", Some("wrong")).status,
        401
    );
    let bad = post(
        &agent,
        "/api/v1/sharing/apply?dry_run=maybe",
        Some("s3cret"),
    );
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert!(bad.text().contains("invalid dry_run 'maybe'"));

    let dry = post(&agent, "/api/v1/sharing/apply?dry_run=true", Some("s3cret"));
    assert_eq!(dry.status, 200, "{}", dry.text());
    let report = dry.json();
    assert_eq!(report["trigger"], "api");
    assert_eq!(report["dry_run"], true);
    assert!(
        report["steps"].as_array().expect("steps").is_empty(),
        "applied at start already: {report}"
    );
    assert_eq!(report["unchanged"], 1);

    let shown = agent.get("/api/v1/sharing");
    assert_eq!(shown.status, 200);
    let shown = shown.json();
    assert_eq!(shown["last_apply"]["trigger"], "api");
    assert_eq!(
        shown["config"]["gpus"][0]["compute_mode"],
        "exclusive_process"
    );
    // Published through the next poll.
    wait_for("the applies counter", Duration::from_secs(20), || {
        let m = agent.metrics();
        (m.value(
            "gpu_steward_sharing_applies_total",
            &[("trigger", "start"), ("result", "ok")],
        ) == Some(1.0))
        .then_some(())
    });
}

#[test]
fn the_memory_guard_reports_and_signals_a_process_over_its_share() {
    // Two real processes the scenario says use GPU 0: one over its 10 GiB share, one under.
    let mut hog = Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("spawn sleep");
    let mut small = Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("spawn sleep");
    let scenario = format!(
        "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"{GPU0}\"\n\
         [[gpu.process]]\npid = {}\nused_memory_mib = 12288\n\
         [[gpu.process]]\npid = {}\nused_memory_mib = 2048\n",
        hog.id(),
        small.id()
    );
    let node = Node::new("");
    let agent = Agent::with_scenario(&scenario)
        .config(&node.config(
            "[sharing.time_slicing]\n[[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpu\"\n\
             replicas = 4\nmemory_per_replica = \"10GiB\"\n\
             [sharing.memory_guard]\naction = \"signal\"\ngrace = \"0s\"\ndry_run = false\n",
        ))
        .start();
    let status = wait_for("the hog signalled", Duration::from_secs(20), || {
        hog.try_wait().expect("try_wait")
    });
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(15), "SIGTERM");
    assert!(
        small.try_wait().expect("try_wait").is_none(),
        "under its share: left alone"
    );
    let record = node
        .audit()
        .into_iter()
        .find(|r| r["event"] == "memory_guard.signal")
        .expect("audited");
    assert_eq!(record["pid"], hog.id());
    assert_eq!(record["result"], "sent");
    assert_eq!(record["limit_bytes"], 10u64 << 30);
    wait_for("guard metrics", Duration::from_secs(20), || {
        let m = agent.metrics();
        (m.value(
            "gpu_steward_sharing_memory_guard_signals_total",
            &[("result", "sent")],
        ) == Some(1.0)
            && m.value(
                "gpu_steward_sharing_memory_over_limit_bytes",
                &[("pid", &hog.id().to_string())],
            ) == Some((2u64 << 30) as f64))
        .then_some(())
    });
    assert!(agent
        .log()
        .contains("memory guard: process over its replica's memory share"));
    let _ = small.kill();
    let _ = small.wait();
}

#[test]
fn a_full_audit_disk_refuses_the_apply_before_any_change() {
    let Some(fs) = SmallFs::new("a_full_audit_disk_refuses_the_apply_before_any_change", 256)
    else {
        return;
    };
    let node = Node::new(&scenario(""));
    let audit = fs.inside().join("audit.jsonl");
    std::fs::write(
        node.path("config.toml"),
        node.config(SETTINGS).replace(
            &node.path("audit.jsonl").display().to_string(),
            &audit.display().to_string(),
        ),
    )
    .expect("config");
    fs.fill();
    let (code, report) = node.cli_with(fs.command(bin()), &["apply"]);
    assert_ne!(code, 0, "{report}");
    assert_eq!(report["audit_failed"], true, "{report}");
    let error = report["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&audit.display().to_string()) && error.contains("No space left"),
        "{report}"
    );
    assert!(
        node.args_log().iter().all(|a| a == "compute-policy -l"),
        "changed unrecorded: {:?}",
        node.args_log()
    );
    assert_eq!(node.timeslice(GPU0), "Default");

    fs.free();
    let (code, report) = node.cli_with(fs.command(bin()), &["apply"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(node.timeslice(GPU0), "Long");
    let events: Vec<String> = fs
        .json_lines("audit.jsonl")
        .iter()
        .map(|r| r["event"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(events.first().map(String::as_str), Some("apply.start"));
    assert_eq!(events.last().map(String::as_str), Some("apply.end"));
}

/// Issue 34: a change shows at the next poll. Compute modes are on the slow tier, read here
/// every 60 s; the reload's apply wakes the poller, whose next poll (1 s) reads it at once.
#[test]
fn a_sharing_change_shows_on_metrics_at_the_next_poll_not_the_slow_tiers_turn() {
    let node = Node::new("");
    let config = |sharing: &str| {
        format!(
            "[poller]\ninterval = \"1s\"\nslow_interval = \"60s\"\n{}",
            node.config(sharing)
        )
    };
    let agent = Agent::with_scenario(&scenario(""))
        .config(&config(""))
        .interval("1s")
        .start();
    let mode = |uuid: &str, mode: &str| {
        agent.metrics().value(
            "gpu_steward_compute_mode",
            &[("uuid", uuid), ("mode", mode)],
        )
    };
    // The scenario's mode, read by the first poll.
    wait_for(
        "the scenario's compute mode",
        Duration::from_secs(20),
        || (mode(GPU0, "prohibited") == Some(1.0)).then_some(()),
    );
    agent.rewrite_config(&config(SETTINGS));
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for("the reload's apply", Duration::from_secs(20), || {
        node.audit()
            .iter()
            .any(|r| r["event"] == "apply.end" && r["ok"] == true)
            .then_some(())
    });
    // Well before the slow tier's next turn (60 s after the first).
    wait_for("the new modes on /metrics", Duration::from_secs(15), || {
        (mode(GPU0, "default") == Some(1.0) && mode(GPU1, "exclusive_process") == Some(1.0))
            .then_some(())
    });
}
