//! The per-device questions of `nvml_capture.py`, each with the NVML symbol pynvml 13.610 calls
//! for it (`nvmlDeviceGetPciInfo` → `_v3`, `…RunningProcesses` → `_v3`, `…ProfileInfo` →
//! `…ProfileInfoV` with a v2 struct whose version pynvml left 0, as the capture shows).

use std::ffi::c_char;

use nvml_wrapper_sys::bindings::{
    nvmlBAR1Memory_t, nvmlFieldValue_t, nvmlGpmSupport_t, nvmlGpuInstanceProfileInfo_v2_t,
    nvmlMemory_t, nvmlMemory_v2_t, nvmlPciInfo_t, nvmlProcessInfo_t,
    nvmlProcessUtilizationSample_t, nvmlRowRemapperHistogramValues_t, nvmlUtilization_t,
};
use serde_json::{json, Value};

use super::{check, split_key, sym, text, Answer, Replay, INSUFFICIENT_SIZE};

/// What `nvml_capture.py` asks `nvmlDeviceGetFieldValues` for.
const FIELDS: [u32; 14] = [
    82, 230, 155, 156, 157, 158, 159, 160, 161, 162, 163, 164, 165, 166,
];

impl Replay {
    pub(super) fn device(&self, key: &str) -> Option<Answer> {
        let l = &self.lib;
        let (base, args) = split_key(key);
        let arg = |i: usize| args.get(i).copied();
        Some(match (base, args.len()) {
            ("GetName", 0) => self.string_of(&l.nvmlDeviceGetName, 96),
            ("GetUUID", 0) => self.string_of(&l.nvmlDeviceGetUUID, 96),
            ("GetSerial", 0) => self.string_of(&l.nvmlDeviceGetSerial, 30),
            ("GetBoardPartNumber", 0) => self.string_of(&l.nvmlDeviceGetBoardPartNumber, 80),
            ("GetInforomImageVersion", 0) => {
                self.string_of(&l.nvmlDeviceGetInforomImageVersion, 16)
            }
            ("GetVbiosVersion", 0) => self.string_of(&l.nvmlDeviceGetVbiosVersion, 32),
            ("GetPciInfo", 0) => self.pci(),
            ("GetIndex", 0) => self.u32_of(&l.nvmlDeviceGetIndex),
            ("GetMinorNumber", 0) => self.u32_of(&l.nvmlDeviceGetMinorNumber),
            ("GetBrand", 0) => self.u32_of(&l.nvmlDeviceGetBrand),
            ("GetArchitecture", 0) => self.u32_of(&l.nvmlDeviceGetArchitecture),
            ("GetCudaComputeCapability", 0) => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetCudaComputeCapability)?;
                let (mut a, mut b) = (0, 0);
                // SAFETY: a handle of this library and two valid out-pointers.
                check(unsafe { f(self.dev, &mut a, &mut b) })?;
                Ok(json!([a, b]))
            })(),
            ("GetMemoryInfo_v1", 0) => self.memory_v1(),
            ("GetMemoryInfo_v2", 0) => self.memory_v2(),
            ("GetBAR1MemoryInfo", 0) => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetBAR1MemoryInfo)?;
                let mut m = nvmlBAR1Memory_t {
                    bar1Total: 0,
                    bar1Free: 0,
                    bar1Used: 0,
                };
                // SAFETY: a handle and a valid out-pointer.
                check(unsafe { f(self.dev, &mut m) })?;
                Ok(
                    json!({"bar1Free": m.bar1Free, "bar1Total": m.bar1Total, "bar1Used": m.bar1Used}),
                )
            })(),
            ("GetUtilizationRates", 0) => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetUtilizationRates)?;
                let mut u = nvmlUtilization_t { gpu: 0, memory: 0 };
                // SAFETY: a handle and a valid out-pointer.
                check(unsafe { f(self.dev, &mut u) })?;
                Ok(json!({"gpu": u.gpu, "memory": u.memory}))
            })(),
            ("GetEncoderUtilization", 0) => self.pair(&l.nvmlDeviceGetEncoderUtilization),
            ("GetDecoderUtilization", 0) => self.pair(&l.nvmlDeviceGetDecoderUtilization),
            ("GetTemperature_GPU", 0) => self.u32_at(&l.nvmlDeviceGetTemperature, 0),
            ("GetTemperatureThreshold", 1) => {
                self.u32_at(&l.nvmlDeviceGetTemperatureThreshold, arg(0)?)
            }
            ("GetPowerUsage", 0) => self.u32_of(&l.nvmlDeviceGetPowerUsage),
            ("GetPowerManagementLimit", 0) => self.u32_of(&l.nvmlDeviceGetPowerManagementLimit),
            ("GetPowerManagementDefaultLimit", 0) => {
                self.u32_of(&l.nvmlDeviceGetPowerManagementDefaultLimit)
            }
            ("GetPowerManagementLimitConstraints", 0) => {
                self.pair(&l.nvmlDeviceGetPowerManagementLimitConstraints)
            }
            ("GetEnforcedPowerLimit", 0) => self.u32_of(&l.nvmlDeviceGetEnforcedPowerLimit),
            ("GetPowerManagementMode", 0) => self.u32_of(&l.nvmlDeviceGetPowerManagementMode),
            ("GetPowerState", 0) => self.u32_of(&l.nvmlDeviceGetPowerState),
            ("GetPerformanceState", 0) => self.u32_of(&l.nvmlDeviceGetPerformanceState),
            ("GetTotalEnergyConsumption", 0) => self.u64_of(&l.nvmlDeviceGetTotalEnergyConsumption),
            ("GetClockInfo", 1) => self.u32_at(&l.nvmlDeviceGetClockInfo, arg(0)?),
            ("GetMaxClockInfo", 1) => self.u32_at(&l.nvmlDeviceGetMaxClockInfo, arg(0)?),
            ("GetApplicationsClock", 1) => self.u32_at(&l.nvmlDeviceGetApplicationsClock, arg(0)?),
            ("GetDefaultApplicationsClock", 1) => {
                self.u32_at(&l.nvmlDeviceGetDefaultApplicationsClock, arg(0)?)
            }
            ("GetClock", 2) => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetClock)?;
                let mut v = 0;
                // SAFETY: a handle, two plain integers and a valid out-pointer.
                check(unsafe { f(self.dev, args[0], args[1], &mut v) })?;
                Ok(json!(v))
            })(),
            ("GetSupportedMemoryClocks", 0) => {
                self.probed_u32s(&l.nvmlDeviceGetSupportedMemoryClocks)
            }
            ("GetFanSpeed", 0) => self.u32_of(&l.nvmlDeviceGetFanSpeed),
            ("GetFanSpeed_v2", 1) => self.u32_at(&l.nvmlDeviceGetFanSpeed_v2, arg(0)?),
            ("GetNumFans", 0) => self.u32_of(&l.nvmlDeviceGetNumFans),
            ("GetPcieReplayCounter", 0) => self.u32_of(&l.nvmlDeviceGetPcieReplayCounter),
            ("GetCurrPcieLinkGeneration", 0) => self.u32_of(&l.nvmlDeviceGetCurrPcieLinkGeneration),
            ("GetCurrPcieLinkWidth", 0) => self.u32_of(&l.nvmlDeviceGetCurrPcieLinkWidth),
            ("GetMaxPcieLinkGeneration", 0) => self.u32_of(&l.nvmlDeviceGetMaxPcieLinkGeneration),
            ("GetMaxPcieLinkWidth", 0) => self.u32_of(&l.nvmlDeviceGetMaxPcieLinkWidth),
            ("GetGpuMaxPcieLinkGeneration", 0) => {
                self.u32_of(&l.nvmlDeviceGetGpuMaxPcieLinkGeneration)
            }
            ("GetPcieLinkMaxSpeed", 0) => self.u32_of(&l.nvmlDeviceGetPcieLinkMaxSpeed),
            ("GetPcieSpeed", 0) => self.u32_of(&l.nvmlDeviceGetPcieSpeed),
            ("GetPcieThroughput_TX", 0) => self.u32_at(&l.nvmlDeviceGetPcieThroughput, 0),
            ("GetPcieThroughput_RX", 0) => self.u32_at(&l.nvmlDeviceGetPcieThroughput, 1),
            ("GetCurrentClocksThrottleReasons", 0) => {
                self.u64_of(&l.nvmlDeviceGetCurrentClocksThrottleReasons)
            }
            ("GetSupportedClocksThrottleReasons", 0) => {
                self.u64_of(&l.nvmlDeviceGetSupportedClocksThrottleReasons)
            }
            ("GetEccMode", 0) => self.pair(&l.nvmlDeviceGetEccMode),
            ("GetTotalEccErrors", 2) => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetTotalEccErrors)?;
                let mut v = 0;
                // SAFETY: a handle, two plain integers and a valid out-pointer.
                check(unsafe { f(self.dev, args[0], args[1], &mut v) })?;
                Ok(json!(v))
            })(),
            ("GetMemoryErrorCounter", 3) => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetMemoryErrorCounter)?;
                let mut v = 0;
                // SAFETY: a handle, three plain integers and a valid out-pointer.
                check(unsafe { f(self.dev, args[0], args[1], args[2], &mut v) })?;
                Ok(json!(v))
            })(),
            ("GetRetiredPages_SBE", 0) => self.retired_pages(0),
            ("GetRetiredPages_DBE", 0) => self.retired_pages(1),
            ("GetRetiredPagesPendingStatus", 0) => {
                self.u32_of(&l.nvmlDeviceGetRetiredPagesPendingStatus)
            }
            ("GetRemappedRows", 0) => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetRemappedRows)?;
                let (mut a, mut b, mut c, mut d) = (0, 0, 0, 0);
                // SAFETY: a handle and four valid out-pointers.
                check(unsafe { f(self.dev, &mut a, &mut b, &mut c, &mut d) })?;
                Ok(json!([a, b, c, d]))
            })(),
            ("GetRowRemapperHistogram", 0) => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetRowRemapperHistogram)?;
                let mut h = nvmlRowRemapperHistogramValues_t {
                    max: 0,
                    high: 0,
                    partial: 0,
                    low: 0,
                    none: 0,
                };
                // SAFETY: a handle and a valid out-pointer.
                check(unsafe { f(self.dev, &mut h) })?;
                Ok(
                    json!({"high": h.high, "low": h.low, "max": h.max, "none": h.none, "partial": h.partial}),
                )
            })(),
            ("GetMigMode", 0) => self.pair(&l.nvmlDeviceGetMigMode),
            ("GetMaxMigDeviceCount", 0) => self.u32_of(&l.nvmlDeviceGetMaxMigDeviceCount),
            // pynvml returns the ctypes object itself; `plain()` wrote its repr.
            ("IsMigDeviceHandle", 0) => self
                .u32_of(&l.nvmlDeviceIsMigDeviceHandle)
                .map(|v| json!(format!("c_uint({v})"))),
            ("GetComputeMode", 0) => self.u32_of(&l.nvmlDeviceGetComputeMode),
            ("GetPersistenceMode", 0) => self.u32_of(&l.nvmlDeviceGetPersistenceMode),
            ("GetVirtualizationMode", 0) => self.u32_of(&l.nvmlDeviceGetVirtualizationMode),
            ("GetDisplayMode", 0) => self.u32_of(&l.nvmlDeviceGetDisplayMode),
            ("GetComputeRunningProcesses", 0) => {
                self.processes(&l.nvmlDeviceGetComputeRunningProcesses_v3)
            }
            ("GetGraphicsRunningProcesses", 0) => {
                self.processes(&l.nvmlDeviceGetGraphicsRunningProcesses_v3)
            }
            ("GetProcessUtilization", 1) => self.process_utilization(u64::from(arg(0)?)),
            ("GetSupportedEventTypes", 0) => self.u64_of(&l.nvmlDeviceGetSupportedEventTypes),
            ("GetBoardId", 0) => self.u32_of(&l.nvmlDeviceGetBoardId),
            ("GetNvLinkState", 1) => self.u32_at(&l.nvmlDeviceGetNvLinkState, arg(0)?),
            ("GpmQueryDeviceSupport", 0) => (|| -> Answer {
                let f = sym(&l.nvmlGpmQueryDeviceSupport)?;
                let mut s = nvmlGpmSupport_t {
                    version: 1,
                    isSupportedDevice: 0,
                };
                // SAFETY: a handle and a valid in/out pointer.
                check(unsafe { f(self.dev, &mut s) })?;
                Ok(json!({"isSupportedDevice": s.isSupportedDevice, "version": s.version}))
            })(),
            ("GetFieldValues", 0) => self.field_values(),
            ("GetGpuInstanceProfileInfo", 1) => self.profile_info(arg(0)?),
            ("GetHandleByUUID_roundtrip", 0) => self.uuid_roundtrip(),
            ("GetHandleByPciBusId_roundtrip", 0) => self.bus_id_roundtrip(),
            ("XidEventWait", 0) => self.xid_wait(),
            _ => return None,
        })
    }

    fn pci(&self) -> Answer {
        let f = sym(&self.lib.nvmlDeviceGetPciInfo_v3)?;
        let mut p = nvmlPciInfo_t {
            busIdLegacy: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pciDeviceId: 0,
            pciSubSystemId: 0,
            busId: [0; 32],
        };
        // SAFETY: a handle and a valid out-pointer.
        check(unsafe { f(self.dev, &mut p) })?;
        let mut legacy = p.busIdLegacy.to_vec();
        let mut bus_id = p.busId.to_vec();
        legacy.push(0);
        bus_id.push(0);
        Ok(json!({
            "bus": p.bus, "busId": text(&bus_id), "busIdLegacy": text(&legacy), "device": p.device,
            "domain": p.domain, "pciDeviceId": p.pciDeviceId, "pciSubSystemId": p.pciSubSystemId,
        }))
    }

    fn memory_v1(&self) -> Answer {
        let f = sym(&self.lib.nvmlDeviceGetMemoryInfo)?;
        let mut m = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: a handle and a valid out-pointer.
        check(unsafe { f(self.dev, &mut m) })?;
        Ok(json!({"free": m.free, "total": m.total, "used": m.used}))
    }

    fn memory_v2(&self) -> Answer {
        let f = sym(&self.lib.nvmlDeviceGetMemoryInfo_v2)?;
        let version = std::mem::size_of::<nvmlMemory_v2_t>() as u32 | 2 << 24;
        let mut m = nvmlMemory_v2_t {
            version,
            total: 0,
            reserved: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: a handle and a valid in/out pointer.
        check(unsafe { f(self.dev, &mut m) })?;
        Ok(
            json!({"free": m.free, "reserved": m.reserved, "total": m.total, "used": m.used, "version": m.version}),
        )
    }

    /// pynvml's count probe: `(count = 0, NULL)`, SUCCESS ⇒ `[]`, INSUFFICIENT_SIZE ⇒ again.
    fn probed_u32s(&self, f: &Result<super::PairOf, libloading::Error>) -> Answer {
        let f = sym(f)?;
        let mut n = 0;
        // SAFETY: a handle, a valid count pointer and NULL for the array (a count probe).
        match unsafe { f(self.dev, &mut n, std::ptr::null_mut()) } {
            0 => return Ok(json!([])),
            INSUFFICIENT_SIZE => {}
            code => return Err(code),
        }
        let mut out = vec![0u32; n as usize];
        // SAFETY: `out` has room for the `n` values announced.
        check(unsafe { f(self.dev, &mut n, out.as_mut_ptr()) })?;
        out.truncate(n as usize);
        Ok(json!(out))
    }

    fn retired_pages(&self, cause: u32) -> Answer {
        let f = sym(&self.lib.nvmlDeviceGetRetiredPages)?;
        let mut n = 0;
        // SAFETY: a handle, a plain integer, a valid count pointer and NULL (a count probe).
        match unsafe { f(self.dev, cause, &mut n, std::ptr::null_mut()) } {
            0 => return Ok(json!([])),
            INSUFFICIENT_SIZE => {}
            code => return Err(code),
        }
        let mut out = vec![0u64; n as usize];
        // SAFETY: `out` has room for the `n` addresses announced.
        check(unsafe { f(self.dev, cause, &mut n, out.as_mut_ptr()) })?;
        out.truncate(n as usize);
        Ok(json!(out))
    }

    fn processes(&self, f: &Result<super::ProcsOf, libloading::Error>) -> Answer {
        let f = sym(f)?;
        let mut n = 0;
        // SAFETY: a handle, a valid count pointer and NULL (a count probe).
        match unsafe { f(self.dev, &mut n, std::ptr::null_mut()) } {
            0 => return Ok(json!([])),
            INSUFFICIENT_SIZE => {}
            code => return Err(code),
        }
        let empty = nvmlProcessInfo_t {
            pid: 0,
            usedGpuMemory: 0,
            gpuInstanceId: 0,
            computeInstanceId: 0,
        };
        let mut out = vec![empty; n as usize];
        // SAFETY: `out` has room for the `n` entries announced.
        check(unsafe { f(self.dev, &mut n, out.as_mut_ptr()) })?;
        out.truncate(n as usize);
        Ok(Value::Array(
            out.iter()
                .map(|p| {
                    json!({
                        "computeInstanceId": p.computeInstanceId, "gpuInstanceId": p.gpuInstanceId,
                        "pid": p.pid, "usedGpuMemory": p.usedGpuMemory,
                    })
                })
                .collect(),
        ))
    }

    fn process_utilization(&self, since: u64) -> Answer {
        let f = sym(&self.lib.nvmlDeviceGetProcessUtilization)?;
        let mut n = 0;
        // SAFETY: a handle, NULL (a count probe), a valid count pointer, a plain integer.
        match unsafe { f(self.dev, std::ptr::null_mut(), &mut n, since) } {
            INSUFFICIENT_SIZE => {}
            code => return Err(code),
        }
        let empty = nvmlProcessUtilizationSample_t {
            pid: 0,
            timeStamp: 0,
            smUtil: 0,
            memUtil: 0,
            encUtil: 0,
            decUtil: 0,
        };
        let mut out = vec![empty; n as usize];
        // SAFETY: `out` has room for the `n` samples announced.
        check(unsafe { f(self.dev, out.as_mut_ptr(), &mut n, since) })?;
        out.truncate(n as usize);
        Ok(Value::Array(out.iter().map(|s| json!({
            "decUtil": s.decUtil, "encUtil": s.encUtil, "memUtil": s.memUtil, "pid": s.pid,
            "smUtil": s.smUtil, "timeStamp": s.timeStamp,
        })).collect()))
    }

    fn field_values(&self) -> Answer {
        let f = sym(&self.lib.nvmlDeviceGetFieldValues)?;
        // SAFETY: nvmlFieldValue_t is plain data (integers and a union of numbers): all-zero
        // bytes are a valid value, as pynvml's zero-initialised ctypes array is.
        let mut values: Vec<nvmlFieldValue_t> = FIELDS
            .iter()
            .map(|&id| {
                let mut v: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
                v.fieldId = id;
                v
            })
            .collect();
        // SAFETY: a handle and an array of exactly `FIELDS.len()` entries.
        check(unsafe { f(self.dev, values.len() as i32, values.as_mut_ptr()) })?;
        Ok(Value::Array(values.iter().map(|v| {
            // SAFETY: reading the union as integers is what pynvml's `plain()` did; every
            // bit pattern is a valid u32/u64.
            let (ull, ui) = unsafe { (v.value.ullVal, v.value.uiVal) };
            json!({"fieldId": v.fieldId, "nvmlReturn": v.nvmlReturn, "ui": ui, "ull": ull, "valueType": v.valueType})
        }).collect()))
    }

    /// `nvmlDeviceGetGpuInstanceProfileInfoV` with a v2 struct whose version is 0, as the
    /// capture's pynvml sent it; the name without trailing NULs.
    pub(super) fn profile_info(&self, index: u32) -> Answer {
        let f = sym(&self.lib.nvmlDeviceGetGpuInstanceProfileInfoV)?;
        // SAFETY: plain data; all-zero bytes are a valid value (version 0, empty name).
        let mut i: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        // SAFETY: a handle, a plain integer and a valid in/out pointer.
        check(unsafe { f(self.dev, index, &mut i) })?;
        let mut name: Vec<c_char> = i.name.to_vec();
        name.push(0);
        Ok(json!({
            "copyEngineCount": i.copyEngineCount, "decoderCount": i.decoderCount,
            "encoderCount": i.encoderCount, "id": i.id, "instanceCount": i.instanceCount,
            "isP2pSupported": i.isP2pSupported, "jpegCount": i.jpegCount,
            "memorySizeMB": i.memorySizeMB, "multiprocessorCount": i.multiprocessorCount,
            "name": text(&name), "ofaCount": i.ofaCount, "sliceCount": i.sliceCount,
            "version": i.version,
        }))
    }
}
