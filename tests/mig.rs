//! `gpu-steward mig` against the simulated driver: mig-parted's published configs converge on
//! every MIG model, infeasible layouts fail before any change, a failure injected at each step
//! leaves the GPU as it was, running processes block an apply, a second apply makes no create
//! or destroy call, pending mode changes are reported (and a configured reset applies them),
//! hooks run, and every change is audited. Real binary, real simulator library, state kept
//! between commands in `NVML_SIM_STATE` as a driver keeps it between processes.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::fullfs::SmallFs;
use common::{bin, sim_lib};
use gpu_steward::config::mig::read_mig_parted;
use gpu_steward::config::mig_layout::Devices;
use serde_json::Value;

/// One simulated node: scenario, MIG state, call stats, config and audit log in a temp dir.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new(scenario: &str, config_extra: &str) -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = Node { dir };
        std::fs::write(n.path("scenario.toml"), scenario).expect("scenario");
        let audit = n.path("audit.jsonl");
        std::fs::write(
            n.path("config.toml"),
            format!("[audit]\nfile = \"{}\"\n{config_extra}", audit.display()),
        )
        .expect("config");
        n
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs `gpu-steward mig ARGS`; the stats file is removed first so it counts this run.
    fn mig(&self, args: &[&str]) -> Output {
        self.mig_with(Command::new(bin()), args)
    }

    /// [`Node::mig`] with `cmd` (a `gpu-steward` command, perhaps run inside a namespace).
    fn mig_with(&self, mut cmd: Command, args: &[&str]) -> Output {
        let _ = std::fs::remove_file(self.path("stats.json"));
        cmd.arg("mig")
            .args(args)
            .arg("--nvml-lib")
            .arg(sim_lib())
            .arg("--config")
            .arg(self.path("config.toml"))
            .env("NVML_SIM_SCENARIO", self.path("scenario.toml"))
            .env("NVML_SIM_STATE", self.path("state.json"))
            .env("NVML_SIM_STATS", self.path("stats.json"))
            .env_remove("GPU_STEWARD_MIG_CONFIG")
            .output()
            .expect("run gpu-steward mig")
    }

    fn show(&self) -> Value {
        let out = self.mig(&["show", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        serde_json::from_slice(&out.stdout).expect("mig show --json is JSON")
    }

    /// Calls made by the last command, of functions whose name contains any of `parts`.
    fn calls(&self, parts: &[&str]) -> u64 {
        let Ok(t) = std::fs::read_to_string(self.path("stats.json")) else {
            return 0;
        };
        let v: BTreeMap<String, u64> = serde_json::from_str(&t).expect("stats JSON");
        v.iter()
            .filter(|(k, _)| parts.iter().any(|p| k.contains(p)))
            .map(|(_, n)| n)
            .sum()
    }

    fn changes(&self) -> u64 {
        self.calls(&["Create", "Destroy", "SetMigMode"])
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A GPU's layout without driver-assigned ids and UUIDs: (mode, sorted (profile, start, size,
/// compute instances as (profile, start, size))).
type Shape = (Value, Vec<(String, u64, u64, Vec<(String, u64, u64)>)>);

fn shape(show: &Value, gpu: usize) -> Shape {
    let g = &show["gpus"][gpu];
    let mut gis: Vec<_> = g["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .map(|gi| {
            let cis = gi["compute_instances"]
                .as_array()
                .expect("CIs")
                .iter()
                .map(|c| {
                    (
                        c["profile"].as_str().expect("profile").to_owned(),
                        c["start"].as_u64().expect("start"),
                        c["size"].as_u64().expect("size"),
                    )
                })
                .collect();
            (
                gi["profile"].as_str().expect("profile").to_owned(),
                gi["start"].as_u64().expect("start"),
                gi["size"].as_u64().expect("size"),
                cis,
            )
        })
        .collect();
    gis.sort();
    (g["mig"].clone(), gis)
}

fn counts(show: &Value, gpu: usize) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for gi in show["gpus"][gpu]["instances"]
        .as_array()
        .expect("instances")
    {
        *m.entry(gi["profile"].as_str().expect("profile").to_owned())
            .or_insert(0) += 1;
        let cis = gi["compute_instances"].as_array().expect("CIs");
        assert_eq!(cis.len(), 1, "one full compute instance per GPU instance");
        assert!(cis[0]["uuid"].as_str().expect("uuid").starts_with("MIG-"));
    }
    m
}

/// The GPU-instance profile names the simulator's tables give each model.
const MODELS: &[(&str, u32, &[&str])] = &[
    (
        "A100-SXM4-40GB",
        0x20B0_10DE,
        &[
            "1g.5gb",
            "2g.10gb",
            "3g.20gb",
            "4g.20gb",
            "7g.40gb",
            "1g.5gb+me",
            "1g.10gb",
        ],
    ),
    (
        "A100-SXM4-80GB",
        0x20B2_10DE,
        &[
            "1g.10gb",
            "2g.20gb",
            "3g.40gb",
            "4g.40gb",
            "7g.80gb",
            "1g.10gb+me",
            "1g.20gb",
        ],
    ),
    (
        "H100-SXM5-80GB",
        0x2330_10DE,
        &[
            "1g.10gb",
            "2g.20gb",
            "3g.40gb",
            "4g.40gb",
            "7g.80gb",
            "1g.10gb+me",
            "1g.20gb",
        ],
    ),
    (
        "H200-SXM-141GB",
        0x2335_10DE,
        &[
            "1g.18gb",
            "2g.35gb",
            "3g.71gb",
            "4g.71gb",
            "7g.141gb",
            "1g.18gb+me",
            "1g.35gb",
        ],
    ),
];

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/mig-parted")
        .join(name)
}

