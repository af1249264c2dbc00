//! Unit tests of scenario parsing: every contract field, the idle defaults, each validation
//! error with its line:col, and the three shared scenarios.

use super::*;

fn ok(text: &str) -> Scenario {
    match parse(text) {
        Ok(s) => s,
        Err(e) => panic!("expected a valid scenario, got {e:?}"),
    }
}

fn bad(text: &str) -> ScenarioError {
    match parse(text) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e,
    }
}

const FULL: &str = r#"version = 1
[driver]
version = "580.95.05"
cuda_version = 13000
init_error = "DRIVER_NOT_LOADED"
[[gpu]]
model = "H100-SXM5-80GB"
uuid = "GPU-0b4f6a5c-1111-2222-3333-444455556666"
pci_bus_id = "00000000:18:00.0"
serial = "1654922000123"
mig_mode = true
mig_devices = ["3g.40gb", "2g.20gb", "1g.10gb"]
power_limit_w = 650
lost = false
recovery_action = "drain_and_reset"
unsupported = ["nvmlDeviceGetFanSpeed_v2"]
errors = { nvmlDeviceGetPowerUsage = "UNKNOWN" }
gpu_util_percent = 87
mem_util_percent = 41
enc_util_percent = 1
dec_util_percent = 2
memory_used_mib = 40960
temperature_c = 62
memory_temperature_c = 70
power_w = 512.5
sm_clock_mhz = 1980
mem_clock_mhz = 2619
pcie_tx_kib_s = 1200
pcie_rx_kib_s = 800
pcie_replay_count = 3
fan_percent = 40
ecc = { sbe_volatile = 1, dbe_volatile = 2, sbe_aggregate = 12, dbe_aggregate = 4 }
remapped_rows = { correctable = 5, uncorrectable = 6, pending = true, failure = false }
throttle_reasons = ["gpu_idle", "hw_thermal_slowdown"]
[[gpu.process]]
pid = 4242
kind = "graphics"
used_memory_mib = 30720
sm_util_percent = 80
mem_util_percent = 30
mig_device = "3g.40gb"
[[gpu.event]]
id = 1
xid = 79
"#;

#[test]
fn the_rate_keys_and_imex_recovery_are_read() {
    let s = ok("version = 1\n[[gpu]]\nmodel = \"H200-SXM-141GB\"\n\
                recovery_action = \"recover_imex_domain\"\n\
                ecc = { correctable_per_s = 17700 }\n\
                pcie = { gen = 4, width = 8, replays_per_s = 2.5 }\n");
    let g = &s.gpus[0];
    assert_eq!(
        g.recovery_action, 5,
        "NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN"
    );
    assert_eq!(g.ecc.correctable_per_s, 17700);
    assert_eq!(
        (g.pcie_gen, g.pcie_width, g.pcie_replays_per_s),
        (4, 8, 2.5)
    );
    assert_eq!((g.model.pcie_max_gen, g.model.pcie_max_width), (5, 16));
}

