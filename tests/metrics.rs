//! `/metrics` of the real binary against the simulated NVML: every value equals the scenario
//! after unit conversion, changes show at the next poll, failures make series absent.

mod common;

use std::time::Duration;

use common::{is_nvlink_series, scenario, scenario_gpus, wait_for, Agent, Metrics};

const MIB: f64 = 1024.0 * 1024.0;

fn int(gpu: &toml::Value, key: &str) -> Option<f64> {
    gpu.get(key).and_then(|v| v.as_integer()).map(|v| v as f64)
}

fn float(gpu: &toml::Value, key: &str) -> Option<f64> {
    gpu.get(key)
        .and_then(|v| v.as_float().or(v.as_integer().map(|i| i as f64)))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

#[test]
fn every_value_equals_the_dgx_scenario_after_unit_conversion() {
    let text = scenario("dgx-h100.toml");
    let agent = Agent::with_scenario(&text).start();
    let m = agent.metrics();
    let gpus = scenario_gpus(&text);
    assert_eq!(gpus.len(), 8);
    assert_eq!(m.get("gpu_steward_gpus", &[]), 8.0);
    for (i, g) in gpus.iter().enumerate() {
        let idx = i.to_string();
        let d = [("gpu", idx.as_str())];
        let bus = g["pci_bus_id"].as_str().expect("bus id");

        // Identity and labels, as dcgm-exporter writes them.
        let util = m.find("DCGM_FI_DEV_GPU_UTIL", &d);
        assert_eq!(util.len(), 1, "gpu {i}");
        let l = &util[0].labels;
        assert_eq!(l["pci_bus_id"], bus);
        assert_eq!(l["modelName"], "NVIDIA H100 80GB HBM3");
        assert_eq!(l["device"], format!("nvidia{i}"));
        assert_eq!(l["DCGM_FI_DRIVER_VERSION"], "580.95.05");
        assert!(l["UUID"].starts_with("GPU-"), "{l:?}");
        assert!(l.contains_key("Hostname"));
        let uuid = l["UUID"].clone();
        let n = [("gpu", idx.as_str()), ("uuid", uuid.as_str())];
        let info = m.find("gpu_steward_gpu_info", &n);
        assert_eq!(info.len(), 1);
        assert_eq!(info[0].labels["pci_bus_id"], bus);
        assert_eq!(info[0].labels["name"], "NVIDIA H100 80GB HBM3");
        assert_eq!(info[0].labels["pci_device_id"], "0x233010DE");
        assert_eq!(info[0].labels["compute_capability"], "9.0");
        assert_eq!(info[0].labels["cuda_version"], "13.0");
        assert_eq!(m.get("gpu_steward_gpu_up", &n), 1.0);

        // Utilization: % on the dcgm side, ratio on the native side.
        let gu = int(g, "gpu_util_percent").expect("util");
        let mu = int(g, "mem_util_percent").expect("mem util");
        assert_eq!(m.get("DCGM_FI_DEV_GPU_UTIL", &d), gu);
        assert_eq!(m.get("DCGM_FI_DEV_MEM_COPY_UTIL", &d), mu);
        assert!(close(
            m.get("gpu_steward_gpu_utilization_ratio", &n),
            gu / 100.0
        ));
        assert!(close(
            m.get("gpu_steward_memory_utilization_ratio", &n),
            mu / 100.0
        ));

        // Memory: MiB on the dcgm side, bytes on the native side; totals from the model.
        let used = int(g, "memory_used_mib").expect("memory");
        assert_eq!(m.get("DCGM_FI_DEV_FB_USED", &d), used);
        assert_eq!(m.get("gpu_steward_memory_used_bytes", &n), used * MIB);
        assert_eq!(m.get("DCGM_FI_DEV_FB_TOTAL", &d), 81559.0);
        assert_eq!(m.get("gpu_steward_memory_total_bytes", &n), 81559.0 * MIB);
        let reserved = m.get("gpu_steward_memory_reserved_bytes", &n);
        let free = m.get("gpu_steward_memory_free_bytes", &n);
        assert_eq!(
            reserved + used * MIB + free,
            81559.0 * MIB,
            "v2 bytes add up"
        );
        assert_eq!(
            m.get("DCGM_FI_DEV_FB_RESERVED", &d),
            (reserved / MIB).floor()
        );
        assert_eq!(m.get("DCGM_FI_DEV_FB_FREE", &d), (free / MIB).floor());

        // Temperatures.
        let t = int(g, "temperature_c").expect("temp");
        let mt = int(g, "memory_temperature_c").expect("mem temp");
        assert_eq!(m.get("DCGM_FI_DEV_GPU_TEMP", &d), t);
        assert_eq!(m.get("gpu_steward_temperature_celsius", &n), t);
        assert_eq!(m.get("DCGM_FI_DEV_MEMORY_TEMP", &d), mt);
        assert_eq!(m.get("gpu_steward_memory_temperature_celsius", &n), mt);

        // Power: mW from NVML, W on both sides; limits from the model (700 W).
        let p = float(g, "power_w").expect("power");
        assert!(close(m.get("DCGM_FI_DEV_POWER_USAGE", &d), p), "gpu {i}");
        assert!(close(m.get("gpu_steward_power_watts", &n), p));
        assert_eq!(m.get("gpu_steward_power_limit_watts", &n), 700.0);
        assert_eq!(m.get("gpu_steward_enforced_power_limit_watts", &n), 700.0);
        assert_eq!(m.get("gpu_steward_power_default_limit_watts", &n), 700.0);

        // Clocks: MHz on the dcgm side, Hz on the native side.
        let sm = int(g, "sm_clock_mhz").expect("sm clock");
        let mem = int(g, "mem_clock_mhz").expect("mem clock");
        assert_eq!(m.get("DCGM_FI_DEV_SM_CLOCK", &d), sm);
        assert_eq!(m.get("DCGM_FI_DEV_MEM_CLOCK", &d), mem);
        let clock = |c: &str| {
            m.get(
                "gpu_steward_clock_hertz",
                &[("gpu", idx.as_str()), ("clock", c)],
            )
        };
        assert_eq!(clock("sm"), sm * 1e6);
        assert_eq!(clock("memory"), mem * 1e6);
        let max_sm = m.get(
            "gpu_steward_clock_max_hertz",
            &[("gpu", idx.as_str()), ("clock", "sm")],
        );
        assert_eq!(max_sm, 1980.0 * 1e6);

        // PCIe: KB/s from NVML, bytes/s native; replays default to 0.
        if let Some(tx) = int(g, "pcie_tx_kib_s") {
            assert_eq!(
                m.get("gpu_steward_pcie_transmit_bytes_per_second", &n),
                tx * 1024.0
            );
        }
        if let Some(rx) = int(g, "pcie_rx_kib_s") {
            assert_eq!(
                m.get("gpu_steward_pcie_receive_bytes_per_second", &n),
                rx * 1024.0
            );
        }
        assert_eq!(m.get("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", &d), 0.0);
        assert_eq!(m.get("gpu_steward_pcie_replays_total", &n), 0.0);
        assert_eq!(m.get("gpu_steward_pcie_link_max_generation", &n), 5.0);

        // ECC (GPU 3 carries counts in the scenario), remapped rows and XIDs default to zero.
        let ecc = g.get("ecc");
        let ecc_of = |k: &str| {
            ecc.and_then(|e| e.get(k))
                .and_then(|v| v.as_integer())
                .unwrap_or(0) as f64
        };
        assert_eq!(
            m.get("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", &d),
            ecc_of("sbe_volatile")
        );
        assert_eq!(
            m.get("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", &d),
            ecc_of("sbe_aggregate")
        );
        assert_eq!(
            m.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", &d),
            ecc_of("dbe_volatile")
        );
        let vol = |e: &str| {
            m.get(
                "gpu_steward_ecc_errors_volatile_total",
                &[("gpu", idx.as_str()), ("error", e)],
            )
        };
        assert_eq!(vol("corrected"), ecc_of("sbe_volatile"));
        assert_eq!(vol("uncorrected"), ecc_of("dbe_volatile"));
        assert_eq!(m.get("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", &d), 0.0);
        assert_eq!(m.get("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", &d), 0.0);
        assert_eq!(m.get("DCGM_FI_DEV_ROW_REMAP_FAILURE", &d), 0.0);
        assert_eq!(m.get("DCGM_FI_DEV_XID_ERRORS", &d), 0.0);
        // H100 replaced page retirement with row remapping: no retired-pages series at all.
        assert_eq!(m.value("DCGM_FI_DEV_RETIRED_SBE", &d), None);
        assert_eq!(m.value("gpu_steward_retired_pages_pending", &n), None);
        // No fan on an SXM board: absent, not 0.
        assert_eq!(m.value("DCGM_FI_DEV_FAN_SPEED", &d), None);
        assert_eq!(m.value("gpu_steward_fan_speed_ratio", &n), None);

        // Clock event reasons from the scenario's names.
        let reasons: Vec<&str> = g
            .get("throttle_reasons")
            .and_then(|r| r.as_array())
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        for reason in ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"] {
            let active = m.get(
                "gpu_steward_clock_event_active",
                &[("gpu", idx.as_str()), ("reason", reason)],
            );
            assert_eq!(
                active,
                f64::from(u8::from(reasons.contains(&reason))),
                "gpu {i} {reason}"
            );
        }

        // Processes.
        let procs = g
            .get("process")
            .and_then(|p| p.as_array())
            .map_or(0, Vec::len);
        assert_eq!(m.get("gpu_steward_gpu_processes", &n), procs as f64);
    }
}

