//! The rules adopted from the real H100 and H200 (driver 580) that apply to every model, and
//! the per-model data the conformance tests cannot reach (they only know the two captured
//! boards): fans, masks, memory error locations, performance state, MIG tables on the A100s and
//! NOT_SUPPORTED MIG on L4/T4, all through the built library.

mod common;

use std::ffi::c_uint;

use common::{Sim, MIXED};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, MemoryLocation};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::{nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t};

/// One idle GPU of each model, MIG disabled.
const EVERY_MODEL: &str = r#"
version = 1
[[gpu]]
model = "A100-SXM4-40GB"
[[gpu]]
model = "A100-SXM4-80GB"
[[gpu]]
model = "H100-SXM5-80GB"
fan_percent = 40
[[gpu]]
model = "H200-SXM-141GB"
[[gpu]]
model = "L4"
[[gpu]]
model = "T4"
"#;

#[test]
fn every_board_is_fanless_like_the_real_ones() {
    let sim = Sim::new(EVERY_MODEL);
    let nvml = sim.init();
    let legacy = nvml.lib().nvmlDeviceGetFanSpeed.as_ref().expect("symbol");
    for i in 0..6 {
        let d = nvml.device_by_index(i).expect("gpu");
        assert_eq!(d.num_fans().expect("fan count"), 0, "gpu {i}");
        for fan in [0, 1, 7] {
            assert!(
                matches!(d.fan_speed(fan), Err(NvmlError::InvalidArg)),
                "gpu {i}"
            );
        }
        let mut speed = 0;
        // SAFETY: a valid handle from this Nvml and a valid out-pointer.
        assert_eq!(
            unsafe { legacy(d.handle(), &mut speed) },
            3,
            "NOT_SUPPORTED"
        );
    }
}

#[test]
fn masks_periods_and_error_locations_on_every_model() {
    let sim = Sim::new(EVERY_MODEL);
    let nvml = sim.init();
    for i in 0..6 {
        let d = nvml.device_by_index(i).expect("gpu");
        let mig = i < 4;
        // Raw: nvml-wrapper 0.13's `EventTypes` does not know the newer bits of 0xFF9F.
        let events = nvml
            .lib()
            .nvmlDeviceGetSupportedEventTypes
            .as_ref()
            .expect("symbol");
        let mut supported = 0;
        // SAFETY: a valid handle from this Nvml and a valid out-pointer.
        assert_eq!(unsafe { events(d.handle(), &mut supported) }, 0);
        assert_eq!(supported, if mig { 0xFF9F } else { 0xFE9F }, "gpu {i}");
        assert!(d
            .supported_event_types()
            .expect("truncated")
            .contains(EventTypes::CRITICAL_XID_ERROR));
        let reasons = d.supported_throttle_reasons_strict().expect("reasons");
        assert_eq!(reasons.bits(), 0x1FF, "gpu {i}");
        assert_eq!(
            d.encoder_utilization().expect("enc").sampling_period,
            100_000
        );
        assert_eq!(
            d.decoder_utilization().expect("dec").sampling_period,
            100_000
        );
        let at = |loc| d.memory_error_counter(MemoryError::Corrected, EccCounter::Volatile, loc);
        assert_eq!(at(MemoryLocation::Device).expect("DRAM"), 0, "gpu {i}");
        assert_eq!(at(MemoryLocation::SRAM).expect("SRAM"), 0, "gpu {i}");
        for loc in [
            MemoryLocation::L1Cache,
            MemoryLocation::RegisterFile,
            MemoryLocation::Cbu,
        ] {
            assert!(matches!(at(loc), Err(NvmlError::NotSupported)), "gpu {i}");
        }
        // P0 at idle on the data-center boards, P8 on L4 and T4.
        let pstate = raw_u32(&nvml, &d, nvml.lib().nvmlDeviceGetPerformanceState.as_ref());
        assert_eq!(pstate, Ok(if i < 4 { 0 } else { 8 }), "gpu {i}");
    }
}

