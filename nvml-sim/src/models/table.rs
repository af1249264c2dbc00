//! The six supported models as data. Values come from captured `nvidia-smi -q` outputs and nvml.h
//! (see `nvml-sim/README.md`); the H100 and H200 rows follow the real boards captured on driver
//! 580.159.04 (`nvml-sim/tests/data/real-h100/`, `…/real-h200/`), which override those outputs
//! where they differ. `CHOSEN` marks values without a source (all listed in the README).

use super::mig;
use super::{Board, Clocks, Model, Thresholds, HOPPER};

const AMPERE: u32 = 7;
const ADA: u32 = 8;
const TURING: u32 = 6;
const BRAND_NVIDIA: u32 = 14;
const MIB: u64 = 1024 * 1024;

/// Driver 580 on both captured boards: GpuIdle … HwPowerBrakeSlowdown plus DisplayClockSetting
/// (0x100). Applied to every model: the supported set is the driver's, not the board's.
const CLOCK_EVENT_REASONS: u64 = 0x1FF;
/// `nvmlEventTypeAll` (0xFF9F), what both captured Hopper boards answer: every type nvml.h
/// defines (SingleBitEcc … Clock, PowerSourceChange, MigConfigChange, SBE storm, DRAM retirement
/// event/failure, (non-)fatal poison, GPU unavailable, recovery action).
const EVENTS_MIG: u64 = 0xFF9F;
/// CHOSEN for boards without MIG: the same set less MigConfigChange (0x100).
const EVENTS_NO_MIG: u64 = EVENTS_MIG & !0x100;
/// Encoder/decoder/JPEG/OFA sampling period on both captured boards (µs).
const ENGINE_SAMPLING_US: u32 = 100_000;
/// `nvmlDeviceGetMemoryErrorCounter` answers only at NVML_MEMORY_LOCATION_DRAM (2) and
/// NVML_MEMORY_LOCATION_SRAM (7) on both captured boards (NOT_SUPPORTED at 0, 1, 3-6), matching
/// the SRAM/DRAM split `nvidia-smi -q` prints on R535+ for every model here.
const ECC_LOCATIONS: &[u32] = &[2, 7];
/// `nvmlDeviceGetDisplayMode` = 1 on both captured boards, which have no display output: a
/// driver-580 answer ("Requested functionality has been deprecated" in nvidia-smi), used for all.
const DISPLAY_MODE: u32 = 1;

const fn clocks(graphics_sm: u32, mem: u32, video: u32) -> Clocks {
    Clocks {
        graphics: graphics_sm,
        sm: graphics_sm,
        mem,
        video,
    }
}

