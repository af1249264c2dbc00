//! NVLink and GPU fabric series, on GPUs that have NVLink (absent elsewhere: a VM that hides
//! the links, a PCIe board; never a made-up 0).
//!
//! Lean (always, native family): links present and active, data bytes each way, the four error
//! counters summed over the GPU's links, and on Hopper and newer the fabric state, health
//! summary and identity, and the GPU's NVLink peers: at most 12 series per GPU, plus the one
//! dcgm-compatible `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`. With `[metrics] nvlink_links = true` (the fuller
//! profile) also per link its state and error counters (up to 18 × 4 series per GPU) and the
//! raw fabric health mask.

use super::dcgm_sets::{Labelled, NameSet};
use super::{flag, Families, Family};
use crate::snapshot::{GpuSnapshot, GpuStatus, NvLinks, Snapshot};

/// dcgm-exporter's name of the NVLink data counter, by name set: 4.8 (`default-counters.csv`)
/// and 4.9 (`reference/dcgm-names.md`, field 449). The only place these names are spelled.
pub const DCGM_NVLINK_TOTAL: [&str; 2] = [
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL",
];
const DCGM_NVLINK_HELP: &str = "Total number of NVLink bandwidth counters for all lanes.";

/// The dcgm-compatible counter: KiB of data transmitted plus received over all links
/// (INFERRED: DCGM derives field 449 from NVML's NVLink throughput counters, which count KiB;
/// no capture of a bare-metal dcgm-exporter was at hand).
pub(super) fn render_dcgm(sets: &[(NameSet, Vec<Labelled>)], out: &mut Families) {
    for (set, gpus) in sets {
        let name = match set {
            NameSet::V48 => DCGM_NVLINK_TOTAL[0],
            NameSet::V49 => DCGM_NVLINK_TOTAL[1],
        };
        let mut f = Family::counter(name, DCGM_NVLINK_HELP);
        for (labels, g) in gpus {
            let total = g
                .reading
                .nvlink
                .as_ref()
                .and_then(|n| Some((n.tx_bytes? + n.rx_bytes?) / 1024));
            f.add_opt(labels, total.map(|v| v as f64));
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
