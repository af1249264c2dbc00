//! The exported NVML C ABI, grouped like nvml.h. Every function is declared with the
//! [`export!`](crate::export) macro, so its body runs under `catch_unwind`, is counted for
//! `NVML_SIM_STATS`, and returns `Err(code)` as its `nvmlReturn_t`. [`EXPORTED`] lists every
//! symbol: scenario `unsupported`/`errors` entries are validated against it, and the
//! integration test checks that each name really resolves in the built library.

mod board;
mod clocks;
mod device;
mod ecc;
mod events;
mod fields;
mod gpm;
mod mig;
mod mig_ci;
mod mig_gi;
mod nvlink;
mod pcie;
mod processes;
mod system;
mod telemetry;

/// Every symbol this library exports.
pub const EXPORTED: &[&str] = &[
    // system.rs
    "nvmlInit_v2",
    "nvmlInit",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetCount",
    "nvmlSystemGetProcessName",
    "nvmlSystemGetConfComputeState",
    // device.rs
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetHandleBySerial",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceSetComputeMode",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    // telemetry.rs
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetBAR1MemoryInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetJpgUtilization",
    "nvmlDeviceGetOfaUtilization",
    "nvmlDeviceGetMarginTemperature",
    // clocks.rs
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetClock",
    "nvmlDeviceGetApplicationsClock",
    "nvmlDeviceGetDefaultApplicationsClock",
    "nvmlDeviceGetSupportedMemoryClocks",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetFanSpeed_v2",
    "nvmlDeviceGetNumFans",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons",
    "nvmlDeviceGetSupportedClocksEventReasons",
    // ecc.rs
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetMemoryErrorCounter",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPages_v2",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetDefaultEccMode",
    "nvmlDeviceGetRowRemapperHistogram",
    // pcie.rs
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPcieSpeed",
    "nvmlDeviceGetPcieLinkMaxSpeed",
    // nvlink.rs
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceGetP2PStatus",
    "nvmlDeviceGetTopologyCommonAncestor",
    // board.rs
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetPowerState",
    "nvmlDeviceGetPowerManagementMode",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetInforomImageVersion",
    "nvmlDeviceGetBoardPartNumber",
    "nvmlDeviceGetBoardId",
    "nvmlDeviceGetModuleId",
    "nvmlDeviceGetVirtualizationMode",
    "nvmlDeviceGetHostVgpuMode",
    "nvmlDeviceGetDisplayMode",
    "nvmlDeviceGetPowerSource",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetCpuAffinity",
    "nvmlDeviceGetAccountingMode",
    "nvmlDeviceGetAccountingBufferSize",
    "nvmlDeviceGetAccountingPids",
    // mig.rs
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetGpuInstanceProfileInfoV",
    "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
    // mig_gi.rs
    "nvmlDeviceSetMigMode",
    "nvmlDeviceGetGpuInstanceRemainingCapacity",
    "nvmlDeviceCreateGpuInstance",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceDestroy",
    "nvmlDeviceGetGpuInstances",
    "nvmlDeviceGetGpuInstanceById",
    "nvmlGpuInstanceGetInfo",
    // mig_ci.rs
    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
    "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
    "nvmlGpuInstanceGetComputeInstanceRemainingCapacity",
    "nvmlGpuInstanceGetComputeInstancePossiblePlacements",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
    "nvmlComputeInstanceDestroy",
    "nvmlGpuInstanceGetComputeInstances",
    "nvmlGpuInstanceGetComputeInstanceById",
    "nvmlComputeInstanceGetInfo_v2",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    // processes.rs
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetProcessesUtilizationInfo",
    // events.rs
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlEventSetWait_v2",
    "nvmlEventSetWait",
    "nvmlEventSetFree",
    // fields.rs
    "nvmlDeviceGetFieldValues",
    // gpm.rs
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlGpmMigSampleGet",
];

/// `Ok` for SUCCESS, else `Err(code)`.
fn code(ret: crate::ffi::Ret) -> crate::ffi::NvResult {
    if ret == crate::ffi::SUCCESS {
        Ok(())
    } else {
        Err(ret)
    }
}
