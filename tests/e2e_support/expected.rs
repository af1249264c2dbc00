//! The scenarios of the value test and what every panel of the shipped dashboards must show for
//! them, derived from the scenario's numbers and NVIDIA's model facts (never from the agent):
//!
//! - the *truth node*: three H100 SXM5 80GB, GPU 0 busy, GPU 1 held but idle, GPU 2 lost; XIDs
//!   13 and 48 arrive on GPU 0 after start (a scenario rewrite);
//! - the *NVLink pair*: two H100 with NVLink at a known rate and one link down;
//! - the MIG node: `tests/scenarios/a100-mig.toml`, read here for its instances' memory.
//!
//! Must not list a panel without an expected value: a panel this file does not know fails the
//! test, so a new panel gets its expectation when it is added.

use std::collections::BTreeMap;

use super::truth::{by, by2, by_tol, one, one_tol, Expect};

/// NVIDIA H100 SXM5 80GB as nvidia-smi reports it (reference/real-h100: memory.total 81559 MiB,
/// memory.reserved 480 MiB), the model the simulator implements.
pub const H100_TOTAL_MIB: f64 = 81559.0;
const MIB: f64 = 1_048_576.0;

/// GPU 0 and GPU 1 of the truth node: (util %, mem util %, used MiB, °C, W, SM MHz, mem MHz,
/// PCIe tx KiB/s, PCIe rx KiB/s, processes).
pub const BUSY: (f64, f64, f64, f64, f64, f64, f64, f64, f64) = (
    87.0, 41.0, 40960.0, 62.0, 512.5, 1980.0, 2619.0, 1200.0, 800.0,
);
pub const IDLE: (f64, f64, f64, f64, f64, f64, f64, f64, f64) =
    (0.0, 0.0, 1024.0, 35.0, 70.0, 345.0, 2619.0, 0.0, 0.0);

fn gpu_toml(g: (f64, f64, f64, f64, f64, f64, f64, f64, f64), pid: u32) -> String {
    format!(
        "[[gpu]]\nmodel = \"H100-SXM5-80GB\"\ngpu_util_percent = {}\nmem_util_percent = {}\n\
         enc_util_percent = 0\ndec_util_percent = 0\nmemory_used_mib = {}\ntemperature_c = {}\n\
         power_w = {}\nsm_clock_mhz = {}\nmem_clock_mhz = {}\npcie_tx_kib_s = {}\n\
         pcie_rx_kib_s = {}\npcie_replay_count = 0\n\
         [[gpu.process]]\npid = {pid}\nused_memory_mib = {}\n",
        g.0, g.1, g.2, g.3, g.4, g.5, g.6, g.7, g.8, g.2
    )
}

/// The truth node's scenario; `xids`: the XIDs GPU 0 has reported so far.
pub fn truth_scenario(xids: &[u32]) -> String {
    let events: String = xids
        .iter()
        .enumerate()
        .map(|(i, x)| format!("[[gpu.event]]\nid = {}\nxid = {x}\n", i + 1))
        .collect();
    format!(
        "version = 1\n[driver]\nversion = \"580.95.05\"\ncuda_version = 13000\n{}{events}{}\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nlost = true\n",
        gpu_toml(BUSY, 4242),
        gpu_toml(IDLE, 4343)
    )
}

/// The XIDs that arrive on GPU 0 after start: one the panels must count from 1, one critical.
pub const LATE_XIDS: [u32; 2] = [13, 48];

/// NVLink pair: GPU 0 sends and receives at these KiB/s (summed over its links), GPU 1 is idle
/// with link 3 down.
pub const NVLINK_TX_KIB_S: f64 = 1_000_000.0;
pub const NVLINK_RX_KIB_S: f64 = 500_000.0;

pub fn nvlink_scenario() -> String {
    format!(
        "version = 1\n[driver]\nversion = \"580.95.05\"\ncuda_version = 13000\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nnvlink = {{ tx_kib_s = {}, rx_kib_s = {} }}\nfabric = {{}}\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nnvlink = {{ down = [3], tx_kib_s = 0, rx_kib_s = 0 }}\nfabric = {{}}\n",
        NVLINK_TX_KIB_S as u64, NVLINK_RX_KIB_S as u64
    )
}

/// Expectations by query origin (as `dashboards::queries` names them).
pub type Table = BTreeMap<String, Expect>;

fn panel(t: &mut Table, file: &str, title: &str, refid: &str, e: Expect) {
    t.insert(format!("{file} panel '{title}' ref {refid}"), e);
}

fn variable(t: &mut Table, file: &str, name: &str, e: Expect) {
    t.insert(format!("{file} variable '{name}'"), e);
}

