//! The command line: `check-config`, exit codes, errors with positions.

mod common;

use std::process::Command;

use common::bin;

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).expect("write");
    p
}

#[test]
fn check_config_accepts_a_valid_file_and_says_what_it_would_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = write(
        &dir,
        "good.toml",
        "[server]\nlisten = \"127.0.0.1:9500\"\n[poller]\ninterval = \"2s\"\n[metrics]\ndcgm = false\n",
    );
    let out = Command::new(bin())
        .arg("check-config")
        .arg(&good)
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("valid"), "{stdout}");
    assert!(stdout.contains("127.0.0.1:9500"), "{stdout}");
    assert!(stdout.contains("poll every 2s"), "{stdout}");
    assert!(stdout.contains("dcgm-compatible off"), "{stdout}");
}

/// Issue 26, deliver 3: a valid file that cannot work as written says so, and check-config
/// lists the rules and routes it loaded.
#[test]
fn check_config_warns_of_an_unwritable_audit_log_and_an_empty_rules_glob_and_lists_what_it_loaded()
{
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        &dir,
        "hot.yml",
        "groups:\n- name: thermal\n  rules:\n  - alert: GpuHot\n    expr: DCGM_FI_DEV_GPU_TEMP > 90\n  - alert: GpuVeryHot\n    expr: DCGM_FI_DEV_GPU_TEMP > 95\n",
    );
    let cfg = write(
        &dir,
        "c.toml",
        &format!(
            "[audit]\nfile = \"{}/no-such-dir/audit.jsonl\"\n\
             [rules]\nfiles = [\"hot.yml\", \"rules.d/*.yml\"]\n\
             [[remediation.hooks]]\nname = \"page\"\ncommand = [\"/bin/true\"]\n\
             [[remediation.routes]]\nmatchers = ['alertname=\"GpuHot\"']\nhooks = [\"page\"]\n",
            dir.path().display()
        ),
    );
    let out = Command::new(bin())
        .arg("check-config")
        .arg(&cfg)
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("group 'thermal': GpuHot, GpuVeryHot"),
        "{stdout}"
    );
    assert!(
        stdout.contains("route [alertname=\"GpuHot\"] -> page"),
        "{stdout}"
    );
    assert!(!stdout.contains("[\""), "no Rust Debug lists: {stdout}");
    assert!(
        stderr.contains("warning: the audit log's directory")
            && stderr.contains("no-such-dir' does not exist")
            && stderr.contains("would be refused"),
        "{stderr}"
    );
    assert!(
        stderr.contains("warning: [rules] files pattern")
            && stderr.contains("rules.d/*.yml' matches no file"),
        "{stderr}"
    );
    // Fixed, the warnings go.
    std::fs::create_dir(dir.path().join("no-such-dir")).expect("mkdir");
    std::fs::create_dir(dir.path().join("rules.d")).expect("mkdir");
    write(&dir, "rules.d/more.yml", "groups: []\n");
    let out = Command::new(bin())
        .arg("check-config")
        .arg(&cfg)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn config_errors_exit_2_with_file_line_and_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "unknown.toml",
            "[poller]\ninterval = \"1s\"\nintervall = \"2s\"\n",
            ":3:1: unknown field `intervall`",
        ),
        (
            "duration.toml",
            "[poller]\ninterval = \"fast\"\n",
            ":2:12: invalid duration 'fast'",
        ),
        ("syntax.toml", "[poller\n", ":1:"),
        ("type.toml", "[metrics]\nnative = 1\n", ":2:10:"),
        (
            "loglevel.toml",
            "[log]\nlevel = \"verbose\"\n",
            ":2:9: invalid log level 'verbose'",
        ),
    ];
    for (name, text, expected) in cases {
        let path = write(&dir, name, text);
        for args in [vec!["check-config"], vec!["run", "--config"]] {
            let out = Command::new(bin())
                .args(&args)
                .arg(&path)
                .env("NVML_SIM_SCENARIO", "/nonexistent")
                .output()
                .expect("run");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?} {name}: {stderr}");
            let want = format!("{}{expected}", path.display());
            assert!(
                stderr.contains(&want),
                "{args:?} {name}: want '{want}' in: {stderr}"
            );
        }
    }
}

