//! The per-model table: one [`Model`] value per supported GPU, as data. Values come from
//! `/work/shared/reference/gpu-models.md` (captured `nvidia-smi -q` outputs, nvml.h); where that
//! file says "unknown", the value chosen here is marked `CHOSEN` and listed in the README.
//! Exports read everything model-specific from here, never branch on a model name.

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
    pub memory_total_mib: u64,
    /// FB memory the driver reserves (`nvmlMemory_v2_t::reserved`), at the cited driver.
    pub memory_reserved_mib: u64,
    pub bar1_total_mib: u64,
    pub power_default_w: u32,
    pub power_min_w: u32,
    pub power_max_w: u32,
    pub idle_power_w: f64,
    pub max_clocks: Clocks,
    pub idle_clocks: Clocks,
    /// Default application clocks (graphics, memory).
    pub app_clocks: (u32, u32),
    pub thresholds: Thresholds,
    pub idle_temp_c: u32,
    /// `None`: the board exposes no memory temperature sensor.
    pub idle_mem_temp_c: Option<u32>,
    pub has_fan: bool,
    pub pcie_max_gen: u32,
    pub pcie_max_width: u32,
    /// Row remapping (A100 and later) vs page retirement (T4).
    pub row_remapping: bool,
    pub page_retirement: bool,
    /// MIG GPU-instance profile names (nvml-mig-timeslicing.md §4.2); empty = not MIG capable.
    pub mig_profiles: &'static [&'static str],
}

impl Model {
    pub fn mig_capable(&self) -> bool {
        !self.mig_profiles.is_empty()
    }
}

const AMPERE: u32 = 7;
pub const HOPPER: u32 = 9;
const ADA: u32 = 8;
const TURING: u32 = 6;
const BRAND_NVIDIA: u32 = 14;

