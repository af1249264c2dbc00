//! The dcgm-exporter compatible family, in one or both of dcgm-exporter's name sets
//! (`[metrics] dcgm_names`):
//!
//! - **4.8**: `DCGM_FI_*` names in dcgm-exporter's historical units (%, MiB, °C, W, mJ, MHz) and
//!   its label set, in its order: `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`
//!   (`[metrics] hostname_label`), `DCGM_FI_DRIVER_VERSION`;
//! - **4.9**: DCGM 4.7's naming standard as dcgm-exporter 4.9.0 serves it: base units in the
//!   name (`_RATIO` 0-1, `_BYTES`, `_HERTZ`, `_JOULES_TOTAL`, `_CELSIUS`, `_WATTS`), labels
//!   `hostname` and `DCGM_FI_SYSTEM_DRIVER_VERSION`.
//!
//! Both sets come from one table ([`FIELDS`]): one raw value per field and its [`Unit`], so the
//! two sets cannot disagree (a ratio is the percentage / 100, Hz are MHz × 10^6, J are mJ / 1000,
//! MiB are bytes / 2^20 rounded down as DCGM does). Which names come from which source is in
//! docs/metrics.md; the 4.9 names that no primary source here confirms are marked there.
//!
//! Only GPUs that answered this poll are rendered: dcgm-exporter drops a GPU it cannot read, and
//! a dashboard showing its last value as current would lie. Nor is a GPU whose name or bus id
//! has not been read yet: its series would carry `modelName=""` and then turn into other series
//! once the value is known. Its native series and `gpu_steward_nvml_errors_total` report it.

use super::{flag, Families, Family, RenderConfig};
use crate::config::DcgmNames;
use crate::health::NodeHealth;
use crate::snapshot::{GpuReading, GpuSnapshot, GpuStatus, Snapshot};

/// One of dcgm-exporter's two name sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NameSet {
    V48,
    V49,
}

impl NameSet {
    /// The sets `names` asks for, 4.8 first.
    pub(super) fn chosen(names: DcgmNames) -> impl Iterator<Item = NameSet> {
        [
            names.v48().then_some(NameSet::V48),
            names.v49().then_some(NameSet::V49),
        ]
        .into_iter()
        .flatten()
    }

    /// The name of the driver-version label.
    fn driver_label(self) -> &'static str {
        match self {
            NameSet::V48 => "DCGM_FI_DRIVER_VERSION",
            NameSet::V49 => "DCGM_FI_SYSTEM_DRIVER_VERSION",
        }
    }
}

/// The unit of a field's raw value, and so what each set serves.
#[derive(Debug, Clone, Copy)]
pub(super) enum Unit {
    /// The same number in both sets (°C, W, counts, 0/1, ratios already 0-1).
    Same,
    /// MHz in 4.8, Hz in 4.9.
    Mhz,
    /// mJ in 4.8, J in 4.9.
    Millijoules,
    /// % in 4.8, a 0-1 ratio in 4.9.
    Percent,
    /// Raw bytes: whole MiB in 4.8 (rounded down, as DCGM divides NVML's bytes), bytes in 4.9.
    Bytes,
}

impl Unit {
    pub(super) fn convert(self, set: NameSet, raw: f64) -> f64 {
        match (self, set) {
            (Unit::Bytes, NameSet::V48) => (raw / 1_048_576.0).floor(),
            (_, NameSet::V48) | (Unit::Same | Unit::Bytes, NameSet::V49) => raw,
            (Unit::Mhz, NameSet::V49) => raw * 1e6,
            (Unit::Millijoules, NameSet::V49) => raw / 1000.0,
            (Unit::Percent, NameSet::V49) => raw / 100.0,
        }
    }
}

type Value = fn(&GpuSnapshot) -> Option<f64>;

fn r(g: &GpuSnapshot) -> &GpuReading {
    &g.reading
}

/// A field of the family in both name sets.
pub(super) struct Field {
    pub v48: &'static str,
    pub v49: &'static str,
    /// Help as dcgm-exporter's CSV words it (4.8); the 4.9 help says the base unit instead.
    help48: &'static str,
    help49: &'static str,
    counter: bool,
    /// On the lean page in this set: dcgm-exporter's default fields.
    lean48: bool,
    lean49: bool,
    unit: Unit,
    value: Value,
}

