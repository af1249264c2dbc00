//! The per-model table: one [`Model`] value per supported GPU, as data (`table.rs`), with the MIG
//! GPU-instance profile tables in `mig.rs`. Values come from the real H100 and H200 captured on
//! driver 580.159.04 (`nvml-sim/tests/data/real-h100`, `…/real-h200`; provenance in
//! `nvml-sim/tests/data/README.md`) and, for the other models, captured `nvidia-smi -q` outputs and
//! nvml.h (summarised in `nvml-sim/README.md`); where neither says, the value chosen here is marked
//! `CHOSEN` and listed in the README. Exports read everything model-specific from here and never
//! branch on a model name.

mod mig;
mod table;

pub use mig::GiProfile;
pub use table::MODELS;

/// Clock frequencies in MHz, by `nvmlClockType_t` (graphics 0, SM 1, memory 2, video 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clocks {
    pub graphics: u32,
    pub sm: u32,
    pub mem: u32,
    pub video: u32,
}

/// Absolute temperature thresholds (°C) as `nvmlDeviceGetTemperatureThreshold` answers them;
/// `None` = NOT_SUPPORTED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub shutdown: Option<u32>,
    pub slowdown: Option<u32>,
    pub mem_max: Option<u32>,
    pub gpu_max: Option<u32>,
}

/// Firmware and board strings (`nvmlDeviceGetVbiosVersion`, `…GetInforomImageVersion`,
/// `…GetBoardPartNumber`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Board {
    pub vbios: &'static str,
    pub inforom_image: &'static str,
    pub part_number: &'static str,
}

/// Everything NVML-visible that depends only on the GPU model.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// The scenario's `model = "..."` spelling.
    pub key: &'static str,
    /// `nvmlDeviceGetName`.
    pub name: &'static str,
    /// `nvmlPciInfo_t::pciDeviceId` = (device << 16) | 0x10DE.
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    /// `nvmlDeviceArchitecture_t`: Turing 6, Ampere 7, Ada 8, Hopper 9.
    pub architecture: u32,
    pub cuda_cc: (i32, i32),
    /// `nvmlBrandType_t`: NVML_BRAND_NVIDIA = 14.
    pub brand: u32,
    pub board: Board,
    pub memory_total_mib: u64,
    /// FB memory the driver reserves (`nvmlMemory_v2_t::reserved`), in bytes, at the cited
    /// driver: not always a whole number of MiB (H200: 615.06 MiB).
    pub memory_reserved_bytes: u64,
    pub bar1_total_mib: u64,
    pub power_default_w: u32,
    pub power_min_w: u32,
    pub power_max_w: u32,
    pub idle_power_w: f64,
    /// `nvmlPstates_t` at idle (0 = P0, 8 = P8); any load runs in P0.
    pub idle_pstate: u32,
    pub max_clocks: Clocks,
    pub idle_clocks: Clocks,
    /// Default application clocks (graphics = SM, memory); video has none.
    pub app_clocks: (u32, u32),
    /// `nvmlDeviceGetSupportedMemoryClocks`, highest first.
    pub supported_mem_clocks: &'static [u32],
    pub thresholds: Thresholds,
    pub idle_temp_c: u32,
    /// `None`: the board exposes no memory temperature sensor.
    pub idle_mem_temp_c: Option<u32>,
    /// `nvmlDeviceGetNumFans` (every board here is passively cooled: 0).
    pub fans: u32,
    pub pcie_max_gen: u32,
    pub pcie_max_width: u32,
    /// NVLinks the board has (`nvmlDeviceGetNvLinkState` answers for links below this): 18 on
    /// H100/H200 SXM, 12 on A100 SXM, 0 on PCIe-only boards (`shared/reference/gpu-models.md`).
    pub nvlinks: u32,
    /// `nvmlDeviceGetSupportedClocksEventReasons` (= `…ThrottleReasons`).
    pub supported_clock_event_reasons: u64,
    /// `nvmlDeviceGetSupportedEventTypes`.
    pub supported_event_types: u64,
    /// Sampling period (µs) the encoder, decoder, JPEG and OFA utilisation calls report.
    pub engine_sampling_us: u32,
    /// `nvmlMemoryLocation_t` values `nvmlDeviceGetMemoryErrorCounter` answers; NOT_SUPPORTED
    /// at the others.
    pub ecc_locations: &'static [u32],
    /// `nvmlDeviceGetDisplayMode`.
    pub display_mode: u32,
    /// Row remapping (A100 and later) vs page retirement (T4).
    pub row_remapping: bool,
    pub page_retirement: bool,
    /// `nvmlRowRemapperHistogramValues_t::max` (banks); meaningless without row remapping.
    pub remap_bank_max: u32,
    /// MIG GPU-instance profiles by NVML profile index; empty = not MIG capable.
    pub mig_profiles: &'static [GiProfile],
}