/// Applies every layout of a mig-parted file in turn on a node of `gpus` GPUs of one model:
/// each one whose profiles the model has converges (and a second apply changes nothing); each
/// other one fails with exit 2 and changes nothing. Returns (converged, refused).
fn converge_all(file: &str, model: &str, device_id: u32, names: &[&str], gpus: u32) -> (u32, u32) {
    let scenario = format!("version = 1\n[[gpu]]\nmodel = \"{model}\"\ncount = {gpus}\n");
    let node = Node::new(&scenario, "");
    let path = data(file);
    let f = path.to_str().expect("utf-8 path");
    let layouts = read_mig_parted(&path).expect("mig-parted's file parses");
    let (mut converged, mut refused) = (0, 0);
    for (name, layout) in &layouts {
        // What each GPU should end up as: the last entry selecting it (mig-parted's order).
        let targets: Vec<Option<_>> = (0..gpus)
            .map(|i| {
                layout
                    .entries
                    .iter()
                    .rev()
                    .find(|e| {
                        (e.device_filter.is_empty()
                            || e.device_filter.iter().any(|d| d.device == device_id))
                            && match &e.devices {
                                Devices::All => true,
                                Devices::Indices(v) => v.contains(&i),
                            }
                    })
                    .cloned()
            })
            .collect();
        let feasible = targets
            .iter()
            .flatten()
            .all(|e| !e.mig_enabled || e.mig_devices.keys().all(|p| names.contains(&p.as_str())));
        let before = node.show();
        let out = node.mig(&["apply", "--layout", name, "--mig-config", f]);
        if !feasible {
            assert_eq!(out.status.code(), Some(2), "{model} {name}: {}", text(&out));
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("does not exist on"),
                "{}",
                text(&out)
            );
            assert_eq!(
                node.changes(),
                0,
                "{model} {name}: refused before any change"
            );
            assert_eq!(node.show(), before, "{model} {name}: nothing changed");
            refused += 1;
            continue;
        }
        assert_eq!(out.status.code(), Some(0), "{model} {name}: {}", text(&out));
        let after = node.show();
        for (i, t) in targets.iter().enumerate() {
            let Some(t) = t else { continue };
            assert_eq!(
                after["gpus"][i]["mig"]["current"], t.mig_enabled,
                "{model} {name}"
            );
            let want: BTreeMap<String, u64> = t
                .mig_devices
                .iter()
                .filter(|(_, c)| **c > 0)
                .map(|(p, c)| (p.clone(), u64::from(*c)))
                .collect();
            assert_eq!(counts(&after, i), want, "{model} {name} GPU {i}");
        }
        let again = node.mig(&["apply", "--layout", name, "--mig-config", f]);
        assert_eq!(again.status.code(), Some(0), "{}", text(&again));
        assert!(
            String::from_utf8_lossy(&again.stdout).contains("nothing to do"),
            "{}",
            text(&again)
        );
        assert_eq!(
            node.changes(),
            0,
            "{model} {name}: second apply changes nothing"
        );
        converged += 1;
    }
    (converged, refused)
}

