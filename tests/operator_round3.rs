//! Smaller things an operator meets: `mig plan --layout` with no layouts names where it looked
//! and how to give some; dcgm-exporter's and the toolkit's listen flags point to `--listen`.

mod common;

use std::process::Command;

use common::bin;

#[test]
fn an_unknown_layout_names_the_config_it_read_and_how_to_define_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = dir.path().join("node.toml");
    std::fs::write(&node, common::scenario("a100-mig.toml")).expect("scenario");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "").expect("config");
    let out = Command::new(bin())
        .args(["mig", "plan", "--layout", "balanced", "--scenario"])
        .arg(&node)
        .arg("--config")
        .arg(&config)
        .arg("--nvml-lib")
        .arg(common::sim_lib())
        .env_remove("NVML_SIM_SCENARIO")
        .env_remove("NVML_SIM_STATE")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "layout 'balanced' is not defined in the config '{}'",
            config.display()
        )),
        "{err}"
    );
    assert!(
        err.contains("[mig] mig_config") && err.contains("--mig-config FILE"),
        "{err}"
    );
    // The flag says what it takes.
    let help = Command::new(bin())
        .args(["mig", "plan", "--help"])
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.lines()
            .any(|l| l.trim_start().starts_with("--layout <NAME>") && l.contains("The layout:")),
        "{help}"
    );
}

#[test]
fn port_and_web_listen_address_name_listen_which_takes_a_colon_port() {
    for (args, want) in [
        (&["run", "--port", "9500"][..], "--listen :9500"),
        (
            &["demo", "--web.listen-address=:9500"][..],
            "--listen :9500",
        ),
    ] {
        let out = Command::new(bin()).args(args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(want) && err.contains("there is no --"),
            "{err}"
        );
    }
    // `--listen :PORT` is accepted: check-config shows the address a config's ':PORT' gives.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "").expect("config");
    let out = Command::new(bin())
        .args(["run", "--listen", ":0", "--interval", "nonsense"])
        .arg("--config")
        .arg(&config)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    // Refused for the interval, not for the address.
    assert!(!err.contains("invalid listen address"), "{err}");
    assert!(err.contains("nonsense"), "{err}");
}

/// A token file other users can read keeps the API off: `check-config` says `valid` (the file
/// is) and warns on stderr, as it does for an audit log it cannot write.
#[test]
fn check_config_warns_when_the_token_file_keeps_the_api_off() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("api-token");
    std::fs::write(&token, "s3cret\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[api]\nenabled = true\ntoken_file = \"{}\"\n[audit]\nfile = \"{}\"\n",
            token.display(),
            dir.path().join("audit.jsonl").display()
        ),
    )
    .expect("config");
    let check = || {
        let out = Command::new(bin())
            .arg("check-config")
            .arg(&config)
            .output()
            .expect("check-config");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = check();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("valid"), "{stdout}");
    assert!(
        stderr.contains(&format!(
            "{}: warning: API token file {} has mode 644",
            config.display(),
            token.display()
        )),
        "{stderr}"
    );
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let (_, _, stderr) = check();
    assert!(!stderr.contains("warning"), "{stderr}");
}
