//! What each job used: a report per owner (Slurm job, pod, systemd unit, user) of the GPUs it
//! held, for how long, how busy, its memory and energy, the XIDs and health conditions on its
//! GPUs while it held them, and the reclaim actions taken on it; as DCGM's job statistics
//! (`dcgmi stats -v -j`) give, for every owner the accounting knows.
//!
//! Built from what each poll already publishes (no NVML call of its own): the reclaim actor
//! folds every publication into [`Jobs`] after its own run, on the same blocking thread, with
//! the reclaim actions of that run. The owner of a process is the accounting's
//! ([`crate::reclaim::accounting::owner`]), and time, busy time and energy are integrated the
//! same way (each snapshot adds the time since the previous one, at most three poll intervals).
//!
//! Kept in the agent's state directory ([`file`]), read back at start, bounded: a report is kept
//! [`KEEP`] after its owner was last seen, and at most [`MAX_REPORTS`] (the least recently seen
//! go first). Served by `GET /api/v1/jobs/...` and `gpu-steward job report`.
//!
//! Must not: call NVML, act on anything, or hold its lock while writing the file.

pub mod file;
pub mod text;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::accounting::{owner, OwnerKind};
use super::stage::Acted;
use crate::publication::Published;
use crate::snapshot::GpuStatus;

/// A report is kept this long after its owner was last seen on a GPU.
pub const KEEP: Duration = Duration::from_secs(7 * 86_400);
/// At most this many reports are kept; beyond, the least recently seen are dropped first (so
/// either every report of the last [`KEEP`] is kept, or the newest [`MAX_REPORTS`] are).
pub const MAX_REPORTS: usize = 10_000;
/// Per report, at most this many XID, condition and reclaim entries each (an XID repeating on
/// a GPU is one entry with its count; a flood of distinct ones is cut here).
pub const MAX_ENTRIES: usize = 64;

/// Which owner a report is about: its kind, its name (job id, unit, user, pod name or UID),
/// and the pod's namespace (`""` otherwise).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub kind: OwnerKind,
    pub namespace: String,
    pub id: String,
}

impl Key {
    pub fn slurm(id: &str) -> Key {
        Key {
            kind: OwnerKind::SlurmJob,
            namespace: String::new(),
            id: id.into(),
        }
    }

    /// "Slurm job 12", "pod ns/name", "systemd unit x.service", "user alice".
    pub fn describe(&self) -> String {
        match self.kind {
            OwnerKind::SlurmJob => format!("Slurm job {}", self.id),
            OwnerKind::Pod if self.namespace.is_empty() => format!("pod UID {}", self.id),
            OwnerKind::Pod => format!("pod {}/{}", self.namespace, self.id),
            OwnerKind::SystemdUnit => format!("systemd unit {}", self.id),
            OwnerKind::User => format!("user {}", self.id),
        }
    }
}

/// A ratio's mean and maximum (0-1); `null` when never sampled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    pub mean: Option<f64>,
    pub max: Option<f64>,
}

/// A maximum in bytes; `null` when never read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MaxBytes {
    pub max: Option<u64>,
}

/// One GPU the owner held.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobGpu {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub held_seconds: f64,
    pub busy_seconds: f64,
    /// The part of `held_seconds` with a utilization sample (the mean is over it).
    pub sampled_seconds: f64,
    pub sm_utilization: Ratio,
    pub memory_used_bytes: MaxBytes,
    pub energy_joules: Option<f64>,
}

/// An XID on one of its GPUs while it held it: the first time, the last and how many.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XidSeen {
    pub xid: u64,
    pub gpu: u32,
    pub uuid: String,
    #[serde(with = "time")]
    pub time: SystemTime,
    #[serde(with = "time")]
    pub last: SystemTime,
    pub count: u64,
}

/// A health condition active on one of its GPUs while it held it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConditionSeen {
    pub condition: String,
    pub gpu: u32,
    pub uuid: String,
    /// The worst severity seen while it held the GPU.
    pub severity: crate::health::Status,
    /// When the condition was raised (it may be before the owner came).
    #[serde(with = "time")]
    pub since: SystemTime,
    /// The last poll it was active while the owner held the GPU.
    #[serde(with = "time")]
    pub last: SystemTime,
    pub reason: String,
}