#[test]
fn sram_errors_are_reported_at_the_sram_location() {
    let sim = Sim::new(
        "version = 1\n[[gpu]]\nmodel = \"H200-SXM-141GB\"\n\
         ecc = { sbe_aggregate = 5, dbe_aggregate = 1 }\necc_sram = { dbe_aggregate = 1 }\n",
    );
    let nvml = sim.init();
    let d = nvml.device_by_index(0).expect("gpu");
    let at = |e, loc| {
        d.memory_error_counter(e, EccCounter::Aggregate, loc)
            .expect("count")
    };
    assert_eq!(at(MemoryError::Uncorrected, MemoryLocation::SRAM), 1);
    assert_eq!(at(MemoryError::Uncorrected, MemoryLocation::Device), 0);
    assert_eq!(at(MemoryError::Corrected, MemoryLocation::Device), 5);
    assert_eq!(
        d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
            .expect("total"),
        1
    );
}

fn raw_u32(
    _nvml: &nvml_wrapper::Nvml,
    d: &Device,
    f: Result<
        &unsafe extern "C" fn(nvml_wrapper_sys::bindings::nvmlDevice_t, *mut c_uint) -> c_uint,
        &libloading::Error,
    >,
) -> Result<u32, u32> {
    let f = f.expect("symbol");
    let mut v = 0;
    // SAFETY: a valid handle and a valid out-pointer.
    match unsafe { f(d.handle(), &mut v) } {
        0 => Ok(v),
        code => Err(code),
    }
}

/// `(id, SMs, memory MB, placements as (start, size))`.
type Profile = (u32, u32, u64, Vec<(u32, u32)>);

/// `(id, SMs, memory MB, placements)` of profile `index` through the raw v1 call and
/// `…PossiblePlacements_v2`, or the return code.
fn profile(nvml: &nvml_wrapper::Nvml, d: &Device, index: u32) -> Result<Profile, u32> {
    let info_fn = nvml
        .lib()
        .nvmlDeviceGetGpuInstanceProfileInfo
        .as_ref()
        .expect("symbol");
    let place_fn = nvml
        .lib()
        .nvmlDeviceGetGpuInstancePossiblePlacements_v2
        .as_ref()
        .expect("symbol");
    // SAFETY: plain data; all-zero bytes are a valid value.
    let mut info: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid handle, a plain integer and a valid out-pointer.
    match unsafe { info_fn(d.handle(), index, &mut info) } {
        0 => {}
        code => return Err(code),
    }
    let mut n = 0;
    // SAFETY: NULL placements: a count probe.
    assert_eq!(
        unsafe { place_fn(d.handle(), info.id, std::ptr::null_mut(), &mut n) },
        0
    );
    let mut p = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; n as usize];
    // SAFETY: room for the `n` placements announced.
    assert_eq!(
        unsafe { place_fn(d.handle(), info.id, p.as_mut_ptr(), &mut n) },
        0
    );
    let placements = p.iter().map(|p| (p.start, p.size)).collect();
    Ok((
        info.id,
        info.multiprocessorCount,
        info.memorySizeMB,
        placements,
    ))
}

#[test]
fn mig_tables_on_the_a100s_and_not_supported_without_mig() {
    let sim = Sim::new(EVERY_MODEL);
    let nvml = sim.init();
    let a100_40 = nvml.device_by_index(0).expect("gpu 0");
    assert_eq!(
        profile(&nvml, &a100_40, 0),
        Ok((19, 14, 4864, (0..7).map(|s| (s, 1)).collect()))
    );
    assert_eq!(
        profile(&nvml, &a100_40, 4),
        Ok((0, 98, 40192, vec![(0, 8)]))
    );
    assert_eq!(
        profile(&nvml, &a100_40, 2),
        Ok((9, 42, 19968, vec![(0, 4), (4, 4)]))
    );
    assert_eq!(profile(&nvml, &a100_40, 5), Err(3), "no 8-slice profile");
    assert_eq!(
        profile(&nvml, &a100_40, 18),
        Err(2),
        "past NVML_GPU_INSTANCE_PROFILE_COUNT"
    );
    let a100_80 = nvml.device_by_index(1).expect("gpu 1");
    assert_eq!(
        profile(&nvml, &a100_80, 9),
        Ok((15, 14, 19968, vec![(0, 2), (2, 2), (4, 2), (6, 2)]))
    );
    for i in [4, 5] {
        let d = nvml.device_by_index(i).expect("L4/T4");
        assert_eq!(profile(&nvml, &d, 0), Err(3), "gpu {i}");
        let capacity = nvml
            .lib()
            .nvmlDeviceGetGpuInstanceRemainingCapacity
            .as_ref()
            .expect("symbol");
        let mut n = 0;
        // SAFETY: a valid handle, a plain integer and a valid out-pointer.
        assert_eq!(unsafe { capacity(d.handle(), 19, &mut n) }, 3, "gpu {i}");
        let is_mig = raw_u32(&nvml, &d, nvml.lib().nvmlDeviceIsMigDeviceHandle.as_ref());
        assert_eq!(is_mig, Ok(0), "a full GPU");
    }
}