#[test]
fn mig_parted_default_config_converges_on_every_mig_model() {
    for &(model, id, names) in MODELS {
        let (ok, refused) = converge_all("config-default.yaml", model, id, names, 1);
        // all-disabled, all-enabled, the model's own all-* layouts and all-balanced at least.
        assert!(
            ok >= 9,
            "{model}: {ok} layouts converged, {refused} refused"
        );
    }
}

#[test]
fn mig_parted_example_config_converges_on_eight_a100s() {
    let (_, id, names) = MODELS[0];
    let (ok, refused) = converge_all("examples-config.yaml", "A100-SXM4-40GB", id, names, 8);
    assert_eq!(
        (ok, refused),
        (7, 0),
        "every layout of examples/config.yaml"
    );
}

const H100_3G_2G: &str = "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nmig_mode = true\n\
                          mig_devices = [\"3g.40gb\", \"2g.20gb\"]\n";

const LAYOUTS: &str = r#"
[[mig.layouts.balanced]]
devices = "all"
mig-enabled = true
mig-devices = { "1g.10gb" = 2, "2g.20gb" = 1, "3g.40gb" = 1 }

[[mig.layouts.too-much]]
devices = "all"
mig-enabled = true
mig-devices = { "3g.40gb" = 2, "1g.10gb" = 1 }

[[mig.layouts.plus-one]]
devices = "all"
mig-enabled = true
mig-devices = { "3g.40gb" = 1, "2g.20gb" = 1, "1g.10gb" = 1 }
"#;

#[test]
fn infeasible_layouts_fail_before_any_change() {
    let node = Node::new(H100_3G_2G, LAYOUTS);
    let before = node.show();
    for args in [
        vec!["apply", "--layout", "too-much"],
        vec!["plan", "--layout", "too-much"],
    ] {
        let out = node.mig(&args);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("GPU 0 (GPU-") && err.contains("do not fit the GPU's 8 memory slices"),
            "{err}"
        );
        assert_eq!(node.changes(), 0);
    }
    let out = node.mig(&["apply", "--layout", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("known layouts: balanced"));
    assert_eq!(node.show(), before);
}

/// The plan from 3g@0 + 2g@4 to the balanced layout: 2 compute and 2 GPU instances
/// destroyed, 4 of each created.
const STEPS: &[(&str, u32)] = &[
    ("destroy_compute_instance", 2),
    ("destroy_gpu_instance", 2),
    ("create_gpu_instance", 4),
    ("create_compute_instance", 4),
];