#[test]
fn every_field_is_read() {
    let s = ok(FULL);
    assert_eq!(s.driver_version, "580.95.05");
    assert_eq!(s.nvml_version(), "13.580.95.05");
    assert_eq!(s.cuda_version, 13000);
    assert_eq!(s.init_error, Some(9));
    let g = &s.gpus[0];
    assert_eq!(g.uuid, "GPU-0b4f6a5c-1111-2222-3333-444455556666");
    assert_eq!(g.pci.bus_id(), "00000000:18:00.0");
    assert_eq!(g.serial, "1654922000123");
    assert!(g.mig_mode);
    assert_eq!(g.mig_devices, ["3g.40gb", "2g.20gb", "1g.10gb"]);
    assert_eq!(g.power_limit_mw, 650_000);
    assert_eq!(g.recovery_action, 4);
    assert_eq!(g.override_for("nvmlDeviceGetFanSpeed_v2"), Some(3));
    assert_eq!(g.override_for("nvmlDeviceGetPowerUsage"), Some(999));
    assert_eq!(g.override_for("nvmlDeviceGetName"), None);
    assert_eq!(
        (g.gpu_util, g.mem_util, g.enc_util, g.dec_util),
        (87, 41, 1, 2)
    );
    assert_eq!(g.memory_used_mib, 40960);
    assert_eq!((g.temperature_c, g.memory_temperature_c), (62, Some(70)));
    assert_eq!(g.power_mw, 512_500);
    assert_eq!(
        (g.clocks.sm, g.clocks.graphics, g.clocks.mem),
        (1980, 1980, 2619)
    );
    assert_eq!(
        (g.pcie_tx_kib_s, g.pcie_rx_kib_s, g.pcie_replay_count),
        (1200, 800, 3)
    );
    assert_eq!(g.fan_percent, None, "fanless board ignores fan_percent");
    assert_eq!(g.ecc.dbe_aggregate, 4);
    assert_eq!(g.ecc.correctable_per_s, 0);
    assert_eq!(
        (g.pcie_gen, g.pcie_width, g.pcie_replays_per_s),
        (5, 16, 0.0),
        "the model's maximum, no replay rate"
    );
    assert_eq!(g.remapped_rows.uncorrectable, 6);
    assert!(g.remapped_rows.pending);
    assert_eq!(g.throttle_reasons, 0x41);
    let p = &g.processes[0];
    assert_eq!(
        (p.pid, p.kind, p.used_memory_mib),
        (4242, ProcessKind::Graphics, 30720)
    );
    assert_eq!(
        (p.sm_util_percent, p.mem_util_percent, p.mig_device),
        (80, 30, Some(0))
    );
    assert_eq!(g.events, [resolve::Event { id: 1, xid: 79 }]);
}

#[test]
fn omitted_fields_take_idle_defaults() {
    let s = ok("version = 1\n[[gpu]]\nmodel = \"T4\"\ncount = 2\n");
    assert_eq!(s.driver_version, "580.159.04", "the captured H100's driver");
    assert_eq!(s.init_error, None);
    assert_eq!(s.gpus.len(), 2);
    let (a, b) = (&s.gpus[0], &s.gpus[1]);
    assert_eq!(a.power_mw, 12_000);
    assert_eq!(a.power_limit_mw, 70_000);
    assert_eq!(a.clocks, a.model.idle_clocks);
    assert_eq!((a.temperature_c, a.memory_temperature_c), (30, None));
    assert_eq!((a.gpu_util, a.memory_used_mib), (0, 0));
    assert_eq!(a.throttle_reasons, 0x1, "idle GPUs report GpuIdle");
    assert!(!a.lost && !a.mig_mode && a.processes.is_empty());
    assert_ne!(a.uuid, b.uuid);
    assert_ne!(a.serial, b.serial);
    assert_eq!(a.serial.len(), 13);
    assert_ne!(a.pci, b.pci);
    assert_eq!(b.index, 1);
}