/// The six supported models.
pub static MODELS: &[Model] = &[
    Model {
        key: "A100-SXM4-40GB",
        name: "NVIDIA A100-SXM4-40GB",
        pci_device_id: 0x20B0_10DE,
        pci_subsystem_id: 0x134F_10DE,
        architecture: AMPERE,
        cuda_cc: (8, 0),
        brand: BRAND_NVIDIA,
        memory_total_mib: 40960,
        memory_reserved_mib: 620,
        bar1_total_mib: 65536,
        power_default_w: 400,
        power_min_w: 100,
        power_max_w: 400,
        idle_power_w: 52.5,
        max_clocks: Clocks {
            graphics: 1410,
            sm: 1410,
            mem: 1215,
            video: 1290,
        },
        idle_clocks: Clocks {
            graphics: 210,
            sm: 210,
            mem: 1215,
            video: 585,
        },
        app_clocks: (1095, 1215),
        thresholds: Thresholds {
            shutdown: Some(92),
            slowdown: Some(89),
            mem_max: Some(95),
            gpu_max: Some(85),
        },
        idle_temp_c: 22,
        idle_mem_temp_c: Some(30),
        has_fan: false,
        pcie_max_gen: 4,
        pcie_max_width: 16,
        row_remapping: true,
        page_retirement: false,
        mig_profiles: &[
            "1g.5gb",
            "1g.5gb+me",
            "1g.10gb",
            "2g.10gb",
            "3g.20gb",
            "4g.20gb",
            "7g.40gb",
        ],
    },
    Model {
        key: "A100-SXM4-80GB",
        name: "NVIDIA A100-SXM4-80GB",
        pci_device_id: 0x20B2_10DE,
        // The 500 W board (692-2G506-0212); the 400 W board is 0x146310DE.
        pci_subsystem_id: 0x147F_10DE,
        architecture: AMPERE,
        cuda_cc: (8, 0),
        brand: BRAND_NVIDIA,
        memory_total_mib: 81920,
        memory_reserved_mib: 763,
        bar1_total_mib: 131072,
        power_default_w: 500,
        power_min_w: 100,
        power_max_w: 500,
        idle_power_w: 60.0,
        max_clocks: Clocks {
            graphics: 1410,
            sm: 1410,
            mem: 1593,
            video: 1290,
        },
        idle_clocks: Clocks {
            graphics: 210,
            sm: 210,
            mem: 1593,
            video: 585,
        },
        app_clocks: (1140, 1593),
        thresholds: Thresholds {
            shutdown: Some(92),
            slowdown: Some(89),
            mem_max: Some(95),
            gpu_max: Some(85),
        },
        idle_temp_c: 26,
        idle_mem_temp_c: Some(44),
        has_fan: false,
        pcie_max_gen: 4,
        pcie_max_width: 16,
        row_remapping: true,
        page_retirement: false,
        mig_profiles: &[
            "1g.10gb",
            "1g.10gb+me",
            "1g.20gb",
            "2g.20gb",
            "3g.40gb",
            "4g.40gb",
            "7g.80gb",
        ],
    },
    Model {
        key: "H100-SXM5-80GB",
        name: "NVIDIA H100 80GB HBM3",
        pci_device_id: 0x2330_10DE,
        pci_subsystem_id: 0x16C1_10DE,
        architecture: HOPPER,
        cuda_cc: (9, 0),
        brand: BRAND_NVIDIA,
        memory_total_mib: 81559,
        memory_reserved_mib: 479,
        bar1_total_mib: 131072,
        power_default_w: 700,
        power_min_w: 200,
        power_max_w: 700,
        idle_power_w: 69.9,
        max_clocks: Clocks {
            graphics: 1980,
            sm: 1980,
            mem: 2619,
            video: 1545,
        },
        idle_clocks: Clocks {
            graphics: 345,
            sm: 345,
            mem: 2619,
            video: 765,
        },
        app_clocks: (1980, 2619),
        // CHOSEN: absolute thresholds unknown for H100; the H800 (same SXM5 board family,
        // 525.105.17) values are used as a proxy.
        thresholds: Thresholds {
            shutdown: Some(92),
            slowdown: Some(89),
            mem_max: Some(95),
            gpu_max: Some(87),
        },
        idle_temp_c: 33,
        idle_mem_temp_c: Some(40),
        has_fan: false,
        pcie_max_gen: 5,
        pcie_max_width: 16,
        row_remapping: true,
        page_retirement: false,
        mig_profiles: &[
            "1g.10gb",
            "1g.10gb+me",
            "1g.20gb",
            "2g.20gb",
            "3g.40gb",
            "4g.40gb",
            "7g.80gb",
        ],
    },
    Model {
        key: "H200-SXM-141GB",
        name: "NVIDIA H200",
        pci_device_id: 0x2335_10DE,
        pci_subsystem_id: 0x18BE_10DE,
        architecture: HOPPER,
        cuda_cc: (9, 0),
        brand: BRAND_NVIDIA,
        memory_total_mib: 143771,
        memory_reserved_mib: 614,
        bar1_total_mib: 262144,
        power_default_w: 700,
        power_min_w: 200,
        power_max_w: 700,
        idle_power_w: 76.0,
        max_clocks: Clocks {
            graphics: 1980,
            sm: 1980,
            mem: 3201,
            video: 1545,
        },
        idle_clocks: Clocks {
            graphics: 345,
            sm: 345,
            mem: 3201,
            video: 765,
        },
        // CHOSEN: H200 default application clocks not captured; max clocks used.
        app_clocks: (1980, 3201),
        // CHOSEN: absolute thresholds unknown; same Hopper proxy as H100 (H800 @ 525).
        thresholds: Thresholds {
            shutdown: Some(92),
            slowdown: Some(89),
            mem_max: Some(95),
            gpu_max: Some(87),
        },
        idle_temp_c: 28,
        idle_mem_temp_c: Some(30),
        has_fan: false,
        pcie_max_gen: 5,
        pcie_max_width: 16,
        row_remapping: true,
        page_retirement: false,
        mig_profiles: &[
            "1g.18gb",
            "1g.18gb+me",
            "1g.35gb",
            "2g.35gb",
            "3g.71gb",
            "4g.71gb",
            "7g.141gb",
        ],
    },
    Model {
        key: "L4",
        name: "NVIDIA L4",
        pci_device_id: 0x27B8_10DE,
        pci_subsystem_id: 0x16CA_10DE,
        architecture: ADA,
        cuda_cc: (8, 9),
        brand: BRAND_NVIDIA,
        memory_total_mib: 23034,
        memory_reserved_mib: 556,
        bar1_total_mib: 32768,
        power_default_w: 72,
        power_min_w: 40,
        power_max_w: 72,
        idle_power_w: 16.5,
        max_clocks: Clocks {
            graphics: 2040,
            sm: 2040,
            mem: 6251,
            video: 1770,
        },
        idle_clocks: Clocks {
            graphics: 210,
            sm: 210,
            mem: 405,
            video: 765,
        },
        app_clocks: (2040, 6251),
        // CHOSEN: absolute thresholds unknown; derived from the T.Limit form (-5/-2/0) and
        // margin + temperature ≈ 86 °C. No memory sensor: MEM_MAX is NOT_SUPPORTED.
        thresholds: Thresholds {
            shutdown: Some(91),
            slowdown: Some(88),
            mem_max: None,
            gpu_max: Some(86),
        },
        idle_temp_c: 33,
        idle_mem_temp_c: None,
        has_fan: false,
        pcie_max_gen: 4,
        pcie_max_width: 16,
        row_remapping: true,
        page_retirement: false,
        mig_profiles: &[],
    },
    Model {
        key: "T4",
        name: "Tesla T4",
        pci_device_id: 0x1EB8_10DE,
        pci_subsystem_id: 0x12A2_10DE,
        architecture: TURING,
        cuda_cc: (7, 5),
        brand: BRAND_NVIDIA,
        memory_total_mib: 15360,
        memory_reserved_mib: 388,
        bar1_total_mib: 256,
        power_default_w: 70,
        power_min_w: 60,
        power_max_w: 70,
        // CHOSEN: P8 idle draw not pinned to a capture (unpinned captures show 9-14 W).
        idle_power_w: 12.0,
        max_clocks: Clocks {
            graphics: 1590,
            sm: 1590,
            mem: 5001,
            video: 1470,
        },
        // CHOSEN: P8 idle clocks not pinned: lowest supported graphics clock 300 MHz, the low
        // memory clock 405 MHz, video 540 MHz.
        idle_clocks: Clocks {
            graphics: 300,
            sm: 300,
            mem: 405,
            video: 540,
        },
        app_clocks: (585, 5001),
        thresholds: Thresholds {
            shutdown: Some(96),
            slowdown: Some(93),
            mem_max: None,
            gpu_max: Some(85),
        },
        // CHOSEN: idle temperature not pinned to a capture.
        idle_temp_c: 30,
        idle_mem_temp_c: None,
        has_fan: false,
        pcie_max_gen: 3,
        pcie_max_width: 16,
        row_remapping: false,
        page_retirement: true,
        mig_profiles: &[],
    },
];

