//! The built `libnvml_sim.so`, loaded through nvml-wrapper 0.13 exactly as the agent loads
//! `libnvidia-ml.so.1`, checked value by value against the scenario in `common::MIXED`.
//! Faults, events, rewrites, init errors and the stats file are in `wrapper_dynamic.rs`.

mod common;

use common::{Sim, MIB, MIXED};
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{
    Brand, Clock, ClockId, ComputeMode, EccCounter, MemoryError, MemoryLocation, PcieUtilCounter,
    RetirementCause, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::{DeviceArchitecture, SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;

#[test]
fn system_identity_and_handles() {
    let sim = Sim::new(MIXED);
    let nvml = sim.init();
    assert_eq!(nvml.sys_driver_version().expect("driver"), "580.95.05");
    assert_eq!(nvml.sys_nvml_version().expect("nvml"), "13.580.95.05");
    assert_eq!(nvml.sys_cuda_driver_version().expect("cuda"), 13000);
    assert_eq!(
        nvml.device_count().expect("count"),
        5,
        "the lost GPU still counts"
    );

    let h100 = nvml.device_by_index(0).expect("gpu 0");
    assert_eq!(h100.name().expect("name"), "NVIDIA H100 80GB HBM3");
    assert_eq!(
        h100.uuid().expect("uuid"),
        "GPU-0b4f6a5c-1111-2222-3333-444455556666"
    );
    assert_eq!(h100.serial().expect("serial"), "1654922000123");
    assert_eq!(h100.index().expect("index"), 0);
    assert_eq!(h100.minor_number().expect("minor"), 0);
    assert_eq!(
        h100.architecture().expect("arch"),
        DeviceArchitecture::Hopper
    );
    let cc = h100.cuda_compute_capability().expect("cc");
    assert_eq!((cc.major, cc.minor), (9, 0));
    assert_eq!(h100.brand().expect("brand"), Brand::Nvidia);
    let pci = h100.pci_info().expect("pci");
    assert_eq!(pci.bus_id, "00000000:3B:00.0");
    assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x3B, 0));
    assert_eq!(pci.pci_device_id, 0x2330_10DE);
    assert_eq!(pci.pci_sub_system_id, Some(0x16C1_10DE));

    // Lookups: by UUID, serial, PCI bus id in any case and with or without the domain.
    for bus in [
        "00000000:3B:00.0",
        "00000000:3b:00.0",
        "0000:3B:00.0",
        "3b:00.0",
    ] {
        let d = nvml.device_by_pci_bus_id(bus).expect(bus);
        assert_eq!(d.index().expect("index"), 0, "{bus}");
    }
    let by_uuid = nvml
        .device_by_uuid("GPU-0b4f6a5c-1111-2222-3333-444455556666")
        .expect("uuid");
    assert_eq!(by_uuid.index().expect("index"), 0);
    #[allow(deprecated)] // the symbol is still the agent's fallback for serial lookups
    let by_serial = nvml.device_by_serial("1654922000123").expect("serial");
    assert_eq!(by_serial.index().ok(), Some(0));
    assert!(matches!(
        nvml.device_by_uuid("GPU-00000000-0000-0000-0000-000000000000"),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_index(5),
        Err(NvmlError::InvalidArg)
    ));

    // Derived identities are distinct and well-formed.
    let t4 = nvml.device_by_index(1).expect("gpu 1");
    let l4 = nvml.device_by_index(3).expect("gpu 3");
    assert_eq!(t4.name().expect("name"), "Tesla T4");
    assert_eq!(l4.name().expect("name"), "NVIDIA L4");
    assert_eq!(t4.architecture().expect("arch"), DeviceArchitecture::Turing);
    assert_eq!(l4.architecture().expect("arch"), DeviceArchitecture::Ada);
    let (u1, u3) = (t4.uuid().expect("uuid"), l4.uuid().expect("uuid"));
    assert!(
        u1.starts_with("GPU-") && u1.len() == 40 && u1 != u3,
        "{u1} {u3}"
    );
    assert_eq!(t4.serial().expect("serial").len(), 13);
    assert_ne!(
        t4.pci_info().expect("pci").bus_id,
        l4.pci_info().expect("pci").bus_id
    );
    assert_eq!(l4.minor_number().expect("minor"), 3);

    // The lost H200: every lookup says GPU is lost.
    assert!(matches!(nvml.device_by_index(4), Err(NvmlError::GpuLost)));
    assert!(matches!(
        nvml.device_by_pci_bus_id("00000000:9B:00.0"),
        Err(NvmlError::GpuLost)
    ));
}