#[test]
fn errors_point_at_the_offending_value() {
    let cases: &[(&str, (usize, usize), &str)] = &[
        ("version = 1\n[[gpu]]\nmodel = \"V100\"\n", (3, 9), "unknown model 'V100'"),
        ("version = 2\n", (1, 11), "unsupported scenario version"),
        ("version = 1\n[[gpu]]\nmodel = \"T4\"\ncolour = 1\n", (4, 1), "unknown field `colour`"),
        ("version = 1\n[driver]\ninit_error = \"OOPS\"\n", (3, 14), "unknown nvmlReturn_t name 'OOPS'"),
        ("version = 1\n[[gpu]]\nmodel = \"T4\"\nerrors = { nvmlDeviceGetPowerUsage = \"NOPE\" }\n", (4, 38), "unknown nvmlReturn_t name 'NOPE'"),
        ("version = 1\n[[gpu]]\nmodel = \"T4\"\nunsupported = [\"nvmlDeviceFly\"]\n", (4, 16), "'nvmlDeviceFly' is not a function"),
        ("version = 1\n[[gpu]]\nmodel = \"T4\"\nerrors = { nvmlDeviceFly = \"UNKNOWN\" }\n", (4, 12), "'nvmlDeviceFly' is not a function"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\nmig_mode = true\n", (4, 12), "does not support MIG"),
        ("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nmig_mode = true\nmig_devices = [\"3g.20gb\"]\n", (5, 16), "'3g.20gb' is not a MIG profile"),
        ("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nmig_devices = [\"3g.40gb\"]\n", (4, 16), "needs 'mig_mode = true'"),
        ("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nmig_mode = true\nmig_devices = [\"4g.40gb\", \"4g.40gb\"]\n", (5, 27), "more than the 7 compute slices"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\nmemory_used_mib = 22479\n", (4, 19), "exceeds L4's total minus reserved (22478 MiB)"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\ngpu_util_percent = 101\n", (4, 20), "101 is not a percentage"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\ncount = 2\nuuid = \"GPU-00000000-0000-0000-0000-000000000000\"\n", (5, 8), "'uuid' cannot be given with count > 1"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\n[[gpu.event]]\nid = 1\nxid = 79\n[[gpu.event]]\nid = 1\nxid = 48\n", (8, 6), "duplicate event id 1"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\npower_limit_w = 700\n", (4, 17), "outside L4's constraints 40..=72 W"),
        ("version = 1\n[[gpu]]\nmodel = \"T4\"\nremapped_rows = { pending = true }\n", (4, 17), "has no row remapping"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\nretired_pages = { sbe = 1 }\n", (4, 17), "not page retirement"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\nrecovery_action = \"panic\"\n", (4, 19), "unknown variant `panic`"),
        ("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\npcie = { gen = 6 }\n", (4, 16), "pcie gen 6 is not one the H100-SXM5-80GB trains to: 1 to 5"),
        ("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\npcie = { width = 12 }\n", (4, 18), "pcie width 12 is not one"),
        ("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\npcie = { replays_per_s = -1.0 }\n", (4, 26), "replays_per_s must be a rate of 0 or more"),
        ("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\npcie = { lanes = 8 }\n", (4, 10), "unknown field `lanes`"),
        ("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\necc = { correctable_per_s = -5 }\n", (4, 29), ""),
        ("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\necc_sram = { correctable_per_s = 1 }\n", (4, 12), "give it in 'ecc', not 'ecc_sram'"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\nrecovery_action = \"recover_imex\"\n", (4, 19), "recover_imex_domain"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\nthrottle_reasons = [\"too_hot\"]\n", (4, 21), "unknown variant `too_hot`"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\npci_bus_id = \"nope\"\n", (4, 14), "is not of the form"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\nuuid = \"GPU-1\"\n", (4, 8), "is not of the form GPU-"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\n[[gpu.process]]\npid = 1\nmig_device = \"1g.10gb\"\n", (6, 14), "is not one of this GPU's mig_devices"),
        ("version = 1\n[[gpu]]\nmodel = \"L4\"\npci_bus_id = \"0:3b:00.0\"\n[[gpu]]\nmodel = \"L4\"\npci_bus_id = \"00000000:3B:00.0\"\n", (5, 1), "repeats the pci_bus_id"),
        ("version = 1\n[[gpu]\nmodel = \"L4\"\n", (2, 6), ""),
    ];
    for (text, (line, col), needle) in cases {
        let e = bad(text);
        assert!(
            e.message.contains(needle),
            "{text:?}: message {:?} lacks {needle:?}",
            e.message
        );
        assert_eq!((e.line, e.col), (*line, *col), "{text:?}: {}", e.message);
    }
}

#[test]
fn render_is_one_line_with_file_position() {
    let e = bad("version = 1\n[[gpu]]\nmodel = \"V100\"\n");
    let line = e.render("/tmp/s.toml");
    assert!(
        line.starts_with("nvml-sim: /tmp/s.toml:3:9: unknown model 'V100'"),
        "{line}"
    );
    assert!(!line.contains('\n'));
}

#[test]
fn shared_scenarios_parse() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/scenarios");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        println!(
            "note: {} does not exist; shared scenarios not checked",
            dir.display()
        );
        return;
    };
    let mut n = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).expect("readable scenario");
            if let Err(e) = parse(&text) {
                panic!("{}", e.render(&path.display().to_string()));
            }
            n += 1;
        }
    }
    assert!(n >= 3, "expected the three shared scenarios, found {n}");
}