impl Field {
    pub(super) fn name(&self, set: NameSet) -> &'static str {
        match set {
            NameSet::V48 => self.v48,
            NameSet::V49 => self.v49,
        }
    }

    fn help(&self, set: NameSet) -> &'static str {
        match set {
            NameSet::V48 => self.help48,
            NameSet::V49 => self.help49,
        }
    }

    pub(super) fn lean(&self, set: NameSet) -> bool {
        match set {
            NameSet::V48 => self.lean48,
            NameSet::V49 => self.lean49,
        }
    }
}

macro_rules! field {
    ($v48:literal, $v49:literal, $counter:literal, $lean48:literal, $lean49:literal, $unit:ident,
     $help48:literal, $help49:literal, $value:expr) => {
        Field {
            v48: $v48,
            v49: $v49,
            help48: $help48,
            help49: $help49,
            counter: $counter,
            lean48: $lean48,
            lean49: $lean49,
            unit: Unit::$unit,
            value: $value,
        }
    };
}

/// Every per-GPU field: (4.8 name, 4.9 name, counter, lean in 4.8, lean in 4.9, raw unit, helps,
/// raw value). Sources of the names: docs/metrics.md.
#[rustfmt::skip]
pub(super) const FIELDS: &[Field] = &[
    field!("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_SM_CLOCK_HERTZ", false, true, true, Mhz,
        "SM clock frequency (in MHz).", "SM clock frequency (in Hz).",
        |g| r(g).clocks_mhz.sm.map(f64::from)),
    field!("DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", false, true, true, Mhz,
        "Memory clock frequency (in MHz).", "Memory clock frequency (in Hz).",
        |g| r(g).clocks_mhz.memory.map(f64::from)),
    field!("DCGM_FI_DEV_VIDEO_CLOCK", "DCGM_FI_DEV_VIDEO_CLOCK_HERTZ", false, false, false, Mhz,
        "Video encoder/decoder clock frequency (in MHz).", "Video encoder/decoder clock frequency (in Hz).",
        |g| r(g).clocks_mhz.video.map(f64::from)),
    field!("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", false, true, true, Same,
        "Memory temperature (in C).", "Memory temperature (in C).",
        |g| r(g).memory_temperature_c.map(f64::from)),
    field!("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS", false, true, true, Same,
        "GPU temperature (in C).", "GPU temperature (in C).",
        |g| r(g).temperature_c.map(f64::from)),
    field!("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS", false, true, true, Same,
        "Power draw (in W).", "Power draw (in W).",
        |g| r(g).power_mw.map(|mw| f64::from(mw) / 1000.0)),
    field!("DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS", false, false, false, Same,
        "Power management limit (in W).", "Power management limit (in W).",
        |g| r(g).power_limit_mw.map(|mw| f64::from(mw) / 1000.0)),
    field!("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS", false, false, false, Same,
        "Effective power limit that the driver enforces (in W).", "Effective power limit that the driver enforces (in W).",
        |g| r(g).enforced_power_limit_mw.map(|mw| f64::from(mw) / 1000.0)),
    field!("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO", false, true, true, Percent,
        "GPU utilization (in %).", "GPU utilization (ratio 0-1).",
        |g| r(g).gpu_util_percent.map(f64::from)),
    field!("DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_MEMORY_UTIL_RATIO", false, true, true, Percent,
        "Memory utilization (in %).", "Memory utilization (ratio 0-1).",
        |g| r(g).mem_util_percent.map(f64::from)),
    field!("DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_ENC_UTIL_RATIO", false, true, true, Percent,
        "Encoder utilization (in %).", "Encoder utilization (ratio 0-1).",
        |g| r(g).enc_util_percent.map(f64::from)),
    field!("DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_DEC_UTIL_RATIO", false, true, true, Percent,
        "Decoder utilization (in %).", "Decoder utilization (ratio 0-1).",
        |g| r(g).dec_util_percent.map(f64::from)),
    field!("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_FREE_BYTES", false, true, true, Bytes,
        "Framebuffer memory free (in MiB).", "Framebuffer memory free (in bytes).",
        |g| r(g).memory.map(|m| m.free as f64)),
    field!("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED_BYTES", false, true, true, Bytes,
        "Framebuffer memory used (in MiB).", "Framebuffer memory used (in bytes).",
        |g| r(g).memory.map(|m| m.used as f64)),
    field!("DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_FB_RESERVED_BYTES", false, true, true, Bytes,
        "Framebuffer memory reserved (in MiB).", "Framebuffer memory reserved (in bytes).",
        |g| r(g).memory.map(|m| m.reserved as f64)),
    // 4.9 collects FB_CAPACITY_BYTES by default; it is used + free + reserved, and would take
    // the lean 4.9 page over 32 series per GPU: full page only, in both sets.
    field!("DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_CAPACITY_BYTES", false, false, false, Bytes,
        "Framebuffer memory total (in MiB).", "Total GPU memory (in bytes).",
        |g| r(g).memory.map(|m| m.total as f64)),
    field!("DCGM_FI_DEV_FAN_SPEED", "DCGM_FI_DEV_FAN_SPEED_RATIO", false, false, false, Percent,
        "Fan speed (in 0-100%).", "Fan speed (ratio 0-1).",
        |g| r(g).fan_percent.map(f64::from)),
    field!("DCGM_FI_DEV_PCIE_LINK_GEN", "DCGM_FI_DEV_PCIE_LINK_GEN", false, false, false, Same,
        "PCIe link generation.", "PCIe link generation.",
        |g| r(g).pcie_generation.map(f64::from)),
    field!("DCGM_FI_DEV_PCIE_LINK_WIDTH", "DCGM_FI_DEV_PCIE_LINK_WIDTH", false, false, false, Same,
        "PCIe link width.", "PCIe link width.",
        |g| r(g).pcie_width.map(f64::from)),
    field!("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", false, false, false, Same,
        "Current clock event (throttle) reasons bitmask.", "Current clock event (throttle) reasons bitmask.",
        |g| r(g).clock_event_reasons.map(|b| b as f64)),
    field!("DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED", false, true, true, Same,
        "Whether remapping of rows has failed", "Whether remapping of rows has failed",
        |g| r(g).remapped_rows.map(|x| flag(x.failure))),
    field!("DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ROW_REMAP_PENDING", false, false, false, Same,
        "Whether remapping of rows is pending", "Whether remapping of rows is pending",
        |g| r(g).remapped_rows.map(|x| flag(x.pending))),
    field!("DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_PAGE_RETIRED_PENDING", false, false, false, Same,
        "Whether pages are pending retirement.", "Whether pages are pending retirement.",
        |g| r(g).retired_pages.pending.map(flag)),
    field!("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", true, true, true, Millijoules,
        "Total energy consumption since boot (in mJ).", "Total energy consumption since boot (in J).",
        |g| r(g).energy_mj.map(|v| v as f64)),
    field!("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", true, true, true, Same,
        "Total number of PCIe retries.", "Total number of PCIe retries.",
        |g| r(g).pcie_replay_count.map(f64::from)),
    field!("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", true, true, true, Same,
        "Number of remapped rows for correctable errors", "Number of remapped rows for correctable errors",
        |g| r(g).remapped_rows.map(|x| f64::from(x.correctable))),
    field!("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", true, true, true, Same,
        "Number of remapped rows for uncorrectable errors", "Number of remapped rows for uncorrectable errors",
        |g| r(g).remapped_rows.map(|x| f64::from(x.uncorrectable))),
    field!("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", true, false, false, Same,
        "Total number of single-bit volatile ECC errors.", "Total number of single-bit volatile ECC errors.",
        |g| r(g).ecc.corrected_volatile.map(|v| v as f64)),
    field!("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", true, false, false, Same,
        "Total number of double-bit volatile ECC errors.", "Total number of double-bit volatile ECC errors.",
        |g| r(g).ecc.uncorrected_volatile.map(|v| v as f64)),
    field!("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", true, false, false, Same,
        "Total number of single-bit persistent ECC errors.", "Total number of single-bit persistent ECC errors.",
        |g| r(g).ecc.corrected_aggregate.map(|v| v as f64)),
    field!("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", true, false, false, Same,
        "Total number of double-bit persistent ECC errors.", "Total number of double-bit persistent ECC errors.",
        |g| r(g).ecc.uncorrected_aggregate.map(|v| v as f64)),
    field!("DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL", true, false, false, Same,
        "Total number of retired pages due to single-bit errors.", "Total number of retired pages due to single-bit errors.",
        |g| r(g).retired_pages.single_bit.map(|v| v as f64)),
    field!("DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL", true, false, false, Same,
        "Total number of retired pages due to double-bit errors.", "Total number of retired pages due to double-bit errors.",
        |g| r(g).retired_pages.double_bit.map(|v| v as f64)),
];

