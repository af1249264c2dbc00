//! `[sharing]` through the whole config loader: the issue's example verbatim, overrides, the
//! YAML source, and errors with positions.

use std::time::Duration;

use crate::config::sharing::{
    DeviceIdStrategy, DeviceListStrategy, Devices, GpuSelector, GuardAction, MigStrategy, Timeslice,
};
use crate::config::{from_text, Overrides};
use crate::snapshot::ComputeMode;

fn ok(text: &str) -> crate::config::sharing::SharingConfig {
    from_text("c.toml", text, &Overrides::default())
        .expect("valid")
        .sharing
}

fn err(text: &str) -> String {
    from_text("c.toml", text, &Overrides::default())
        .map(|_| ())
        .expect_err("must be rejected")
        .to_string()
}

const ISSUE_EXAMPLE: &str = r#"
[sharing]
compute_mode = "default"          # default | exclusive_process | prohibited
timeslice = "long"                # default | short | medium | long
nvidia_smi = "/usr/bin/nvidia-smi"
[sharing.time_slicing]
rename_by_default = false
fail_requests_greater_than_one = false
[[sharing.time_slicing.resources]]
name = "nvidia.com/gpu"
replicas = 4
"#;

#[test]
fn the_issue_example_parses() {
    let s = ok(ISSUE_EXAMPLE);
    assert_eq!(s.node.compute_mode, Some(ComputeMode::Default));
    assert_eq!(s.node.timeslice, Some(Timeslice::Long));
    assert_eq!(s.nvidia_smi.to_str(), Some("/usr/bin/nvidia-smi"));
    let ts = s.time_slicing.expect("time slicing");
    assert!(!ts.rename_by_default && !ts.fail_requests_greater_than_one);
    assert_eq!(ts.resources[0].name, "nvidia.com/gpu");
    assert_eq!(ts.resources[0].replicas, 4);
    assert_eq!(ts.resources[0].devices, Devices::All);
    assert!(!s.device_plugin.enabled);
}

#[test]
fn absent_section_manages_nothing() {
    let s = ok("");
    assert!(!s.manages_node() && s.time_slicing.is_none() && !s.device_plugin.enabled);
    assert_eq!(s.memory_guard.action, GuardAction::None);
    assert!(s.memory_guard.dry_run);
}