#[test]
fn energy_is_power_integrated_over_time_and_agrees_between_families() {
    let text = scenario("dgx-h100.toml");
    let agent = Agent::with_scenario(&text).start();
    let energy = |m: &Metrics| {
        (
            m.get("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", &[("gpu", "0")]),
            m.get("gpu_steward_energy_joules_total", &[("gpu", "0")]),
            m.get("gpu_steward_snapshot_timestamp_seconds", &[]),
        )
    };
    let first = agent.metrics();
    let (mj1, j1, t1) = energy(&first);
    assert_eq!(mj1 / 1000.0, j1, "mJ and J agree");
    let second = wait_for("two seconds of snapshots", Duration::from_secs(10), || {
        let m = agent.metrics();
        (energy(&m).2 - t1 >= 2.0).then_some(m)
    });
    let (mj2, _, t2) = energy(&second);
    // GPU 0 draws 618.4 W in the scenario. The energy read happens a little after the snapshot
    // timestamp; allow one poll interval (200 ms) of slack at each end.
    let expected = 618.4 * (t2 - t1) * 1000.0;
    let slack = 618.4 * 0.4 * 1000.0;
    assert!(
        (mj2 - mj1 - expected).abs() <= slack,
        "energy grew {} mJ in {:.3} s; expected {expected} ± {slack}",
        mj2 - mj1,
        t2 - t1
    );
}