#[test]
fn usage_errors_exit_2() {
    let bad_interval = Command::new(bin())
        .args(["run", "--interval", "10ms"])
        .output()
        .expect("run");
    assert_eq!(bad_interval.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_interval.stderr).contains("minimum of 100ms"));

    let env_listen = Command::new(bin())
        .args(["run"])
        .env("GPU_STEWARD_LISTEN", "not-an-address")
        .output()
        .expect("run");
    assert_eq!(env_listen.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&env_listen.stderr).contains("'not-an-address'"));

    let missing = Command::new(bin())
        .args(["run", "--config", "/nonexistent/config.toml"])
        .output()
        .expect("run");
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/config.toml: cannot read")
    );
}

#[test]
fn a_log_level_typo_is_a_usage_error_naming_the_levels() {
    // EnvFilter alone reads a bare word as a target, silencing every log line.
    let flag = Command::new(bin())
        .args(["run", "--log-level", "inof"])
        .env("GPU_STEWARD_CONFIG", "/dev/null")
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&flag.stderr);
    assert_eq!(flag.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("'inof'"), "{stderr}");
    assert!(
        stderr.contains("error, warn, info, debug, trace, off"),
        "{stderr}"
    );

    let env = Command::new(bin())
        .args(["run"])
        .env("GPU_STEWARD_CONFIG", "/dev/null")
        .env("GPU_STEWARD_LOG_LEVEL", "verbose")
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&env.stderr);
    assert_eq!(env.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("'verbose'"), "{stderr}");

    // A directive with a target still works, and RUST_LOG keeps the full filter syntax.
    let dir = tempfile::tempdir().expect("tempdir");
    let good = write(
        &dir,
        "good.toml",
        "[log]\nlevel = \"gpu_steward=debug,warn\"\n",
    );
    let out = Command::new(bin())
        .arg("check-config")
        .arg(&good)
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_taken_port_is_a_runtime_failure() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = holder.local_addr().expect("addr").port();
    let out = Command::new(bin())
        .args([
            "run",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--nvml-lib",
            "/nonexistent.so",
        ])
        .env("GPU_STEWARD_CONFIG", "/dev/null")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen on"));
}

#[test]
fn the_packaged_config_is_valid_and_shows_the_built_in_defaults() {
    let packaged = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/deb/config.toml");
    let describe = |path: &str| {
        let out = Command::new(bin())
            .args(["check-config", path])
            .output()
            .expect("run");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with("size:")) // the files' size
            .skip(2) // the file names
            .filter(|l| !l.starts_with("log:")) // "info" vs "info (or RUST_LOG)": same effect
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = write(&dir, "empty.toml", "");
    assert_eq!(describe(packaged), describe(&empty.display().to_string()));
}

#[test]
fn build_info_carries_the_source_revision() {
    let git = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    let Some(head) = git
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    else {
        eprintln!("note: not a git checkout; the revision is 'unknown' by design");
        return;
    };
    let agent = common::Agent::with_scenario(&common::scenario("dgx-h100.toml")).start();
    let m = agent.metrics();
    let info = m.find("gpu_steward_build_info", &[]);
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].labels["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(info[0].labels["revision"], head);
}

