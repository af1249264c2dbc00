//! NVLink and the GPU fabric through the built library: the HGX answers (18 or 12 links, the
//! fabric of Hopper), the VM answer the real H100 gave (NOT_SUPPORTED), and PCIe boards.

mod common;

use common::Sim;
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper_sys::bindings::{field_id, nvmlGpuFabricInfo_v3_t};

const NODE: &str = r#"version = 1
[[gpu]]
model = "H100-SXM5-80GB"
nvlink = { down = [5], recovery_errors = 7, replay_errors = 3, tx_kib_s = 1700000, rx_kib_s = 850000 }
fabric = { health = ["degraded_bw"] }
[[gpu]]
model = "A100-SXM4-80GB"
nvlink = {}
[[gpu]]
model = "H100-SXM5-80GB"
[[gpu]]
model = "L4"
"#;

/// `nvmlDeviceGetGpuFabricInfoV` with struct version `version`.
fn fabric(nvml: &nvml_wrapper::Nvml, i: u32, version: u32) -> (u32, nvmlGpuFabricInfo_v3_t) {
    let d = nvml.device_by_index(i).expect("gpu");
    let sym = nvml
        .lib()
        .nvmlDeviceGetGpuFabricInfoV
        .as_ref()
        .expect("symbol");
    // SAFETY: a plain C struct of integers, valid when zeroed.
    let mut info: nvmlGpuFabricInfo_v3_t = unsafe { std::mem::zeroed() };
    info.version = version;
    // SAFETY: a live handle from this Nvml and a valid out-pointer to a v3 struct.
    let ret = unsafe { sym(d.handle(), &mut info) };
    (ret, info)
}

const V3: u32 = 40 | 3 << 24;
const V2: u32 = 36 | 2 << 24;

#[test]
fn hgx_boards_have_their_links_and_a_down_link_reads_inactive() {
    let sim = Sim::new(NODE);
    let nvml = sim.init();
    let h100 = nvml.device_by_index(0).expect("gpu");
    let states: Vec<bool> = (0..18)
        .map(|l| h100.link_wrapper_for(l).is_active().expect("state"))
        .collect();
    assert_eq!(states.iter().filter(|a| !**a).count(), 1);
    assert!(!states[5]);
    assert!(matches!(
        h100.link_wrapper_for(18).is_active(),
        Err(NvmlError::InvalidArg)
    ));
    let a100 = nvml.device_by_index(1).expect("gpu");
    assert!(a100.link_wrapper_for(11).is_active().expect("state"));
    assert!(matches!(
        a100.link_wrapper_for(12).is_active(),
        Err(NvmlError::InvalidArg)
    ));
    let l0 = h100.link_wrapper_for(0);
    assert_eq!(
        l0.error_counter(ErrorCounter::DlRecovery).expect("count"),
        7
    );
    assert_eq!(l0.error_counter(ErrorCounter::DlReplay).expect("count"), 3);
    assert_eq!(
        h100.link_wrapper_for(1)
            .error_counter(ErrorCounter::DlRecovery)
            .expect("count"),
        0
    );
}

#[test]
fn field_values_give_link_count_error_totals_and_growing_throughput() {
    let sim = Sim::new(NODE);
    let nvml = sim.init();
    let d = nvml.device_by_index(0).expect("gpu");
    let ids = [
        field_id::NVML_FI_DEV_NVLINK_LINK_COUNT,
        field_id::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
        field_id::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    ]
    .map(FieldId);
    let read = || -> Vec<SampleValue> {
        d.field_values_for(&ids)
            .expect("call")
            .into_iter()
            .map(|s| s.expect("sample").value.expect("value"))
            .collect()
    };
    let first = read();
    assert!(matches!(first[0], SampleValue::U32(18)), "{first:?}");
    assert!(matches!(first[1], SampleValue::U64(7)), "{first:?}");
    assert!(matches!(first[2], SampleValue::U64(3)), "{first:?}");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (SampleValue::U64(a), SampleValue::U64(b)) = (first[3].clone(), read()[3].clone()) else {
        panic!("KiB counters are unsigned long long");
    };
    // 1.7e6 KiB/s over 17 active links: 100000 KiB/s on link 0; 50 ms ≈ 5000 KiB.
    assert!(b > a && b - a >= 4000, "{a} then {b}");
}

#[test]
fn the_fabric_of_hopper_answers_v3_and_v2_and_reports_its_health_bits() {
    let sim = Sim::new(NODE);
    let nvml = sim.init();
    let (ret, info) = fabric(&nvml, 0, V3);
    assert_eq!(ret, 0);
    assert_eq!((info.state, info.status), (3, 0), "completed, SUCCESS");
    assert_eq!(info.healthMask & 0x3, 1, "degraded bandwidth TRUE");
    assert_eq!(info.healthSummary, 3, "limited capacity");
    assert_ne!(info.clusterUuid, [0; 16]);
    let (ret, info) = fabric(&nvml, 0, V2);
    assert_eq!((ret, info.healthSummary), (0, 0), "v2 has no summary");
    assert_eq!(fabric(&nvml, 0, 7 << 24).0, 25, "ARGUMENT_VERSION_MISMATCH");
    assert_eq!(fabric(&nvml, 1, V3).0, 3, "an A100 has no fabric info");
}

#[test]
fn a_vm_and_a_pcie_board_answer_not_supported_like_the_real_h100() {
    let sim = Sim::new(NODE);
    let nvml = sim.init();
    for i in [2, 3] {
        let d = nvml.device_by_index(i).expect("gpu");
        assert!(
            matches!(
                d.link_wrapper_for(0).is_active(),
                Err(NvmlError::NotSupported)
            ),
            "gpu {i}"
        );
        assert!(matches!(
            d.link_wrapper_for(0).error_counter(ErrorCounter::DlReplay),
            Err(NvmlError::NotSupported)
        ));
        assert_eq!(fabric(&nvml, i, V3).0, 3, "gpu {i}");
        let v = d
            .field_values_for(&[FieldId(field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX)])
            .expect("call");
        assert!(matches!(
            v[0].as_ref().expect("sample").value,
            Err(NvmlError::NotSupported)
        ));
    }
}

#[test]
fn p2p_over_nvlink_needs_links_on_both_and_the_common_ancestor_follows_the_pcie_switch() {
    use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
    let sim = Sim::new(
        r#"version = 1
[[gpu]]
model = "H100-SXM5-80GB"
nvlink = {}
pcie_switch = 1
[[gpu]]
model = "H100-SXM5-80GB"
nvlink = { down = [0, 1] }
pcie_switch = 2
[[gpu]]
model = "H100-SXM5-80GB"
pcie_switch = 1
"#,
    );
    let nvml = sim.init();
    let d = |i| nvml.device_by_index(i).expect("gpu");
    let p2p = |a, b| {
        d(a).p2p_status(&d(b), P2pCapabilitiesIndex::NvLink)
            .expect("status")
    };
    assert_eq!(p2p(0, 1), P2pStatus::Ok);
    assert_eq!(p2p(0, 2), P2pStatus::NotSupported, "GPU 2 has no NVLink");
    let level = |a, b| d(a).topology_common_ancestor(d(b)).expect("level");
    assert_eq!(level(0, 2), TopologyLevel::Single);
    assert_eq!(level(0, 1), TopologyLevel::System);
    assert_eq!(level(1, 1), TopologyLevel::Internal);
}
