//! The dcgm-exporter compatible family: `DCGM_FI_*` names in dcgm-exporter's units (%, MiB, °C,
//! W, mJ, MHz) and its label set, in its order: `gpu`, `UUID`, `pci_bus_id`, `device`,
//! `modelName`, `Hostname`, `DCGM_FI_DRIVER_VERSION`.
//!
//! Only GPUs that answered this poll are rendered: dcgm-exporter drops a GPU it cannot read, and
//! a dashboard showing its last value as current would lie.
//!
//! Nor is a GPU whose name or bus id has not been read yet (NVML failed on them so far; they
//! are re-read every poll until they succeed). Its series would carry `modelName=""` or
//! `pci_bus_id=""` and then turn into other series once the value is known: two series for one
//! GPU, broken `rate()`s and sums across the change, and panels filtered on `modelName` that
//! miss it. Leaving the GPU out of this family until then is the honest gap; its native series
//! (labelled by `gpu` and `uuid` only) and `gpu_steward_nvml_errors_total` still report it.

use super::{flag, Families, Family, RenderConfig};
use crate::health::NodeHealth;
use crate::snapshot::{GpuReading, GpuSnapshot, GpuStatus, Snapshot};

type Value = fn(&GpuSnapshot) -> Option<f64>;

fn r(g: &GpuSnapshot) -> &GpuReading {
    &g.reading
}

fn mib(bytes: u64) -> f64 {
    (bytes / (1024 * 1024)) as f64
}

/// (name, help as dcgm-exporter's default-counters.csv words it, value).
const GAUGES: &[(&str, &str, Value)] = &[
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "SM clock frequency (in MHz).",
        |g| r(g).clocks_mhz.sm.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        "Memory clock frequency (in MHz).",
        |g| r(g).clocks_mhz.memory.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_VIDEO_CLOCK",
        "Video encoder/decoder clock frequency (in MHz).",
        |g| r(g).clocks_mhz.video.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "Memory temperature (in C).",
        |g| r(g).memory_temperature_c.map(f64::from),
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", |g| {
        r(g).temperature_c.map(f64::from)
    }),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", |g| {
        r(g).power_mw.map(|mw| f64::from(mw) / 1000.0)
    }),
    (
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "Power management limit (in W).",
        |g| r(g).power_limit_mw.map(|mw| f64::from(mw) / 1000.0),
    ),
    (
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "Effective power limit that the driver enforces (in W).",
        |g| {
            r(g).enforced_power_limit_mw
                .map(|mw| f64::from(mw) / 1000.0)
        },
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", |g| {
        r(g).gpu_util_percent.map(f64::from)
    }),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        |g| r(g).mem_util_percent.map(f64::from),
    ),
    ("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", |g| {
        r(g).enc_util_percent.map(f64::from)
    }),
    ("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", |g| {
        r(g).dec_util_percent.map(f64::from)
    }),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        |g| r(g).memory.map(|m| mib(m.free)),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        |g| r(g).memory.map(|m| mib(m.used)),
    ),
    (
        "DCGM_FI_DEV_FB_RESERVED",
        "Framebuffer memory reserved (in MiB).",
        |g| r(g).memory.map(|m| mib(m.reserved)),
    ),
    (
        "DCGM_FI_DEV_FB_TOTAL",
        "Framebuffer memory total (in MiB).",
        |g| r(g).memory.map(|m| mib(m.total)),
    ),
    ("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in 0-100%).", |g| {
        r(g).fan_percent.map(f64::from)
    }),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe link generation.", |g| {
        r(g).pcie_generation.map(f64::from)
    }),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe link width.", |g| {
        r(g).pcie_width.map(f64::from)
    }),
    (
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "Current clock event (throttle) reasons bitmask.",
        |g| r(g).clock_event_reasons.map(|b| b as f64),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed",
        |g| r(g).remapped_rows.map(|x| flag(x.failure)),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "Whether remapping of rows is pending",
        |g| r(g).remapped_rows.map(|x| flag(x.pending)),
    ),
    (
        "DCGM_FI_DEV_RETIRED_PENDING",
        "Whether pages are pending retirement.",
        |g| r(g).retired_pages.pending.map(flag),
    ),
];

const COUNTERS: &[(&str, &str, Value)] = &[
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        |g| r(g).energy_mj.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "Total number of PCIe retries.",
        |g| r(g).pcie_replay_count.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        |g| r(g).remapped_rows.map(|x| f64::from(x.correctable)),
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        |g| r(g).remapped_rows.map(|x| f64::from(x.uncorrectable)),
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        |g| r(g).ecc.corrected_volatile.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        |g| r(g).ecc.uncorrected_volatile.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Total number of single-bit persistent ECC errors.",
        |g| r(g).ecc.corrected_aggregate.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Total number of double-bit persistent ECC errors.",
        |g| r(g).ecc.uncorrected_aggregate.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_RETIRED_SBE",
        "Total number of retired pages due to single-bit errors.",
        |g| r(g).retired_pages.single_bit.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_RETIRED_DBE",
        "Total number of retired pages due to double-bit errors.",
        |g| r(g).retired_pages.double_bit.map(|v| v as f64),
    ),
];

pub(super) fn render(
    snapshot: &Snapshot,
    health: &NodeHealth,
    config: &RenderConfig,
    out: &mut Families,
) {
    let driver = snapshot
        .driver
        .as_ref()
        .map(|d| d.driver_version.as_str())
        .unwrap_or("");
    let gpus: Vec<(Vec<(&str, String)>, &GpuSnapshot)> = snapshot
        .gpus
        .iter()
        .filter(|g| g.status == GpuStatus::Up)
        .filter_map(|g| {
            let id = g.identity.as_ref().filter(|id| id.labels_known())?;
            let mut labels = vec![
                ("gpu", g.index.to_string()),
                ("UUID", id.uuid.clone()),
                ("pci_bus_id", id.pci_bus_id.clone()),
                // /dev/nvidiaN is named after the minor number.
                (
                    "device",
                    format!("nvidia{}", id.minor_number.unwrap_or(g.index)),
                ),
                ("modelName", id.name.clone()),
            ];
            if !config.hostname_label.is_empty() {
                labels.push((config.hostname_label.as_str(), config.hostname.clone()));
            }
            labels.push(("DCGM_FI_DRIVER_VERSION", driver.to_string()));
            // dcgm-exporter's --kubernetes attributes, for a GPU allocated to one container.
            if let (Some(k), [pod]) = (&snapshot.kubernetes, g.reading.pods.as_slice()) {
                labels.push((k.labels.container.as_str(), pod.container.clone()));
                labels.push((k.labels.namespace.as_str(), pod.namespace.clone()));
                labels.push((k.labels.pod.as_str(), pod.pod.clone()));
            }
            Some((labels, g))
        })
        .collect();
    for (table, counter) in [(GAUGES, false), (COUNTERS, true)] {
        for (name, help, value) in table {
            let mut f = Family::new(name, help, counter);
            for (labels, g) in &gpus {
                f.add_opt(labels, value(g));
                for (extra, v) in super::mig::dcgm_instance_series(name, g) {
                    let mut l = labels.clone();
                    l.extend(extra);
                    f.add(&l, v);
                }
            }
            out.push(f);
        }
    }
    super::dcgm_xid::render(&gpus, health, out);
    super::gpm::render_dcgm(&gpus, out);
    super::nvlink::render_dcgm(&gpus, out);
}