#[test]
fn instance_calls_with_mig_enabled_answer_the_live_layout() {
    let sim = Sim::new(MIXED);
    let nvml = sim.init();
    let a100 = nvml.device_by_index(2).expect("the MIG-enabled A100");
    let capacity = nvml
        .lib()
        .nvmlDeviceGetGpuInstanceRemainingCapacity
        .as_ref()
        .expect("symbol");
    let mut n = 0;
    // SAFETY: a valid handle, a plain integer and a valid out-pointer.
    assert_eq!(unsafe { capacity(a100.handle(), 19, &mut n) }, 0);
    // The scenario's 3g.40gb + 2g.20gb + 1g.10gb leave room for one more 1g.10gb (7 compute
    // slices: 3 + 2 + 1 used) where the driver would put it.
    assert_eq!(n, 1);
    // The profile table answers whatever the mode.
    assert_eq!(profile(&nvml, &a100, 0).map(|p| p.0), Ok(19));
}

/// `ecc = { correctable_per_s }` grows the volatile and aggregate correctable counters (in
/// device memory) at that rate, `pcie = { gen, width, replays_per_s }` sets the current link
/// (the maximum stays the model's) and grows the replay counter; a rewrite without the rates
/// stops the growth and keeps what grew.
#[test]
fn rates_grow_counters_and_the_link_trains_down() {
    let sim = Sim::new(
        "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\n\
         ecc = { sbe_volatile = 7, correctable_per_s = 1000 }\n\
         pcie = { gen = 3, width = 8, replays_per_s = 100.0 }\npcie_replay_count = 5\n",
    );
    let nvml = sim.init();
    let d = nvml.device_by_index(0).expect("gpu");
    assert_eq!(d.current_pcie_link_gen().ok(), Some(3));
    assert_eq!(d.current_pcie_link_width().ok(), Some(8));
    assert_eq!(d.max_pcie_link_gen().ok(), Some(5));
    assert_eq!(d.max_pcie_link_width().ok(), Some(16));
    let sbe = |c| d.total_ecc_errors(MemoryError::Corrected, c).expect("sbe");
    let (v0, a0, r0) = (
        sbe(EccCounter::Volatile),
        sbe(EccCounter::Aggregate),
        d.pcie_replay_counter().expect("replays"),
    );
    assert!(v0 >= 7 && a0 <= v0 - 7 + 1, "{v0} {a0}");
    assert!(r0 >= 5);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (v1, r1) = (
        sbe(EccCounter::Volatile),
        d.pcie_replay_counter().expect("replays"),
    );
    // 1000/s and 100/s over at least 0.5 s; the calls in between take far less than 1 s.
    assert!((500..1500).contains(&(v1 - v0)), "{v0} -> {v1}");
    assert!((50..150).contains(&(r1 - r0)), "{r0} -> {r1}");
    assert_eq!(
        d.memory_error_counter(
            MemoryError::Corrected,
            EccCounter::Volatile,
            MemoryLocation::Device
        )
        .expect("device memory")
        .saturating_sub(v1),
        0
    );
    assert_eq!(
        d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .ok(),
        Some(0)
    );
    sim.rewrite("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\necc = { sbe_volatile = 7 }\n");
    assert!(common::eventually(
        std::time::Duration::from_secs(5),
        || d.current_pcie_link_width().ok() == Some(16)
    ));
    let (v2, r2) = (
        sbe(EccCounter::Volatile),
        d.pcie_replay_counter().expect("replays"),
    );
    assert!(v2 >= v1 && r2 >= r1, "kept");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(sbe(EccCounter::Volatile), v2, "no more growth");
    assert_eq!(d.pcie_replay_counter().ok(), Some(r2));
    assert_eq!(d.current_pcie_link_gen().ok(), Some(5));
}
