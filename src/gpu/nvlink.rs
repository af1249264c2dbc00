//! The NVLink and fabric reads of [`super::READS`]: link state and per-link errors at the slow
//! tier, the summed error and throughput counters every poll (one `nvmlDeviceGetFieldValues`
//! call), and the fabric info of Hopper and newer at the slow tier.
//!
//! Costs: on the measured H100 (driver 580, in a VM) `nvmlDeviceGetNvLinkState` answered
//! NOT_SUPPORTED in 9 µs and `nvmlDeviceGetFieldValues` took 14 µs of CPU for two fields
//! (`nvml-sim/costs/h100-driver-580.json`); bare-metal NVLink costs were not measured, so the
//! 18 state calls go to the slow tier with the 0.16 ms calls, and everything that moves fast is
//! one field-values call. A GPU whose link 0 answers NOT_SUPPORTED (a VM, a PCIe board) is
//! learned to have no NVLink once and costs nothing after.
//!
//! nvml-wrapper 0.13 sets no `scopeId` in its field-values call and does not wrap
//! `nvmlDeviceGetGpuFabricInfoV`: both are called through the raw symbols here.

use std::mem;
use std::time::Instant;

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::{
    field_id, nvmlFieldValue_t, nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfo_v3_t,
};

use super::GpuReader;
use crate::snapshot::{
    Fabric, FabricState, GpuReading, LinkErrors, NvLinkErrors, NvLinks, NvmlCode, ThroughputWindow,
};

/// `NVML_NVLINK_MAX_LINKS` (nvml.h, driver 580).
const MAX_LINKS: u32 = 18;
const STATE: &str = "nvmlDeviceGetNvLinkState";
const FIELDS: &str = "nvmlDeviceGetFieldValues";
const FABRIC: &str = "nvmlDeviceGetGpuFabricInfoV";
/// `NVML_STRUCT_VERSION(GpuFabricInfo, n)`: the struct's size | n << 24.
const FABRIC_V3: u32 = mem::size_of::<nvmlGpuFabricInfo_v3_t>() as u32 | 3 << 24;
const FABRIC_V2: u32 = mem::size_of::<nvmlGpuFabricInfo_v2_t>() as u32 | 2 << 24;
/// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`: a driver that knows only an older struct version.
const VERSION_MISMATCH: u32 = 25;

/// Slow tier: which links the board has and whether each is active, and their error counters.
pub(super) fn links(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    let mut active = Vec::new();
    for link in 0..MAX_LINKS {
        match r
            .log
            .probe_call(STATE, link, || d.link_wrapper_for(link).is_active())
        {
            Ok(a) => active.push(a),
            // Link 0 unsupported: no NVLink here; a link past the last: the board's count.
            Err(c) if c.is_unsupported() || c == NvmlCode::InvalidArgument => break,
            Err(_) => {
                // A link that answered before fails now: no reading this run (counted).
                out.nvlink = None;
                return;
            }
        }
    }
    if active.is_empty() {
        out.nvlink = None;
        return;
    }
    let mut wanted = Vec::new();
    for link in 0..active.len() as u32 {
        for f in PER_LINK {
            wanted.push((f, link));
        }
    }
    let values = field_values(r, d, &wanted);
    let per_link = values
        .map(|v| {
            v.chunks(PER_LINK.len())
                .map(|c| LinkErrors {
                    replay: c[0],
                    recovery: c[1],
                    crc: c[2],
                })
                .collect::<Vec<_>>()
        })
        .filter(|l| {
            l.iter()
                .any(|e| e.replay.is_some() || e.recovery.is_some() || e.crc.is_some())
        })
        .unwrap_or_default();
    let previous = out.nvlink.take().unwrap_or_default();
    out.nvlink = Some(NvLinks {
        active,
        per_link,
        ..previous
    });
}

/// `NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY`, `_RECOVERY`, `_CRC`, per link (`scopeId` = link).
const PER_LINK: [u32; 3] = [
    field_id::NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    field_id::NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    field_id::NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
];

/// Every poll, on a GPU with NVLink: the error totals and the data throughput counters.
pub(super) fn counters(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    let Some(links) = out.nvlink.as_ref().map(|n| n.active.len() as u32) else {
        return;
    };
    let mut wanted = vec![
        (field_id::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, 0),
        (field_id::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, 0),
        (field_id::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 0),
        (field_id::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, 0),
    ];
    // The throughput counters are per link (`scopeId` = link, nvml.h); the GPU's is their sum.
    for link in 0..links {
        wanted.push((field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link));
        wanted.push((field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link));
    }
    let values = field_values(r, d, &wanted);
    let now = Instant::now();
    let Some(n) = out.nvlink.as_mut() else { return };
    let before = n.total_kib().zip(n.sampled_at);
    let Some(v) = values else {
        n.errors = NvLinkErrors::default();
        (n.tx_bytes, n.rx_bytes) = (None, None);
        (n.sampled_at, n.window) = (None, None);
        return;
    };
    n.errors = NvLinkErrors {
        replay: v[0],
        recovery: v[1],
        crc_flit: v[2],
        crc_data: v[3],
    };
    let sum = |dir: usize| -> Option<u64> {
        v[4..]
            .iter()
            .skip(dir)
            .step_by(2)
            .try_fold(0u64, |acc, kib| Some(acc + (*kib)? * 1024))
    };
    n.tx_bytes = sum(0);
    n.rx_bytes = sum(1);
    n.sampled_at = n.total_kib().map(|_| now);
    n.window = match (before, n.total_kib()) {
        (Some((kib_before, at)), Some(kib_now)) => Some(ThroughputWindow {
            kib_before,
            kib_now,
            elapsed: now.saturating_duration_since(at),
        }),
        _ => None,
    };
}

