//! What reclaim does with each snapshot: idleness, accounting, the ladder, and the dispatch of
//! its decisions. It owns everything reclaim keeps across polls and makes a [`View`] of each run
//! for `/metrics`, `/health` and `/api/v1/reclaim`.
//!
//! The reclaim actor ([`super::task`]) runs it on a blocking thread, one run per publication:
//! procfs reads are one `stat` per holder, audit records are rare, and hooks and signals run on
//! threads of their own ([`super::act`]).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::audit::event::Reclaim;

use super::accounting::{Accounts, OwnerKey, Totals};
use super::act::{ActionCounts, Actor};
use super::idle::{IdleConfig, IdleTracker, UnitState, UnitStatus};
use super::ladder::{self, Decision, Ladder, Next, Undo};
use crate::changes::Owner;
use crate::config::reclaim::{AccountingConfig, ReclaimConfig};
use crate::health::conditions::{finding, Finding};
use crate::health::{Action, Status};
use crate::snapshot::Snapshot;

/// Health condition of a GPU held idle for `idle_after`.
pub const IDLE_HELD: &str = "idle_held";
/// Health condition of a GPU allocated to a pod that runs nothing on it for `idle_after`.
pub const ALLOCATED_UNUSED: &str = "allocated_unused";

/// What the stage needs from the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub reclaim: ReclaimConfig,
    /// Pod labels from the container runtime, when `exempt_pod_labels` needs them.
    pub pod_labels: Option<super::cri::PodLabelFeed>,
    pub accounting: AccountingConfig,
    pub audit_file: PathBuf,
    pub procfs: PathBuf,
    pub interval: Duration,
    /// Where the job reports are kept (the agent's state directory); `None`: in memory only.
    pub jobs_dir: Option<PathBuf>,
}

/// A warn or reclaim step recorded on a unit's holders in one run (the job reports list it).
#[derive(Debug, Clone, PartialEq)]
pub struct Acted {
    pub at: SystemTime,
    pub gpu: u32,
    pub uuid: String,
    /// `warn` or `reclaim`.
    pub step: &'static str,
    /// What the step does: `[reclaim] action` for a reclaim, `hook` or `log` for a warning.
    pub action: &'static str,
    pub dry_run: bool,
    pub pids: Vec<u32>,
}

/// One unit as `/api/v1/reclaim` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Candidate {
    #[serde(flatten)]
    pub unit: UnitStatus,
    pub idle_seconds: f64,
    /// Per holder: why it is exempt (`null` when it is not).
    pub exempt: Vec<Option<String>>,
    /// The pids the next warn or reclaim would act on.
    pub targets: Vec<u32>,
    pub next: Option<Next>,
    /// Why `next` is `null`: set exactly when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_next: Option<String>,
}

/// What the stage publishes with each snapshot.
#[derive(Debug, Clone)]
pub struct View {
    pub taken_at: SystemTime,
    pub config: ReclaimConfig,
    /// Dry run in force: configured, or forced because the audit log cannot be written.
    pub dry_run: bool,
    pub audit: Result<PathBuf, String>,
    pub units: Vec<UnitStatus>,
    pub candidates: Vec<Candidate>,
    pub reclaims_last_hour: usize,
    /// The container runtime's pod labels: (answering, failed reads, socket).
    pub pod_labels: Option<(bool, u64, PathBuf)>,
    pub actions: BTreeMap<(&'static str, &'static str), u64>,
    pub accounting: bool,
    pub owners: BTreeMap<OwnerKey, Totals>,
    pub idle_held: BTreeMap<(u32, String), f64>,
    pub state_write_errors: u64,
    /// The warn and reclaim steps recorded in this run.
    pub acts: Vec<Acted>,
}

pub struct Stage {
    tracker: IdleTracker,
    ladder: Ladder,
    accounts: Accounts,
    actor: Actor,
    /// The owner of changes: records reclaim's decisions and lends its acts their turn.
    owner: Arc<Owner>,
    audit: Result<PathBuf, String>,
    last_persist: Option<Instant>,
    state_write_errors: u64,
    /// The steps of the current run, handed on in its view.
    acts: Vec<Acted>,
}