/// Tolerance of values the simulator integrates or samples over wall time (energy, GPM): a
/// scrape carries the value of the last poll (up to one 500 ms poll old at each end of a 10 s
/// window), more on a loaded machine. A unit or a 0-for-1 error is far outside it.
const MOVING: f64 = 0.10;

/// The fleet and node dashboards on the truth node before the XIDs (`xids` false) and just
/// after the first scrape that saw them (`xids` true: only the XID panels differ).
pub fn truth_node(xids: bool, xid_ms: (f64, f64)) -> Table {
    let mut t = Table::new();
    let (b, i) = (BUSY, IDLE);
    let f = "gpu-steward-fleet.json";
    variable(&mut t, f, "instance", one(1.0));
    variable(
        &mut t,
        f,
        "gpu",
        by("gpu", &[("0", 1.0), ("1", 1.0), ("2", 0.0)]),
    );
    panel(&mut t, f, "Nodes", "A", one(1.0));
    panel(&mut t, f, "GPUs", "A", one(3.0));
    panel(&mut t, f, "GPUs lost", "A", one(1.0));
    panel(&mut t, f, "GPUs failing health", "A", one(1.0));
    panel(&mut t, f, "Fleet power", "A", one(b.4 + i.4));
    let avg_util = (b.0 + i.0) / 2.0 / 100.0;
    panel(&mut t, f, "Average utilization", "A", one(avg_util));
    // Busy (util > 0), idle (util 0, no process), held idle (process, util 0), lost.
    panel(&mut t, f, "GPUs by state", "A", one(1.0));
    panel(&mut t, f, "GPUs by state", "B", one(0.0));
    panel(&mut t, f, "GPUs by state", "C", one(1.0));
    panel(&mut t, f, "GPUs by state", "D", one(1.0));
    panel(
        &mut t,
        f,
        "Idle but held GPUs",
        "A",
        by("gpu", &[("1", 1.0)]),
    );
    panel(
        &mut t,
        f,
        "GPUs not passing health",
        "A",
        by("gpu", &[("2", 2.0)]),
    );
    let lost = by("condition", &[("gpu_lost", 1.0)]);
    panel(&mut t, f, "Active conditions across the fleet", "A", lost);
    let late = |v: f64| -> Expect {
        if !xids {
            return Expect::Empty;
        }
        let s: Vec<(&str, &str, f64)> = vec![("0", "13", v), ("0", "48", v)];
        by2("gpu", "xid", &s)
    };
    panel(
        &mut t,
        f,
        "XIDs since each agent started (top 20)",
        "A",
        late(1.0),
    );
    panel(
        &mut t,
        f,
        "Driver recovery actions and row remaps",
        "A",
        Expect::Empty,
    );
    panel(
        &mut t,
        f,
        "Driver recovery actions and row remaps",
        "B",
        Expect::Empty,
    );
    let temps = by("gpu", &[("0", b.3), ("1", i.3)]);
    panel(&mut t, f, "Hottest GPUs", "A", temps.clone());
    panel(
        &mut t,
        f,
        "Worst temperature per node",
        "A",
        one(b.3.max(i.3)),
    );
    panel(&mut t, f, "Power per node", "A", one(b.4 + i.4));
    panel(&mut t, f, "Utilization per node", "A", one(avg_util));
    panel(&mut t, f, "Agents", "A", one(1.0));
    panel(&mut t, f, "Agents", "B", Expect::Between(0.0, 5.0));
    panel(&mut t, f, "Agents", "C", one(1.0));

    let n = "gpu-steward-node.json";
    variable(&mut t, n, "instance", one(1.0));
    variable(
        &mut t,
        n,
        "gpu",
        by("gpu", &[("0", 1.0), ("1", 1.0), ("2", 0.0)]),
    );
    panel(
        &mut t,
        n,
        "GPU up",
        "A",
        by("gpu", &[("0", 1.0), ("1", 1.0), ("2", 0.0)]),
    );
    let verdicts = by("gpu", &[("0", 0.0), ("1", 0.0), ("2", 2.0)]);
    panel(&mut t, n, "Health verdict", "A", verdicts);
    let zero_up = by("gpu", &[("0", 0.0), ("1", 0.0)]);
    // Condition series exist while the condition is active (docs/metrics.md): none here.
    panel(&mut t, n, "Driver recovery action", "A", Expect::Empty);
    let active = by2("gpu", "condition", &[("2", "gpu_lost", 1.0)]);
    panel(&mut t, n, "Active health conditions", "A", active);
    let util = by("gpu", &[("0", b.0 / 100.0), ("1", i.0 / 100.0)]);
    panel(&mut t, n, "GPU utilization", "A", util);
    let mem_util = by("gpu", &[("0", b.1 / 100.0), ("1", i.1 / 100.0)]);
    panel(&mut t, n, "Memory controller utilization", "A", mem_util);
    let used = by("gpu", &[("0", b.2 * MIB), ("1", i.2 * MIB)]);
    panel(&mut t, n, "Memory used", "A", used);
    let total = H100_TOTAL_MIB * MIB;
    panel(
        &mut t,
        n,
        "Memory used",
        "B",
        by("gpu", &[("0", total), ("1", total)]),
    );
    panel(
        &mut t,
        n,
        "Processes",
        "A",
        by("gpu", &[("0", 1.0), ("1", 1.0)]),
    );
    panel(&mut t, n, "Temperature", "A", temps);
    panel(
        &mut t,
        n,
        "Power",
        "A",
        by("gpu", &[("0", b.4), ("1", i.4)]),
    );
    panel(
        &mut t,
        n,
        "Average power (over the rate interval)",
        "A",
        by("gpu", &[("0", b.4), ("1", i.4)]),
    );
    // $__range is 10 s here: (W × 10 s) in kWh.
    let kwh = one_tol((b.4 + i.4) * 10.0 / 3.6e6, MOVING);
    panel(&mut t, n, "Energy in the time range", "A", kwh);
    panel(&mut t, n, "Power now", "A", one(b.4 + i.4));
    let sm = by("gpu", &[("0", b.5 * 1e6), ("1", i.5 * 1e6)]);
    panel(&mut t, n, "Clocks", "A", sm);
    panel(
        &mut t,
        n,
        "Clocks",
        "B",
        by("gpu", &[("0", b.6 * 1e6), ("1", i.6 * 1e6)]),
    );
    panel(
        &mut t,
        n,
        "Active clock events (throttling)",
        "A",
        Expect::Empty,
    );
    panel(&mut t, n, "XIDs", "A", late(1.0));
    panel(&mut t, n, "XIDs in the time range", "A", late(1.0));
    let last = if xids {
        Expect::Between(xid_ms.0, xid_ms.1)
    } else {
        Expect::Empty
    };
    // One series per XID, both received between the rewrite and the first scrape that saw them.
    let last = match last {
        Expect::Between(lo, hi) if xids => Expect::Series {
            key: vec!["gpu", "xid"],
            series: vec![
                (vec!["0".into(), "13".into()], (lo + hi) / 2.0),
                (vec!["0".into(), "48".into()], (lo + hi) / 2.0),
            ],
            tol: (hi - lo) / (lo + hi),
        },
        other => other,
    };
    panel(&mut t, n, "XIDs in the time range", "B", last);
    panel(&mut t, n, "ECC errors (volatile)", "A", Expect::Empty);
    // Healthy boards at their maximum link (Gen5 x16), no correctable errors.
    panel(
        &mut t,
        n,
        "Degrading while it answers (ECC storm, PCIe link)",
        "A",
        Expect::Empty,
    );
    panel(&mut t, n, "Row remapping", "A", Expect::Empty);
    panel(&mut t, n, "Row remapping", "B", zero_up.clone());
    panel(&mut t, n, "PCIe replays", "A", zero_up);
    let tx = by_tol("gpu", &[("0", b.7 * 1024.0), ("1", i.7 * 1024.0)], MOVING);
    panel(&mut t, n, "PCIe throughput", "A", tx);
    let rx = by_tol("gpu", &[("0", b.8 * 1024.0), ("1", i.8 * 1024.0)], MOVING);
    panel(&mut t, n, "PCIe throughput", "B", rx);
    // The agent's own measurement: nothing in the scenario says what it is.
    panel(&mut t, n, "Poll duration", "A", Expect::Present);
    panel(&mut t, n, "Snapshot age", "A", Expect::Between(0.0, 5.0));
    panel(&mut t, n, "NVML up", "A", one(1.0));
    t
}

