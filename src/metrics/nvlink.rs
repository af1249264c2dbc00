//! NVLink and GPU fabric series, on GPUs that have NVLink (absent elsewhere: a VM that hides
//! the links, a PCIe board; never a made-up 0).
//!
//! Lean (always, native family): links present and active, data bytes each way, the four error
//! counters summed over the GPU's links, and on Hopper and newer the fabric state, health
//! summary and identity, and the GPU's NVLink peers: at most 12 series per GPU, plus the one
//! dcgm-compatible throughput per name set (field 449 in 4.8, 1648 in 4.9: DCGM's rates, absent
//! until the second poll). With `[metrics] nvlink_links = true` (the fuller
//! profile) also per link its state and error counters (up to 18 × 4 series per GPU) and the
//! raw fabric health mask.

use super::dcgm::{Labelled, NameSet};
use super::{flag, Families, Family};
use crate::snapshot::{GpuSnapshot, GpuStatus, NvLinks, Snapshot, ThroughputWindow};

/// dcgm-exporter's NVLink throughput, by name set: 4.8 serves field 449
/// (`DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`, `default-counters.csv`), 4.9 field 1648
/// (`DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND`, `reference/dcgm-names.md`). The only place
/// these names are spelled.
pub const DCGM_NVLINK_TOTAL: [&str; 2] = [
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND",
];
const DCGM_NVLINK_HELP: [&str; 2] = [
    "NVLink bandwidth for all links (DCGM field 449: transmitted + received KiB between the last two polls, per second, / 1000, in DCGM's MB/s).",
    "NVLink throughput for all links (DCGM field 1648: transmitted + received bytes per second between the last two polls).",
];

/// Field 449 as DCGM computes it (NVIDIA/DCGM v4.6.0 `DcgmCacheManager.cpp`,
/// `ReadAndCacheNvLinkBandwidth`): the transmit + receive KiB counters summed, their difference
/// over the seconds between two reads, / 1000, truncated to an integer. DCGM publishes 0 on its
/// first read; here the series is absent until a second poll gives a window (never a made-up 0).
pub(super) fn dcgm_mb_per_second(w: &ThroughputWindow) -> Option<f64> {
    w.kib_per_second().map(|kib| (kib / 1000.0).trunc())
}

/// Field 1648: the same window in bytes per second (KiB/s × 1024, not the legacy ÷ 1000).
pub(super) fn dcgm_bytes_per_second(w: &ThroughputWindow) -> Option<f64> {
    w.kib_per_second().map(|kib| kib * 1024.0)
}

/// The dcgm-compatible throughput gauge of each chosen name set. dcgm-exporter's CSV declares
/// field 449 `counter`, but its value is DCGM's rate: served as what it is, a gauge.
pub(super) fn render_dcgm(sets: &[(NameSet, Vec<Labelled>)], out: &mut Families) {
    for (set, gpus) in sets {
        let (i, value): (usize, fn(&ThroughputWindow) -> Option<f64>) = match set {
            NameSet::V48 => (0, dcgm_mb_per_second),
            NameSet::V49 => (1, dcgm_bytes_per_second),
        };
        let mut f = Family::gauge(DCGM_NVLINK_TOTAL[i], DCGM_NVLINK_HELP[i]);
        for (labels, g) in gpus {
            let v = g.reading.nvlink.as_ref().and_then(|n| n.window.as_ref());
            f.add_opt(labels, v.and_then(value));
        }
        out.push(f);
    }
}

type Value = fn(&NvLinks) -> Option<f64>;

const ERRORS: &[(&str, Value)] = &[
    ("replay", |n| n.errors.replay.map(|v| v as f64)),
    ("recovery", |n| n.errors.recovery.map(|v| v as f64)),
    ("crc_flit", |n| n.errors.crc_flit.map(|v| v as f64)),
    ("crc_data", |n| n.errors.crc_data.map(|v| v as f64)),
];

