//! Builders of snapshots for the unit tests of this module: chosen instants, no sleeping.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::snapshot::{
    Attribution, GpuIdentity, GpuProcess, GpuReading, GpuSnapshot, GpuStatus, NvmlStatus, PodRef,
    ProcessInfo, ProcessKind, Snapshot,
};

pub const MIB: u64 = 1024 * 1024;

pub fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
}

pub fn gpu(index: u32, util: Option<u32>, procs: Vec<GpuProcess>) -> GpuSnapshot {
    let id = GpuIdentity {
        index,
        uuid: format!("GPU-{index}"),
        ..GpuIdentity::default()
    };
    GpuSnapshot {
        index,
        identity: Some(Arc::new(id)),
        status: GpuStatus::Up,
        reading: GpuReading {
            gpu_util_percent: util,
            power_mw: Some(100_000),
            processes: Some(procs),
            ..GpuReading::default()
        },
        failed_calls: 0,
        failing_runs: 0,
        xids: BTreeMap::new(),
        last_xid: None,
    }
}

pub fn proc(pid: u32, mib: u64, sm: Option<u32>) -> GpuProcess {
    GpuProcess {
        pid,
        kind: ProcessKind::Compute,
        used_memory_bytes: Some(mib * MIB),
        sm_util_percent: sm,
        mem_util_percent: sm,
        gpu_instance_id: None,
        compute_instance_id: None,
        info: Some(Arc::new(ProcessInfo {
            name: format!("p{pid}"),
            user: "alice".into(),
            attribution: Attribution::default(),
        })),
    }
}

pub fn with_info(
    mut p: GpuProcess,
    name: &str,
    user: &str,
    attribution: Attribution,
) -> GpuProcess {
    p.info = Some(Arc::new(ProcessInfo {
        name: name.into(),
        user: user.into(),
        attribution,
    }));
    p
}

pub fn pod(namespace: &str, name: &str) -> PodRef {
    PodRef {
        namespace: namespace.into(),
        pod: name.into(),
        container: "main".into(),
        replica: None,
    }
}

pub fn snap(t: u64, gpus: Vec<GpuSnapshot>) -> Snapshot {
    let mut s = Snapshot::starting(at(t));
    s.nvml = NvmlStatus::Up;
    s.gpus = gpus;
    s
}

/// Every pid of the snapshot alive, with start time = pid * 10.
pub fn alive(s: &Snapshot) -> HashMap<u32, u64> {
    s.gpus
        .iter()
        .flat_map(|g| g.reading.processes.iter().flatten())
        .map(|p| (p.pid, u64::from(p.pid) * 10))
        .collect()
}