#[test]
fn a_failure_injected_at_each_step_leaves_the_gpu_as_it_was() {
    let hooks = "[[mig.hooks]]\nname = \"on-failure\"\ncommand = [\"/bin/touch\", \"FAILED\"]\n";
    for &(op, n) in STEPS {
        for call in 1..=n {
            let scenario = format!("{H100_3G_2G}mig_faults = {{ {op} = {call} }}\n");
            let marker = format!("{LAYOUTS}{}", hooks.replace("FAILED", "@"));
            let node = Node::new(&scenario, &marker);
            let flag = node.path("on-failure-ran");
            let config = std::fs::read_to_string(node.path("config.toml"))
                .expect("config")
                .replace('@', flag.to_str().expect("utf-8"));
            std::fs::write(node.path("config.toml"), config).expect("config");
            let before = shape(&node.show(), 0);
            let out = node.mig(&["apply", "--layout", "balanced"]);
            assert_eq!(out.status.code(), Some(1), "{op} #{call}: {}", text(&out));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("the layout found before was restored"),
                "{op} #{call}: {err}"
            );
            assert_eq!(shape(&node.show(), 0), before, "{op} #{call}: as it was");
            assert!(flag.exists(), "{op} #{call}: the on-failure hook ran");
            let audit = std::fs::read_to_string(node.path("audit.jsonl")).expect("audit");
            // Only the very first step leaves nothing to undo.
            let first = op == "destroy_compute_instance" && call == 1;
            assert_eq!(
                audit.contains("\"event\":\"rollback\""),
                !first,
                "{op} #{call}: {audit}"
            );
            assert!(audit.contains("\"event\":\"apply.failed\""), "{audit}");
            // Undos in words, not Rust Debug (`CiCreated { gi: 1, ci: 0 }`).
            assert!(!audit.contains(" { "), "{op} #{call}: {audit}");
            if !first {
                assert!(
                    audit.contains("\"undo\":\"destroy created")
                        || audit.contains("\"undo\":\"re-create destroyed")
                        || audit.contains("\"undo\":\"set MIG mode back"),
                    "{op} #{call}: {audit}"
                );
            }
        }
    }
    // Enabling MIG fails: nothing to undo, still disabled.
    let node = Node::new(
        "version = 1\n[[gpu]]\nmodel = \"A100-SXM4-80GB\"\nmig_faults = { set_mig_mode = 1 }\n",
        LAYOUTS,
    );
    let out = node.mig(&["apply", "--layout", "balanced"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(node.show()["gpus"][0]["mig"]["current"], false);
}

#[test]
fn running_processes_block_apply_but_not_changes_around_them() {
    let scenario = format!(
        "{H100_3G_2G}[[gpu.process]]\npid = 4242\nused_memory_mib = 1024\nmig_device = \"3g.40gb\"\n"
    );
    let node = Node::new(&scenario, LAYOUTS);
    let before = shape(&node.show(), 0);
    // Balanced must move the 3g the process runs in: refused, nothing touched.
    let out = node.mig(&["apply", "--layout", "balanced"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("4242") && err.contains("--force"), "{err}");
    // The message promises only what the driver allows.
    assert!(
        err.contains("stop them and apply again") && err.contains("waits for a GPU reset"),
        "{err}"
    );
    assert!(!err.contains("[4242]"), "no Rust Debug list: {err}");
    assert_eq!(node.changes(), 0);
    // Issue 35 item 12: a refusal is a decision, recorded with its reason and who asked.
    let audit = std::fs::read_to_string(node.path("audit.jsonl")).expect("audit");
    let refused: Vec<Value> = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["component"] == "mig" && r["event"] == "apply.refused")
        .collect();
    assert_eq!(refused.len(), 1, "{audit}");
    assert_eq!(refused[0]["layout"], "balanced");
    assert_eq!(refused[0]["trigger"], "cli");
    assert!(
        refused[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("4242") && r.contains("--force")),
        "{}",
        refused[0]
    );
    // Issue 26 bug 8: the dry run fails where the apply would, with the plan and the reason.
    let out = node.mig(&["apply", "--layout", "balanced", "--dry-run"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("apply 'balanced' would be refused") && err.contains("pid 4242"),
        "{err}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("dry run: nothing was changed"),
        "{}",
        text(&out)
    );
    // With --force the dry run passes: the apply would try.
    let out = node.mig(&["apply", "--layout", "balanced", "--dry-run", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(node.changes(), 0);
    // --force tries; the driver answers IN_USE; the found layout comes back.
    let out = node.mig(&["apply", "--layout", "balanced", "--force"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in_use"),
        "{}",
        text(&out)
    );
    assert_eq!(shape(&node.show(), 0), before);
    // Adding a 1g next to the busy 3g keeps it: allowed, one instance created.
    let out = node.mig(&["apply", "--layout", "plus-one"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(node.calls(&["Destroy"]), 0);
    assert_eq!(node.calls(&["nvmlDeviceCreateGpuInstance"]), 1);
}

#[test]
fn dry_run_and_plan_change_nothing_and_the_second_apply_makes_no_calls() {
    let node = Node::new(H100_3G_2G, LAYOUTS);
    let before = node.show();
    for args in [
        vec!["plan", "--layout", "balanced"],
        vec!["apply", "--layout", "balanced", "--dry-run"],
    ] {
        let out = node.mig(&args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("destroy GPU instance"), "{stdout}");
        assert_eq!(node.changes(), 0);
    }
    assert_eq!(node.show(), before);
    assert_eq!(
        node.mig(&["apply", "--layout", "balanced"]).status.code(),
        Some(0)
    );
    assert_eq!(node.changes(), 2 + 2 + 4 + 4);
    let out = node.mig(&["apply", "--layout", "balanced"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(node.changes(), 0, "{}", text(&out));
    let audit = std::fs::read_to_string(node.path("audit.jsonl")).expect("audit");
    let steps = audit
        .lines()
        .filter(|l| l.contains("\"event\":\"step\""))
        .count();
    assert_eq!(steps, 8, "one record per step: {audit}");
    assert!(audit.contains("\"event\":\"apply.done\""));
}

#[test]
fn a_pending_mode_change_is_reported_and_a_configured_reset_applies_it() {
    let base =
        "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\npci_bus_id = \"00000000:3B:00.0\"\n";
    let busy = format!("{base}[[gpu.process]]\npid = 7\n");
    let node = Node::new(&busy, LAYOUTS);
    let out = node.mig(&["apply", "--layout", "balanced", "--force"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pending") && err.contains("reset"), "{err}");
    let mig = &node.show()["gpus"][0]["mig"];
    assert_eq!(
        (mig["current"].clone(), mig["pending"].clone()),
        (false.into(), true.into())
    );

    // A reset command (here: the simulated reset, a scenario rewrite) makes it current, and
    // the same apply then goes on to create the instances. Its arguments get the GPU's
    // index, UUID and PCI bus id.
    let reset = node.path("reset.sh");
    let next = node.path("after-reset.toml");
    let args = node.path("reset-args");
    std::fs::write(&next, format!("{base}reset_count = 1\n")).expect("next scenario");
    std::fs::write(
        &reset,
        format!(
            "#!/bin/sh\necho \"$@\" > {}\ncp {} {}.tmp && mv {}.tmp {}\n",
            args.display(),
            next.display(),
            node.path("scenario.toml").display(),
            node.path("scenario.toml").display(),
            node.path("scenario.toml").display()
        ),
    )
    .expect("script");
    let cfg = std::fs::read_to_string(node.path("config.toml")).expect("config");
    let cfg = cfg.replacen(
        "[audit]",
        &format!(
            "[mig]\nreset_command = [\"/bin/sh\", \"{}\", \"{{index}}\", \"{{pci_bus_id}}\"]\n\n[audit]",
            reset.display()
        ),
        1,
    );
    std::fs::write(node.path("config.toml"), cfg).expect("config");
    let out = node.mig(&["apply", "--layout", "balanced", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let show = node.show();
    assert_eq!(show["gpus"][0]["mig"]["current"], true);
    assert_eq!(counts(&show, 0).values().sum::<u64>(), 4);
    let args = std::fs::read_to_string(&args).expect("the reset command ran");
    assert_eq!(
        args.trim().to_ascii_uppercase(),
        "0 00000000:3B:00.0",
        "{args}"
    );
}

#[test]
fn hooks_run_around_an_apply_and_a_failing_pre_apply_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = dir.path().join("seen");
    let hooks = format!(
        "[[mig.hooks]]\nname = \"post-apply\"\ncommand = [\"/bin/sh\", \"-c\", \"echo $GPU_STEWARD_MIG_LAYOUT > {}\"]\ntimeout = \"5s\"\n",
        seen.display()
    );
    let node = Node::new(H100_3G_2G, &format!("{LAYOUTS}{hooks}"));
    let out = node.mig(&["apply", "--layout", "balanced"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(&seen)
            .expect("post-apply ran")
            .trim(),
        "balanced"
    );

    let failing = "[[mig.hooks]]\nname = \"pre-apply\"\ncommand = [\"/bin/false\"]\n\
                   [[mig.hooks]]\nname = \"on-failure\"\n\
                   command = [\"/bin/sh\", \"-c\", \"echo cleaned up; echo no GPU >&2; exit 3\"]\n";
    let node = Node::new(H100_3G_2G, &format!("{LAYOUTS}{failing}"));
    let out = node.mig(&["apply", "--layout", "balanced"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing was changed"), "{err}");
    // The outcome in words, not the Rust enum (`Exited(1)`).
    assert!(err.contains("exited with status 1"), "{err}");
    assert!(!err.contains("Exited("), "{err}");
    assert_eq!(node.changes(), 0);
    // Issue 35 item 12: the on-failure hook's exit code and output are in its record.
    let audit = std::fs::read_to_string(node.path("audit.jsonl")).expect("audit");
    let hook = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["event"] == "hook" && r["hook"] == "on-failure")
        .unwrap_or_else(|| panic!("no on-failure hook record: {audit}"));
    assert_eq!(hook["exit_code"], 3, "{hook}");
    assert_eq!(hook["result"], "failure", "{hook}");
    assert_eq!(hook["stdout"], "cleaned up\n", "{hook}");
    assert_eq!(hook["stderr"], "no GPU\n", "{hook}");
}

#[test]
fn bad_layouts_and_files_are_rejected_with_positions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "[mig]\nlayout = \"missing\"\n",
            ":2:10: layout 'missing' is not defined",
        ),
        (
            "[[mig.layouts.x]]\ndevices = \"all\"\nmig-enabled = false\nmig-devices = { \"1g.10gb\" = 1 }\n",
            "mig-enabled is false",
        ),
        (
            "[[mig.layouts.x]]\ndevices = \"all\"\nmig-enabled = true\nmig-devices = { \"1x.10gb\" = 1 }\n",
            "is not of the form",
        ),
        (
            "[[mig.hooks]]\nname = \"pre-flight\"\ncommand = [\"/bin/true\"]\n",
            "MIG hook 'pre-flight' is unknown",
        ),
        // Issue 26 bug 10: the bad hook is named at its own place, not at the first hook.
        (
            "[[mig.hooks]]\nname = \"pre-apply\"\ncommand = [\"/bin/true\"]\n\n\
             [[mig.hooks]]\nname = \"post-aply\"\ncommand = [\"/bin/true\"]\n",
            ":5:1: MIG hook 'post-aply' is unknown",
        ),
    ];
    for (i, (toml, want)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("c{i}.toml"));
        std::fs::write(&p, toml).expect("write");
        let out = Command::new(bin())
            .arg("check-config")
            .arg(&p)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{toml}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{err} should contain {want}");
        assert!(err.starts_with(&format!("{}:", p.display())), "{err}");
    }
    let good = dir.path().join("good.toml");
    std::fs::write(&good, format!("[mig]\nlayout = \"balanced\"\n{LAYOUTS}")).expect("write");
    let out = Command::new(bin())
        .arg("check-config")
        .arg(&good)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("MIG: converge to layout 'balanced'"),
        "{said}"
    );

    let yaml = dir.path().join("bad.yaml");
    std::fs::write(
        &yaml,
        "version: v1\nmig-configs:\n  a:\n    - devices: sometimes\n      mig-enabled: true\n",
    )
    .expect("yaml");
    let node = Node::new(H100_3G_2G, "");
    let out = node.mig(&[
        "plan",
        "--layout",
        "a",
        "--mig-config",
        yaml.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml:4:"), "{err}");
}

#[test]
fn a_full_audit_disk_refuses_the_apply_and_cuts_the_half_record_off() {
    let Some(fs) = SmallFs::new(
        "a_full_audit_disk_refuses_the_apply_and_cuts_the_half_record_off",
        256,
    ) else {
        return;
    };
    let node = Node::new(H100_3G_2G, LAYOUTS);
    let audit = fs.inside().join("audit.jsonl");
    std::fs::write(
        node.path("config.toml"),
        format!("[audit]\nfile = \"{}\"\n{LAYOUTS}", audit.display()),
    )
    .expect("config");
    // A first record that ends near a page's end: the next one is written in part, then hits
    // ENOSPC (tmpfs counts pages), which is the short write that must be cut off.
    let seed = format!("{{\"seed\":\"{}\"}}\n", "x".repeat(4096 - 40));
    std::fs::write(fs.path("audit.jsonl"), &seed).expect("seed");
    let before = node.show();
    fs.fill();

    let out = node.mig_with(fs.command(bin()), &["apply", "--layout", "balanced"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&audit.display().to_string())
            && stderr.contains("No space left")
            && stderr.contains("nothing was changed"),
        "{stderr}"
    );
    assert_eq!(node.changes(), 0, "{}", text(&out));
    assert_eq!(node.show(), before);
    assert_eq!(
        std::fs::read_to_string(fs.path("audit.jsonl")).expect("audit"),
        seed,
        "the refused record left bytes behind"
    );

    fs.free();
    let out = node.mig_with(fs.command(bin()), &["apply", "--layout", "balanced"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(node.changes(), 2 + 2 + 4 + 4);
    let events: Vec<String> = fs
        .json_lines("audit.jsonl")
        .iter()
        .map(|r| r["event"].as_str().unwrap_or("seed").to_string())
        .collect();
    assert_eq!(events.first().map(String::as_str), Some("seed"));
    assert_eq!(
        events.get(1).map(String::as_str),
        Some("apply.start"),
        "{events:?}"
    );
    assert_eq!(events.last().map(String::as_str), Some("apply.done"));
}

/// Starts `gpu-steward mig apply --layout balanced` with GPU- and compute-instance creations
/// made slow (`ms` each) by the simulator's cost table, and waits for its first step's record.
fn slow_apply(node: &Node, ms: u64) -> std::process::Child {
    let cost = node.path("cost.json");
    let table = serde_json::json!({"functions": {
        "nvmlDeviceCreateGpuInstanceWithPlacement": {"wall_us": ms * 1000},
        "nvmlGpuInstanceCreateComputeInstanceWithPlacement": {"wall_us": ms * 1000},
    }});
    std::fs::write(&cost, table.to_string()).expect("cost table");
    let child = Command::new(bin())
        .args(["mig", "apply", "--layout", "balanced", "--nvml-lib"])
        .arg(sim_lib())
        .arg("--config")
        .arg(node.path("config.toml"))
        .env("NVML_SIM_SCENARIO", node.path("scenario.toml"))
        .env("NVML_SIM_STATE", node.path("state.json"))
        .env("NVML_SIM_COST", &cost)
        .env_remove("GPU_STEWARD_MIG_CONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start gpu-steward mig apply");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let audit = std::fs::read_to_string(node.path("audit.jsonl")).unwrap_or_default();
        // Past the destruction of what was there: the apply is creating.
        if audit
            .lines()
            .any(|l| l.contains("\"event\":\"step\"") && l.contains("\"op\":\"create_instance\""))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the apply never got to its creations: {audit}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child
}

#[test]
fn a_signal_during_a_cli_apply_rolls_it_back_instead_of_killing_it_mid_change() {
    for signal in [
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGHUP,
    ] {
        let node = Node::new(H100_3G_2G, LAYOUTS);
        let before = shape(&node.show(), 0);
        let child = slow_apply(&node, 300);
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal");
        let out = child.wait_with_output().expect("wait");
        assert_eq!(out.status.code(), Some(1), "{signal}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{signal}: stopping the apply")),
            "{signal}: {err}"
        );
        assert!(err.contains("a stop was asked for"), "{signal}: {err}");
        assert!(
            err.contains("the layout found before was restored"),
            "{signal}: {err}"
        );
        assert_eq!(shape(&node.show(), 0), before, "{signal}: as it was");
        assert!(
            !node.path("mig-apply.intent").exists(),
            "{signal}: a rolled-back apply is settled"
        );
        let audit = std::fs::read_to_string(node.path("audit.jsonl")).expect("audit");
        assert!(audit.contains("\"event\":\"rollback\""), "{audit}");
        // Every record says who asked.
        for line in audit.lines() {
            let r: Value = serde_json::from_str(line).expect("JSON");
            assert_eq!(r["trigger"], "cli", "{line}");
        }
    }
}

#[test]
fn a_cli_apply_killed_half_way_leaves_its_intent_record_for_the_daemon() {
    let node = Node::new(H100_3G_2G, LAYOUTS);
    let mut child = slow_apply(&node, 1_000);
    let intent = node.path("mig-apply.intent");
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(&intent).expect("an intent record"))
            .expect("JSON");
    assert_eq!(record["layout"], "balanced");
    assert_eq!(record["pid"], child.id());
    child.kill().expect("kill -9");
    let _ = child.wait();
    assert!(intent.exists(), "kept: the layout may be half-made");
    // A later apply that completes settles it.
    let out = node.mig(&["apply", "--layout", "balanced"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!intent.exists());
}

/// Issue 26, defect 7: an intent record left by an apply killed half-way was overwritten by the
/// next apply and removed even when that apply was rolled back, leaving a half-made GPU with no
/// record. Now the next apply says it (its terminal, the audit log), keeps it when it is rolled
/// back, and settles it only once the node is in the layout.
#[test]
fn a_leftover_intent_record_is_said_and_kept_when_the_next_apply_is_rolled_back() {
    let faulty = format!("{H100_3G_2G}mig_faults = {{ create_gpu_instance = 1 }}\n");
    let node = Node::new(&faulty, LAYOUTS);
    let intent = node.path("mig-apply.intent");
    let leftover = r#"{"layout":"seven","pid":4242,"started":1767322245}"#;
    std::fs::write(&intent, leftover).expect("a leftover record");
    let before = shape(&node.show(), 0);
    let out = node.mig(&["apply", "--layout", "balanced"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("an apply of 'seven' (pid 4242")
            && err.contains("left its intent record")
            && err.contains("the layout found before was restored"),
        "{err}"
    );
    assert_eq!(shape(&node.show(), 0), before, "rolled back");
    let kept: Value =
        serde_json::from_str(&std::fs::read_to_string(&intent).expect("kept")).expect("JSON");
    assert_eq!(
        kept,
        serde_json::from_str::<Value>(leftover).expect("JSON"),
        "the found record is back as it was"
    );
    let audit = std::fs::read_to_string(node.path("audit.jsonl")).expect("audit");
    let records: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let found = records
        .iter()
        .position(|r| r["event"] == "intent.found")
        .unwrap_or_else(|| panic!("no intent.found record: {audit}"));
    let start = records
        .iter()
        .position(|r| r["event"] == "apply.start")
        .expect("apply.start");
    assert!(found < start, "said before acting: {audit}");
    let r = &records[found];
    assert_eq!(
        (
            &r["component"],
            &r["layout"],
            &r["pid"],
            &r["started"],
            &r["trigger"]
        ),
        (
            &Value::from("mig"),
            &Value::from("seven"),
            &Value::from(4242),
            &Value::from(1_767_322_245u64),
            &Value::from("cli")
        ),
        "{r}"
    );
    // The same apply without the fault reaches the layout: the record is settled.
    std::fs::write(node.path("scenario.toml"), H100_3G_2G).expect("scenario");
    let out = node.mig(&["apply", "--layout", "balanced"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("an apply of 'seven' (pid 4242"),
        "{}",
        text(&out)
    );
    assert!(!intent.exists(), "settled once the node is in the layout");
}
