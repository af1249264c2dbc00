//! Idleness, decided from successive snapshots: a pure function with time as data.
//!
//! A *unit* is a whole GPU, or one MIG GPU instance of a GPU in MIG mode. It is **held** when
//! at least one process on it uses `min_memory` or more, and **idle** while it is held and
//! nothing shows activity: the GPU's utilization and every process's SM utilization are at or
//! below the threshold. Any activity resets the clock, and so does not knowing: a utilization
//! NVML did not give (a process listed since the last per-process read, an unsupported or
//! failed read) is not evidence of idleness, so the window starts again once it is known.
//!
//! The real driver's facts this rests on (a real H100, driver 580; docs/reclaim.md): per-process
//! utilization lists only processes with a sample, so an idle holder is absent there;
//! `gpu::processes` turns "absent although covered by the read" into 0 and "too new to have a
//! sample" into `None`, which is what this module sees. On MIG, NVML gives neither GPU nor
//! per-process utilization (nvml.h: not supported on MIG-enabled GPUs), so a MIG instance with
//! holders is always `Unknown`: never judged idle, never reclaimed; its held memory is still
//! reported.
//!
//! "Allocated but unused" (the kubelet allocated the GPU to a pod, and no process runs on it)
//! is tracked with its own clock, for reporting only: there is no process to act on.
//!
//! Nothing here reads the clock, procfs or NVML: the caller passes the snapshot and the start
//! time of each live pid (`None` for a pid that is gone or a zombie).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::snapshot::{GpuProcess, GpuSnapshot, GpuStatus, PodRef, Snapshot};

/// What idleness needs from `[reclaim]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdleConfig {
    /// Utilization at or below this ratio (0-1) is no activity.
    pub threshold: f64,
    /// A process holds the unit with at least this much GPU memory.
    pub min_memory_bytes: u64,
}

/// A whole GPU (`gpu_instance: None`) or one MIG GPU instance of it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct UnitKey {
    pub uuid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
}

impl std::fmt::Display for UnitKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.gpu_instance {
            Some(gi) => write!(f, "{}/gi{gi}", self.uuid),
            None => f.write_str(&self.uuid),
        }
    }
}

/// A process holding a unit, with who it belongs to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Holder {
    pub pid: u32,
    /// `/proc/PID/stat` start time when observed; `None` when the process is gone or a zombie.
    pub start_time: Option<u64>,
    pub memory_bytes: u64,
    pub sm_util_percent: Option<u32>,
    pub name: Option<String>,
    pub user: Option<String>,
    pub pod_uid: Option<String>,
    pub systemd_unit: Option<String>,
    pub slurm_job: Option<String>,
    /// The labels of its pod, from the container runtime (filled in by the stage when
    /// `exempt_pod_labels` needs them; `None`: not in a pod, or not known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_labels: Option<std::collections::BTreeMap<String, String>>,
    /// When this process (same pid and start time) was first seen holding the unit.
    #[serde(serialize_with = "crate::health::rfc3339")]
    pub since: SystemTime,
}

/// Where a unit stands at one snapshot.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum UnitState {
    /// Held, and something was busy at this snapshot.
    Active { reason: String },
    /// Held, and activity cannot be told (no utilization): the clock does not run.
    Unknown { reason: String },
    /// Held and idle since `since`.
    Idle {
        #[serde(serialize_with = "crate::health::rfc3339")]
        since: SystemTime,
    },
    /// No process, but the kubelet allocated the GPU to a pod, since `since` (report only).
    AllocatedUnused {
        #[serde(serialize_with = "crate::health::rfc3339")]
        since: SystemTime,
    },
}

/// One unit at one snapshot. Units that are neither held nor allocated are left out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnitStatus {
    pub key: UnitKey,
    pub gpu: u32,
    #[serde(flatten)]
    pub state: UnitState,
    pub holders: Vec<Holder>,
    pub held_memory_bytes: u64,
    pub pods: Vec<PodRef>,
}

impl UnitStatus {
    /// How long the unit has been idle at `now` (0 unless idle).
    pub fn idle_for(&self, now: SystemTime) -> Duration {
        match self.state {
            UnitState::Idle { since } => now.duration_since(since).unwrap_or_default(),
            _ => Duration::ZERO,
        }
    }
}

/// What is carried from one snapshot to the next, per unit.
#[derive(Debug, Default)]
struct Track {
    idle_since: Option<SystemTime>,
    unused_since: Option<SystemTime>,
    /// First sight of each holder by pid, with its start time when known: a pid seen with
    /// another start time is a new holder. An unknown start time (the process is gone, or
    /// reclaim was off and nothing was read) neither starts nor ends a holder.
    holders: HashMap<u32, (Option<u64>, SystemTime)>,
}

/// The idleness clocks of every unit.
#[derive(Debug, Default)]
pub struct IdleTracker {
    units: BTreeMap<UnitKey, Track>,
}

impl IdleTracker {
    /// Judges every unit of `snapshot` (taken at `snapshot.taken_at`) and advances the clocks.
    /// `starts` maps each live pid to its start time; a pid absent from it is gone.
    pub fn observe(
        &mut self,
        snapshot: &Snapshot,
        starts: &HashMap<u32, u64>,
        config: &IdleConfig,
    ) -> Vec<UnitStatus> {
        let now = snapshot.taken_at;
        let mut out = Vec::new();
        let mut next: BTreeMap<UnitKey, Track> = BTreeMap::new();
        for gpu in &snapshot.gpus {
            for (key, procs) in units_of(gpu) {
                let mut track = self.units.remove(&key).unwrap_or_default();
                if let Some(status) =
                    judge(gpu, key.clone(), &procs, starts, config, now, &mut track)
                {
                    out.push(status);
                    next.insert(key, track);
                }
            }
        }
        self.units = next;
        out
    }
}