/// The native series; `per_link` adds the fuller profile's per-link breakdown.
pub(super) fn render_native(snapshot: &Snapshot, per_link: bool, out: &mut Families) {
    let gpus: Vec<&GpuSnapshot> = snapshot
        .gpus
        .iter()
        .filter(|g| g.status == GpuStatus::Up)
        .collect();
    let labels = |g: &GpuSnapshot| [("gpu", g.index.to_string()), ("uuid", g.uuid().to_string())];
    let mut present = Family::gauge(
        "gpu_steward_nvlinks",
        "NVLinks the GPU has (links nvmlDeviceGetNvLinkState answers for).",
    );
    let mut active = Family::gauge(
        "gpu_steward_nvlinks_active",
        "NVLinks of the GPU that are active (nvmlDeviceGetNvLinkState).",
    );
    let mut bytes = Family::counter(
        "gpu_steward_nvlink_data_bytes_total",
        "Data bytes over all the GPU's NVLinks since the driver loaded, by direction (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX per link, KiB x 1024).",
    );
    let mut errors = Family::counter(
        "gpu_steward_nvlink_errors_total",
        "NVLink errors summed over the GPU's links, by type (NVML_FI_DEV_NVLINK_{REPLAY,RECOVERY,CRC_FLIT,CRC_DATA}_ERROR_COUNT_TOTAL).",
    );
    let mut link_active = Family::gauge(
        "gpu_steward_nvlink_link_active",
        "1 if the NVLink is active (nvmlDeviceGetNvLinkState); [metrics] nvlink_links only.",
    );
    let mut link_errors = Family::counter(
        "gpu_steward_nvlink_link_errors_total",
        "Data-link errors of one NVLink, by type (NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY/RECOVERY/CRC); [metrics] nvlink_links only.",
    );
    for g in &gpus {
        let Some(n) = &g.reading.nvlink else { continue };
        let [gpu, uuid] = labels(g);
        let l = [gpu.clone(), uuid.clone()];
        present.add(&l, n.active.len() as f64);
        active.add(&l, n.active_count() as f64);
        for (dir, v) in [("transmit", n.tx_bytes), ("receive", n.rx_bytes)] {
            bytes.add_opt(
                &[gpu.clone(), uuid.clone(), ("direction", dir.to_string())],
                v.map(|b| b as f64),
            );
        }
        for (kind, value) in ERRORS {
            errors.add_opt(
                &[gpu.clone(), uuid.clone(), ("type", kind.to_string())],
                value(n),
            );
        }
        if !per_link {
            continue;
        }
        for (i, a) in n.active.iter().enumerate() {
            let link = ("link", i.to_string());
            link_active.add(&[gpu.clone(), uuid.clone(), link.clone()], flag(*a));
            let Some(e) = n.per_link.get(i) else { continue };
            for (kind, v) in [
                ("replay", e.replay),
                ("recovery", e.recovery),
                ("crc", e.crc),
            ] {
                link_errors.add_opt(
                    &[
                        gpu.clone(),
                        uuid.clone(),
                        link.clone(),
                        ("type", kind.to_string()),
                    ],
                    v.map(|v| v as f64),
                );
            }
        }
    }
    for f in [present, active, bytes, errors, link_active, link_errors] {
        out.push(f);
    }
    render_fabric(&gpus, per_link, out);
}

fn render_fabric(gpus: &[&GpuSnapshot], per_link: bool, out: &mut Families) {
    let mut info = Family::gauge(
        "gpu_steward_fabric_info",
        "The GPU's fabric, value 1: clique id, cluster UUID and registration status (nvmlDeviceGetGpuFabricInfoV).",
    );
    let mut state = Family::gauge(
        "gpu_steward_fabric_state",
        "Fabric state: 1 not started, 2 in progress, 3 completed (nvmlGpuFabricState_t).",
    );
    let mut summary = Family::gauge(
        "gpu_steward_fabric_health_summary",
        "Fabric health summary: 1 healthy, 2 unhealthy, 3 limited capacity (nvmlGpuFabricInfo_v3_t.healthSummary).",
    );
    let mut mask = Family::gauge(
        "gpu_steward_fabric_health_mask",
        "The raw fabric health mask (nvmlGpuFabricInfo_v3_t.healthMask, NVML_GPU_FABRIC_HEALTH_MASK_*); [metrics] nvlink_links only.",
    );
    for g in gpus {
        let Some(f) = &g.reading.fabric else { continue };
        let (gpu, uuid) = (("gpu", g.index.to_string()), ("uuid", g.uuid().to_string()));
        info.add(
            &[
                gpu.clone(),
                uuid.clone(),
                ("clique_id", f.clique_id.to_string()),
                ("cluster_uuid", f.cluster_uuid.clone()),
                (
                    "status",
                    f.error.map_or("success".into(), |c| c.label()).into_owned(),
                ),
            ],
            1.0,
        );
        let l = [gpu, uuid];
        state.add(&l, f64::from(f.state.code()));
        summary.add_opt(&l, f.health_summary.map(f64::from));
        if per_link {
            mask.add_opt(&l, f.health_mask.map(f64::from));
        }
    }
    for f in [info, state, summary, mask] {
        out.push(f);
    }
}

