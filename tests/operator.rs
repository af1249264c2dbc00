//! What an operator meets on the command line, as they meet it: the real binary, against the
//! real agent on the simulated NVML where one is needed. `check-health` naming the GPU it
//! means, `RUST_LOG` refused as `--log-level` refuses it, `GPU_STEWARD_SCENARIO` read by every
//! command that takes `--scenario`, and `demo` with a broken scenario.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{bin, wait_for, with_gpu, Agent};

const UUID: &str = "GPU-0badc0de-1111-2222-3333-444455556666";

fn check_health(args: &[&str]) -> (i32, String) {
    let out = Command::new(bin())
        .arg("check-health")
        .args(args)
        .output()
        .expect("run check-health");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim_end().to_string(),
    )
}

#[test]
fn check_health_names_a_lost_gpu_by_the_uuid_it_had_and_its_model() {
    let node = format!(
        "version = 1\n[[gpu]]\nmodel = \"H200-SXM-141GB\"\nuuid = \"{UUID}\"\n\
         [[gpu]]\nmodel = \"H200-SXM-141GB\"\n"
    );
    let agent = Agent::with_scenario(&node).start();
    let url = format!("http://127.0.0.1:{}", agent.port);
    agent.rewrite_scenario(&with_gpu(&node, 0, "lost = true"));
    let line = wait_for("GPU 0 lost", Duration::from_secs(20), || {
        let (code, line) = check_health(&["--url", &url]);
        (code == 1).then_some(line)
    });
    // The scenario's UUID, read before the GPU fell off the bus; the model as NVML names it.
    assert!(
        line.starts_with(&format!("GPU 0 ({UUID}, H200")),
        "{line}\n{}",
        agent.log()
    );
    assert!(
        line.contains(" fails, action ") && line.len() < 256,
        "{line}"
    );
    let (code, line) = check_health(&["--url", &url, "--gpu", "0"]);
    assert_eq!(code, 1, "{line}");
    assert!(line.starts_with(&format!("GPU 0 ({UUID}, H200")), "{line}");

    // A page's URL is not the agent's address: refused, with what to write.
    let (code, line) = check_health(&["--url", &format!("{url}/metrics")]);
    assert_eq!(code, 2, "{line}");
    assert!(
        line.contains("'/metrics'") && line.contains(&format!("like '{url}'")),
        "{line}"
    );
    // A host that does not resolve: the URL tried is on the line.
    let (code, line) = check_health(&["--url", "http://no-such-host.invalid:9400"]);
    assert_eq!(code, 2, "{line}");
    assert!(
        line.starts_with("cannot ask the agent at http://no-such-host.invalid:9400/health/gpus: "),
        "{line}"
    );
}

/// Runs `cmd` to its exit, killing it after `limit` (a daemon that should have refused to start
/// but did not): (exit status, stdout and stderr).
fn exit_of(mut cmd: Command, limit: Duration) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = cmd
        .stdout(std::fs::File::create(&out).expect("out"))
        .stderr(std::fs::File::create(&err).expect("err"))
        .spawn()
        .expect("spawn");
    let deadline = std::time::Instant::now() + limit;
    let code = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&out).unwrap_or_default()
        + &std::fs::read_to_string(&err).unwrap_or_default();
    (code, text)
}

#[test]
fn rust_log_with_a_word_log_level_refuses_is_refused_the_same_way() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = dir.path().join("node.toml");
    std::fs::write(&node, common::scenario("dgx-h100.toml")).expect("scenario");
    let empty = dir.path().join("config.toml");
    std::fs::write(&empty, "").expect("config");
    let daemon = |env: Option<&str>, flag: Option<&str>| {
        let mut cmd = Command::new(bin());
        cmd.args(["run", "--listen", "127.0.0.1:0", "--config"])
            .arg(&empty)
            .arg("--nvml-lib")
            .arg(common::sim_lib())
            .env("NVML_SIM_SCENARIO", &node)
            .env_remove("RUST_LOG")
            .env_remove("GPU_STEWARD_LOG_LEVEL");
        if let Some(v) = env {
            cmd.env("RUST_LOG", v);
        }
        if let Some(v) = flag {
            cmd.args(["--log-level", v]);
        }
        exit_of(cmd, Duration::from_secs(20))
    };
    let (code, flag) = daemon(None, Some("verbose"));
    assert_eq!(code, Some(2), "{flag}");
    let (code, env) = daemon(Some("verbose"), None);
    assert_eq!(code, Some(2), "a daemon that started silenced: {env}");
    let reason =
        "invalid log level 'verbose': 'verbose' is not a level; use one of error, warn, info";
    assert!(flag.contains(reason), "{flag}");
    assert!(env.contains(&format!("RUST_LOG: {reason}")), "{env}");
}

#[test]
fn demo_with_a_broken_scenario_exits_2_at_its_file_line_and_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broken = dir.path().join("broken.toml");
    // Line 4, column 1: a key the format does not have.
    std::fs::write(
        &broken,
        "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nbogus_key = 3\n",
    )
    .expect("write");
    let mut cmd = Command::new(bin());
    cmd.args(["demo", "--listen", "127.0.0.1:0", "--scenario"])
        .arg(&broken)
        .arg("--nvml-lib")
        .arg(common::sim_lib())
        .env_remove("NVML_SIM_SCENARIO");
    let (code, text) = exit_of(cmd, Duration::from_secs(20));
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains(&format!("{}:4:1", broken.display())),
        "{text}"
    );
    assert!(!text.contains("no stand-in nvidia-smi"), "{text}");
}

#[test]
fn mig_and_sharing_read_gpu_steward_scenario() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = dir.path().join("node.toml");
    let text = with_gpu(
        &common::scenario("a100-mig.toml"),
        1,
        &format!("uuid = \"{UUID}\""),
    );
    std::fs::write(&node, text).expect("scenario");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[audit]\nfile = \"{}/audit.jsonl\"\n", dir.path().display()),
    )
    .expect("config");
    for args in [&["mig", "show"][..], &["sharing", "show"][..]] {
        let out = Command::new(bin())
            .args(args)
            .arg("--config")
            .arg(&config)
            .arg("--nvml-lib")
            .arg(common::sim_lib())
            .env("GPU_STEWARD_SCENARIO", &node)
            .env_remove("NVML_SIM_SCENARIO")
            .env_remove("NVML_SIM_STATE")
            .output()
            .expect("run");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(0), "{args:?}: {text}");
        // The scenario's GPU 1, which only the simulated node has.
        assert!(text.contains(UUID), "{args:?}: {text}");
    }
    // The simulator kept its MIG state beside the scenario, as with --scenario.
    assert!(dir.path().join("node.toml.state").is_file());
}

#[test]
fn mig_and_sharing_say_who_speaks_with_the_same_prefix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.toml");
    let empty = dir.path().join("config.toml");
    std::fs::write(&empty, "").expect("config");
    for cmd in ["mig", "sharing"] {
        let out = Command::new(bin())
            .args([cmd, "show", "--scenario"])
            .arg(&missing)
            .arg("--config")
            .arg(&empty)
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.starts_with(&format!(
                "gpu-steward {cmd}: scenario '{}' does not exist",
                missing.display()
            )),
            "{err}"
        );
    }
}