/// The NVLink dashboard on the NVLink pair.
pub fn nvlink_pair() -> Table {
    let mut t = Table::new();
    let f = "gpu-steward-nvlink.json";
    let (tx, rx) = (NVLINK_TX_KIB_S * 1024.0, NVLINK_RX_KIB_S * 1024.0);
    variable(
        &mut t,
        f,
        "instance",
        by("gpu", &[("0", 18.0), ("1", 18.0)]),
    );
    variable(&mut t, f, "gpu", by("gpu", &[("0", 18.0), ("1", 18.0)]));
    let each = |v0: f64, v1: f64, tol: f64| by_tol("gpu", &[("0", v0), ("1", v1)], tol);
    panel(
        &mut t,
        f,
        "NVLink throughput, transmit",
        "A",
        each(tx, 0.0, MOVING),
    );
    panel(
        &mut t,
        f,
        "NVLink throughput, receive",
        "A",
        each(rx, 0.0, MOVING),
    );
    panel(&mut t, f, "Links down", "A", each(0.0, 1.0, 0.0));
    panel(&mut t, f, "Active links", "A", each(18.0, 17.0, 0.0));
    panel(&mut t, f, "Active links", "B", one(18.0));
    let mut errors = Vec::new();
    for gpu in ["0", "1"] {
        for ty in ["replay", "recovery", "crc_flit", "crc_data"] {
            errors.push((gpu, ty, 0.0));
        }
    }
    panel(
        &mut t,
        f,
        "NVLink errors per minute",
        "A",
        by2("gpu", "type", &errors),
    );
    // Field 449 (KiB/s / 1000) × 1000 × 1024, or field 1648: both directions in bytes/s.
    let both = each(tx + rx, 0.0, MOVING);
    panel(
        &mut t,
        f,
        "NVLink throughput (dcgm-exporter name)",
        "A",
        both,
    );
    panel(&mut t, f, "Fabric state", "A", each(3.0, 3.0, 0.0));
    panel(&mut t, f, "Fabric health", "A", each(1.0, 1.0, 0.0));
    panel(&mut t, f, "Fabric identity", "A", each(1.0, 1.0, 0.0));
    t
}