/// Moves `path` to the first free `PATH.unreadable.N`, never over an earlier copy: each
/// corrupt file may hold totals worth recovering. A hard link fails when the name is taken, so
/// two agents (or a race with an operator) cannot overwrite one either.
fn keep_aside(path: &std::path::Path) -> Option<PathBuf> {
    for n in 1..1000 {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".unreadable.{n}"));
        let aside = PathBuf::from(name);
        match std::fs::hard_link(path, &aside) {
            Ok(()) => return std::fs::remove_file(path).is_ok().then_some(aside),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(_) => return None,
        }
    }
    None
}

impl Stage {
    pub fn new(s: &Settings, owner: Arc<Owner>) -> Stage {
        let accounts = match (&s.accounting.state_dir, s.accounting.enabled) {
            (Some(dir), true) => Accounts::load(dir).unwrap_or_else(|e| {
                // Kept aside, not overwritten by the next write: the totals may be recoverable.
                let path = dir.join(super::accounting::STATE_FILE);
                let aside = keep_aside(&path);
                let kept = aside.is_some();
                let aside = aside.map_or_else(String::new, |a| a.display().to_string());
                tracing::error!(error = %e, kept_as = %aside, kept, "cannot read the accounting state; counting from 0");
                Accounts::default()
            }),
            _ => Accounts::default(),
        };
        let mut stage = Stage {
            tracker: IdleTracker::default(),
            ladder: Ladder::default(),
            accounts,
            actor: Actor {
                procfs: s.procfs.clone(),
                owner: None,
                counts: ActionCounts::default(),
            },
            owner,
            audit: Err("not opened".into()),
            last_persist: None,
            state_write_errors: 0,
            acts: Vec::new(),
        };
        stage.reconfigure(s);
        if s.reclaim.enabled {
            // A restart (or a crash loop) must not reclaim beyond the hourly limit.
            let now = SystemTime::now();
            let at = super::replay::reclaims(&s.audit_file, s.reclaim.dry_run, now);
            tracing::info!(file = %s.audit_file.display(), reclaims = at.len(), "reclaims read back from the audit log for max_reclaims_per_hour");
            stage.ladder.restore_reclaims(at, now);
        }
        stage
    }

    /// Follows a reload: history is kept; the audit log is (re)opened when reclaim is on.
    pub fn reconfigure(&mut self, s: &Settings) {
        self.actor.procfs = s.procfs.clone();
        if !s.reclaim.enabled {
            self.actor.owner = None;
            self.audit = Err("reclaim is off".into());
            return;
        }
        if self.actor.owner.is_some() && self.audit.as_ref().ok() == Some(&s.audit_file) {
            return;
        }
        match self.owner.audit_ready() {
            Ok(path) => {
                self.actor.owner = Some(self.owner.clone());
                self.audit = Ok(path);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot open the audit log; reclaim stays in dry run until it can be written");
                self.actor.owner = None;
                self.audit = Err(e.to_string());
            }
        }
    }