#[test]
fn overrides_devices_memory_plugin_and_guard() {
    let s = ok(r#"
[sharing]
timeslice = "short"
nvidia_smi_timeout = "5s"
[[sharing.gpu]]
id = 1
compute_mode = "exclusive_process"
[[sharing.gpu]]
id = "GPU-abc"
timeslice = "medium"
[sharing.time_slicing]
rename_by_default = true
fail_requests_greater_than_one = true
[[sharing.time_slicing.resources]]
name = "nvidia.com/gpu"
replicas = 2
devices = [0, "GPU-abc"]
memory_per_replica = "20GiB"
[[sharing.time_slicing.resources]]
name = "nvidia.com/mig-1g.10gb"
replicas = 3
devices = 2
[sharing.device_plugin]
enabled = true
directory = "/tmp/dp"
[sharing.memory_guard]
action = "signal"
signal = "KILL"
grace = "2m"
dry_run = false
exempt_processes = ["nvidia-persistenced"]
"#);
    assert_eq!(s.nvidia_smi_timeout, Duration::from_secs(5));
    assert_eq!(
        s.desired(1, "GPU-x").compute_mode,
        Some(ComputeMode::ExclusiveProcess)
    );
    assert_eq!(s.desired(1, "GPU-x").timeslice, Some(Timeslice::Short));
    assert_eq!(s.desired(2, "GPU-abc").timeslice, Some(Timeslice::Medium));
    let ts = s.time_slicing.as_ref().expect("time slicing");
    assert_eq!(
        ts.advertised_name(&ts.resources[0]),
        "nvidia.com/gpu.shared"
    );
    assert_eq!(
        ts.resources[0].devices,
        Devices::List(vec![
            GpuSelector::Index(0),
            GpuSelector::Uuid("GPU-abc".into())
        ])
    );
    assert_eq!(ts.resources[0].memory_per_replica, Some(20 << 30));
    assert_eq!(ts.resources[1].devices, Devices::Count(2));
    assert!(s.device_plugin.enabled);
    assert_eq!(s.memory_guard.signal, "SIGKILL");
    assert_eq!(s.memory_guard.grace, Duration::from_secs(120));
    let d = s.describe();
    assert!(
        d.contains("advertised as nvidia.com/gpu.shared with 2 replicas"),
        "{d}"
    );
    assert!(
        d.contains("device plugin: on, kubelet at '/tmp/dp/kubelet.sock'"),
        "{d}"
    );
}

#[test]
fn errors_point_at_the_value_and_say_what_to_do() {
    let e = err("[sharing]\ncompute_mode = \"exclusive\"\n");
    assert!(
        e.starts_with("c.toml:2:16: unknown compute mode 'exclusive'"),
        "{e}"
    );
    assert!(e.contains("\"exclusive_process\""), "{e}");
    let e = err("[sharing]\ntimeslice = \"forever\"\n");
    assert!(
        e.starts_with("c.toml:2:13: unknown time-slice 'forever'"),
        "{e}"
    );
    let e = err("[sharing]\nnvidia_smi = \"nvidia-smi\"\n");
    assert!(
        e.starts_with("c.toml:2:14: path 'nvidia-smi' is not absolute"),
        "{e}"
    );
    let e = err("[sharing]\ntime_slice = \"long\"\n");
    assert!(
        e.starts_with("c.toml:2:1: unknown field `time_slice`"),
        "{e}"
    );
    let e = err("[sharing.time_slicing]\n[[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpu\"\nreplicas = 1\n");
    assert!(
        e.starts_with("c.toml:4:12: replicas 1 is out of range"),
        "{e}"
    );
    let e = err("[[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpus\"\nreplicas = 2\n");
    assert!(e.contains("unknown resource 'nvidia.com/gpus'"), "{e}");
    assert!(e.starts_with("c.toml:"), "{e}");
    let e = err(
        "[[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpu\"\nreplicas = 2\n\
                 [[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpu\"\nreplicas = 3\n",
    );
    assert!(e.contains("listed twice"), "{e}");
    let e = err("[[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpu\"\nreplicas = 2\ndevices = \"some\"\n");
    assert!(e.starts_with("c.toml:4:11: invalid devices 'some'"), "{e}");
    let e = err("[[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpu\"\nreplicas = 2\nmemory_per_replica = \"lots\"\n");
    assert!(
        e.starts_with("c.toml:4:22: invalid memory size 'lots'"),
        "{e}"
    );
    let e = err("[[sharing.gpu]]\nid = 3\n");
    assert!(
        e.starts_with("c.toml:2:6: [[sharing.gpu]] for GPU '3' sets nothing"),
        "{e}"
    );
    let e = err("[[sharing.gpu]]\nid = \"gpu3\"\ntimeslice = \"long\"\n");
    assert!(e.starts_with("c.toml:2:6: invalid GPU 'gpu3'"), "{e}");
    let e = err("[sharing.device_plugin]\ndirectory = \"dp\"\n");
    assert!(
        e.starts_with("c.toml:2:13: path 'dp' is not absolute"),
        "{e}"
    );
    let e = err("[sharing.memory_guard]\nsignal = \"SIGFOO\"\n");
    assert!(e.starts_with("c.toml:2:10: unknown signal 'SIGFOO'"), "{e}");
}

#[test]
fn the_device_plugin_yaml_is_read_and_its_errors_name_that_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = dir.path().join("config.yaml");
    std::fs::write(
        &yaml,
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 8\n",
    )
    .expect("write");
    let text = format!("[sharing]\ndevice_plugin_config = \"{}\"\n", yaml.display());
    let s = ok(&text);
    assert_eq!(s.time_slicing.expect("from yaml").resources[0].replicas, 8);
    assert_eq!(s.time_slicing_file.as_deref(), Some(yaml.as_path()));

    std::fs::write(
        &yaml,
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 0\n",
    )
    .expect("write");
    let e = err(&text);
    assert!(
        e.starts_with(&format!(
            "{}:5:7: sharing.timeSlicing.resources[0]: replicas 0 is out of range",
            yaml.display()
        )),
        "{e}"
    );
    let both = format!("{text}[sharing.time_slicing]\n[[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpu\"\nreplicas = 2\n");
    std::fs::write(&yaml, "version: v1\n").expect("write");
    let e = err(&both);
    assert!(
        e.starts_with("c.toml:2:24: give the shared resources either"),
        "{e}"
    );
}

