use super::scontrol::parse_node;
use super::*;
use crate::health::{Action, Condition, GpuHealth, GpuVerdict};

/// `scontrol show node -o vm` from Slurm 22.05.8 (Debian's slurm-wlm), drained by an admin.
const ADMIN_DRAINED: &str = "NodeName=vm Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=5.67 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=1 FreeMem=777 Sockets=2 Boards=1 State=MIXED+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=main  BootTime=2026-11-26T06:06:46 SlurmdStartTime=2026-11-26T06:20:12 LastBusyTime=2026-11-26T06:20:22 CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES=cpu=1,mem=1M CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=admin: bad fan [root@2026-11-26T06:20:32]\n";

/// The same node idle, without a reason.
const IDLE: &str = "NodeName=vm Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=main  ExtSensorsTemp=n/s\n";

#[test]
fn the_one_line_node_record_gives_state_and_reason_without_the_stamp() {
    let n = parse_node(ADMIN_DRAINED).expect("parsed");
    assert_eq!(n.state, "MIXED+DRAIN");
    assert_eq!(n.reason, "admin: bad fan");
    assert!(n.drained());
    let n = parse_node(IDLE).expect("parsed");
    assert_eq!((n.state.as_str(), n.reason.as_str()), ("IDLE", ""));
    assert!(!n.drained());
    assert!(parse_node("Node nosuch not found\n").is_none());
}

fn gpu(index: u32, conditions: Vec<Condition>) -> GpuHealth {
    GpuHealth {
        index,
        uuid: format!("GPU-{index}"),
        verdict: GpuVerdict::new(conditions),
        xid_window_counts: Default::default(),
    }
}

fn condition(name: &str, severity: Status, action: Action) -> Condition {
    Condition {
        name: name.into(),
        severity,
        reason: String::new(),
        action,
        since: std::time::SystemTime::UNIX_EPOCH,
    }
}

#[test]
fn the_reason_names_the_first_failing_gpu_and_its_most_drastic_failing_condition() {
    let mut h = NodeHealth::default();
    h.gpus
        .push(gpu(0, vec![condition("temp", Status::Warn, Action::None)]));
    assert_eq!(failing_reason(&h), None, "warn does not drain");
    h.gpus.push(gpu(
        3,
        vec![
            condition("ecc_dbe", Status::Fail, Action::ResetGpu),
            condition("xid_79", Status::Fail, Action::RebootNode),
        ],
    ));
    assert_eq!(
        failing_reason(&h).as_deref(),
        Some("gpu-steward: GPU 3 GPU-3 xid_79 (reboot_node)")
    );
}

#[test]
fn a_lost_gpu_without_a_uuid_has_no_empty_field_in_its_reason() {
    let mut h = NodeHealth::default();
    let mut lost = gpu(
        1,
        vec![condition(
            crate::health::conditions::GPU_LOST,
            Status::Fail,
            Action::RebootNode,
        )],
    );
    lost.uuid = String::new();
    h.gpus.push(lost);
    let reason = failing_reason(&h).expect("drains");
    assert_eq!(reason, "gpu-steward: GPU 1 gpu_lost (reboot_node)");
    assert!(!reason.contains("  "), "{reason}");
}

#[test]
fn a_long_reason_is_cut_to_slurms_limit_on_a_character_boundary() {
    let s = cut("é".repeat(200), MAX_REASON_BYTES);
    assert_eq!(s.len(), 254);
    assert_eq!(cut("short".into(), MAX_REASON_BYTES), "short");
}

#[test]
fn the_section_defaults_to_off_and_scontrol_on_the_path() {
    let c: SlurmConfig = toml::from_str("drain = true\nnode_name = \"gpu-07\"\n").expect("toml");
    assert!(c.drain);
    assert_eq!(
        (c.node().expect("one node"), c.scontrol.as_str()),
        ("gpu-07".into(), "scontrol")
    );
    assert!(
        c.describe().contains("drain node 'gpu-07'"),
        "{}",
        c.describe()
    );
    assert_eq!(SlurmConfig::default().describe(), "slurm: off\n");
    let empty: SlurmConfig = toml::from_str("scontrol = \"\"\n").expect("toml");
    assert_eq!(
        empty,
        SlurmConfig::default(),
        "an empty scontrol is the one on the path"
    );
    let e = toml::from_str::<SlurmConfig>("drian = true\n").expect_err("typo");
    assert!(e.to_string().contains("drian"), "{e}");
}

