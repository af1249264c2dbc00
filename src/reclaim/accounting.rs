//! Accounting for chargeback: per GPU and owner, held seconds, busy seconds (weighted by SM
//! utilization) and energy (attributed by share of utilization); per GPU, idle-held seconds.
//!
//! Integrated at poll resolution: each snapshot adds its own state over the time since the
//! previous snapshot (capped at three poll intervals, so a stalled poller or a wall-clock
//! step never invents hours). Time the agent was not running is not counted: after a restart
//! the first snapshot only sets the clock.
//!
//! - **held**: every process NVML lists on the GPU makes its owner hold it (one count per
//!   owner, however many processes);
//! - **busy**: the owner's summed SM utilization (capped at 1) times the interval;
//! - **energy**: power × interval, split by the owners' shares of SM utilization, or equally
//!   among the holders when none computes (idle power of a held GPU is its holders' cost);
//!   energy of a GPU nobody holds is nobody's;
//! - **idle-held**: the interval, when the idleness rule of [`super::idle`] says idle.
//!
//! Owner: the pod (namespace and name when the kubelet allocated the GPU to one pod, else the
//! pod UID), else the Slurm job (its processes also sit in `slurmstepd.scope`, so the job is the
//! more specific), else the systemd unit, else the user; `unknown` when procfs could not be
//! read. Counters persist in `STATE_FILE` under `[accounting] state_dir`, rewritten atomically
//! (temporary file, fsync, rename), so that they stay exact across agent restarts.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::idle::{UnitState, UnitStatus};
use crate::snapshot::{GpuProcess, GpuSnapshot, GpuStatus, Snapshot};

/// The state file's name inside `state_dir`.
pub const STATE_FILE: &str = crate::config::reclaim::ACCOUNTING_STATE_FILE;
const VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OwnerKind {
    Pod,
    SystemdUnit,
    SlurmJob,
    User,
}

impl OwnerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OwnerKind::Pod => "pod",
            OwnerKind::SystemdUnit => "systemd_unit",
            OwnerKind::SlurmJob => "slurm_job",
            OwnerKind::User => "user",
        }
    }
}

/// One owner on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OwnerKey {
    pub gpu: u32,
    pub uuid: String,
    pub kind: OwnerKind,
    pub owner: String,
    /// Pods only (`""` otherwise, and for a pod known by UID alone).
    pub namespace: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    pub held_seconds: f64,
    pub busy_seconds: f64,
    pub energy_joules: f64,
    /// Unix seconds of the last poll this owner held the GPU (for forgetting).
    pub last_held: u64,
}

/// What is persisted.
#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    version: u32,
    owners: Vec<(OwnerKey, Totals)>,
    /// (gpu, uuid) → idle-held seconds.
    idle_held: Vec<((u32, String), f64)>,
}

/// The counters.
#[derive(Debug, Default)]
pub struct Accounts {
    pub owners: BTreeMap<OwnerKey, Totals>,
    pub idle_held: BTreeMap<(u32, String), f64>,
    last: Option<SystemTime>,
}

impl Accounts {
    /// Adds `snapshot`'s interval. `units` are the idleness verdicts of the same snapshot.
    pub fn add(
        &mut self,
        snapshot: &Snapshot,
        units: &[UnitStatus],
        interval: Duration,
        forget_after: Duration,
    ) {
        let now = snapshot.taken_at;
        let dt = self
            .last
            .and_then(|l| now.duration_since(l).ok())
            .map(|d| d.min(interval * 3))
            .unwrap_or_default();
        self.last = Some(now);
        let unix = unix(now);
        if !dt.is_zero() {
            for gpu in &snapshot.gpus {
                self.add_gpu(gpu, dt.as_secs_f64(), unix);
            }
            let idle: HashSet<&str> = units
                .iter()
                .filter(|u| u.key.gpu_instance.is_none())
                .filter(|u| matches!(u.state, UnitState::Idle { .. }))
                .map(|u| u.key.uuid.as_str())
                .collect();
            for gpu in snapshot.gpus.iter().filter(|g| g.identity.is_some()) {
                // Every GPU gets its series from the start, so that increase() sees it begin.
                let total = self
                    .idle_held
                    .entry((gpu.index, gpu.uuid().to_string()))
                    .or_default();
                if idle.contains(gpu.uuid()) {
                    *total += dt.as_secs_f64();
                }
            }
        }
        let keep = forget_after.as_secs();
        self.owners
            .retain(|_, t| unix.saturating_sub(t.last_held) <= keep);
    }

    fn add_gpu(&mut self, gpu: &GpuSnapshot, dt: f64, unix: u64) {
        let (GpuStatus::Up, Some(procs)) = (&gpu.status, &gpu.reading.processes) else {
            return;
        };
        if gpu.identity.is_none() || procs.is_empty() {
            return;
        }
        let mut shares: BTreeMap<OwnerKey, f64> = BTreeMap::new();
        for p in procs {
            let share = f64::from(p.sm_util_percent.unwrap_or(0)) / 100.0;
            *shares.entry(owner(gpu, p)).or_default() += share;
        }
        let total: f64 = shares.values().map(|s| s.min(1.0)).sum();
        let joules = gpu.reading.power_mw.map(|mw| f64::from(mw) / 1000.0 * dt);
        let n = shares.len() as f64;
        for (key, share) in shares {
            let share = share.min(1.0);
            let t = self.owners.entry(key).or_default();
            t.held_seconds += dt;
            t.busy_seconds += dt * share;
            if let Some(j) = joules {
                t.energy_joules += if total > 0.0 {
                    j * share / total
                } else {
                    j / n
                };
            }
            t.last_held = unix;
        }
    }