const fn thresholds(
    shutdown: u32,
    slowdown: u32,
    mem_max: Option<u32>,
    gpu_max: u32,
) -> Thresholds {
    Thresholds {
        shutdown: Some(shutdown),
        slowdown: Some(slowdown),
        mem_max,
        gpu_max: Some(gpu_max),
    }
}

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
        // S10 (`nvidia-smi -q`, 535.129.03).
        board: Board {
            vbios: "92.00.36.00.04",
            inforom_image: "G506.0200.00.04",
            part_number: "692-2G506-0200-002",
        },
        memory_total_mib: 40960,
        memory_reserved_bytes: 620 * MIB,
        bar1_total_mib: 65536,
        power_default_w: 400,
        power_min_w: 100,
        power_max_w: 400,
        idle_power_w: 52.5,
        idle_pstate: 0,
        max_clocks: clocks(1410, 1215, 1290),
        idle_clocks: clocks(210, 1215, 585),
        app_clocks: (1095, 1215),
        // CHOSEN: only the one memory clock seen in captures.
        supported_mem_clocks: &[1215],
        thresholds: thresholds(92, 89, Some(95), 85),
        idle_temp_c: 22,
        idle_mem_temp_c: Some(30),
        fans: 0,
        pcie_max_gen: 4,
        pcie_max_width: 16,
        nvlinks: 12,
        supported_clock_event_reasons: CLOCK_EVENT_REASONS,
        supported_event_types: EVENTS_MIG,
        engine_sampling_us: ENGINE_SAMPLING_US,
        ecc_locations: ECC_LOCATIONS,
        display_mode: DISPLAY_MODE,
        row_remapping: true,
        page_retirement: false,
        remap_bank_max: 640,
        mig_profiles: mig::A100_40GB,
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
        // A public `nvidia-smi -q` of a 692-2G506-0212-005 board (code search; repository not
        // resolved), so: CHOSEN from an unpinned source.
        board: Board {
            vbios: "92.00.9E.00.02",
            inforom_image: "G506.0212.00.01",
            part_number: "692-2G506-0212-005",
        },
        memory_total_mib: 81920,
        memory_reserved_bytes: 763 * MIB,
        bar1_total_mib: 131072,
        power_default_w: 500,
        power_min_w: 100,
        power_max_w: 500,
        idle_power_w: 60.0,
        idle_pstate: 0,
        max_clocks: clocks(1410, 1593, 1290),
        idle_clocks: clocks(210, 1593, 585),
        app_clocks: (1140, 1593),
        // CHOSEN: only the one memory clock seen in captures.
        supported_mem_clocks: &[1593],
        thresholds: thresholds(92, 89, Some(95), 85),
        idle_temp_c: 26,
        idle_mem_temp_c: Some(44),
        fans: 0,
        pcie_max_gen: 4,
        pcie_max_width: 16,
        nvlinks: 12,
        supported_clock_event_reasons: CLOCK_EVENT_REASONS,
        supported_event_types: EVENTS_MIG,
        engine_sampling_us: ENGINE_SAMPLING_US,
        ecc_locations: ECC_LOCATIONS,
        display_mode: DISPLAY_MODE,
        row_remapping: true,
        page_retirement: false,
        remap_bank_max: 640,
        mig_profiles: mig::A100_80GB,
    },
    Model {
        key: "H100-SXM5-80GB",
        name: "NVIDIA H100 80GB HBM3",
        pci_device_id: 0x2330_10DE,
        pci_subsystem_id: 0x16C1_10DE,
        architecture: HOPPER,
        cuda_cc: (9, 0),
        brand: BRAND_NVIDIA,
        board: Board {
            vbios: "96.00.DA.00.0C",
            inforom_image: "G520.0200.00.05",
            part_number: "692-2G520-0200-000",
        },
        memory_total_mib: 81559,
        // Exactly 480 MiB on 580.159.04 (479 MiB @ 590.48.01 in an `nvidia-smi -q` capture).
        memory_reserved_bytes: 503_316_480,
        bar1_total_mib: 131072,
        power_default_w: 700,
        power_min_w: 200,
        power_max_w: 700,
        idle_power_w: 69.9,
        idle_pstate: 0,
        max_clocks: clocks(1980, 2619, 1545),
        idle_clocks: clocks(345, 2619, 765),
        app_clocks: (1980, 2619),
        supported_mem_clocks: &[2619, 1593],
        thresholds: thresholds(95, 89, Some(95), 87),
        idle_temp_c: 33,
        idle_mem_temp_c: Some(40),
        fans: 0,
        pcie_max_gen: 5,
        pcie_max_width: 16,
        nvlinks: 18,
        supported_clock_event_reasons: CLOCK_EVENT_REASONS,
        supported_event_types: EVENTS_MIG,
        engine_sampling_us: ENGINE_SAMPLING_US,
        ecc_locations: ECC_LOCATIONS,
        display_mode: DISPLAY_MODE,
        row_remapping: true,
        page_retirement: false,
        remap_bank_max: 2560,
        mig_profiles: mig::H100_80GB,
    },
    Model {
        key: "H200-SXM-141GB",
        name: "NVIDIA H200",
        pci_device_id: 0x2335_10DE,
        // The captured 692-2G520-0282 board (`nvidia-smi -q` captures of 695-2G520-0280 boards:
        // 0x18BE).
        pci_subsystem_id: 0x18BF_10DE,
        architecture: HOPPER,
        cuda_cc: (9, 0),
        brand: BRAND_NVIDIA,
        board: Board {
            vbios: "96.00.A5.00.1A",
            inforom_image: "G520.0282.02.02",
            part_number: "692-2G520-0282-000",
        },
        memory_total_mib: 143771,
        // 615.06 MiB on 580.159.04 (614 MiB @ 590.48.01 in an `nvidia-smi -q` capture).
        memory_reserved_bytes: 644_939_776,
        bar1_total_mib: 262144,
        power_default_w: 700,
        power_min_w: 200,
        power_max_w: 700,
        idle_power_w: 76.0,
        idle_pstate: 0,
        max_clocks: clocks(1980, 3201, 1545),
        idle_clocks: clocks(345, 3201, 765),
        app_clocks: (1980, 3201),
        supported_mem_clocks: &[3201, 2201],
        thresholds: thresholds(95, 89, Some(95), 87),
        idle_temp_c: 28,
        idle_mem_temp_c: Some(30),
        fans: 0,
        pcie_max_gen: 5,
        pcie_max_width: 16,
        nvlinks: 18,
        supported_clock_event_reasons: CLOCK_EVENT_REASONS,
        supported_event_types: EVENTS_MIG,
        engine_sampling_us: ENGINE_SAMPLING_US,
        ecc_locations: ECC_LOCATIONS,
        display_mode: DISPLAY_MODE,
        row_remapping: true,
        page_retirement: false,
        remap_bank_max: 3072,
        mig_profiles: mig::H200_141GB,
    },
    Model {
        key: "L4",
        name: "NVIDIA L4",
        pci_device_id: 0x27B8_10DE,
        pci_subsystem_id: 0x16CA_10DE,
        architecture: ADA,
        cuda_cc: (8, 9),
        brand: BRAND_NVIDIA,
        // CHOSEN from an unpinned public `nvidia-smi -q` (code search; repository not resolved).
        board: Board {
            vbios: "95.04.29.00.06",
            inforom_image: "G193.0200.00.01",
            part_number: "900-2G193-0000-000",
        },
        memory_total_mib: 23034,
        memory_reserved_bytes: 556 * MIB,
        bar1_total_mib: 32768,
        power_default_w: 72,
        power_min_w: 40,
        power_max_w: 72,
        idle_power_w: 16.5,
        idle_pstate: 8,
        max_clocks: clocks(2040, 6251, 1770),
        idle_clocks: clocks(210, 405, 765),
        app_clocks: (2040, 6251),
        // CHOSEN: the max and the idle memory clock.
        supported_mem_clocks: &[6251, 405],
        // CHOSEN: absolute thresholds unknown; derived from the T.Limit form (-5/-2/0) and
        // margin + temperature ≈ 86 °C. No memory sensor: MEM_MAX is NOT_SUPPORTED.
        thresholds: thresholds(91, 88, None, 86),
        idle_temp_c: 33,
        idle_mem_temp_c: None,
        fans: 0,
        pcie_max_gen: 4,
        pcie_max_width: 16,
        nvlinks: 0,
        supported_clock_event_reasons: CLOCK_EVENT_REASONS,
        supported_event_types: EVENTS_NO_MIG,
        engine_sampling_us: ENGINE_SAMPLING_US,
        ecc_locations: ECC_LOCATIONS,
        display_mode: DISPLAY_MODE,
        row_remapping: true,
        page_retirement: false,
        remap_bank_max: 96,
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
        // CHOSEN from an unpinned public `nvidia-smi -q` (code search; repository not resolved).
        board: Board {
            vbios: "90.04.38.00.03",
            inforom_image: "G183.0200.00.02",
            part_number: "900-2G183-0000-001",
        },
        memory_total_mib: 15360,
        memory_reserved_bytes: 388 * MIB,
        bar1_total_mib: 256,
        power_default_w: 70,
        power_min_w: 60,
        power_max_w: 70,
        // CHOSEN: P8 idle draw not pinned to a capture (unpinned captures show 9-14 W).
        idle_power_w: 12.0,
        // CHOSEN: P8 at idle, like the L4 (not pinned to a capture).
        idle_pstate: 8,
        max_clocks: clocks(1590, 5001, 1470),
        // CHOSEN: P8 idle clocks not pinned: lowest supported graphics clock 300 MHz, the low
        // memory clock 405 MHz, video 540 MHz.
        idle_clocks: clocks(300, 405, 540),
        app_clocks: (585, 5001),
        supported_mem_clocks: &[5001, 405],
        thresholds: thresholds(96, 93, None, 85),
        // CHOSEN: idle temperature not pinned to a capture.
        idle_temp_c: 30,
        idle_mem_temp_c: None,
        fans: 0,
        pcie_max_gen: 3,
        pcie_max_width: 16,
        nvlinks: 0,
        supported_clock_event_reasons: CLOCK_EVENT_REASONS,
        supported_event_types: EVENTS_NO_MIG,
        engine_sampling_us: ENGINE_SAMPLING_US,
        ecc_locations: ECC_LOCATIONS,
        display_mode: DISPLAY_MODE,
        row_remapping: false,
        page_retirement: true,
        remap_bank_max: 0,
        mig_profiles: &[],
    },
];
