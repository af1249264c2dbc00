//! The processes on a GPU: the running-process lists (cheap, every poll) joined with
//! per-process utilization (`nvmlDeviceGetProcessUtilization`, 2.8 ms of CPU on an H100: the
//! slow tier).
//!
//! How the real driver answers utilization (H100, driver 580): one sample per active process
//! per second; only processes with a sample newer than `lastSeenTimeStamp` are listed; NOT_FOUND
//! when there is none. So a process that holds memory and computes nothing is absent, not 0.
//! The cursor keeps the newest sample per pid, and the join says: a process listed at the last
//! utilization read with no recent sample was idle (0); one that started since that read has
//! no utilization yet (absent), rather than a made-up 0.

use std::collections::{HashMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::Device;

use super::GpuReader;
use crate::snapshot::{GpuProcess, GpuReading, ProcessKind};

/// A sample older than this at the time of the read means the process was idle: three of the
/// driver's one-second sampling periods.
const IDLE_AFTER_US: u64 = 3_000_000;
/// A process listed for less than this at a utilization read may have had no sampling period
/// yet: no sample then says nothing, and its utilization stays absent rather than 0.
const SAMPLED_AFTER_US: u64 = 2_000_000;

/// Per-GPU state of `nvmlDeviceGetProcessUtilization`, which returns only samples newer than
/// the caller's last-seen timestamp.
#[derive(Debug, Default, Clone)]
pub(super) struct ProcessCursor {
    /// CPU timestamp (µs) of the newest sample seen.
    last_seen_us: u64,
    /// Newest (sm, mem, timestamp) per pid.
    latest: HashMap<u32, (u32, u32, u64)>,
    /// The pids listed long enough before the last successful utilization read to have had
    /// a sample, and when that read was.
    covered: HashSet<u32>,
    read_at_us: Option<u64>,
    /// When each running pid was first listed.
    listed_since: HashMap<u32, u64>,
}

pub(super) fn list(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    let compute = r.log.read("nvmlDeviceGetComputeRunningProcesses_v3", || {
        d.running_compute_processes()
    });
    let graphics = r.log.read("nvmlDeviceGetGraphicsRunningProcesses_v3", || {
        d.running_graphics_processes()
    });
    out.processes = (compute.is_some() || graphics.is_some()).then(|| merge(compute, graphics));
    let now = now_us();
    let listed = &mut r.cursor.listed_since;
    let running: HashSet<u32> = out.processes.iter().flatten().map(|p| p.pid).collect();
    listed.retain(|pid, _| running.contains(pid));
    for pid in running {
        listed.entry(pid).or_insert(now);
    }
    join(&r.cursor, r.mig == Some(true), out);
}

pub(super) fn utilization(r: &mut GpuReader, d: &Device, out: &mut GpuReading) {
    // Not supported on MIG-enabled GPUs (nvml.h): not asked there.
    if r.mig == Some(true) {
        join(&r.cursor, true, out);
        return;
    }
    let since = r.cursor.last_seen_us;
    let samples = r.log.call("nvmlDeviceGetProcessUtilization", || {
        match d.process_utilization_stats(since) {
            // No sample newer than the last one seen: no process was active.
            Err(NvmlError::NotFound) => Ok(Vec::new()),
            other => other,
        }
    });
    let c = &mut r.cursor;
    match samples {
        Ok(samples) => {
            // Several samples per process may come, in no promised order: keep the newest.
            for s in samples {
                c.last_seen_us = c.last_seen_us.max(s.timestamp);
                if c.latest.get(&s.pid).is_none_or(|l| s.timestamp >= l.2) {
                    c.latest.insert(s.pid, (s.sm_util, s.mem_util, s.timestamp));
                }
            }
            let now = now_us();
            c.latest.retain(|_, l| l.2 + IDLE_AFTER_US >= now);
            let listed = &c.listed_since;
            c.covered = out
                .processes
                .iter()
                .flatten()
                .map(|p| p.pid)
                .filter(|pid| listed.get(pid).is_some_and(|t| t + SAMPLED_AFTER_US <= now))
                .collect();
            c.read_at_us = Some(now);
        }
        Err(_) => {
            *c = ProcessCursor {
                listed_since: std::mem::take(&mut c.listed_since),
                ..ProcessCursor::default()
            }
        }
    }
    join(&r.cursor, false, out);
}

/// Fills utilization into the process list from what the last utilization read saw.
fn join(cursor: &ProcessCursor, mig: bool, out: &mut GpuReading) {
    for p in out.processes.iter_mut().flatten() {
        let util = if mig || cursor.read_at_us.is_none() || !cursor.covered.contains(&p.pid) {
            None
        } else {
            Some(cursor.latest.get(&p.pid).map_or((0, 0), |l| (l.0, l.1)))
        };
        p.sm_util_percent = util.map(|u| u.0);
        p.mem_util_percent = util.map(|u| u.1);
    }
}

/// One entry per process: a process in both lists (same MIG instance, if any) is nvidia-smi's
/// "C+G", not two series.
fn merge(compute: Option<Vec<ProcessInfo>>, graphics: Option<Vec<ProcessInfo>>) -> Vec<GpuProcess> {
    let mut out: Vec<GpuProcess> = Vec::new();
    let kinds = [
        (compute, ProcessKind::Compute),
        (graphics, ProcessKind::Graphics),
    ];
    for (list, kind) in kinds {
        for p in list.unwrap_or_default() {
            let new = process(&p, kind);
            match out.iter_mut().find(|o| {
                o.pid == new.pid
                    && o.gpu_instance_id == new.gpu_instance_id
                    && o.compute_instance_id == new.compute_instance_id
            }) {
                Some(o) => {
                    if o.kind != new.kind {
                        o.kind = ProcessKind::ComputeAndGraphics;
                    }
                    o.used_memory_bytes = o.used_memory_bytes.max(new.used_memory_bytes);
                }
                None => out.push(new),
            }
        }
    }
    out.sort_by_key(|p| p.pid);
    out
}

fn process(p: &ProcessInfo, kind: ProcessKind) -> GpuProcess {
    GpuProcess {
        pid: p.pid,
        kind,
        used_memory_bytes: match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        },
        sm_util_percent: None,
        mem_util_percent: None,
        gpu_instance_id: p.gpu_instance_id,
        compute_instance_id: p.compute_instance_id,
        info: None,
    }
}

/// Samples carry CPU timestamps in µs since the epoch.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