/// The units of a readable GPU with their processes; none when the GPU or its process list
/// could not be read (the clocks of its units then start again, as for any unknown).
fn units_of(gpu: &GpuSnapshot) -> Vec<(UnitKey, Vec<&GpuProcess>)> {
    let (Some(id), GpuStatus::Up) = (&gpu.identity, &gpu.status) else {
        return Vec::new();
    };
    let Some(procs) = &gpu.reading.processes else {
        return Vec::new();
    };
    let key = |gi| UnitKey {
        uuid: id.uuid.clone(),
        gpu_instance: gi,
    };
    if gpu.reading.mig_mode_current == Some(true) {
        let mut by: BTreeMap<Option<u32>, Vec<&GpuProcess>> = BTreeMap::new();
        for p in procs {
            by.entry(p.gpu_instance_id).or_default().push(p);
        }
        by.into_iter().map(|(gi, ps)| (key(gi), ps)).collect()
    } else {
        vec![(key(None), procs.iter().collect())]
    }
}

fn judge(
    gpu: &GpuSnapshot,
    key: UnitKey,
    procs: &[&GpuProcess],
    starts: &HashMap<u32, u64>,
    config: &IdleConfig,
    now: SystemTime,
    track: &mut Track,
) -> Option<UnitStatus> {
    let mig = key.gpu_instance.is_some() || gpu.reading.mig_mode_current == Some(true);
    let pods = if mig {
        Vec::new()
    } else {
        gpu.reading.pods.clone()
    };
    let holding: Vec<&GpuProcess> = procs
        .iter()
        .copied()
        .filter(|p| p.used_memory_bytes.unwrap_or(0) >= config.min_memory_bytes.max(1))
        .collect();
    if holding.is_empty() {
        track.idle_since = None;
        track.holders.clear();
        if !procs.is_empty() || pods.is_empty() {
            track.unused_since = None;
            return None;
        }
        let since = *track.unused_since.get_or_insert(now);
        return Some(UnitStatus {
            key,
            gpu: gpu.index,
            state: UnitState::AllocatedUnused { since },
            holders: Vec::new(),
            held_memory_bytes: 0,
            pods,
        });
    }
    track.unused_since = None;
    let mut seen = HashMap::new();
    let holders: Vec<Holder> = holding
        .iter()
        .map(|p| {
            let start = starts.get(&p.pid).copied();
            let since = match track.holders.get(&p.pid) {
                Some((Some(old), _)) if start.is_some_and(|s| s != *old) => now,
                Some((old, since)) => {
                    seen.insert(p.pid, (start.or(*old), *since));
                    *since
                }
                None => now,
            };
            seen.entry(p.pid).or_insert((start, since));
            holder(p, start, since)
        })
        .collect();
    track.holders = seen;
    let state = match activity(gpu, procs, &holding, mig, config.threshold) {
        Some(state) => {
            track.idle_since = None;
            state
        }
        None => UnitState::Idle {
            since: *track.idle_since.get_or_insert(now),
        },
    };
    Some(UnitStatus {
        key,
        gpu: gpu.index,
        state,
        held_memory_bytes: holders.iter().map(|h| h.memory_bytes).sum(),
        holders,
        pods,
    })
}

/// `None` when the unit is idle; else why it is not (activity wins over not knowing).
fn activity(
    gpu: &GpuSnapshot,
    procs: &[&GpuProcess],
    holding: &[&GpuProcess],
    mig: bool,
    threshold: f64,
) -> Option<UnitState> {
    let busy = |percent: u32| f64::from(percent) / 100.0 > threshold;
    if !mig {
        if let Some(u) = gpu.reading.gpu_util_percent.filter(|u| busy(*u)) {
            return Some(UnitState::Active {
                reason: format!("GPU utilization {u}%"),
            });
        }
    }
    if let Some(p) = procs.iter().find(|p| p.sm_util_percent.is_some_and(busy)) {
        return Some(UnitState::Active {
            reason: format!(
                "process {} SM utilization {}%",
                p.pid,
                p.sm_util_percent.unwrap_or(0)
            ),
        });
    }
    if mig {
        return Some(UnitState::Unknown {
            reason: "NVML gives no utilization on a MIG instance".into(),
        });
    }
    if gpu.reading.gpu_util_percent.is_none() {
        return Some(UnitState::Unknown {
            reason: "GPU utilization was not read".into(),
        });
    }
    if let Some(p) = holding.iter().find(|p| p.sm_util_percent.is_none()) {
        return Some(UnitState::Unknown {
            reason: format!(
                "process {} has no utilization sample yet (listed since the last per-process read)",
                p.pid
            ),
        });
    }
    None
}

fn holder(p: &GpuProcess, start_time: Option<u64>, since: SystemTime) -> Holder {
    let info = p.info.as_deref();
    let attr = info.map(|i| &i.attribution);
    Holder {
        pid: p.pid,
        start_time,
        memory_bytes: p.used_memory_bytes.unwrap_or(0),
        sm_util_percent: p.sm_util_percent,
        name: info.map(|i| i.name.clone()),
        user: info.map(|i| i.user.clone()),
        pod_uid: attr.and_then(|a| a.pod_uid.clone()),
        systemd_unit: attr.and_then(|a| a.systemd_unit.clone()),
        slurm_job: attr.and_then(|a| a.slurm_job.clone()),
        pod_labels: None,
        since,
    }
}

#[cfg(test)]
#[path = "idle_tests.rs"]
mod tests;