/// Issue [26/28] defect 4: a hostlist as `[slurm] node_name` passed `check-config` and went to
/// `scontrol update NodeName=…`, draining every node it named. Refused at load, with its
/// position; the record `scontrol show node` returns must be this node's, and only it.
#[test]
fn a_hostlist_is_never_taken_for_this_node() {
    use crate::config::{from_text, Overrides};
    for bad in ["gpu[01-99],login1", "gpu01,gpu02", "gpu 01", "gpu[01-02]"] {
        let text = format!("[slurm]\ndrain = true\nnode_name = {bad:?}\n");
        let e = from_text("c.toml", &text, &Overrides::default())
            .expect_err(bad)
            .to_string();
        assert!(
            e.starts_with("c.toml:3:13: node_name") && e.contains("is not one node name"),
            "{e}"
        );
    }
    let ok = from_text(
        "c.toml",
        "[slurm]\nnode_name = \"gpu-07.rack_2\"\n",
        &Overrides::default(),
    )
    .expect("one node name");
    assert_eq!(ok.slurm.node().expect("valid"), "gpu-07.rack_2");
    assert!(crate::config::slurm::one_node_name("gpu[1-2]").is_err());

    // `show node` of a hostlist answers one record per node: refused, whatever the first says.
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("scontrol");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s\\n%s\\n' '{}' '{}'\n",
            IDLE.trim().replace("NodeName=vm", "NodeName=gpu01"),
            IDLE.trim().replace("NodeName=vm", "NodeName=gpu02")
        ),
    )
    .expect("stand-in");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let sc = super::scontrol::Scontrol {
        program: script.display().to_string(),
        timeout: std::time::Duration::from_secs(5),
    };
    let e = sc.show_node("gpu01").expect_err("two records").to_string();
    assert!(e.contains("answered 2 record(s)"), "{e}");
    let e = sc
        .show_node("gpu07")
        .expect_err("another node's record")
        .to_string();
    assert!(
        e.contains("the first for node 'gpu01', not the one record of node 'gpu07'"),
        "{e}"
    );
}

/// A stand-in `scontrol` (a real program, run as the agent runs it) that records its
/// arguments and answers `show node` with an idle node.
fn fake_scontrol(dir: &std::path::Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("scontrol");
    let calls = dir.join("calls");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\n[ \"$1\" = show ] && echo 'NodeName=n1 Arch=x86_64 State=IDLE ThreadsPerCore=1'\nexit 0\n",
            calls.display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // Another test thread forking while the script was open for writing keeps a writer on it
    // until that child execs, and running it then fails with ETXTBSY: wait until it runs.
    for _ in 0..200 {
        match std::process::Command::new(&script).arg("probe").output() {
            Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            _ => break,
        }
    }
    let _ = std::fs::remove_file(&calls);
    script.display().to_string()
}

#[test]
fn a_drain_whose_audit_record_cannot_be_written_is_not_made() {
    use super::drain::{Done, Drainer, Request};
    use super::scontrol::Scontrol;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Drainer {
        scontrol: Scontrol {
            program: fake_scontrol(dir.path()),
            timeout: std::time::Duration::from_secs(5),
        },
        node: "n1".into(),
    };
    let reason = "gpu-steward: GPU 0 GPU-0 xid_79 (reboot_node)".to_string();
    let drain = Request::Drain {
        reason: reason.clone(),
    };
    // The audit log's directory does not exist: the owner cannot record, so nothing is done.
    let mut setup = crate::changes::Setup {
        nvml_lib: String::new(),
        audit_file: dir.path().join("missing").join("audit.jsonl"),
        mig: Default::default(),
    };
    let owner = crate::changes::Owner::with(setup.clone());
    let change = |request: &Request| crate::slurm::change::SlurmChange {
        drainer: d.clone(),
        request: request.clone(),
        trigger: "test",
    };
    let e = owner.handle(change(&drain)).expect_err("refused");
    assert_eq!(e.result(), "audit_failed");
    let calls = std::fs::read_to_string(dir.path().join("calls")).expect("calls");
    assert_eq!(calls, "show node -o n1\n", "read, never updated");

    let audit_path = dir.path().join("audit.jsonl");
    setup.audit_file = audit_path.clone();
    owner.set(setup);
    assert_eq!(
        owner.handle(change(&drain)).expect("drained"),
        Done::Changed
    );
    let calls = std::fs::read_to_string(dir.path().join("calls")).expect("calls");
    assert_eq!(
        calls.lines().last(),
        Some(format!("update NodeName=n1 State=DRAIN Reason={reason}").as_str())
    );
    let audit = std::fs::read_to_string(&audit_path).expect("audit");
    assert!(
        audit.contains("\"component\":\"slurm\",\"event\":\"drain\"") && audit.contains(&reason),
        "{audit}"
    );
    // An idle node is not ours to resume: nothing to do.
    assert_eq!(
        owner.handle(change(&Request::Resume)).expect("read"),
        Done::AlreadyThere
    );
}