/// `gpu_steward_gpu_topology_info`: for each GPU with NVLink peers, who they are, as a label a
/// scheduler extension can read (the full pairwise topology is `/api/v1/topology`). Absent on
/// GPUs without NVLink peers, so the node's per-GPU budget without NVLink is unchanged.
pub(super) fn render_topology(snapshot: &Snapshot, out: &mut Families) {
    let mut f = Family::gauge(
        "gpu_steward_gpu_topology_info",
        "GPUs this GPU reaches over NVLink (nvmlDeviceGetP2PStatus NVLINK), value 1; the full topology is /api/v1/topology.",
    );
    if let Some(t) = &snapshot.topology {
        for g in &t.gpus {
            let peers = t.nvlink_peers(g.index);
            if peers.is_empty() {
                continue;
            }
            let list: Vec<String> = peers.iter().map(u32::to_string).collect();
            f.add(
                &[
                    ("gpu", g.index.to_string()),
                    ("uuid", g.uuid.clone()),
                    ("nvlink_peers", list.join(",")),
                ],
                1.0,
            );
        }
    }
    out.push(f);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// GPU 0 of the HGX scenario: (tx_kib_s, rx_kib_s) as the file says.
    fn hgx_gpu0_kib_s() -> (u64, u64) {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scenarios/hgx-h100.toml");
        let text = std::fs::read_to_string(path).expect("the HGX scenario is in the repository");
        let doc: toml::Table = text.parse().expect("the HGX scenario is TOML");
        let nvlink = &doc["gpu"].as_array().expect("[[gpu]] entries")[0]["nvlink"];
        let kib = |k: &str| nvlink[k].as_integer().expect("an integer rate") as u64;
        (kib("tx_kib_s"), kib("rx_kib_s"))
    }

    fn window(seconds: u64, kib_before: u64) -> ThroughputWindow {
        let (tx, rx) = hgx_gpu0_kib_s();
        ThroughputWindow {
            kib_before,
            kib_now: kib_before + (tx + rx) * seconds,
            elapsed: Duration::from_secs(seconds),
        }
    }

    #[test]
    fn field_449_is_dcgm_s_rate_in_its_mb_per_second() {
        let (tx, rx) = hgx_gpu0_kib_s();
        // DCGM: (sum now - sum before) / seconds / 1000, whatever the counters' level.
        let expected = ((tx + rx) as f64 / 1000.0).trunc();
        assert_eq!(dcgm_mb_per_second(&window(3, 0)), Some(expected));
        assert_eq!(dcgm_mb_per_second(&window(3, 300_137_537)), Some(expected));
        // Truncated like DCGM's (long long) cast: 1999 KiB in 1 s is 1 "MB/s".
        let w = ThroughputWindow {
            kib_before: 0,
            kib_now: 1999,
            elapsed: Duration::from_secs(1),
        };
        assert_eq!(dcgm_mb_per_second(&w), Some(1.0));
    }

    #[test]
    fn field_1648_is_bytes_per_second() {
        let (tx, rx) = hgx_gpu0_kib_s();
        let expected = (tx + rx) as f64 * 1024.0;
        assert_eq!(dcgm_bytes_per_second(&window(2, 42)), Some(expected));
    }

    #[test]
    fn no_rate_without_a_window_a_time_or_when_the_counters_went_back() {
        let back = ThroughputWindow {
            kib_before: 10,
            kib_now: 5,
            elapsed: Duration::from_secs(1),
        };
        assert_eq!(dcgm_mb_per_second(&back), None);
        let no_time = ThroughputWindow {
            elapsed: Duration::ZERO,
            ..window(1, 0)
        };
        assert_eq!(dcgm_bytes_per_second(&no_time), None);
    }
}