#[test]
fn a_scenario_rewrite_shows_at_the_next_poll() {
    let text = scenario("dgx-h100.toml");
    let agent = Agent::with_scenario(&text).start();
    assert_eq!(
        agent.metrics().get("DCGM_FI_DEV_GPU_TEMP", &[("gpu", "0")]),
        64.0
    );
    let changed = text
        .replacen("temperature_c = 64", "temperature_c = 81", 1)
        .replacen("power_w = 618.4", "power_w = 688.25", 1);
    assert_ne!(changed, text);
    agent.rewrite_scenario(&changed);
    let m = wait_for("the new temperature", Duration::from_secs(5), || {
        let m = agent.metrics();
        (m.get("DCGM_FI_DEV_GPU_TEMP", &[("gpu", "0")]) == 81.0).then_some(m)
    });
    assert_eq!(m.get("DCGM_FI_DEV_POWER_USAGE", &[("gpu", "0")]), 688.25);
    assert_eq!(
        m.get("gpu_steward_temperature_celsius", &[("gpu", "0")]),
        81.0
    );
    // The other GPUs are untouched.
    assert_eq!(m.get("DCGM_FI_DEV_GPU_TEMP", &[("gpu", "1")]), 66.0);
}

#[test]
fn unsupported_and_failing_calls_make_series_absent_and_are_counted() {
    let agent = Agent::with_scenario(&scenario("faults.toml")).start();
    let m = wait_for("the error counter", Duration::from_secs(5), || {
        let m = agent.metrics();
        m.value(
            "gpu_steward_nvml_errors_total",
            &[
                ("function", "nvmlDeviceGetMemoryInfo_v2"),
                ("error", "unknown"),
            ],
        )
        .is_some()
        .then_some(m)
    });
    // GPU 3: power and energy unsupported, memory info failing.
    let g3 = [("gpu", "3")];
    assert_eq!(m.value("DCGM_FI_DEV_POWER_USAGE", &g3), None);
    assert_eq!(m.value("gpu_steward_power_watts", &g3), None);
    assert_eq!(m.value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", &g3), None);
    assert_eq!(m.value("gpu_steward_energy_joules_total", &g3), None);
    assert_eq!(m.value("DCGM_FI_DEV_FB_USED", &g3), None);
    assert_eq!(m.value("gpu_steward_memory_used_bytes", &g3), None);
    // ... while what it can give is there.
    assert_eq!(m.get("DCGM_FI_DEV_GPU_UTIL", &g3), 12.0);
    assert_eq!(m.get("gpu_steward_gpu_up", &g3), 1.0);
    // Not supported is not an error; the failing call is, and fails its source.
    assert!(m
        .find(
            "gpu_steward_nvml_errors_total",
            &[("function", "nvmlDeviceGetPowerUsage")]
        )
        .is_empty());
    assert_eq!(
        m.get("gpu_steward_poll_source_success", &[("source", "memory")]),
        0.0
    );
    assert_eq!(
        m.get(
            "gpu_steward_poll_source_success",
            &[("source", "utilization")]
        ),
        1.0
    );
    // The other GPUs report power.
    assert_eq!(m.get("DCGM_FI_DEV_POWER_USAGE", &[("gpu", "1")]), 90.0);
    assert_eq!(m.get("DCGM_FI_DEV_POWER_USAGE", &[("gpu", "2")]), 698.0);
    // GPU 0 is lost: up 0 and no telemetry; GPU 1 carries the remap/ECC state of the scenario.
    assert_eq!(m.get("gpu_steward_gpu_up", &[("gpu", "0")]), 0.0);
    assert!(m.find("DCGM_FI_DEV_GPU_TEMP", &[("gpu", "0")]).is_empty());
    let g1 = [("gpu", "1")];
    assert_eq!(m.get("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", &g1), 1.0);
    assert_eq!(m.get("DCGM_FI_DEV_ROW_REMAP_PENDING", &g1), 1.0);
    assert_eq!(m.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", &g1), 1.0);
    assert_eq!(m.get("gpu_steward_recovery_action", &g1), 1.0);
    assert_eq!(
        m.get(
            "gpu_steward_clock_event_active",
            &[("gpu", "2"), ("reason", "hw_thermal_slowdown")]
        ),
        1.0
    );
    // H200 model values.
    assert_eq!(m.get("DCGM_FI_DEV_FB_TOTAL", &g1), 143771.0);
    // The counter keeps counting, poll after poll.
    let before = m.get(
        "gpu_steward_nvml_errors_total",
        &[
            ("function", "nvmlDeviceGetMemoryInfo_v2"),
            ("error", "unknown"),
        ],
    );
    wait_for("the error counter to grow", Duration::from_secs(5), || {
        let now = agent.metrics().get(
            "gpu_steward_nvml_errors_total",
            &[
                ("function", "nvmlDeviceGetMemoryInfo_v2"),
                ("error", "unknown"),
            ],
        );
        (now > before).then_some(())
    });
}

#[test]
fn xids_from_the_event_stream_are_counted_once() {
    let text = scenario("dgx-h100.toml");
    let agent = Agent::with_scenario(&text).start();
    // Inject an XID on GPU 4: an [[gpu.event]] table just before the sixth [[gpu]] belongs to
    // the fifth GPU.
    let at = text.match_indices("[[gpu]]").nth(5).expect("eight GPUs").0;
    let with_xid = format!(
        "{}[[gpu.event]]\nid = 7\nxid = 31\n\n{}",
        &text[..at],
        &text[at..]
    );
    let gpus = scenario_gpus(&with_xid);
    assert!(gpus[4].get("event").is_some(), "event injected on GPU 4");
    agent.rewrite_scenario(&with_xid);
    let labels = [("gpu", "4"), ("xid", "31")];
    wait_for("the XID counter", Duration::from_secs(5), || {
        agent
            .metrics()
            .value("gpu_steward_xid_errors_total", &labels)
    });
    // Several more polls later it is still exactly one.
    let polls = agent.metrics().get("gpu_steward_polls_total", &[]);
    let m = wait_for("five more polls", Duration::from_secs(5), || {
        let m = agent.metrics();
        (m.get("gpu_steward_polls_total", &[]) >= polls + 5.0).then_some(m)
    });
    assert_eq!(m.get("gpu_steward_xid_errors_total", &labels), 1.0);
    assert_eq!(m.get("DCGM_FI_DEV_XID_ERRORS", &[("gpu", "4")]), 31.0);
    assert_eq!(m.get("DCGM_FI_DEV_XID_ERRORS", &[("gpu", "3")]), 0.0);
    assert!(m.get("gpu_steward_xid_last_timestamp_seconds", &labels) > 1.7e9);
}

#[test]
fn gzip_and_plain_carry_the_same_exposition() {
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml")).start();
    let plain = agent.get("/metrics");
    assert_eq!(
        plain.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert_eq!(plain.header("content-encoding"), None);
    // The body goes out in parts; its length is still announced, exactly.
    let length = |r: &common::Response| r.header("content-length").map(str::to_string);
    assert_eq!(length(&plain), Some(plain.body.len().to_string()));
    let gz = agent.get_with("/metrics", "Accept-Encoding: gzip");
    assert_eq!(gz.status, 200);
    assert_eq!(gz.header("content-encoding"), Some("gzip"));
    assert_eq!(length(&gz), Some(gz.body.len().to_string()));
    assert!(gz.body.len() * 4 < plain.body.len(), "gzip is compressed");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz.body[..]), &mut text)
        .expect("valid single-member gzip");
    let a = Metrics::parse(&plain.text());
    let b = Metrics::parse(&text);
    let names = |m: &Metrics| {
        let mut v: Vec<String> = m.samples.iter().map(|s| s.name.clone()).collect();
        v.dedup();
        v
    };
    // The same page, gzipped: the same families in the same order (the two scrapes may read
    // two publications, whose values differ but whose families do not). Nothing is computed
    // per scrape: the snapshot's age is `time() - gpu_steward_snapshot_timestamp_seconds`.
    let (a, b) = (names(&a), names(&b));
    assert_eq!(a, b);
    assert!(!a.iter().any(|n| n == "gpu_steward_snapshot_age_seconds"));
    // q=0 refuses gzip.
    let refused = agent.get_with("/metrics", "Accept-Encoding: gzip;q=0");
    assert_eq!(refused.header("content-encoding"), None);
}

#[test]
fn the_native_family_passes_promtool_check_metrics() {
    let agent = Agent::with_scenario(&scenario("faults.toml"))
        .config("[metrics]\ndcgm = false\n")
        .start();
    // Wait until XIDs and errors are in, so that every family is exercised.
    let body = wait_for("a full page", Duration::from_secs(5), || {
        let m = agent.metrics();
        m.value(
            "gpu_steward_nvml_errors_total",
            &[("function", "nvmlDeviceGetMemoryInfo_v2")],
        )
        .map(|_| m.text)
    });
    assert!(!body.contains("DCGM_FI_"), "dcgm family switched off");
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool must be installed (Debian package 'prometheus'); .ci/run installs it");
    std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), body.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool runs");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.trim().is_empty(),
        "promtool: {report}"
    );
}