    /// Runs the stage on `snapshot`: the view to publish and the health findings per GPU.
    pub fn observe(
        &mut self,
        snapshot: &Snapshot,
        s: &Settings,
    ) -> (Arc<View>, BTreeMap<u32, Vec<Finding>>) {
        let r = &s.reclaim;
        let idle = IdleConfig {
            threshold: r.utilization_threshold,
            min_memory_bytes: r.min_memory_mib * 1024 * 1024,
        };
        let starts = if r.enabled {
            start_times(snapshot, s)
        } else {
            HashMap::new()
        };
        let mut units = self.tracker.observe(snapshot, &starts, &idle);
        let labels = s
            .pod_labels
            .as_ref()
            .filter(|_| r.enabled)
            .map(|f| f.latest());
        if let Some(l) = &labels {
            for h in units.iter_mut().flat_map(|u| u.holders.iter_mut()) {
                h.pod_labels = h
                    .pod_uid
                    .as_ref()
                    .and_then(|uid| l.by_uid.get(uid).cloned());
            }
        }
        if s.accounting.enabled {
            self.accounts
                .add(snapshot, &units, s.interval, s.accounting.forget_after);
            self.persist(s, false);
        }
        let dry_run = r.dry_run || self.audit.is_err();
        let mut findings = BTreeMap::new();
        let mut candidates = Vec::new();
        if r.enabled {
            let mut effective = r.clone();
            effective.dry_run = dry_run;
            let decisions = self.ladder.decide(&units, &effective, snapshot.taken_at);
            for d in decisions {
                self.carry_out(d, &effective, snapshot.taken_at);
            }
            findings = health_findings(&units, r, snapshot.taken_at);
            candidates = units
                .iter()
                .map(|u| {
                    let (next, no_next) = match self.ladder.next(u, &effective) {
                        Ok(n) => (Some(n), None),
                        Err(why) => (None, Some(why)),
                    };
                    Candidate {
                        unit: u.clone(),
                        idle_seconds: u.idle_for(snapshot.taken_at).as_secs_f64(),
                        exempt: u
                            .holders
                            .iter()
                            .map(|h| ladder::exemption(h, u, &r.exempt))
                            .collect(),
                        targets: ladder::targets(u, &r.exempt)
                            .iter()
                            .map(|h| h.pid)
                            .collect(),
                        next,
                        no_next,
                    }
                })
                .collect();
        }
        let view = View {
            taken_at: snapshot.taken_at,
            config: r.clone(),
            dry_run,
            audit: self.audit.clone(),
            units,
            candidates,
            reclaims_last_hour: self.ladder.reclaims_last_hour(),
            pod_labels: labels.map(|l| (l.up, l.errors, l.socket)),
            actions: self
                .actor
                .counts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            accounting: s.accounting.enabled,
            owners: self.accounts.owners.clone(),
            idle_held: self.accounts.idle_held.clone(),
            state_write_errors: self.state_write_errors,
            acts: std::mem::take(&mut self.acts),
        };
        (Arc::new(view), findings)
    }

    fn carry_out(&mut self, d: Decision, config: &ReclaimConfig, at: SystemTime) {
        let a = &self.actor;
        match d {
            Decision::Detected { unit } => {
                tracing::warn!(gpu = unit.gpu, unit = %unit.key, held_bytes = unit.held_memory_bytes, "GPU held idle");
                a.audit(Reclaim::IdleDetected(super::act::recorded(
                    &super::act::describe(&unit, &unit.holders, "report", config.dry_run),
                )));
            }
            Decision::AllocatedUnused { unit } => {
                tracing::warn!(gpu = unit.gpu, pods = ?unit.pods, "GPU allocated to a pod that runs nothing on it");
                a.audit(Reclaim::AllocatedUnused(super::act::recorded(
                    &super::act::describe(&unit, &[], "report", config.dry_run),
                )));
            }
            Decision::Cleared { key, gpu, reason } => {
                tracing::info!(gpu, unit = %key, %reason, "idle episode over");
                a.audit(Reclaim::IdleCleared {
                    gpu,
                    gpu_instance: key.gpu_instance,
                    reason: reason.to_string(),
                    trigger: super::act::TRIGGER.into(),
                    uuid: key.uuid.clone(),
                });
            }
            // A step whose record could not be written did not happen: the ladder takes it
            // back (its hourly count included) and decides it again at a later poll.
            Decision::Warn { unit, targets } => {
                if !a.warn(&unit, &targets, config) {
                    self.ladder.undo(&unit.key, Undo::Warn);
                } else {
                    let hook = config.warn.as_ref().is_some_and(|w| w.hook.is_some());
                    let action = if hook { "hook" } else { "log" };
                    self.acts
                        .push(acted(&unit, &targets, "warn", action, config.dry_run, at));
                }
            }
            Decision::Reclaim { unit, targets } => {
                if !a.reclaim(&unit, &targets, config) {
                    self.ladder.undo(&unit.key, Undo::Reclaim);
                } else {
                    let action = config.action.as_str();
                    self.acts.push(acted(
                        &unit,
                        &targets,
                        "reclaim",
                        action,
                        config.dry_run,
                        at,
                    ));
                }
            }
            Decision::RateLimited { unit } => {
                tracing::warn!(gpu = unit.gpu, unit = %unit.key, max = config.max_reclaims_per_hour, "reclaim held back by max_reclaims_per_hour");
                a.count(config.action.as_str(), "rate_limited");
                a.audit(Reclaim::RateLimited {
                    gpu: unit.gpu,
                    gpu_instance: unit.key.gpu_instance,
                    max_reclaims_per_hour: config.max_reclaims_per_hour,
                    trigger: super::act::TRIGGER.into(),
                    uuid: unit.key.uuid.clone(),
                });
            }
        }
    }