#[test]
fn compute_mode_is_read_by_name_and_defaults_to_default() {
    let s = ok("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\ncompute_mode = \"exclusive_process\"\n[[gpu]]\nmodel = \"L4\"\n");
    assert_eq!(s.gpus[0].compute_mode, 3);
    assert_eq!(s.gpus[1].compute_mode, 0);
    let e = bad("version = 1\n[[gpu]]\nmodel = \"L4\"\ncompute_mode = \"shared\"\n");
    assert_eq!((e.line, e.col), (4, 16), "{e:?}");
}

#[test]
fn nvlink_and_fabric_follow_the_model() {
    let s = ok(r#"version = 1
[[gpu]]
model = "H100-SXM5-80GB"
nvlink = { down = [3], replay_errors = 2, tx_kib_s = 100 }
fabric = { state = "in_progress", status = "NOT_READY", health = ["route_unhealthy"] }
[[gpu]]
model = "A100-SXM4-80GB"
nvlink = {}
[[gpu]]
model = "H200-SXM-141GB"
nvlink = {}
fabric = { state = "completed", status = "SUCCESS", health = [] }
[[gpu]]
model = "H100-SXM5-80GB"
"#);
    let h100 = s.gpus[0].nvlink.as_ref().expect("links");
    assert_eq!(h100.active.len(), 18);
    assert_eq!(h100.active_links(), 17);
    assert!(!h100.active[3]);
    assert_eq!(h100.errors, [2, 0, 0, 0]);
    let f = s.gpus[0].fabric.expect("fabric");
    assert_eq!((f.state, f.health_summary), (2, 2));
    // route_unhealthy TRUE (1 << 4), everything else false (2) or none (1 << 8).
    assert_eq!(f.health_mask, 2 | 2 << 2 | 1 << 4 | 2 << 6 | 1 << 8);
    assert_eq!(s.gpus[1].nvlink.as_ref().map(|n| n.active.len()), Some(12));
    assert_eq!(s.gpus[1].fabric, None, "an A100 has no fabric info");
    let healthy = s.gpus[2]
        .fabric
        .expect("Hopper with NVLink has fabric info");
    assert_eq!(
        (healthy.state, healthy.status, healthy.health_summary),
        (3, 0, 1)
    );
    assert_eq!(s.gpus[3].nvlink, None, "no key: the VM answer");
    assert_eq!(s.gpus[3].fabric, None);
}

#[test]
fn nvlink_and_fabric_errors_point_at_the_key() {
    let e = bad("version = 1\n[[gpu]]\nmodel = \"L4\"\nnvlink = {}\n");
    assert_eq!((e.line, e.col), (4, 10), "{e:?}");
    assert!(e.message.contains("has no NVLink"), "{e:?}");
    let e = bad("version = 1\n[[gpu]]\nmodel = \"A100-SXM4-40GB\"\nnvlink = { down = [12] }\n");
    assert_eq!((e.line, e.col), (4, 20), "{e:?}");
    assert!(e.message.contains("links 0 to 11"), "{e:?}");
    let e = bad("version = 1\n[[gpu]]\nmodel = \"A100-SXM4-40GB\"\nnvlink = {}\nfabric = {}\n");
    assert!(e.message.contains("Hopper"), "{e:?}");
    let e = bad("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nfabric = {}\n");
    assert!(e.message.contains("needs 'nvlink'"), "{e:?}");
    let e = bad("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nnvlink = {}\nfabric = { status = \"FINE\" }\n");
    assert_eq!((e.line, e.col), (5, 21), "{e:?}");
    let e = bad("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nnvlink = {}\nfabric = { health = [\"slow\"] }\n");
    assert_eq!(e.line, 5, "{e:?}");
}