/// A GPU this family renders, with the labels of one name set in dcgm-exporter's order.
pub(super) type Labelled<'a> = (Vec<(&'a str, String)>, &'a GpuSnapshot);

fn labelled<'a>(
    snapshot: &'a Snapshot,
    config: &'a RenderConfig,
    set: NameSet,
) -> Vec<Labelled<'a>> {
    let driver = snapshot
        .driver
        .as_ref()
        .map(|d| d.driver_version.as_str())
        .unwrap_or("");
    // 4.9 renamed `Hostname` to `hostname` (4.8.3 already had); `""` leaves it out in both.
    let host_label = match set {
        _ if config.hostname_label.is_empty() => None,
        NameSet::V48 => Some(config.hostname_label.as_str()),
        NameSet::V49 => Some("hostname"),
    };
    snapshot
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
            if let Some(name) = host_label {
                labels.push((name, config.hostname.clone()));
            }
            labels.push((set.driver_label(), driver.to_string()));
            // dcgm-exporter's --kubernetes attributes, for a GPU allocated to one container.
            if let (Some(k), [pod]) = (&snapshot.kubernetes, g.reading.pods.as_slice()) {
                labels.push((k.labels.container.as_str(), pod.container.clone()));
                labels.push((k.labels.namespace.as_str(), pod.namespace.clone()));
                labels.push((k.labels.pod.as_str(), pod.pod.clone()));
            }
            Some((labels, g))
        })
        .collect()
}