/// Issue 26 deliver 4: `mig` and `sharing` run on a simulated node with `--scenario`, the MIG
/// state kept in an implicit `FILE.state` between commands (as a driver keeps it), the time-slice
/// through the stand-in nvidia-smi shipped beside the simulator.
#[test]
fn mig_and_sharing_run_on_a_scenario_and_keep_its_state_between_commands() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = common::scenario("a100-mig.toml");
    // GPU 1 without its process: nothing holds it, so MIG can be enabled at once.
    let cut = scenario
        .rfind("[[gpu.process]]\npid = 41010")
        .expect("GPU 1's process");
    let node = write(&dir, "node.toml", &scenario[..cut]);
    let config = write(
        &dir,
        "config.toml",
        &format!(
            "[audit]\nfile = \"{}/audit.jsonl\"\n\
             [[mig.layouts.balanced]]\ndevices = \"all\"\nmig-enabled = true\n\
             mig-devices = {{ \"3g.40gb\" = 1, \"2g.20gb\" = 1, \"1g.10gb\" = 2 }}\n\
             [sharing]\ncompute_mode = \"default\"\ntimeslice = \"long\"\n",
            dir.path().display()
        ),
    );
    let sim = common::sim_lib();
    let run = |args: &[&str], scenario: &std::path::Path| {
        let out = Command::new(bin())
            .args(args)
            .arg("--scenario")
            .arg(scenario)
            .arg("--config")
            .arg(&config)
            .arg("--nvml-lib")
            .arg(&sim)
            .env_remove("NVML_SIM_SCENARIO")
            .env_remove("NVML_SIM_STATE")
            .output()
            .expect("run");
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, text) = run(&["mig", "apply", "--layout", "balanced"], &node);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("applied 'balanced': 5 step(s)"), "{text}");
    assert!(dir.path().join("node.toml.state").is_file());
    // A second command sees what the first did.
    let (code, text) = run(&["mig", "apply", "--layout", "balanced"], &node);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("nothing to do"), "{text}");

    let h100 = write(&dir, "h100.toml", &common::scenario("dgx-h100.toml"));
    let (code, text) = run(&["sharing", "apply"], &h100);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("applied 8 change(s)"), "{text}");
    let (code, text) = run(&["sharing", "show"], &h100);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("time-slice long") && !text.contains("time-slice default"),
        "the stand-in kept the time-slices: {text}"
    );
    let (code, text) = run(&["mig", "show"], &dir.path().join("missing.toml"));
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("scenario") && text.contains("does not exist"),
        "{text}"
    );
}

/// Runs `check-config PATH`, killed if it outlives 20 s (a hang fails the test, it does not
/// stall it): (exit status, stderr).
fn check_config_bounded(config: &std::path::Path) -> (Option<i32>, String) {
    let child = Command::new(bin())
        .arg("check-config")
        .arg(config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(20)) {
        Ok(out) => {
            let out = out.expect("output");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("check-config {} hangs", config.display());
        }
    }
}

#[test]
fn a_fifo_or_a_link_to_dev_zero_as_config_rules_web_config_or_token_is_refused_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let zero = dir.path().join("zero");
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
    let fifo_is = "is a FIFO, not a regular file; replace it with a regular file";
    let zero_is = "is a character device, not a regular file";

    // The config file itself.
    let (code, err) = check_config_bounded(&fifo);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("{}: cannot read: {fifo_is}", fifo.display())),
        "{err}"
    );
    let (code, err) = check_config_bounded(&zero);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("{}: cannot read: {zero_is}", zero.display())),
        "{err}"
    );

    // A rule file, with the position check-config gives every rule file error.
    for (name, is) in [("fifo", fifo_is), ("zero", zero_is)] {
        let config = write(
            &dir,
            "rules.toml",
            &format!("[rules]\nfiles = [\"{name}\"]\n"),
        );
        let (code, err) = check_config_bounded(&config);
        assert_eq!(code, Some(2), "{err}");
        let path = dir.path().join(name);
        assert!(
            err.contains(&format!("{}:1:1: cannot read: {is}", path.display())),
            "{err}"
        );
    }

    // The web config.
    let config = write(
        &dir,
        "web.toml",
        &format!("[server]\nweb_config_file = \"{}\"\n", fifo.display()),
    );
    let (code, err) = check_config_bounded(&config);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("web config {}: {fifo_is}", fifo.display())),
        "{err}"
    );

    // The API token: the API stays off (as for any unusable token), and check-config says why
    // instead of waiting on the FIFO.
    let config = write(
        &dir,
        "api.toml",
        &format!(
            "[api]\nenabled = true\ntoken_file = \"{}\"\n",
            fifo.display()
        ),
    );
    let out = Command::new(bin())
        .arg("check-config")
        .arg(&config)
        .output()
        .expect("check-config");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "the token is unusable: API token file {}: {fifo_is}",
            fifo.display()
        )),
        "{text}"
    );

    // A rule file over the limit of 16 MiB.
    let big = dir.path().join("big.yml");
    let mut text = b"groups: []\n".to_vec();
    text.resize((16 << 20) + 1, b'#');
    std::fs::write(&big, text).expect("write");
    let config = write(&dir, "big.toml", "[rules]\nfiles = [\"big.yml\"]\n");
    let (code, err) = check_config_bounded(&config);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("over the limit of 16777216 bytes"), "{err}");
}