/// A reclaim step taken on its processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReclaimSeen {
    #[serde(with = "time")]
    pub time: SystemTime,
    /// `warn` or `reclaim`.
    pub step: String,
    /// What the step does (`signal`, `hook`, `log`).
    pub action: String,
    pub dry_run: bool,
    pub gpu: u32,
    pub uuid: String,
    pub pids: Vec<u32>,
}

/// What one owner used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// `slurm_job`, `pod`, `systemd_unit` or `user`.
    pub kind: OwnerKind,
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub gpus: Vec<JobGpu>,
    #[serde(with = "time")]
    pub first_seen: SystemTime,
    #[serde(with = "time")]
    pub last_seen: SystemTime,
    /// GPU-seconds held, summed over its GPUs.
    pub held_seconds: f64,
    /// GPU-seconds busy: SM utilization (its processes' sum, at most 1) times time, summed.
    pub busy_seconds: f64,
    /// The part of `held_seconds` with a per-process utilization sample (which comes on the
    /// expensive tier, every 30 s by default): the busy share is over it.
    #[serde(default)]
    pub sampled_seconds: f64,
    pub sm_utilization: Ratio,
    pub memory_used_bytes: MaxBytes,
    pub energy_joules: Option<f64>,
    pub xids: Vec<XidSeen>,
    pub conditions: Vec<ConditionSeen>,
    pub reclaim_actions: Vec<ReclaimSeen>,
}

impl Report {
    pub fn key(&self) -> Key {
        Key {
            kind: self.kind,
            namespace: self.namespace.clone(),
            id: self.id.clone(),
        }
    }

    fn new(key: &Key, now: SystemTime) -> Report {
        Report {
            kind: key.kind,
            id: key.id.clone(),
            namespace: key.namespace.clone(),
            gpus: Vec::new(),
            first_seen: now,
            last_seen: now,
            held_seconds: 0.0,
            busy_seconds: 0.0,
            sampled_seconds: 0.0,
            sm_utilization: Ratio::default(),
            memory_used_bytes: MaxBytes::default(),
            energy_joules: None,
            xids: Vec::new(),
            conditions: Vec::new(),
            reclaim_actions: Vec::new(),
        }
    }

    /// The totals over its GPUs: sums of seconds and energy, the mean over sampled time, the
    /// maxima of the GPUs' maxima.
    fn summarize(&mut self) {
        let g = &self.gpus;
        self.held_seconds = g.iter().map(|g| g.held_seconds).sum();
        self.busy_seconds = g.iter().map(|g| g.busy_seconds).sum();
        let sampled: f64 = g.iter().map(|g| g.sampled_seconds).sum();
        self.sampled_seconds = sampled;
        self.sm_utilization = Ratio {
            mean: (sampled > 0.0).then(|| self.busy_seconds / sampled),
            max: g
                .iter()
                .filter_map(|g| g.sm_utilization.max)
                .reduce(f64::max),
        };
        self.memory_used_bytes.max = g.iter().filter_map(|g| g.memory_used_bytes.max).max();
        self.energy_joules = g
            .iter()
            .filter_map(|g| g.energy_joules)
            .reduce(|a, b| a + b);
    }

    /// Share of the held GPU time that was busy (0-1), as measured over the part of it that
    /// was sampled: busy ÷ sampled GPU-seconds. `None` before any utilization sample. (Held
    /// time also counts the polls before a process's first per-process sample, which would
    /// otherwise count as idle.)
    pub fn busy_share(&self) -> Option<f64> {
        (self.sampled_seconds > 0.0).then(|| self.busy_seconds / self.sampled_seconds)
    }

    /// Share of the held GPU time that had a utilization sample (0-1), when it held any.
    pub fn sampled_share(&self) -> Option<f64> {
        (self.held_seconds > 0.0).then(|| self.sampled_seconds / self.held_seconds)
    }
}