pub(super) fn render(
    snapshot: &Snapshot,
    health: &NodeHealth,
    config: &RenderConfig,
    out: &mut Families,
) {
    let full = config.profile.is_full();
    let sets: Vec<(NameSet, Vec<Labelled>)> = NameSet::chosen(config.names)
        .map(|set| (set, labelled(snapshot, config, set)))
        .collect();
    for field in FIELDS {
        // With "both", a field that kept its name is one family with both label sets.
        let mut families = ByName::default();
        for (set, gpus) in &sets {
            if !(full || field.lean(*set)) {
                continue;
            }
            let f = families.get(field.name(*set), field.help(*set), field.counter);
            for (labels, g) in gpus {
                f.add_opt(
                    labels,
                    (field.value)(g).map(|v| field.unit.convert(*set, v)),
                );
                for (extra, bytes) in super::mig::dcgm_instance_series(field.v48, g) {
                    let mut l = labels.clone();
                    l.extend(extra);
                    f.add(&l, field.unit.convert(*set, bytes));
                }
            }
        }
        families.push_into(out);
    }
    super::dcgm_xid::render(&sets, health, out);
    super::gpm::render_dcgm(&sets, full, out);
    super::nvlink::render_dcgm(&sets, out);
}

/// The families of one field across the chosen name sets: one per distinct name, so that a name
/// both sets share gets one `# TYPE` line (a second one would make Prometheus reject the page).
#[derive(Default)]
pub(super) struct ByName(Vec<Family>);

impl ByName {
    pub(super) fn get(
        &mut self,
        name: &'static str,
        help: &'static str,
        counter: bool,
    ) -> &mut Family {
        let i = match self.0.iter().position(|f| f.name() == name) {
            Some(i) => i,
            None => {
                self.0.push(Family::new(name, help, counter));
                self.0.len() - 1
            }
        };
        &mut self.0[i]
    }

    pub(super) fn push_into(self, out: &mut Families) {
        for f in self.0 {
            out.push(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sets_convert_one_raw_value() {
        let c = |u: Unit, s, v| u.convert(s, v);
        assert_eq!(c(Unit::Mhz, NameSet::V48, 1980.0), 1980.0);
        assert_eq!(c(Unit::Mhz, NameSet::V49, 1980.0), 1.98e9);
        assert_eq!(c(Unit::Millijoules, NameSet::V49, 1500.0), 1.5);
        assert_eq!(c(Unit::Percent, NameSet::V49, 97.0), 0.97);
        assert_eq!(c(Unit::Percent, NameSet::V48, 97.0), 97.0);
        assert_eq!(c(Unit::Bytes, NameSet::V48, 3.5 * 1_048_576.0), 3.0);
        assert_eq!(c(Unit::Bytes, NameSet::V49, 3.5 * 1_048_576.0), 3_670_016.0);
        assert_eq!(c(Unit::Same, NameSet::V49, 64.0), 64.0);
    }

    #[test]
    fn names_are_unique_within_each_set() {
        for set in [NameSet::V48, NameSet::V49] {
            let mut names: Vec<&str> = FIELDS.iter().map(|f| f.name(set)).collect();
            names.sort_unstable();
            let n = names.len();
            names.dedup();
            assert_eq!(n, names.len(), "{set:?}");
        }
    }
}
