//! The demo, and commands run with `--scenario`, write nothing of the node's: on a node with
//! the .deb installed, `$STATE_DIRECTORY` and `/var/lib/gpu-steward` hold the real agent's
//! health journal and audit log. The demo keeps its own in a throwaway directory it names and
//! removes; `mig`/`sharing --scenario` keep their audit log beside the scenario, unless the
//! named config sets `[audit] file`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{bin, Agent};

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The throwaway directory the demo's line names.
fn named_state(log: &str) -> PathBuf {
    let line = log
        .lines()
        .find(|l| l.starts_with("gpu-steward demo: state"))
        .unwrap_or_else(|| panic!("no line saying where the demo writes:\n{log}"));
    let path = line
        .split('\'')
        .nth(1)
        .unwrap_or_else(|| panic!("no quoted path: {line}"));
    PathBuf::from(path)
}

#[test]
fn the_demo_keeps_its_journal_and_audit_log_in_a_throwaway_directory_it_names() {
    let scratch = tempfile::tempdir().expect("tempdir");
    // The installed agent's state directory, as systemd would hand it down, with a journal
    // holding another agent's event.
    let node_state = scratch.path().join("node-state");
    std::fs::create_dir(&node_state).expect("mkdir");
    let other = "{\"ts\":\"2026-11-20T10:00:00Z\",\"gpu\":0,\"uuid\":\"GPU-0\",\"kind\":\"xid\",\"reason\":\"xid_48\"}\n";
    std::fs::write(node_state.join("journal.jsonl"), other).expect("journal");
    let tmp = scratch.path().join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir");
    let mut agent = Agent::with_scenario("")
        .demo()
        .env("STATE_DIRECTORY", &node_state.display().to_string())
        .env("TMPDIR", &tmp.display().to_string())
        .start();
    let log = agent.log();
    let state = named_state(&log);
    assert!(state.starts_with(&tmp), "{log}");
    assert!(log.contains("its audit log there too"), "{log}");
    // The demo's journal is in its own directory; the node's is as it was.
    assert!(
        state.join("journal.jsonl").is_file(),
        "{:?}",
        listing(&state)
    );
    assert_eq!(listing(&node_state), ["journal.jsonl"]);
    assert_eq!(
        std::fs::read_to_string(node_state.join("journal.jsonl")).expect("read"),
        other
    );
    // Nothing read back from another agent's journal: no event before a restart.
    let health = agent.get("/health").text();
    assert!(!health.contains("xid_48"), "{health}");
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(agent.wait_exit(Duration::from_secs(20)).success());
    assert!(
        !state.exists(),
        "the throwaway directory is removed at exit"
    );
}

#[test]
fn the_demo_keeps_the_audit_log_a_named_config_sets() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let audit = scratch.path().join("mine.jsonl");
    let tmp = scratch.path().join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir");
    let agent = Agent::with_scenario("")
        .demo()
        .config(&format!("[audit]\nfile = \"{}\"\n", audit.display()))
        .env("TMPDIR", &tmp.display().to_string())
        .start();
    let log = agent.log();
    assert!(
        log.contains(&format!(
            "its audit log '{}' (from the config's [audit] file)",
            audit.display()
        )),
        "{log}"
    );
}

#[test]
fn mig_apply_on_a_scenario_keeps_its_audit_log_beside_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = dir.path().join("node.toml");
    std::fs::write(&node, common::scenario("dgx-h100.toml")).expect("scenario");
    let layouts = dir.path().join("layouts.yaml");
    std::fs::write(
        &layouts,
        "version: v1\nmig-configs:\n  all-1g:\n    - devices: [7]\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": 7\n",
    )
    .expect("layouts");
    // No --config, as an operator tries it on an installed node: the node's audit log
    // (/var/lib/gpu-steward/audit.jsonl) is not the simulated node's.
    let out = Command::new(bin())
        .args(["mig", "apply", "--layout", "all-1g", "--mig-config"])
        .arg(&layouts)
        .arg("--scenario")
        .arg(&node)
        .arg("--nvml-lib")
        .arg(common::sim_lib())
        .env_remove("NVML_SIM_SCENARIO")
        .env_remove("NVML_SIM_STATE")
        .env_remove("GPU_STEWARD_CONFIG")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    let audit = dir.path().join("node.toml.steward/audit.jsonl");
    assert!(
        err.contains(&format!(
            "gpu-steward mig: simulated node: audit log '{}'",
            audit.display()
        )),
        "{err}"
    );
    assert_eq!(out.status.code(), Some(0), "{err}");
    let records = std::fs::read_to_string(&audit).expect("the audit log beside the scenario");
    assert!(records.contains("\"event\":\"apply.done\""), "{records}");
}

/// On a node where the installed agent holds the port, the demo says so, naming the process,
/// instead of guessing at another exporter.
#[test]
fn a_demo_on_a_port_the_agent_holds_names_the_holder() {
    let service = Agent::with_scenario(&common::scenario("dgx-h100.toml")).start();
    let scratch = tempfile::tempdir().expect("tempdir");
    let out = Command::new(bin())
        .args(["demo", "--listen", &format!("127.0.0.1:{}", service.port)])
        .arg("--nvml-lib")
        .arg(common::sim_lib())
        .env("TMPDIR", scratch.path())
        .env_remove("NVML_SIM_SCENARIO")
        .env_remove("GPU_STEWARD_CONFIG")
        .output()
        .expect("run the demo");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "the port is held by gpu-steward (pid {}, user ",
            service.child.id()
        )),
        "{err}"
    );
    assert!(!err.contains("dcgm-exporter?"), "{err}");
    // The throwaway directory went with the demo.
    assert!(
        listing(scratch.path()).is_empty(),
        "{:?}",
        listing(scratch.path())
    );
}

/// The check docs/install.md gives after installing passes with the service running: an
/// agent holds the page's 9400 (moved to a free port, as is the page's 9401).
#[test]
fn the_install_check_in_docs_passes_with_the_service_running() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/install.md"))
            .expect("docs/install.md");
    let begin =
        "<!-- install check: run by tests/demo_state.rs with the service holding 9400 -->\n```sh\n";
    let start = doc.find(begin).expect("the install check block") + begin.len();
    let end = start + doc[start..].find("```\n").expect("the block's end");
    // A node in trouble: `check-health` on it would exit 1, so a 0 is the demo's answer.
    let service = Agent::with_scenario(&common::scenario("faults.toml")).start();
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let script = doc[start..end]
        .replace("9401", &free.to_string())
        .replace("9400", &service.port.to_string());
    let scratch = tempfile::tempdir().expect("tempdir");
    let dir = Path::new(bin()).parent().expect("the binary's directory");
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .env("PATH", path)
        .env("GPU_STEWARD_NVML_LIB", common::sim_lib())
        .env("TMPDIR", scratch.path())
        .env_remove("NVML_SIM_SCENARIO")
        .env_remove("GPU_STEWARD_CONFIG")
        .env_remove("GPU_STEWARD_URL")
        .output()
        .expect("run the check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{script}\n{text}");
    assert!(text.contains("all 8 GPUs pass"), "{text}");
    let _ = service;
}