/// Issue [26/28], defect 5: `check-config` passed audit and state places that `run` refuses.
/// Each layout gets the same refusal, with the same text, from both (exit 2).
#[test]
fn check_config_refuses_the_audit_and_state_places_run_refuses_with_the_same_text() {
    use std::os::unix::fs::PermissionsExt;
    let nobody = nix::unistd::Uid::from_raw(65534);
    let nogroup = nix::unistd::Gid::from_raw(65534);
    let root = nix::unistd::geteuid().is_root();
    // (name, what is made, what the refusal says)
    type Make = fn(&std::path::Path, &std::path::Path, nix::unistd::Uid, nix::unistd::Gid);
    let layouts: Vec<(&str, Make, &str, bool)> = vec![
        (
            "a world-writable audit directory",
            |audit, _, _, _| {
                std::fs::set_permissions(audit, std::fs::Permissions::from_mode(0o777))
                    .expect("chmod")
            },
            "mode 0777",
            false,
        ),
        (
            "an audit log others may write",
            |audit, _, _, _| {
                let log = audit.join("audit.jsonl");
                std::fs::write(&log, "").expect("log");
                std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o666))
                    .expect("chmod")
            },
            "mode 0666",
            false,
        ),
        (
            "an audit directory writable by another group",
            |audit, _, _, g| {
                nix::unistd::chown(audit, None, Some(g)).expect("chgrp");
                std::fs::set_permissions(audit, std::fs::Permissions::from_mode(0o770))
                    .expect("chmod")
            },
            "group may write",
            true,
        ),
        (
            "an audit log owned by another user",
            |audit, _, u, _| {
                let log = audit.join("audit.jsonl");
                std::fs::write(&log, "").expect("log");
                nix::unistd::chown(&log, Some(u), None).expect("chown")
            },
            "owned by uid 65534",
            true,
        ),
        (
            "an audit directory owned by another user",
            |audit, _, u, _| nix::unistd::chown(audit, Some(u), None).expect("chown"),
            "owned by uid 65534",
            true,
        ),
        (
            "a world-writable state directory",
            |_, state, _, _| {
                std::fs::set_permissions(state, std::fs::Permissions::from_mode(0o757))
                    .expect("chmod")
            },
            "the agent's state directory",
            false,
        ),
    ];
    for (name, make, says, needs_root) in layouts {
        if needs_root && !root {
            // Only root can give a file away.
            continue;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let audit = dir.path().join("audit");
        let state = dir.path().join("state");
        std::fs::create_dir(&audit).expect("mkdir");
        std::fs::create_dir(&state).expect("mkdir");
        for d in [dir.path(), &audit, &state] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        }
        let config = write(
            &dir,
            "config.toml",
            &format!(
                "[audit]\nfile = \"{}\"\n",
                audit.join("audit.jsonl").display()
            ),
        );
        make(&audit, &state, nobody, nogroup);
        let out = |args: &[&str]| {
            let o = Command::new(bin())
                .args(args)
                .arg(&config)
                .args(
                    ["--listen", "127.0.0.1:0"]
                        .iter()
                        .filter(|_| args[0] == "run"),
                )
                .env("STATE_DIRECTORY", &state)
                .env("NVML_SIM_SCENARIO", "/nonexistent")
                .stdin(std::process::Stdio::null())
                .output()
                .expect("run");
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        };
        let (checked, check_err) = out(&["check-config"]);
        let (ran, run_err) = out(&["run", "--config"]);
        assert_eq!(checked, Some(2), "{name}: check-config: {check_err}");
        assert_eq!(ran, Some(2), "{name}: run: {run_err}");
        let message = check_err.trim();
        assert!(message.contains(says), "{name}: {message}");
        assert!(
            run_err.contains(message),
            "{name}: run says otherwise:\n{run_err}\ncheck-config:\n{message}"
        );
    }
}