#[test]
fn every_exported_metric_is_documented_in_docs_metrics() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md"))
        .expect("docs/metrics.md");
    let mut missing = Vec::new();
    for name in ["dgx-h100.toml", "faults.toml", "a100-mig.toml"] {
        let agent = Agent::with_scenario(&scenario(name))
            .config("[metrics]\ndcgm_names = \"both\"\n")
            .start();
        let m = agent.metrics();
        for s in &m.samples {
            if !doc.contains(&format!("`{}`", s.name)) && !missing.contains(&s.name) {
                missing.push(s.name.clone());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "metrics missing from the tables of docs/metrics.md: {missing:?}"
    );
}

#[test]
fn the_repository_scenarios_mirror_the_shared_ones() {
    // CI checks out the repository with shared/ beside it; the tests use the repository's copy.
    let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/scenarios");
    if !shared.is_dir() {
        eprintln!("note: {} not present; nothing to compare", shared.display());
        return;
    }
    for name in ["dgx-h100.toml", "faults.toml", "a100-mig.toml"] {
        let theirs = std::fs::read_to_string(shared.join(name)).expect("shared scenario");
        assert_eq!(
            scenario(name),
            theirs,
            "tests/scenarios/{name} differs from shared/"
        );
    }
}

#[test]
fn the_demo_node_is_the_dgx_node_on_an_nvlink_board() {
    // The demo's node is dgx-h100.toml's GPUs, work and faults, each GPU with NVLink and a set-up
    // fabric added, and nothing else changed: the shared scenario's figures hold for it.
    let parse = |name: &str| -> toml::Value {
        toml::from_str(&scenario(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let (mut demo, dgx) = (parse("demo.toml"), parse("dgx-h100.toml"));
    let gpus = demo
        .get_mut("gpu")
        .and_then(toml::Value::as_array_mut)
        .expect("the demo's GPUs");
    assert_eq!(gpus.len(), 8);
    for (i, gpu) in gpus.iter_mut().enumerate() {
        let gpu = gpu.as_table_mut().expect("a GPU table");
        let nvlink = gpu.remove("nvlink");
        assert!(
            nvlink.as_ref().is_some_and(|l| l.get("down").is_none()),
            "GPU {i}: all links up"
        );
        let fabric = gpu.remove("fabric").expect("a fabric");
        assert_eq!(
            fabric.get("state").and_then(|v| v.as_str()),
            Some("completed")
        );
        assert_eq!(
            fabric.get("status").and_then(|v| v.as_str()),
            Some("SUCCESS")
        );
    }
    assert_eq!(demo, dgx, "demo.toml is dgx-h100.toml plus NVLink");
}

/// Series the budget counts: those with a `gpu` label and no `pid` label.
fn per_gpu_series(m: &Metrics) -> usize {
    m.samples
        .iter()
        .filter(|s| s.labels.contains_key("gpu") && !s.labels.contains_key("pid"))
        .count()
}

/// Series the fleet pays for on every scrape: every series without a `pid` label (per-process
/// series churn with the workload and are bounded by `[processes] max_per_gpu`).
fn all_in_series(m: &Metrics) -> usize {
    m.samples
        .iter()
        .filter(|s| !s.labels.contains_key("pid"))
        .count()
}

/// Node-level series on the lean page: the agent's own (build, NVML, polls, failing sources,
/// snapshot time, page size, reloads 2, audit 5 + 1) and accounting's write errors. The 28
/// per-source poll series are on the full page only.
const LEAN_NODE_SERIES: usize = 18;

/// `gpu-steward demo` with an empty config file: the default configuration, nothing else.
fn demo_default_page() -> (Metrics, serde_json::Value) {
    let agent = Agent::with_scenario("").demo().start();
    // GPM needs two samples, a profiling window (5 s by default, staggered across the GPUs by
    // up to one more window) apart: wait for the profiling fields.
    // Field 449 is a rate: it needs the second poll.
    let m = wait_for("GPM fields on every GPU", Duration::from_secs(20), || {
        let m = agent.metrics();
        (m.find("DCGM_FI_PROF_GR_ENGINE_ACTIVE", &[]).len() == 8
            && m.find("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", &[]).len() == 8)
            .then_some(m)
    });
    let health: serde_json::Value =
        serde_json::from_slice(&agent.get("/health").body).expect("health json");
    (m, health)
}

#[test]
fn the_default_page_keeps_the_series_budget_and_answers_what_fleets_ask() {
    let (m, health) = demo_default_page();
    // CONTRACT §4: at most 32.25 per GPU, and an NVLink GPU adds 13 (every GPU of the demo's
    // HGX board has NVLink). The NVLink, fabric and topology series are counted apart.
    let budgeted = || {
        m.samples
            .iter()
            .filter(|s| s.labels.contains_key("gpu") && !s.labels.contains_key("pid"))
    };
    let per_gpu = budgeted().filter(|s| !is_nvlink_series(&s.name)).count() as f64 / 8.0;
    let per_nvlink_gpu = budgeted().filter(|s| is_nvlink_series(&s.name)).count() as f64 / 8.0;
    eprintln!(
        "default page: {} series, {per_gpu} per GPU and {per_nvlink_gpu} for its NVLink",
        m.samples.len()
    );
    // gpu_steward_gpu_info on the lean page (issue 30) adds one per GPU: 30 per GPU plus the
    // accounting owner series (3 per GPU holding processes, 6 of 8 here) make 258 / 8 = 32.25
    // (the notes of issues 30 and 31: no per-GPU answer was taken off the page to get under 32).
    assert!(
        per_gpu <= 32.25,
        "{per_gpu} series per GPU on the default page"
    );
    assert!(
        per_nvlink_gpu <= 13.0,
        "{per_nvlink_gpu} NVLink series per GPU on the default page"
    );
    assert_eq!(per_gpu_series(&m) as f64 / 8.0, per_gpu + per_nvlink_gpu);
    // All in: the node-level series are the agent's own and few; the per-source detail is
    // folded into one count of failing sources (the full page keeps it).
    let node: Vec<&str> = m
        .samples
        .iter()
        .filter(|s| !s.labels.contains_key("gpu") && !s.labels.contains_key("pid"))
        .map(|s| s.name.as_str())
        .collect();
    assert!(
        node.len() <= LEAN_NODE_SERIES,
        "{} node series: {node:?}",
        node.len()
    );
    assert!(m.find("gpu_steward_poll_source_success", &[]).is_empty());
    assert_eq!(m.get("gpu_steward_poll_failing_sources", &[]), 0.0);
    assert!(m.value("gpu_steward_poll_duration_seconds", &[]).is_some());
    // The per-GPU figure (32.25) plus the node's 18 at most: 34.5 per GPU all in on 8 GPUs.
    // CONTRACT §4's 30 all in is not met: the 23 dcgm default fields and the 6 native series
    // (up, health, processes, idle) are 29 per GPU on their own, gpu_info 1 and accounting's
    // owners 2.25 more (issue 31's note).
    let all_in = all_in_series(&m) as f64 / 8.0;
    eprintln!("default page all in: {all_in} series per GPU");
    assert!(
        all_in <= 32.25 + 13.0 + LEAN_NODE_SERIES as f64 / 8.0,
        "{all_in} series per GPU all in"
    );
    // dcgm-exporter's default fields (4.8 names; the vGPU licence has no source on this node).
    for name in [
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        // health per GPU, processes per GPU, idle time
        "gpu_steward_gpu_up",
        "gpu_steward_gpu_health",
        "gpu_steward_gpu_processes",
        "gpu_steward_gpu_idle_seconds",
        // the identity join docs/metrics.md names (model, UUID, versions)
        "gpu_steward_gpu_info",
    ] {
        assert_eq!(m.find(name, &[]).len(), 8, "{name} on every GPU");
    }
    // Field 449 is DCGM's rate in its "MB/s" (KiB/s / 1000), as the demo's scenario moves data:
    // the training GPUs 0-3 at their tx + rx, the others 0.
    let demo: toml::Value = toml::from_str(&scenario("demo.toml")).expect("demo.toml");
    let gpus = demo
        .get("gpu")
        .and_then(toml::Value::as_array)
        .expect("GPUs");
    for (i, gpu) in gpus.iter().enumerate() {
        let kib_s = |k: &str| {
            gpu.get("nvlink")
                .and_then(|l| l.get(k))
                .and_then(toml::Value::as_integer)
                .expect("the scenario's NVLink traffic") as f64
        };
        let expected = (kib_s("tx_kib_s") + kib_s("rx_kib_s")) / 1000.0;
        let served = m.get(
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            &[("gpu", &i.to_string())],
        );
        assert!(
            (served - expected).abs() <= expected * 0.05,
            "GPU {i}: field 449 is {served}, the scenario moves {expected} MB/s"
        );
    }
    // Each value once: the native copies of dcgm fields are on the full page only, and XID
    // counters exist only for codes seen (none on this node).
    for name in [
        "gpu_steward_gpu_utilization_ratio",
        "gpu_steward_temperature_celsius",
        "gpu_steward_clock_hertz",
        "gpu_steward_clock_event_active",
        "gpu_steward_compute_mode",
        "gpu_steward_xid_errors_total",
        "gpu_steward_sm_active_ratio",
    ] {
        assert!(
            m.find(name, &[]).is_empty(),
            "{name} is not on the lean page"
        );
    }
    // Labels stay bounded.
    for s in &m.samples {
        assert!(
            s.labels.len() <= 15,
            "{} has {} labels",
            s.name,
            s.labels.len()
        );
    }
    // The page counts itself, and /health says so.
    let n = m.samples.len() as f64;
    assert_eq!(m.get("gpu_steward_page_series", &[]), n);
    let agent = &health["agent"];
    assert_eq!(agent["pageSeries"].as_f64(), Some(n), "{agent}");
    let bytes = agent["pageBytes"].as_f64().expect("pageBytes");
    assert!(
        (bytes - m.text.len() as f64).abs() < 0.1 * bytes,
        "pageBytes {bytes} vs a page of {}",
        m.text.len()
    );
}

#[test]
fn the_full_profile_serves_everything_and_costs_what_the_docs_say() {
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .config("[metrics]\nprofile = \"full\"\n")
        .start();
    let m = wait_for("GPM fields", Duration::from_secs(10), || {
        let m = agent.metrics();
        (m.find("gpu_steward_sm_active_ratio", &[]).len() == 8).then_some(m)
    });
    let per_gpu = per_gpu_series(&m) as f64 / 8.0;
    eprintln!("full page: {} series, {per_gpu} per GPU", m.samples.len());
    assert!(per_gpu > 100.0, "{per_gpu}");
    assert_eq!(
        m.find("gpu_steward_xid_errors_total", &[("gpu", "0")])
            .len(),
        19
    );
}

#[test]
fn a_mig_instance_costs_at_most_10_series_on_the_lean_page() {
    let text = "version = 1\n[driver]\nversion = \"580.95.05\"\ncuda_version = 13000\n\
        [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nmig_mode = true\n\
        mig_devices = [\"3g.40gb\", \"2g.20gb\", \"1g.10gb\", \"1g.10gb\"]\n\
        [[gpu.process]]\npid = 4242\nused_memory_mib = 1024\nmig_device = \"3g.40gb\"\n\
        [[gpu]]\nmodel = \"H100-SXM5-80GB\"\n";
    let agent = Agent::with_scenario(text)
        .config("[metrics]\nprofile = \"lean\"\n")
        .start();
    let m = wait_for("per-instance GPM series", Duration::from_secs(10), || {
        let m = agent.metrics();
        (m.find("DCGM_FI_PROF_GR_ENGINE_ACTIVE", &[("GPU_I_ID", "1")])
            .len()
            == 1)
            .then_some(m)
    });
    let instances = m.find("gpu_steward_mig_instance_info", &[]).len();
    assert_eq!(instances, 4);
    let per_instance = m
        .samples
        .iter()
        .filter(|s| {
            (s.labels.contains_key("GPU_I_ID") || s.labels.contains_key("gpu_instance"))
                && !s.labels.contains_key("pid")
        })
        .count() as f64
        / instances as f64;
    eprintln!("lean MIG page: {per_instance} series per MIG instance");
    assert!(
        per_instance <= 10.0,
        "{per_instance} series per MIG instance"
    );
    assert!(per_gpu_series(&m) as f64 / 2.0 <= 32.0 + 10.0 * 2.0);
    for name in [
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
    ] {
        assert_eq!(m.find(name, &[("GPU_I_ID", "1")]).len(), 1, "{name}");
    }
}

fn promtool_check_metrics(body: &str) {
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool must be installed (Debian package 'prometheus')");
    std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), body.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool runs");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // dcgm-exporter's names break promtool's naming lints (camelCase labels, counters without
    // _total), which it reports one per line and exits 1 for; what must not appear is a parse
    // error ("error while linting: text format parsing error", e.g. a second TYPE line).
    assert!(
        !report.contains("error while linting"),
        "promtool: {report}"
    );
}

#[test]
fn both_name_sets_carry_the_same_values_in_their_units_and_labels() {
    for profile in ["lean", "full"] {
        let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
            .config(&format!(
                "[metrics]\nprofile = \"{profile}\"\ndcgm_names = \"both\"\nhostname = \"node-7\"\n"
            ))
            .start();
        let m = wait_for("GPM fields", Duration::from_secs(10), || {
            let m = agent.metrics();
            (m.find("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", &[]).len() == 8).then_some(m)
        });
        let v = |name: &str, gpu: &str| {
            let s = m.find(name, &[("gpu", gpu)]);
            assert_eq!(s.len(), 1, "{profile}: {name} gpu {gpu}");
            s[0].value
        };
        for gpu in ["0", "5", "7"] {
            for (v48, v49, to49) in [
                ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO", 0.01),
                (
                    "DCGM_FI_DEV_MEM_COPY_UTIL",
                    "DCGM_FI_DEV_MEMORY_UTIL_RATIO",
                    0.01,
                ),
                ("DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_ENC_UTIL_RATIO", 0.01),
                ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_SM_CLOCK_HERTZ", 1e6),
                (
                    "DCGM_FI_DEV_MEM_CLOCK",
                    "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ",
                    1e6,
                ),
                (
                    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
                    1e-3,
                ),
                ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS", 1.0),
                (
                    "DCGM_FI_DEV_MEMORY_TEMP",
                    "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
                    1.0,
                ),
                (
                    "DCGM_FI_DEV_POWER_USAGE",
                    "DCGM_FI_DEV_BOARD_POWER_WATTS",
                    1.0,
                ),
                (
                    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                    "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
                    1.0,
                ),
                ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR", 1.0),
                (
                    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                    "DCGM_FI_DEV_ROW_REMAP_FAILED",
                    1.0,
                ),
                (
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                    "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
                    1.0,
                ),
                (
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                    "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
                    1.0,
                ),
                (
                    "DCGM_FI_PROF_DRAM_ACTIVE",
                    "DCGM_FI_PROF_DRAM_UTIL_RATIO",
                    1.0,
                ),
            ] {
                let (a, b) = (v(v48, gpu), v(v49, gpu));
                assert!(
                    close(a * to49, b),
                    "{profile} gpu {gpu}: {v48} {a} vs {v49} {b}"
                );
            }
            for (v48, v49) in [
                ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED_BYTES"),
                ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_FREE_BYTES"),
                ("DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_FB_RESERVED_BYTES"),
            ] {
                let (mib, bytes) = (v(v48, gpu), v(v49, gpu));
                assert_eq!(
                    mib,
                    (bytes / MIB).floor(),
                    "{profile} gpu {gpu}: {v48} vs {v49}"
                );
            }
            // A name both sets share is one family with both label sets.
            assert_eq!(
                m.find("DCGM_FI_PROF_PCIE_TX_BYTES", &[("gpu", gpu)]).len(),
                2
            );
        }
        // 4.9's labels on 4.9's names, 4.8's on 4.8's.
        let s49 = &m.find("DCGM_FI_DEV_GPU_UTIL_RATIO", &[("gpu", "0")])[0].labels;
        assert_eq!(s49.get("hostname").map(String::as_str), Some("node-7"));
        assert_eq!(
            s49.get("DCGM_FI_SYSTEM_DRIVER_VERSION").map(String::as_str),
            Some("580.95.05")
        );
        assert!(!s49.contains_key("Hostname") && !s49.contains_key("DCGM_FI_DRIVER_VERSION"));
        let s48 = &m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")])[0].labels;
        assert_eq!(s48.get("Hostname").map(String::as_str), Some("node-7"));
        assert_eq!(
            s48.get("DCGM_FI_DRIVER_VERSION").map(String::as_str),
            Some("580.95.05")
        );
        promtool_check_metrics(&m.text);
    }
    // "4.9" alone serves no 4.8 name.
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .config("[metrics]\nprofile = \"lean\"\ndcgm_names = \"4.9\"\n")
        .start();
    let m = agent.metrics();
    assert_eq!(m.find("DCGM_FI_DEV_GPU_UTIL_RATIO", &[]).len(), 8);
    assert!(
        per_gpu_series(&m) as f64 / 8.0 <= 32.25,
        "lean 4.9 keeps the default page's figure"
    );
    assert!(m.find("DCGM_FI_DEV_GPU_UTIL", &[]).is_empty());
    assert!(m.find("DCGM_FI_DEV_FB_TOTAL", &[]).is_empty());
}

#[test]
fn sighup_switches_name_sets_and_profiles_without_a_gap_in_the_series_that_stay() {
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .config("[metrics]\nprofile = \"lean\"\n")
        .start();
    let start = agent.metrics().get("gpu_steward_start_time_seconds", &[]);
    // Every page on the way must keep the series that stay.
    let switch = |config: &str, stays: &str, arrives: &str, leaves: &str| {
        agent.rewrite_config(config);
        agent.signal(nix::sys::signal::Signal::SIGHUP);
        wait_for(arrives, Duration::from_secs(10), || {
            let m = agent.metrics();
            assert_eq!(m.find(stays, &[]).len(), 8, "{stays} kept on every page");
            (m.find(arrives, &[]).len() == 8 && m.find(leaves, &[]).is_empty()).then_some(())
        });
    };
    switch(
        "[metrics]\nprofile = \"full\"\ndcgm_names = \"both\"\n",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_GPU_UTIL_RATIO",
        "gpu_steward_nonexistent",
    );
    assert_eq!(
        agent
            .metrics()
            .find("gpu_steward_temperature_celsius", &[])
            .len(),
        8
    );
    switch(
        "[metrics]\nprofile = \"lean\"\ndcgm_names = \"4.9\"\n",
        "DCGM_FI_DEV_GPU_UTIL_RATIO",
        "DCGM_FI_DEV_FB_USED_BYTES",
        "DCGM_FI_DEV_GPU_UTIL",
    );
    let m = agent.metrics();
    assert!(m.find("gpu_steward_temperature_celsius", &[]).is_empty());
    assert_eq!(
        m.get("gpu_steward_start_time_seconds", &[]),
        start,
        "not restarted"
    );
    assert_eq!(
        m.get("gpu_steward_config_reloads_total", &[("result", "success")]),
        2.0
    );
    // A bad value is refused with its position; the running configuration stays.
    agent.rewrite_config("[metrics]\nprofile = \"lean\"\ndcgm_names = \"5.0\"\n");
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for("the failed reload", Duration::from_secs(10), || {
        let m = agent.metrics();
        (m.value("gpu_steward_config_reloads_total", &[("result", "failure")]) == Some(1.0))
            .then_some(())
    });
    assert_eq!(
        agent
            .metrics()
            .find("DCGM_FI_DEV_GPU_UTIL_RATIO", &[])
            .len(),
        8
    );
    assert!(agent.log().contains(":3:14:"), "{}", agent.log());
}