    /// Reads `dir/STATE_FILE`; a missing file is an empty start.
    pub fn load(dir: &Path) -> std::io::Result<Accounts> {
        let path = dir.join(STATE_FILE);
        // The agent writes this file too: a link planted here is refused, not followed, and a
        // FIFO or a huge file is an error (the file is then moved aside), never a hang or OOM.
        let text = match crate::bounded::read(&path, crate::bounded::Limits::own(MAX_STATE_FILE)) {
            Ok(t) => t,
            Err(e) if e.is_not_found() => return Ok(Accounts::default()),
            Err(e) => return Err(e.into()),
        };
        let state: State = serde_json::from_slice(&text).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })?;
        if state.version != VERSION {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: version {} is not {VERSION}; move the file aside to start from 0",
                    path.display(),
                    state.version
                ),
            ));
        }
        if let Some(why) = implausible(&state) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {why}", path.display()),
            ));
        }
        Ok(Accounts {
            owners: state.owners.into_iter().collect(),
            idle_held: state.idle_held.into_iter().collect(),
            last: None,
        })
    }

    /// Writes `dir/STATE_FILE` atomically: a temporary file, fsynced, renamed over it.
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        use std::io::Write;
        std::fs::create_dir_all(dir)?;
        let state = State {
            version: VERSION,
            owners: self.owners.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            idle_held: self
                .idle_held
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        };
        let body = serde_json::to_vec(&state).map_err(std::io::Error::other)?;
        let tmp = dir.join(format!(".{STATE_FILE}.tmp"));
        // Never written through a link planted at the temporary name: removed, then made anew.
        let _ = std::fs::remove_file(&tmp);
        let mut f = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&tmp)?
        };
        f.write_all(&body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(STATE_FILE))?;
        // The rename itself is durable once the directory is synced.
        std::fs::File::open(dir)?.sync_all()
    }
}

/// The largest accounting state read back: a few hundred bytes per pod that held a GPU, so
/// 16 MiB is tens of thousands of pods; a larger file is not ours.
const MAX_STATE_FILE: u64 = 16 << 20;

/// A century of seconds: more than any counter of this agent can have added up.
const MAX_SECONDS: f64 = 100.0 * 365.25 * 86_400.0;
/// A century at 3 kW: more energy than any one GPU can have drawn.
const MAX_JOULES: f64 = MAX_SECONDS * 3_000.0;

/// Why the read-back counters cannot be ours (negative, not finite, or beyond a century), if
/// so: served as they are they would be counters that go backwards or absurd dashboards.
fn implausible(state: &State) -> Option<String> {
    let bad = |what: &str, v: f64, max: f64| {
        (!(v.is_finite() && (0.0..=max).contains(&v)))
            .then(|| format!("{what} {v} is not a plausible total (0 to {max:e})"))
    };
    for (k, t) in &state.owners {
        let who = format!("owner '{}' on GPU {}", k.owner, k.gpu);
        let found = bad(&format!("{who}: held_seconds"), t.held_seconds, MAX_SECONDS)
            .or_else(|| bad(&format!("{who}: busy_seconds"), t.busy_seconds, MAX_SECONDS))
            .or_else(|| {
                bad(
                    &format!("{who}: energy_joules"),
                    t.energy_joules,
                    MAX_JOULES,
                )
            });
        if found.is_some() {
            return found;
        }
    }
    state
        .idle_held
        .iter()
        .find_map(|((gpu, _), v)| bad(&format!("GPU {gpu}: idle-held seconds"), *v, MAX_SECONDS))
}

/// Who a process on `gpu` belongs to.
pub fn owner(gpu: &GpuSnapshot, p: &GpuProcess) -> OwnerKey {
    let key = |kind, owner: &str, namespace: &str| OwnerKey {
        gpu: gpu.index,
        uuid: gpu.uuid().to_string(),
        kind,
        owner: owner.to_string(),
        namespace: namespace.to_string(),
    };
    let Some(info) = p.info.as_deref() else {
        return key(OwnerKind::User, "unknown", "");
    };
    let a = &info.attribution;
    if let Some(uid) = &a.pod_uid {
        let mut pods: Vec<(&str, &str)> = gpu
            .reading
            .pods
            .iter()
            .map(|p| (p.namespace.as_str(), p.pod.as_str()))
            .collect();
        pods.sort_unstable();
        pods.dedup();
        return match pods.as_slice() {
            [(ns, pod)] => key(OwnerKind::Pod, pod, ns),
            _ => key(OwnerKind::Pod, uid, ""),
        };
    }
    if let Some(job) = &a.slurm_job {
        return key(OwnerKind::SlurmJob, job, "");
    }
    if let Some(unit) = &a.systemd_unit {
        return key(OwnerKind::SystemdUnit, unit, "");
    }
    let user = if info.user.is_empty() {
        "unknown"
    } else {
        &info.user
    };
    key(OwnerKind::User, user, "")
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

#[cfg(test)]
#[path = "accounting_tests.rs"]
mod tests;