/// What one owner did on one GPU at one poll.
#[derive(Default)]
struct Holding {
    /// Summed SM utilization of its processes (0-1 each); `None` when none had a sample.
    share: Option<f64>,
    memory: Option<u64>,
    pids: Vec<u32>,
}

/// Every owner's report, and what the fold keeps between polls.
#[derive(Debug, Default)]
pub struct Jobs {
    reports: HashMap<Key, Report>,
    last: Option<SystemTime>,
    /// Per GPU UUID: the XID counts of the previous poll (counts are since the agent started).
    xid_counts: HashMap<String, BTreeMap<u64, u64>>,
    /// Changed since the last write.
    dirty: bool,
}

impl Jobs {
    pub fn from_reports(reports: Vec<Report>) -> Jobs {
        let mut jobs = Jobs {
            reports: reports.into_iter().map(|r| (r.key(), r)).collect(),
            ..Jobs::default()
        };
        jobs.prune(SystemTime::now());
        jobs
    }

    pub fn get(&self, key: &Key) -> Option<&Report> {
        self.reports.get(key)
    }

    pub fn len(&self) -> usize {
        self.reports.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reports.is_empty()
    }

    pub fn reports(&self) -> impl Iterator<Item = &Report> {
        self.reports.values()
    }

    /// Folds one publication in, with the reclaim steps taken on its snapshot.
    pub fn observe(&mut self, p: &Published, acts: &[Acted]) {
        let snapshot = &p.snapshot;
        let now = snapshot.taken_at;
        let dt = self
            .last
            .and_then(|l| now.duration_since(l).ok())
            .map(|d| d.min(p.interval * 3))
            .unwrap_or_default()
            .as_secs_f64();
        self.last = Some(now);
        let mut pids_of: HashMap<(u32, u32), Key> = HashMap::new();
        for gpu in &snapshot.gpus {
            let Some(identity) = &gpu.identity else {
                continue;
            };
            let uuid = identity.uuid.as_str();
            // New XIDs since the previous poll (counts only grow while the agent runs).
            let before = self.xid_counts.remove(uuid).unwrap_or_default();
            let new_xids: Vec<(u64, u64, SystemTime)> = gpu
                .xids
                .iter()
                .filter_map(|(xid, stat)| {
                    let n = stat.count.saturating_sub(*before.get(xid).unwrap_or(&0));
                    (n > 0).then_some((*xid, n, stat.last_seen))
                })
                .collect();
            self.xid_counts.insert(
                uuid.to_string(),
                gpu.xids.iter().map(|(x, s)| (*x, s.count)).collect(),
            );
            let (GpuStatus::Up, Some(procs)) = (&gpu.status, &gpu.reading.processes) else {
                continue;
            };
            let mut holders: BTreeMap<Key, Holding> = BTreeMap::new();
            for proc in procs {
                let k = owner(gpu, proc);
                let key = Key {
                    kind: k.kind,
                    namespace: k.namespace,
                    id: k.owner,
                };
                pids_of.insert((gpu.index, proc.pid), key.clone());
                let h = holders.entry(key).or_default();
                if let Some(sm) = proc.sm_util_percent {
                    *h.share.get_or_insert(0.0) += f64::from(sm) / 100.0;
                }
                if let Some(m) = proc.used_memory_bytes {
                    *h.memory.get_or_insert(0) += m;
                }
                h.pids.push(proc.pid);
            }
            if holders.is_empty() {
                continue;
            }
            let total: f64 = holders
                .values()
                .map(|h| h.share.unwrap_or(0.0).min(1.0))
                .sum();
            let joules = gpu.reading.power_mw.map(|mw| f64::from(mw) / 1000.0 * dt);
            let n = holders.len() as f64;
            let conditions = p
                .health
                .gpu(gpu.index)
                .map(|h| h.verdict.conditions.as_slice())
                .unwrap_or_default();
            for (key, h) in holders {
                let share = h.share.map(|s| s.min(1.0));
                let report = self
                    .reports
                    .entry(key.clone())
                    .or_insert_with(|| Report::new(&key, now));
                report.last_seen = now;
                let g = match report.gpus.iter().position(|g| g.uuid == uuid) {
                    Some(i) => &mut report.gpus[i],
                    None => {
                        report.gpus.push(JobGpu {
                            index: gpu.index,
                            uuid: uuid.to_string(),
                            model: identity.name.clone(),
                            held_seconds: 0.0,
                            busy_seconds: 0.0,
                            sampled_seconds: 0.0,
                            sm_utilization: Ratio::default(),
                            memory_used_bytes: MaxBytes::default(),
                            energy_joules: None,
                        });
                        report.gpus.sort_by_key(|g| g.index);
                        let i = report.gpus.iter().position(|g| g.uuid == uuid);
                        &mut report.gpus[i.unwrap_or_default()]
                    }
                };
                g.held_seconds += dt;
                if let Some(s) = share {
                    g.sampled_seconds += dt;
                    g.busy_seconds += dt * s;
                    g.sm_utilization.max = Some(g.sm_utilization.max.map_or(s, |m| m.max(s)));
                    if g.sampled_seconds > 0.0 {
                        g.sm_utilization.mean = Some(g.busy_seconds / g.sampled_seconds);
                    }
                }
                if let Some(m) = h.memory {
                    g.memory_used_bytes.max = Some(g.memory_used_bytes.max.map_or(m, |x| x.max(m)));
                }
                if let Some(j) = joules {
                    // As the accounting: by share of utilization, or equally when none computes.
                    let mine = if total > 0.0 {
                        j * share.unwrap_or(0.0) / total
                    } else {
                        j / n
                    };
                    *g.energy_joules.get_or_insert(0.0) += mine;
                }
                for &(xid, count, at) in &new_xids {
                    let room = report.xids.len() < MAX_ENTRIES;
                    match report
                        .xids
                        .iter_mut()
                        .find(|x| x.xid == xid && x.uuid == uuid)
                    {
                        Some(x) => {
                            x.count += count;
                            x.last = at;
                        }
                        None if room => report.xids.push(XidSeen {
                            xid,
                            gpu: gpu.index,
                            uuid: uuid.to_string(),
                            time: at,
                            last: at,
                            count,
                        }),
                        None => {}
                    }
                }
                for c in conditions {
                    let room = report.conditions.len() < MAX_ENTRIES;
                    match report
                        .conditions
                        .iter_mut()
                        .find(|x| x.condition == c.name && x.uuid == uuid && x.since == c.since)
                    {
                        Some(x) => {
                            x.last = now;
                            if c.severity > x.severity {
                                x.severity = c.severity;
                                x.reason = c.reason.clone();
                            }
                        }
                        None if room => report.conditions.push(ConditionSeen {
                            condition: c.name.clone(),
                            gpu: gpu.index,
                            uuid: uuid.to_string(),
                            severity: c.severity,
                            since: c.since,
                            last: now,
                            reason: c.reason.clone(),
                        }),
                        None => {}
                    }
                }
                report.summarize();
            }
            self.dirty = true;
        }
        for act in acts {
            let mut by_owner: BTreeMap<&Key, Vec<u32>> = BTreeMap::new();
            for pid in &act.pids {
                if let Some(k) = pids_of.get(&(act.gpu, *pid)) {
                    by_owner.entry(k).or_default().push(*pid);
                }
            }
            for (key, pids) in by_owner {
                if let Some(r) = self.reports.get_mut(key) {
                    if r.reclaim_actions.len() < MAX_ENTRIES {
                        r.reclaim_actions.push(ReclaimSeen {
                            time: act.at,
                            step: act.step.to_string(),
                            action: act.action.to_string(),
                            dry_run: act.dry_run,
                            gpu: act.gpu,
                            uuid: act.uuid.clone(),
                            pids,
                        });
                        self.dirty = true;
                    }
                }
            }
        }
        if self.reports.len() > MAX_REPORTS {
            self.prune(now);
        }
    }