#[test]
fn device_plugin_strategies_take_nvidias_names_and_defaults() {
    let d = ok("").device_plugin;
    assert_eq!(d.mig_strategy, MigStrategy::None);
    assert_eq!(d.device_list_strategy, [DeviceListStrategy::Envvar]);
    assert_eq!(d.device_id_strategy, DeviceIdStrategy::Uuid);
    assert_eq!(d.cdi_kind, "nvidia.com/gpu");
    assert!(!d.uses_cdi());
    let d = ok(r#"
[sharing.device_plugin]
mig_strategy = "mixed"
device_list_strategy = ["cdi-cri", "envvar", "cdi-annotations"]
device_id_strategy = "index"
cdi_kind = "example.com/gpu"
cdi_spec_dirs = ["/etc/cdi"]
"#)
    .device_plugin;
    assert_eq!(d.mig_strategy, MigStrategy::Mixed);
    assert_eq!(d.device_list_strategy[0], DeviceListStrategy::CdiCri);
    assert_eq!(d.device_id_strategy, DeviceIdStrategy::Index);
    assert!(d.uses_cdi());
    // A single string, as NVIDIA's DEVICE_LIST_STRATEGY.
    let d = ok("[sharing.device_plugin]\ndevice_list_strategy = \"cdi-cri\"\n").device_plugin;
    assert_eq!(d.device_list_strategy, [DeviceListStrategy::CdiCri]);
}

#[test]
fn device_plugin_strategy_errors_have_positions_and_say_what_to_do() {
    let e = err("[sharing.device_plugin]\nmig_strategy = \"auto\"\n");
    assert!(
        e.starts_with("c.toml:2:16: unknown mig_strategy 'auto'"),
        "{e}"
    );
    assert!(e.contains("\"mixed\""), "{e}");
    let e = err("[sharing.device_plugin]\ndevice_list_strategy = []\n");
    assert!(
        e.starts_with("c.toml:2:24: device_list_strategy is empty"),
        "{e}"
    );
    let e =
        err("[sharing.device_plugin]\ndevice_list_strategy = [\"envvar\", \"volume-mounts\"]\n");
    assert!(
        e.starts_with("c.toml:2:24: unknown device_list_strategy 'volume-mounts'"),
        "{e}"
    );
    let e = err("[sharing.device_plugin]\ndevice_list_strategy = [\"cdi-cri\", \"cdi-cri\"]\n");
    assert!(e.contains("lists 'cdi-cri' twice"), "{e}");
    let e = err("[sharing.device_plugin]\ndevice_id_strategy = \"serial\"\n");
    assert!(
        e.starts_with("c.toml:2:22: unknown device_id_strategy 'serial'"),
        "{e}"
    );
    let e =
        err("[sharing.device_plugin]\ndevice_list_strategy = [\"cdi-cri\"]\ncdi_kind = \"gpu\"\n");
    assert!(
        e.starts_with("c.toml:3:12: cdi_kind 'gpu' is not a CDI kind 'vendor/class'"),
        "{e}"
    );
    for bad in [
        "nvidia.com/",
        "/gpu",
        "nvidia.com/gpu/x",
        "-nvidia.com/gpu",
        "nvidia.com/g.pu",
    ] {
        assert!(
            crate::config::sharing::section::check_cdi_kind(bad).is_err(),
            "{bad}"
        );
    }
    let e = err("[sharing.device_plugin]\ncdi_spec_dirs = [\"cdi\"]\n");
    assert!(
        e.starts_with("c.toml:2:17: path 'cdi' is not absolute"),
        "{e}"
    );
}