impl Model {
    pub fn mig_capable(&self) -> bool {
        !self.mig_profiles.is_empty()
    }

    pub fn memory_total_bytes(&self) -> u64 {
        self.memory_total_mib * 1024 * 1024
    }

    /// The profile at NVML profile index `index` (`NVML_GPU_INSTANCE_PROFILE_1_SLICE` = 0 …).
    pub fn mig_profile_at(&self, index: u32) -> Option<&'static GiProfile> {
        self.mig_profiles.iter().find(|p| p.index == index)
    }

    /// The profile whose hardware id (`nvmlGpuInstanceProfileInfo_t::id`) is `id`.
    pub fn mig_profile_by_id(&self, id: u32) -> Option<&'static GiProfile> {
        self.mig_profiles.iter().find(|p| p.id == id)
    }

    /// The profile named `name` (`"3g.40gb"`, without NVML's `"MIG "` prefix).
    pub fn mig_profile_named(&self, name: &str) -> Option<&'static GiProfile> {
        self.mig_profiles.iter().find(|p| p.name == name)
    }
}

/// The model a scenario names, if it is one of [`MODELS`].
pub fn by_key(key: &str) -> Option<&'static Model> {
    MODELS.iter().find(|m| m.key == key)
}

pub const HOPPER: u32 = 9;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sane() {
        assert_eq!(MODELS.len(), 6);
        for m in MODELS {
            assert_eq!(m.pci_device_id & 0xFFFF, 0x10DE, "{}", m.key);
            assert_eq!(m.pci_subsystem_id & 0xFFFF, 0x10DE, "{}", m.key);
            assert!(
                m.memory_reserved_bytes < m.memory_total_bytes(),
                "{}",
                m.key
            );
            assert!(m.power_min_w <= m.power_default_w && m.power_default_w <= m.power_max_w);
            assert!(m.idle_power_w > 0.0 && m.idle_power_w < f64::from(m.power_min_w));
            assert!(m.idle_clocks.sm <= m.max_clocks.sm && m.idle_clocks.mem <= m.max_clocks.mem);
            assert_eq!(
                m.supported_mem_clocks.first(),
                Some(&m.max_clocks.mem),
                "{}",
                m.key
            );
            assert!(
                m.row_remapping != m.page_retirement,
                "{}: exactly one scheme",
                m.key
            );
            assert_eq!(m.fans, 0, "{}: none of the six boards has a fan", m.key);
            // MigConfigChange (0x100) only where MIG exists.
            assert_eq!(
                m.supported_event_types & 0x100 != 0,
                m.mig_capable(),
                "{}",
                m.key
            );
            assert_eq!(by_key(m.key), Some(m));
        }
        assert!(by_key("V100").is_none());
    }

    #[test]
    fn mig_tables_are_consistent() {
        for m in MODELS.iter().filter(|m| m.mig_capable()) {
            assert_eq!(m.mig_profiles.len(), 7, "{}", m.key);
            for p in m.mig_profiles {
                assert_eq!(m.mig_profile_at(p.index), Some(p));
                assert_eq!(m.mig_profile_by_id(p.id), Some(p));
                // One placement per instance, except `+me` (one instance, any 1-slice spot).
                let spots = if p.id == 20 { 7 } else { p.instances };
                assert_eq!(
                    p.placement_starts.len() as u32,
                    spots,
                    "{} {}",
                    m.key,
                    p.name
                );
                assert!(p.placement_starts.iter().all(|s| s + p.placement_size <= 8));
                assert!(p.memory_mb <= m.memory_total_mib, "{} {}", m.key, p.name);
                assert!(p.name.starts_with(&format!("{}g.", p.slices)), "{}", p.name);
            }
        }
    }
}