#[test]
fn utilization_memory_temperature_power() {
    let sim = Sim::new(MIXED);
    let nvml = sim.init();
    let h100 = nvml.device_by_index(0).expect("gpu 0");
    let u = h100.utilization_rates().expect("util");
    assert_eq!((u.gpu, u.memory), (87, 41));
    assert_eq!(h100.encoder_utilization().expect("enc").utilization, 3);
    assert_eq!(h100.decoder_utilization().expect("dec").utilization, 4);

    let m = h100.memory_info().expect("memory v2");
    assert_eq!(m.total, 81559 * MIB);
    // The real H100 on driver 580.159.04: exactly 480 MiB (tests/data/real-h100).
    assert_eq!(m.reserved, 503_316_480);
    assert_eq!(m.used, 40960 * MIB);
    assert_eq!(
        m.total,
        m.reserved + m.used + m.free,
        "bytes add up exactly"
    );
    // v1 through the raw symbol: used includes reserved.
    let v1 = nvml
        .lib()
        .nvmlDeviceGetMemoryInfo
        .as_ref()
        .expect("v1 symbol");
    let mut raw = nvml_wrapper_sys::bindings::nvmlMemory_t {
        total: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: a valid handle from this Nvml and a valid out-pointer.
    assert_eq!(unsafe { v1(h100.handle(), &mut raw) }, 0);
    assert_eq!(
        (raw.total, raw.used, raw.free),
        (m.total, m.used + m.reserved, m.free)
    );
    // v2 with a wrong version: ARGUMENT_VERSION_MISMATCH (25).
    let v2 = nvml
        .lib()
        .nvmlDeviceGetMemoryInfo_v2
        .as_ref()
        .expect("v2 symbol");
    let mut bad = nvml_wrapper_sys::bindings::nvmlMemory_v2_t {
        version: 1,
        total: 0,
        reserved: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: as above.
    assert_eq!(unsafe { v2(h100.handle(), &mut bad) }, 25);

    let bar1 = h100.bar1_memory_info().expect("bar1");
    assert_eq!(bar1.total, 131072 * MIB);
    assert_eq!(bar1.total, bar1.used + bar1.free);

    assert_eq!(h100.temperature(TemperatureSensor::Gpu).expect("temp"), 62);
    // The real H100 on driver 580.159.04 (tests/data/real-h100): 95/89/95/87 °C.
    let th = |t| h100.temperature_threshold(t).expect("threshold");
    assert_eq!(
        (
            th(TemperatureThreshold::Shutdown),
            th(TemperatureThreshold::Slowdown)
        ),
        (95, 89)
    );
    assert_eq!(
        (
            th(TemperatureThreshold::MemoryMax),
            th(TemperatureThreshold::GpuMax)
        ),
        (95, 87)
    );
    let t4 = nvml.device_by_index(1).expect("gpu 1");
    assert_eq!(
        t4.temperature_threshold(TemperatureThreshold::Shutdown)
            .expect("t4"),
        96
    );
    assert!(matches!(
        t4.temperature_threshold(TemperatureThreshold::MemoryMax),
        Err(NvmlError::NotSupported)
    ));

    assert_eq!(h100.power_usage().expect("power"), 512_500);
    assert_eq!(h100.power_management_limit().expect("limit"), 650_000);
    assert_eq!(h100.enforced_power_limit().expect("enforced"), 650_000);
    assert_eq!(
        h100.power_management_limit_default().expect("default"),
        700_000
    );
    let c = h100
        .power_management_limit_constraints()
        .expect("constraints");
    assert_eq!((c.min_limit, c.max_limit), (200_000, 700_000));
    let l4 = nvml.device_by_index(3).expect("gpu 3");
    assert_eq!(l4.power_usage().expect("idle power"), 16_500);
    assert_eq!(
        l4.temperature(TemperatureSensor::Gpu).expect("idle temp"),
        33
    );
    assert_eq!(l4.utilization_rates().expect("idle util").gpu, 0);
    assert_eq!(l4.memory_info().expect("mem").used, 0);
    assert!(h100.total_energy_consumption().expect("energy") > 3_600_000_000);

    // MIG-enabled GPUs do not report device utilization (nvml.h).
    let a100 = nvml.device_by_index(2).expect("gpu 2");
    assert!(matches!(
        a100.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
}

#[test]
fn clocks_fans_pcie_throttle_ecc() {
    let sim = Sim::new(MIXED);
    let nvml = sim.init();
    let h100 = nvml.device_by_index(0).expect("gpu 0");
    assert_eq!(h100.clock_info(Clock::SM).expect("sm"), 1980);
    assert_eq!(h100.clock_info(Clock::Graphics).expect("gr"), 1980);
    assert_eq!(h100.clock_info(Clock::Memory).expect("mem"), 2619);
    assert_eq!(h100.clock_info(Clock::Video).expect("video"), 765);
    assert_eq!(h100.max_clock_info(Clock::Video).expect("max video"), 1545);
    assert_eq!(
        h100.clock(Clock::Graphics, ClockId::DefaultAppClock)
            .expect("app"),
        1980
    );
    assert_eq!(
        h100.clock(Clock::Memory, ClockId::CustomerMaxBoost)
            .expect("boost"),
        2619
    );
    let l4 = nvml.device_by_index(3).expect("gpu 3");
    assert_eq!(l4.clock_info(Clock::Memory).expect("idle mem"), 405);
    assert_eq!(l4.max_clock_info(Clock::Memory).expect("max mem"), 6251);

    // Fanless, as the real H100 answers (every model: tests/models.rs).
    assert_eq!(h100.num_fans().expect("fan count"), 0);
    assert!(matches!(h100.fan_speed(0), Err(NvmlError::InvalidArg)));

    assert_eq!(
        h100.pcie_throughput(PcieUtilCounter::Send).expect("tx"),
        1200
    );
    assert_eq!(
        h100.pcie_throughput(PcieUtilCounter::Receive).expect("rx"),
        800
    );
    assert_eq!(h100.pcie_replay_counter().expect("replay"), 5);
    assert_eq!(h100.max_pcie_link_gen().expect("gen"), 5);
    assert_eq!(h100.max_pcie_link_width().expect("width"), 16);
    assert_eq!(h100.current_pcie_link_gen().expect("gen"), 5);
    let t4 = nvml.device_by_index(1).expect("gpu 1");
    assert_eq!(t4.max_pcie_link_gen().expect("gen"), 3);

    let reasons = h100.current_throttle_reasons().expect("reasons");
    assert_eq!(
        reasons,
        ThrottleReasons::SW_POWER_CAP | ThrottleReasons::HW_SLOWDOWN
    );
    assert_eq!(
        l4.current_throttle_reasons().expect("idle"),
        ThrottleReasons::GPU_IDLE
    );
    assert!(h100
        .supported_throttle_reasons()
        .expect("supported")
        .contains(ThrottleReasons::HW_THERMAL_SLOWDOWN));

    let ecc = h100.is_ecc_enabled().expect("ecc");
    assert!(ecc.currently_enabled && ecc.pending_enabled);
    let e = |err, counter| h100.total_ecc_errors(err, counter).expect("ecc count");
    assert_eq!(e(MemoryError::Corrected, EccCounter::Volatile), 1);
    assert_eq!(e(MemoryError::Uncorrected, EccCounter::Volatile), 2);
    assert_eq!(e(MemoryError::Corrected, EccCounter::Aggregate), 12);
    assert_eq!(e(MemoryError::Uncorrected, EccCounter::Aggregate), 3);
    let dev = h100.memory_error_counter(
        MemoryError::Corrected,
        EccCounter::Aggregate,
        MemoryLocation::Device,
    );
    assert_eq!(dev.expect("device memory"), 12);

    // Row remapping on the H100 (raw symbol), page retirement NOT_SUPPORTED there.
    let sym = nvml
        .lib()
        .nvmlDeviceGetRemappedRows
        .as_ref()
        .expect("remapped rows symbol");
    let (mut corr, mut unc, mut pending, mut failure) = (9, 9, 9, 9);
    // SAFETY: a valid handle and four valid out-pointers.
    let ret = unsafe {
        sym(
            h100.handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failure,
        )
    };
    assert_eq!((ret, corr, unc, pending, failure), (0, 4, 1, 1, 0));
    assert!(matches!(
        h100.retired_pages(RetirementCause::DoubleBitEccError),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        h100.are_pages_pending_retired(),
        Err(NvmlError::NotSupported)
    ));
    // The T4 the other way round.
    // SAFETY: as above.
    let ret = unsafe { sym(t4.handle(), &mut corr, &mut unc, &mut pending, &mut failure) };
    assert_eq!(ret, 3, "T4 has no row remapping");
    let sbe = t4
        .retired_pages(RetirementCause::MultipleSingleBitEccErrors)
        .expect("sbe pages");
    assert_eq!(sbe.len(), 2);
    assert_ne!(sbe[0].address, sbe[1].address);
    assert_eq!(
        t4.retired_pages(RetirementCause::DoubleBitEccError)
            .expect("dbe")
            .len(),
        1
    );
    assert!(t4.are_pages_pending_retired().expect("pending"));
    let l4_dbe = l4.retired_pages(RetirementCause::DoubleBitEccError);
    assert!(matches!(l4_dbe, Err(NvmlError::NotSupported)), "{l4_dbe:?}");
}

#[test]
fn processes_mig_fields() {
    let sim = Sim::new(MIXED);
    let nvml = sim.init();
    let h100 = nvml.device_by_index(0).expect("gpu 0");
    assert_eq!(h100.running_compute_processes_count().expect("probe"), 1);
    let compute = h100.running_compute_processes().expect("compute");
    assert_eq!(compute.len(), 1);
    assert_eq!(compute[0].pid, 4242);
    assert_eq!(compute[0].used_gpu_memory, UsedGpuMemory::Used(30720 * MIB));
    assert_eq!(
        (compute[0].gpu_instance_id, compute[0].compute_instance_id),
        (None, None)
    );
    let graphics = h100.running_graphics_processes().expect("graphics");
    assert_eq!(graphics.iter().map(|p| p.pid).collect::<Vec<_>>(), [4243]);
    let l4 = nvml.device_by_index(3).expect("gpu 3");
    assert!(l4.running_compute_processes().expect("none").is_empty());
    assert_eq!(l4.running_compute_processes_count().expect("probe"), 0);

    let samples = h100.process_utilization_stats(None).expect("samples");
    assert_eq!(samples.len(), 2);
    let s = samples.iter().find(|s| s.pid == 4242).expect("pid 4242");
    assert_eq!((s.sm_util, s.mem_util), (80, 30));
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as u64;
    assert!(
        s.timestamp <= now_us && s.timestamp + 1_000_000 > now_us,
        "1 s sampling period"
    );
    assert!(matches!(
        h100.process_utilization_stats(now_us),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        l4.process_utilization_stats(None),
        Err(NvmlError::NotFound)
    ));

    let a100 = nvml.device_by_index(2).expect("gpu 2");
    let mig = a100.mig_mode().expect("mig mode");
    assert_eq!((mig.current, mig.pending), (1, 1));
    assert_eq!(a100.mig_device_count().expect("max mig"), 7);
    assert!(matches!(
        a100.process_utilization_stats(None),
        Err(NvmlError::NotSupported)
    ));
    let p = a100.running_compute_processes().expect("mig processes");
    // The 3g.40gb of the scenario's layout is the first GPU instance created: id 1.
    assert_eq!(p[0].gpu_instance_id, Some(1));
    assert_eq!(p[0].compute_instance_id, Some(0));
    let h100_mig = h100.mig_mode().expect("capable, disabled");
    assert_eq!((h100_mig.current, h100_mig.pending), (0, 0));
    assert_eq!(h100.mig_device_count().expect("disabled"), 0);
    for d in [&l4, &nvml.device_by_index(1).expect("t4")] {
        assert!(matches!(d.mig_mode(), Err(NvmlError::NotSupported)));
    }
    assert_eq!(
        h100.compute_mode().expect("compute mode"),
        ComputeMode::Default
    );

    let ids = [FieldId(230), FieldId(82), FieldId(1)];
    let f = h100.field_values_for(&ids).expect("field values");
    assert!(
        matches!(f[0].as_ref().expect("230").value, Ok(SampleValue::U32(1))),
        "{:?}",
        f[0]
    );
    assert!(
        matches!(f[1].as_ref().expect("82").value, Ok(SampleValue::U32(70))),
        "{:?}",
        f[1]
    );
    assert!(matches!(
        f[2].as_ref().expect("1").value,
        Err(NvmlError::NotSupported)
    ));
    let f = l4.field_values_for(&ids).expect("l4 field values");
    assert!(matches!(
        f[0].as_ref().expect("230").value,
        Ok(SampleValue::U32(0))
    ));
    assert!(
        matches!(
            f[1].as_ref().expect("82").value,
            Err(NvmlError::NotSupported)
        ),
        "no HBM sensor"
    );
}