    /// Writes the accounting state when due (or now, at shutdown).
    fn persist(&mut self, s: &Settings, now: bool) {
        let Some(dir) = &s.accounting.state_dir else {
            return;
        };
        let due = self
            .last_persist
            .is_none_or(|t| t.elapsed() >= s.accounting.persist_every);
        if !(now || due) {
            return;
        }
        self.last_persist = Some(Instant::now());
        if let Err(e) = self.accounts.save(dir) {
            self.state_write_errors += 1;
            tracing::error!(error = %e, dir = %dir.display(), "cannot write the accounting state");
        }
    }

    /// At shutdown: the accounting state is written one last time.
    pub fn shutdown(&mut self, s: &Settings) {
        if s.accounting.enabled {
            self.persist(s, true);
        }
    }
}

fn acted(
    unit: &UnitStatus,
    targets: &[super::idle::Holder],
    step: &'static str,
    action: &'static str,
    dry_run: bool,
    at: SystemTime,
) -> Acted {
    Acted {
        at,
        gpu: unit.gpu,
        uuid: unit.key.uuid.clone(),
        step,
        action,
        dry_run,
        pids: targets.iter().map(|h| h.pid).collect(),
    }
}

/// Start times of the live processes of the snapshot (one `stat` read each).
fn start_times(snapshot: &Snapshot, s: &Settings) -> HashMap<u32, u64> {
    snapshot
        .gpus
        .iter()
        .flat_map(|g| g.reading.processes.iter().flatten())
        .filter_map(|p| {
            let who = crate::procs::identify(&s.procfs, p.pid)?;
            Some((p.pid, who.start_time))
        })
        .collect()
}