    /// Drops reports last seen more than [`KEEP`] before `now`, then the least recently seen
    /// beyond [`MAX_REPORTS`].
    pub fn prune(&mut self, now: SystemTime) {
        let before = self.reports.len();
        self.reports.retain(|_, r| {
            now.duration_since(r.last_seen).is_ok_and(|age| age <= KEEP) || r.last_seen > now
        });
        if self.reports.len() > MAX_REPORTS {
            let mut seen: Vec<(SystemTime, Key)> = self
                .reports
                .values()
                .map(|r| (r.last_seen, r.key()))
                .collect();
            seen.sort_unstable();
            let drop = seen.len() - MAX_REPORTS;
            for (_, k) in seen.into_iter().take(drop) {
                self.reports.remove(&k);
            }
        }
        if self.reports.len() != before {
            self.dirty = true;
        }
    }
}

/// The reports, shared by the reclaim actor (which folds and writes) and the HTTP handlers.
#[derive(Debug, Clone, Default)]
pub struct Shared(Arc<Mutex<Jobs>>);

impl Shared {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Jobs> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One report, copied out.
    pub fn get(&self, key: &Key) -> Option<Report> {
        self.lock().get(key).cloned()
    }
}

/// Where the reports are kept, and the writer's state.
#[derive(Debug)]
pub struct Store {
    pub shared: Shared,
    pub dir: Option<PathBuf>,
    last_write: Option<std::time::Instant>,
    failing: bool,
}

