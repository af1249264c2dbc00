//! `nvml_mig_probe.py`'s questions (MIG disabled: GPU instances, capacity, MIG handles, GPM MIG
//! samples, accounting, sharing-related reads), the MIG profile table with placements of
//! `nvml_cost.py`, and the capture's round trips and XID wait.

use std::ffi::{c_char, c_uint, c_ulong};

use nvml_wrapper_sys::bindings::{
    nvmlConfComputeSystemState_t, nvmlDevice_t, nvmlEventData_t, nvmlGpuInstancePlacement_t,
    nvmlMarginTemperature_t, nvmlProcessesUtilizationInfo_t,
};
use serde_json::{json, Value};

use super::{check, split_key, sym, text, Answer, Replay, INSUFFICIENT_SIZE};

type HandleAt<H> = unsafe extern "C" fn(nvmlDevice_t, c_uint, *mut *mut H) -> u32;

impl Replay {
    pub(super) fn probe(&self, key: &str) -> Option<Answer> {
        let l = &self.lib;
        let (base, args) = split_key(key);
        let arg = |i: usize| args.get(i).copied();
        Some(match (base, args.len()) {
            ("GetGpuInstances", 1) => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetGpuInstances)?;
                let mut gis = [std::ptr::null_mut(); 8];
                let mut n = 0;
                // SAFETY: a handle, a plain integer, room for 8 instances and a count pointer.
                check(unsafe { f(self.dev, args[0], gis.as_mut_ptr(), &mut n) })?;
                Ok(json!(n))
            })(),
            ("GetGpuInstanceRemainingCapacity", 1) => {
                self.u32_at(&l.nvmlDeviceGetGpuInstanceRemainingCapacity, arg(0)?)
            }
            ("GetGpuInstanceById", 1) => self.handle_of(&l.nvmlDeviceGetGpuInstanceById, arg(0)?),
            ("GetMigDeviceHandleByIndex", 1) => {
                self.handle_of(&l.nvmlDeviceGetMigDeviceHandleByIndex, arg(0)?)
            }
            ("GetDeviceHandleFromMigDeviceHandle_self", 0) => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetDeviceHandleFromMigDeviceHandle)?;
                let mut out = std::ptr::null_mut();
                // SAFETY: a handle and a valid out-pointer.
                check(unsafe { f(self.dev, &mut out) })?;
                Ok(json!("<handle>"))
            })(),
            ("GetGpuInstanceId_self", 0) => self.u32_of(&l.nvmlDeviceGetGpuInstanceId),
            ("GetComputeInstanceId_self", 0) => self.u32_of(&l.nvmlDeviceGetComputeInstanceId),
            ("GpmMigSampleGet_gi1", 0) => self.gpm_mig_sample(),
            ("GetAccountingMode", 0) => self.u32_of(&l.nvmlDeviceGetAccountingMode),
            ("GetAccountingBufferSize", 0) => self.u32_of(&l.nvmlDeviceGetAccountingBufferSize),
            ("GetAccountingPids", 0) => self.accounting_pids(),
            ("GetProcessesUtilizationInfo", 1) => self.processes_utilization(u64::from(arg(0)?)),
            ("GetMarginTemperature", 0) => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetMarginTemperature)?;
                let version = std::mem::size_of::<nvmlMarginTemperature_t>() as u32 | 1 << 24;
                let mut m = nvmlMarginTemperature_t {
                    version,
                    marginTemperature: 0,
                };
                // SAFETY: a handle and a valid in/out pointer.
                check(unsafe { f(self.dev, &mut m) })?;
                Ok(json!(m.marginTemperature))
            })(),
            ("SystemGetProcessName_self", 0) => (|| -> Answer {
                let f = sym(&l.nvmlSystemGetProcessName)?;
                let mut buf = [0 as c_char; 1025];
                // SAFETY: `buf` has 1025 writable bytes; we announce 1024.
                check(unsafe { f(std::process::id(), buf.as_mut_ptr(), 1024) })?;
                Ok(text(&buf))
            })(),
            ("GetCpuAffinity", 0) => (|| -> Answer {
                let f = sym(&l.nvmlDeviceGetCpuAffinity)?;
                let mut set: [c_ulong; 4] = [0; 4];
                // SAFETY: a handle and an array of the 4 words announced.
                check(unsafe { f(self.dev, 4, set.as_mut_ptr()) })?;
                Ok(json!(set))
            })(),
            ("GetNumaNodeId", 0) => self.u32_of(&l.nvmlDeviceGetNumaNodeId),
            ("GetCurrentClocksEventReasons", 0) => {
                self.u64_of(&l.nvmlDeviceGetCurrentClocksEventReasons)
            }
            ("GetPowerSource", 0) => self.u32_of(&l.nvmlDeviceGetPowerSource),
            ("GetDefaultEccMode", 0) => self
                .u32_of(&l.nvmlDeviceGetDefaultEccMode)
                .map(|v| json!([v])),
            ("GetComputeMode", 0) => self.u32_of(&l.nvmlDeviceGetComputeMode),
            ("GetJpgUtilization", 0) => self.pair(&l.nvmlDeviceGetJpgUtilization),
            ("GetOfaUtilization", 0) => self.pair(&l.nvmlDeviceGetOfaUtilization),
            ("GetModuleId", 0) => self.u32_of(&l.nvmlDeviceGetModuleId),
            // pynvml returned the struct; `repr()` of a Python object is all the probe kept.
            ("SystemGetConfComputeState", 0) => (|| -> Answer {
                let f = sym(&l.nvmlSystemGetConfComputeState)?;
                let mut s = nvmlConfComputeSystemState_t {
                    environment: 0,
                    ccFeature: 0,
                    devToolsMode: 0,
                };
                // SAFETY: a valid out-pointer.
                check(unsafe { f(&mut s) })?;
                Ok(json!(format!(
                    "<c_nvmlConfComputeSystemState_t {} {} {}>",
                    s.environment, s.ccFeature, s.devToolsMode
                )))
            })(),
            ("GetHostVgpuMode", 0) => self.u32_of(&l.nvmlDeviceGetHostVgpuMode),
            ("GetSupportedEventTypes", 0) => self.u64_of(&l.nvmlDeviceGetSupportedEventTypes),
            _ => return None,
        })
    }

    /// A call that answers a handle (a GPU instance or MIG device), recorded as `"<handle>"`.
    fn handle_of<H>(&self, f: &Result<HandleAt<H>, libloading::Error>, n: c_uint) -> Answer {
        let f = sym(f)?;
        let mut out = std::ptr::null_mut();
        // SAFETY: a handle, a plain integer and a valid out-pointer.
        check(unsafe { f(self.dev, n, &mut out) })?;
        Ok(json!("<handle>"))
    }

    fn gpm_mig_sample(&self) -> Answer {
        let alloc = sym(&self.lib.nvmlGpmSampleAlloc)?;
        let free = sym(&self.lib.nvmlGpmSampleFree)?;
        let get = sym(&self.lib.nvmlGpmMigSampleGet)?;
        let mut sample = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the sample is freed below, whatever the answer.
        check(unsafe { alloc(&mut sample) })?;
        // SAFETY: a handle, a plain integer and the sample just allocated.
        let ret = unsafe { get(self.dev, 1, sample) };
        // SAFETY: the sample allocated above, freed once.
        unsafe { free(sample) };
        check(ret)?;
        Ok(json!("sampled"))
    }

    fn accounting_pids(&self) -> Answer {
        let size = self.u32_of(&self.lib.nvmlDeviceGetAccountingBufferSize)?;
        let f = sym(&self.lib.nvmlDeviceGetAccountingPids)?;
        let mut n = size.as_u64().unwrap_or(0) as c_uint;
        let mut pids = vec![0u32; n as usize];
        // SAFETY: `pids` has room for the `n` pids announced.
        check(unsafe { f(self.dev, &mut n, pids.as_mut_ptr()) })?;
        pids.truncate(n as usize);
        Ok(json!(pids))
    }

    fn processes_utilization(&self, since: u64) -> Answer {
        let f = sym(&self.lib.nvmlDeviceGetProcessesUtilizationInfo)?;
        let version = std::mem::size_of::<nvmlProcessesUtilizationInfo_t>() as u32 | 1 << 24;
        let mut info = nvmlProcessesUtilizationInfo_t {
            version,
            processSamplesCount: 0,
            lastSeenTimeStamp: since,
            procUtilArray: std::ptr::null_mut(),
        };
        // SAFETY: a handle and a valid in/out pointer whose array is NULL (a count probe).
        match unsafe { f(self.dev, &mut info) } {
            INSUFFICIENT_SIZE => {}
            code => return Err(code),
        }
        // SAFETY: plain data; all-zero bytes are a valid sample.
        let mut out = vec![unsafe { std::mem::zeroed() }; info.processSamplesCount as usize];
        info.procUtilArray = out.as_mut_ptr();
        // SAFETY: the array has room for the count announced.
        check(unsafe { f(self.dev, &mut info) })?;
        Ok(json!(out.len()))
    }

    /// `nvml_cost.py`'s row: the profile info (name included) and its placements.
    pub(super) fn mig_profile(&self, index: u32) -> Answer {
        let mut row = self.profile_info(index)?;
        let id = row["id"].as_u64().unwrap_or(u64::MAX) as u32;
        let f = sym(&self.lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2)?;
        let mut arr = [nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 16];
        let mut n = 16;
        // SAFETY: a handle, a plain integer, room for 16 placements and a count pointer.
        check(unsafe { f(self.dev, id, arr.as_mut_ptr(), &mut n) })?;
        let placements: Vec<Value> = arr[..n as usize]
            .iter()
            .map(|p| json!([p.start, p.size]))
            .collect();
        row["placements"] = Value::Array(placements);
        Ok(row)
    }

    pub(super) fn uuid_roundtrip(&self) -> Answer {
        let uuid = self.string_of(&self.lib.nvmlDeviceGetUUID, 96)?;
        let by_uuid = sym(&self.lib.nvmlDeviceGetHandleByUUID)?;
        let c = std::ffi::CString::new(uuid.as_str().unwrap_or_default()).map_err(|_| 2u32)?;
        let mut d = std::ptr::null_mut();
        // SAFETY: a NUL-terminated string and a valid out-pointer.
        check(unsafe { by_uuid(c.as_ptr(), &mut d) })?;
        self.index_of(d)
    }

    pub(super) fn bus_id_roundtrip(&self) -> Answer {
        let pci = self.device("GetPciInfo").unwrap_or(Err(2))?;
        let bus = pci["busId"].as_str().unwrap_or_default().to_owned();
        let by_bus = sym(&self.lib.nvmlDeviceGetHandleByPciBusId_v2)?;
        let c = std::ffi::CString::new(bus).map_err(|_| 2u32)?;
        let mut d = std::ptr::null_mut();
        // SAFETY: a NUL-terminated string and a valid out-pointer.
        check(unsafe { by_bus(c.as_ptr(), &mut d) })?;
        self.index_of(d)
    }

    fn index_of(&self, d: nvmlDevice_t) -> Answer {
        let f = sym(&self.lib.nvmlDeviceGetIndex)?;
        let mut i = 0;
        // SAFETY: a handle this library returned and a valid out-pointer.
        check(unsafe { f(d, &mut i) })?;
        Ok(json!(i))
    }

    /// Register for XIDs and wait 10 ms: a healthy GPU times out.
    pub(super) fn xid_wait(&self) -> Answer {
        let l = &self.lib;
        let (create, register, wait, free) = (
            sym(&l.nvmlEventSetCreate)?,
            sym(&l.nvmlDeviceRegisterEvents)?,
            sym(&l.nvmlEventSetWait_v2)?,
            sym(&l.nvmlEventSetFree)?,
        );
        let mut set = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the set is freed below.
        check(unsafe { create(&mut set) })?;
        // SAFETY: a handle, the XID mask and the set just created.
        let registered = check(unsafe { register(self.dev, 0x8, set) });
        // SAFETY: plain data; all-zero bytes (a NULL device) are a valid value to overwrite.
        let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
        // SAFETY: the set and a valid out-pointer.
        let waited = registered.and_then(|()| match unsafe { wait(set, &mut data, 10) } {
            0 => Ok(json!("event")),
            10 => Ok(json!("timeout")),
            code => Err(code),
        });
        // SAFETY: the set created above, freed once.
        unsafe { free(set) };
        waited
    }
}