/// Slow tier: the fabric info, on a GPU with NVLink (Hopper and newer answer; others and
/// drivers without the call answer NOT_SUPPORTED, learned once).
pub(super) fn fabric(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    if out.nvlink.is_none() {
        out.fabric = None;
        return;
    }
    out.fabric = r.log.read(FABRIC, || fabric_info(d)).flatten();
}

/// `None` inside when the driver answers with state NOT_SUPPORTED (0), as `nvidia-smi -q`
/// shows "N/A".
fn fabric_info(d: &Device) -> Result<Option<Fabric>, NvmlError> {
    let sym = nvml_sym(d.nvml().lib().nvmlDeviceGetGpuFabricInfoV.as_ref())?;
    // SAFETY: a plain C struct of integers and byte arrays, valid when zeroed.
    let mut info: nvmlGpuFabricInfo_v3_t = unsafe { mem::zeroed() };
    info.version = FABRIC_V3;
    // SAFETY: `d.handle()` is a live handle borrowed for the call, and `info` is a writable
    // `nvmlGpuFabricInfo_v3_t` whose `version` says so, as nvml.h requires.
    let mut ret = unsafe { sym(d.handle(), &mut info) };
    let mut v3 = true;
    if ret == VERSION_MISMATCH {
        info.version = FABRIC_V2;
        v3 = false;
        // SAFETY: as above; a v2 answer writes a prefix of the v3 struct (same layout up to
        // `healthMask`).
        ret = unsafe { sym(d.handle(), &mut info) };
    }
    nvml_try(ret)?;
    let state = match info.state {
        1 => FabricState::NotStarted,
        2 => FabricState::InProgress,
        3 => FabricState::Completed,
        _ => return Ok(None),
    };
    let u = info.clusterUuid;
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    Ok(Some(Fabric {
        state,
        error: nvml_try(info.status).err().map(|e| super::code(&e)),
        clique_id: info.cliqueId,
        cluster_uuid: format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        ),
        health_mask: Some(info.healthMask),
        health_summary: (v3 && info.healthSummary != 0).then_some(info.healthSummary),
    }))
}

/// One `nvmlDeviceGetFieldValues` call for (field, scope) pairs: each value, or `None` where
/// its slot failed (recorded per field, so an unsupported field is learned and a failing one
/// counted). `None` overall when the call itself failed.
fn field_values(r: &mut GpuReader, d: &Device, wanted: &[(u32, u32)]) -> Option<Vec<Option<u64>>> {
    if wanted.iter().all(|(f, _)| r.log.lacks(FIELDS, *f)) {
        return Some(vec![None; wanted.len()]);
    }
    let values = r.log.read(FIELDS, || raw_field_values(d, wanted))?;
    Some(
        values
            .iter()
            .map(|v| match value_u64(v) {
                Ok(x) => {
                    r.log.answered_at(FIELDS, v.fieldId);
                    Some(x)
                }
                Err(e) => {
                    r.log.fail_at(FIELDS, v.fieldId, &e);
                    None
                }
            })
            .collect(),
    )
}

fn raw_field_values(d: &Device, wanted: &[(u32, u32)]) -> Result<Vec<nvmlFieldValue_t>, NvmlError> {
    let sym = nvml_sym(d.nvml().lib().nvmlDeviceGetFieldValues.as_ref())?;
    let mut values: Vec<nvmlFieldValue_t> = wanted
        .iter()
        .map(|(field, scope)| {
            // SAFETY: a plain C struct of integers and a union of numbers, valid when zeroed.
            let mut v: nvmlFieldValue_t = unsafe { mem::zeroed() };
            v.fieldId = *field;
            v.scopeId = *scope;
            v
        })
        .collect();
    let count = i32::try_from(values.len()).map_err(|_| NvmlError::InvalidArg)?;
    // SAFETY: `d.handle()` is a live handle borrowed for the call; `values` holds `count`
    // initialised, writable `nvmlFieldValue_t`, as nvml.h requires.
    unsafe { nvml_try(sym(d.handle(), count, values.as_mut_ptr()))? };
    Ok(values)
}

/// A field's value as a count, read from the union member its `valueType` names.
fn value_u64(v: &nvmlFieldValue_t) -> Result<u64, NvmlError> {
    nvml_try(v.nvmlReturn)?;
    // SAFETY: NVML wrote the member that `valueType` names (nvmlValueType_t: 0 double, 1 uint,
    // 2 ulong, 3 ulonglong, 4 slonglong, 5 sint); every member is a plain number.
    let x = unsafe {
        match v.valueType {
            0 if v.value.dVal >= 0.0 => v.value.dVal as u64,
            1 => u64::from(v.value.uiVal),
            2 => v.value.ulVal,
            3 => v.value.ullVal,
            4 => u64::try_from(v.value.sllVal).map_err(|_| NvmlError::Unknown)?,
            5 => u64::try_from(v.value.siVal).map_err(|_| NvmlError::Unknown)?,
            _ => return Err(NvmlError::Unknown),
        }
    };
    Ok(x)
}