/// `idle_held` and `allocated_unused`, per GPU, once the window is reached.
fn health_findings(
    units: &[UnitStatus],
    r: &ReclaimConfig,
    now: SystemTime,
) -> BTreeMap<u32, Vec<Finding>> {
    let mut out: BTreeMap<u32, Vec<Finding>> = BTreeMap::new();
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    for u in units {
        let f = match u.state {
            UnitState::Idle { since }
                if now.duration_since(since).unwrap_or_default() >= r.idle_after =>
            {
                let who: Vec<String> = u
                    .holders
                    .iter()
                    .map(|h| match (h.name.as_deref(), h.user.as_deref()) {
                        (Some(n), Some(u)) => format!("{} ({n}, user {u})", h.pid),
                        (Some(n), None) => format!("{} ({n}, user unknown)", h.pid),
                        (None, Some(u)) => format!("{} (name unknown, user {u})", h.pid),
                        // Another pid namespace without hostPID, or gone since NVML listed it.
                        (None, None) => format!("{} (owner unknown)", h.pid),
                    })
                    .collect();
                finding(
                    IDLE_HELD,
                    Status::Warn,
                    Action::None,
                    format!(
                        "{} held by {} process(es) ({:.1} GiB) at <= {}% utilization for {}: {}; \
                         see /api/v1/reclaim",
                        u.key,
                        u.holders.len(),
                        gib(u.held_memory_bytes),
                        r.utilization_threshold * 100.0,
                        crate::human::duration(now.duration_since(since).unwrap_or_default()),
                        who.join(", ")
                    ),
                )
            }
            UnitState::AllocatedUnused { since }
                if now.duration_since(since).unwrap_or_default() >= r.idle_after =>
            {
                let pods: Vec<String> = u
                    .pods
                    .iter()
                    .map(|p| format!("{}/{}", p.namespace, p.pod))
                    .collect();
                finding(
                    ALLOCATED_UNUSED,
                    Status::Warn,
                    Action::None,
                    format!(
                        "allocated to {} for {} with no process on the GPU",
                        pods.join(", "),
                        crate::human::duration(now.duration_since(since).unwrap_or_default())
                    ),
                )
            }
            _ => continue,
        };
        out.entry(u.gpu).or_default().push(f);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reclaim::testkit::{gpu, proc, snap};

    fn owner(s: &Settings) -> Arc<Owner> {
        Owner::with(crate::changes::Setup {
            nvml_lib: String::new(),
            audit_file: s.audit_file.clone(),
            mig: Default::default(),
        })
    }

    fn settings(audit_file: PathBuf) -> Settings {
        Settings {
            reclaim: ReclaimConfig {
                enabled: true,
                dry_run: false,
                idle_after: Duration::from_secs(60),
                grace: Duration::from_millis(100),
                ..ReclaimConfig::default()
            },
            accounting: AccountingConfig::default(),
            audit_file,
            pod_labels: None,
            procfs: PathBuf::from("/proc"),
            interval: Duration::from_secs(1),
            jobs_dir: None,
        }
    }

    #[test]
    fn without_a_writable_audit_log_nothing_is_done_to_the_node() {
        let mut child = std::process::Command::new("sleep")
            .arg("300")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        // A file under a regular file cannot be created.
        let tmp = tempfile::NamedTempFile::new().expect("tempfile");
        let s = settings(tmp.path().join("audit.jsonl"));
        let mut stage = Stage::new(&s, owner(&s));
        let idle = |t| snap(t, vec![gpu(0, Some(0), vec![proc(pid, 4096, Some(0))])]);
        let (view, findings) = stage.observe(&idle(0), &s);
        assert!(view.dry_run && view.audit.is_err());
        assert!(findings.is_empty());
        let (view, findings) = stage.observe(&idle(60), &s);
        assert_eq!(view.actions.get(&("signal", "dry_run")), Some(&1));
        assert_eq!(findings[&0][0].name, IDLE_HELD);
        assert!(findings[&0][0].reason.contains(&pid.to_string()));
        assert_eq!(view.candidates[0].targets, [pid]);
        assert_eq!(
            view.candidates[0].next, None,
            "reclaimed (in dry run): nothing more"
        );
        assert!(view.candidates[0]
            .no_next
            .as_deref()
            .is_some_and(|w| w.contains("reclaimed in dry run")));
        std::thread::sleep(Duration::from_millis(300));
        assert!(child.try_wait().expect("try_wait").is_none(), "untouched");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn an_unreadable_state_file_is_kept_aside_not_overwritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = settings(dir.path().join("audit.jsonl"));
        s.accounting.state_dir = Some(dir.path().to_path_buf());
        std::fs::write(dir.path().join("accounting.json"), "{not json").expect("write");
        let mut stage = Stage::new(&s, owner(&s));
        stage.observe(
            &snap(0, vec![gpu(0, Some(0), vec![proc(1, 4096, Some(0))])]),
            &s,
        );
        let aside = std::fs::read_to_string(dir.path().join("accounting.json.unreadable.1"));
        assert_eq!(aside.expect("kept aside"), "{not json");
        let fresh = std::fs::read_to_string(dir.path().join("accounting.json")).expect("new");
        assert!(fresh.starts_with("{\"version\":1"), "{fresh}");
        // A second corrupt file (here: counters that cannot be ours) gets a copy of its own.
        let negative = r#"{"version":1,"owners":[],"idle_held":[[[0,"GPU-0"],-3.0]]}"#;
        std::fs::write(dir.path().join("accounting.json"), negative).expect("write");
        let _ = Stage::new(&s, owner(&s));
        let first = std::fs::read_to_string(dir.path().join("accounting.json.unreadable.1"));
        assert_eq!(first.expect("first copy kept"), "{not json");
        let second = std::fs::read_to_string(dir.path().join("accounting.json.unreadable.2"));
        assert_eq!(second.expect("second copy"), negative);
    }

    #[test]
    fn off_measures_idleness_but_reports_and_decides_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = settings(dir.path().join("audit.jsonl"));
        s.reclaim.enabled = false;
        let mut stage = Stage::new(&s, owner(&s));
        let idle = |t| snap(t, vec![gpu(0, Some(0), vec![proc(1, 4096, Some(0))])]);
        stage.observe(&idle(0), &s);
        let (view, findings) = stage.observe(&idle(600), &s);
        assert!(findings.is_empty() && view.candidates.is_empty() && view.actions.is_empty());
        assert_eq!(
            view.units[0].idle_for(view.taken_at),
            Duration::from_secs(600)
        );
        assert!(
            !dir.path().join("audit.jsonl").exists(),
            "no audit log opened"
        );
    }
}