/// "Framebuffer used per MIG instance" on the MIG node, from its scenario file: each instance's
/// used memory is the sum of the scenario processes placed in it (MiB).
pub fn mig_node(scenario: &str) -> Table {
    let doc: toml::Table = scenario.parse().expect("the MIG scenario is TOML");
    let mut series = Vec::new();
    for (gpu, g) in doc["gpu"].as_array().expect("[[gpu]]").iter().enumerate() {
        let Some(devices) = g.get("mig_devices").and_then(|d| d.as_array()) else {
            continue;
        };
        let procs = g.get("process").and_then(|p| p.as_array());
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for d in devices {
            let profile = d.as_str().expect("a profile name").to_string();
            // Processes name the profile; with two instances of one profile, the first gets them.
            let nth = seen.entry(profile.clone()).or_default();
            let used: f64 = if *nth == 0 {
                procs
                    .into_iter()
                    .flatten()
                    .filter(|p| p.get("mig_device").and_then(|m| m.as_str()) == Some(&profile))
                    .map(|p| p["used_memory_mib"].as_integer().unwrap_or(0) as f64)
                    .sum()
            } else {
                0.0
            };
            *nth += 1;
            series.push((vec![gpu.to_string(), profile], used));
        }
    }
    let mut t = Table::new();
    let o = "gpu-steward-operations.json";
    // The instances, by GPU and profile, and the process memory placed in each.
    let info: Vec<(Vec<String>, f64)> = series.iter().map(|(k, _)| (k.clone(), 1.0)).collect();
    let mut per_gpu: BTreeMap<String, f64> = BTreeMap::new();
    let mut per_profile: BTreeMap<(String, String), f64> = BTreeMap::new();
    for (k, _) in &series {
        *per_gpu.entry(k[0].clone()).or_default() += 1.0;
        *per_profile.entry((k[0].clone(), k[1].clone())).or_default() += 1.0;
    }
    let held: Vec<(Vec<String>, f64)> = series
        .iter()
        .filter(|(_, mib)| *mib > 0.0)
        .map(|(k, mib)| (vec![k[0].clone()], mib * MIB))
        .collect();
    let keyed = |key: Vec<&'static str>, series: Vec<(Vec<String>, f64)>| Expect::Series {
        key,
        series,
        tol: 0.0,
    };
    panel(
        &mut t,
        o,
        "MIG instances",
        "A",
        keyed(vec!["gpu", "profile"], info),
    );
    let counts = per_gpu.into_iter().map(|(g, n)| (vec![g], n)).collect();
    let title = "MIG: instances per GPU, and mode changes pending";
    panel(&mut t, o, title, "A", keyed(vec!["gpu"], counts));
    panel(&mut t, o, title, "B", one(0.0));
    let profiles = per_profile
        .into_iter()
        .map(|((g, p), n)| (vec![g, p], n))
        .collect();
    panel(
        &mut t,
        o,
        "Instances per profile",
        "A",
        keyed(vec!["gpu", "profile"], profiles),
    );
    panel(
        &mut t,
        o,
        "Process memory per MIG instance",
        "A",
        keyed(vec!["gpu"], held),
    );
    let fb = keyed(vec!["gpu", "GPU_I_PROFILE"], series);
    panel(&mut t, o, "Framebuffer used per MIG instance", "A", fb);
    t
}
