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