impl Store {
    /// The store over `dir`; nothing is read until [`Store::load`].
    pub fn new(shared: Shared, dir: Option<PathBuf>) -> Store {
        Store {
            shared,
            dir,
            last_write: None,
            failing: false,
        }
    }

    /// Reads back what a previous run kept (problems logged and set as the `jobs` warning).
    pub fn load(&self) {
        let Some(dir) = &self.dir else {
            tracing::info!("no state directory: job reports are kept in memory only");
            return;
        };
        let (reports, problems) = file::load(dir);
        for p in &problems {
            tracing::warn!("{p}");
        }
        crate::warnings::set(
            file::COMPONENT,
            (!problems.is_empty()).then(|| problems.join("; ")),
        );
        tracing::info!(reports = reports.len(), file = %dir.join(file::FILE_NAME).display(), "job reports read back");
        *self.shared.lock() = Jobs::from_reports(reports);
    }

    /// Folds a publication in; writes the file when `every` has passed (or `now`) and
    /// something changed.
    pub fn observe(&mut self, p: &Published, acts: &[Acted], every: Duration) {
        self.shared.lock().observe(p, acts);
        self.persist(every, false);
    }

    /// Writes the file when due (always when `now`) and changed. The reports are serialized
    /// under the lock and written without it.
    pub fn persist(&mut self, every: Duration, now: bool) {
        let Some(dir) = &self.dir else {
            return;
        };
        let due = self.last_write.is_none_or(|t| t.elapsed() >= every);
        if !(now || due) {
            return;
        }
        let body = {
            let mut jobs = self.shared.lock();
            if !jobs.dirty {
                return;
            }
            jobs.prune(SystemTime::now());
            jobs.dirty = false;
            file::serialize(jobs.reports())
        };
        self.last_write = Some(std::time::Instant::now());
        match file::save(dir, &body) {
            Ok(()) if std::mem::take(&mut self.failing) => {
                tracing::info!(dir = %dir.display(), "job reports can be written again");
                crate::warnings::set(file::COMPONENT, None);
            }
            Ok(()) => {}
            Err(e) => {
                // Written again at the next due time, whole.
                self.shared.lock().dirty = true;
                if !self.failing {
                    self.failing = true;
                    let text = format!(
                        "cannot write the job reports '{}' ({e}): reports from now on will not \
                         outlive a restart; free space or fix the state directory",
                        dir.join(file::FILE_NAME).display()
                    );
                    tracing::warn!("{text}");
                    crate::warnings::set(file::COMPONENT, Some(text));
                }
            }
        }
    }
}

/// RFC 3339 with milliseconds, as the rest of the API writes times.
mod time {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::SystemTime;

    pub fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_rfc3339_millis(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_rfc3339_weak(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests;