/// The model a scenario names, if it is one of [`MODELS`].
pub fn by_key(key: &str) -> Option<&'static Model> {
    MODELS.iter().find(|m| m.key == key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sane() {
        assert_eq!(MODELS.len(), 6);
        for m in MODELS {
            assert_eq!(m.pci_device_id & 0xFFFF, 0x10DE, "{}", m.key);
            assert_eq!(m.pci_subsystem_id & 0xFFFF, 0x10DE, "{}", m.key);
            assert!(m.memory_reserved_mib < m.memory_total_mib, "{}", m.key);
            assert!(m.power_min_w <= m.power_default_w && m.power_default_w <= m.power_max_w);
            assert!(m.idle_power_w > 0.0 && m.idle_power_w < f64::from(m.power_min_w));
            assert!(m.idle_clocks.sm <= m.max_clocks.sm && m.idle_clocks.mem <= m.max_clocks.mem);
            assert!(
                m.row_remapping != m.page_retirement,
                "{}: exactly one scheme",
                m.key
            );
            assert!(!m.has_fan, "{}: none of the six boards has a fan", m.key);
            assert_eq!(m.mig_capable(), m.mig_profiles.len() == 7, "{}", m.key);
            assert_eq!(by_key(m.key), Some(m));
        }
        assert!(by_key("V100").is_none());
    }
}
