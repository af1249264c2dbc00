//! The replica memory guard: what time-slicing lacks (replicas share one GPU's memory with no
//! isolation, NVIDIA/k8s-device-plugin#1433). For GPUs shared by a resource with
//! `memory_per_replica`, each process's observed GPU memory is compared with that share; a
//! process over it is reported (metric, log once per transition, `/api/v1/sharing`), and with
//! `[sharing.memory_guard] action = "signal"` it is signalled once it has stayed over for the
//! grace period, unless exempt, after checking it is still the same process (start time), in a
//! dry run by default, with an audit record either way.
//!
//! Honest about what it is: usage observed each poll (NVML's per-process used memory), not a
//! limit the driver enforces. A process is judged alone, not summed with its pod's others.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use super::plugin::devices::GpuState;
use super::status::StatusSink;
use crate::audit::event::Sharing;
use crate::audit::Event;
use crate::changes::{Acting, Done, Owner};
use crate::config::sharing::{GuardAction, MemoryGuardConfig, TimeSlicing};
use crate::procs::{self, ProcessIdentity};
use crate::publication::Published;
use crate::snapshot::{OverLimit, Snapshot};

/// The memory share per GPU UUID: `memory_per_replica` of the `nvidia.com/gpu` resource that
/// covers it (the same coverage the device plugin advertises).
pub fn limits(ts: &TimeSlicing, gpus: &[GpuState]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Some(r) = ts.resource(super::plugin::devices::GPU_RESOURCE) else {
        return out;
    };
    let Some(limit) = r.memory_per_replica else {
        return out;
    };
    let mut sorted: Vec<&GpuState> = gpus.iter().collect();
    sorted.sort_by_key(|g| g.index);
    for (position, g) in sorted.into_iter().enumerate() {
        if !g.mig_enabled && r.devices.covers(position, g.index, &g.uuid) {
            out.insert(g.uuid.clone(), limit);
        }
    }
    out
}

/// A process the guard decided to signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offender {
    pub over: OverLimit,
    pub name: String,
    pub since: SystemTime,
}

/// What the guard remembers between polls: since when each (GPU, pid) has been over, and
/// which were signalled already (once per process).
#[derive(Debug, Default)]
pub struct GuardState {
    over_since: BTreeMap<(String, u32), SystemTime>,
    signalled: BTreeMap<(String, u32), SystemTime>,
}

impl GuardState {
    /// Forgets that `o` was signalled (its decision could not be recorded, so nothing was
    /// sent): it is due again at the next poll.
    fn not_signalled(&mut self, o: &OverLimit) {
        self.signalled.remove(&(o.uuid.clone(), o.pid));
    }
}

/// One poll's judgement: who is over now, and who is due a signal. Pure; `now` is passed in.
pub fn evaluate(
    snapshot: &Snapshot,
    limits: &BTreeMap<String, u64>,
    config: &MemoryGuardConfig,
    state: &mut GuardState,
    now: SystemTime,
) -> (Vec<OverLimit>, Vec<Offender>) {
    let mut over = Vec::new();
    let mut due = Vec::new();
    let mut seen = Vec::new();
    for g in &snapshot.gpus {
        let Some(limit) = limits.get(g.uuid()) else {
            continue;
        };
        for p in g.reading.processes.iter().flatten() {
            let Some(used) = p.used_memory_bytes.filter(|u| u > limit) else {
                continue;
            };
            let key = (g.uuid().to_string(), p.pid);
            let since = *state.over_since.entry(key.clone()).or_insert(now);
            seen.push(key.clone());
            let o = OverLimit {
                gpu: g.index,
                uuid: g.uuid().to_string(),
                pid: p.pid,
                used_bytes: used,
                limit_bytes: *limit,
            };
            let name = p.info.as_ref().map_or(String::new(), |i| i.name.clone());
            let exempt = config.exempt_processes.contains(&name);
            let waited = now.duration_since(since).unwrap_or(Duration::ZERO) >= config.grace;
            if config.action == GuardAction::Signal
                && waited
                && !exempt
                && !state.signalled.contains_key(&key)
            {
                state.signalled.insert(key, now);
                due.push(Offender {
                    over: o.clone(),
                    name,
                    since,
                });
            }
            over.push(o);
        }
    }
    state.over_since.retain(|k, _| seen.contains(k));
    state.signalled.retain(|k, _| seen.contains(k));
    (over, due)
}

/// Runs the guard on every publication until `stop`. Must run inside a tokio runtime.
pub fn spawn(
    ts: TimeSlicing,
    config: MemoryGuardConfig,
    procfs: PathBuf,
    owner: Arc<Owner>,
    mut published: watch::Receiver<Arc<Published>>,
    status: StatusSink,
    mut stop: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut state = GuardState::default();
        let mut reported: Vec<(String, u32)> = Vec::new();
        loop {
            let p = published.borrow_and_update().clone();
            let gpus: Vec<GpuState> = p
                .snapshot
                .gpus
                .iter()
                .filter(|g| g.identity.is_some())
                .map(|g| GpuState {
                    index: g.index,
                    uuid: g.uuid().to_string(),
                    mig_enabled: g.reading.mig_mode_current == Some(true),
                    healthy: true,
                    present: true,
                    mig_devices: Vec::new(),
                })
                .collect();
            let limits = limits(&ts, &gpus);
            let (over, due) =
                evaluate(&p.snapshot, &limits, &config, &mut state, SystemTime::now());
            let now_keys: Vec<(String, u32)> =
                over.iter().map(|o| (o.uuid.clone(), o.pid)).collect();
            for o in over
                .iter()
                .filter(|o| !reported.contains(&(o.uuid.clone(), o.pid)))
            {
                tracing::warn!(
                    gpu = o.gpu,
                    pid = o.pid,
                    used_mib = o.used_bytes >> 20,
                    limit_mib = o.limit_bytes >> 20,
                    "memory guard: process over its replica's memory share"
                );
            }
            reported = now_keys;
            for offender in due {
                // Stopping: no new signal (what was not sent is not remembered as sent).
                if *stop.borrow() || crate::shutdown::requested() {
                    state.not_signalled(&offender.over);
                    continue;
                }
                let (procfs, config, owner) = (procfs.clone(), config.clone(), owner.clone());
                let over = offender.over.clone();
                let label =
                    tokio::task::spawn_blocking(move || act(&offender, &config, &procfs, &owner))
                        .await
                        .unwrap_or(Ok("failed"))
                        .unwrap_or_else(|()| {
                            // Not sent, so not remembered as sent: tried again at the next poll.
                            state.not_signalled(&over);
                            crate::audit::AUDIT_FAILED
                        });
                status.update(|s| *s.guard_signals_total.entry(label).or_default() += 1);
            }
            status.update(|s| {
                if s.over_limit != over {
                    s.over_limit = over;
                }
            });
            tokio::select! {
                changed = published.changed() => if changed.is_err() { return },
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    });
}

/// Signals (or, in a dry run, only records) one offender; the result label, or `Err` when the
/// decision could not be recorded (nothing was sent).
fn act(
    o: &Offender,
    config: &MemoryGuardConfig,
    procfs: &std::path::Path,
    owner: &Arc<Owner>,
) -> Result<&'static str, ()> {
    let who: Option<ProcessIdentity> = procs::identify(procfs, o.over.pid);
    let signal = config.signal.parse::<nix::sys::signal::Signal>().ok();
    let outcome = |label: &'static str, detail: String| {
        Event::Sharing(Sharing::MemoryGuardSignal {
            detail,
            dry_run: config.dry_run,
            gpu: o.over.gpu,
            limit_bytes: o.over.limit_bytes,
            over_since: humantime::format_rfc3339_millis(o.since).to_string(),
            pid: o.over.pid,
            process: o.name.clone(),
            result: label.to_string(),
            signal: config.signal.clone(),
            used_bytes: o.over.used_bytes,
            uuid: o.over.uuid.clone(),
        })
    };
    let label = match (who, signal) {
        (Some(who), Some(sig)) if !config.dry_run => {
            // The decision is recorded before the signal: without the record, nothing is sent.
            let decision = Sharing::MemoryGuardDecision {
                gpu: o.over.gpu,
                limit_bytes: o.over.limit_bytes,
                pid: o.over.pid,
                process: o.name.clone(),
                signal: config.signal.clone(),
                used_bytes: o.over.used_bytes,
                uuid: o.over.uuid.clone(),
            };
            let begun = owner.begin(decision).map_err(|e| {
                tracing::error!(error = %e, pid = o.over.pid, "memory guard: not signalling: its decision cannot be recorded");
            })?;
            begun.act(|_: &Acting<'_>| {
                let (label, detail) = match procs::signal_verified(procfs, &who, sig) {
                    procs::SignalResult::Failed(e) => ("failed", e),
                    r => (r.label(), String::new()),
                };
                Done {
                    value: label,
                    after: Some(outcome(label, detail)),
                    touched: label == "sent",
                }
            })
        }
        (who, signal) => {
            let (label, detail) = match (who, signal) {
                (None, _) => ("gone", String::new()),
                (Some(_), None) => ("failed", format!("unknown signal '{}'", config.signal)),
                (Some(_), Some(_)) => ("dry_run", String::new()),
            };
            if let Err(e) = owner.record(outcome(label, detail)) {
                tracing::error!(error = %e, "memory guard: cannot write the audit record");
            }
            label
        }
    };
    tracing::warn!(
        pid = o.over.pid,
        gpu = o.over.gpu,
        result = label,
        dry_run = config.dry_run,
        "memory guard: {} {} for using {} MiB over a {} MiB share",
        if config.dry_run {
            "would signal"
        } else {
            "signalled"
        },
        config.signal,
        o.over.used_bytes >> 20,
        o.over.limit_bytes >> 20
    );
    Ok(label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::sharing::{Devices, SharedResource};
    use crate::snapshot::{
        GpuIdentity, GpuProcess, GpuReading, GpuSnapshot, GpuStatus, ProcessInfo, ProcessKind,
    };

    fn snapshot(used_mib: u64, name: &str) -> Snapshot {
        let mut s = Snapshot::starting(SystemTime::UNIX_EPOCH);
        let process = GpuProcess {
            pid: 42,
            kind: ProcessKind::Compute,
            used_memory_bytes: Some(used_mib << 20),
            sm_util_percent: None,
            mem_util_percent: None,
            gpu_instance_id: None,
            compute_instance_id: None,
            info: Some(Arc::new(ProcessInfo {
                name: name.into(),
                ..ProcessInfo::default()
            })),
        };
        s.gpus.push(GpuSnapshot {
            index: 0,
            identity: Some(Arc::new(GpuIdentity {
                uuid: "GPU-a".into(),
                ..GpuIdentity::default()
            })),
            status: GpuStatus::Up,
            reading: GpuReading {
                processes: Some(vec![process]),
                ..GpuReading::default()
            },
            failed_calls: 0,
            failing_runs: 0,
            xids: BTreeMap::new(),
            last_xid: None,
        });
        s
    }

    fn ts() -> TimeSlicing {
        TimeSlicing {
            rename_by_default: false,
            fail_requests_greater_than_one: false,
            resources: vec![SharedResource {
                name: "nvidia.com/gpu".into(),
                replicas: 4,
                devices: Devices::All,
                memory_per_replica: Some(10 << 30),
            }],
        }
    }

    #[test]
    fn no_signal_is_sent_when_its_decision_cannot_be_recorded() {
        // /dev/full takes the open and answers every write with ENOSPC, like a full disk.
        let owner = crate::changes::Owner::with(crate::changes::Setup {
            nvml_lib: String::new(),
            audit_file: "/dev/full".into(),
            mig: Default::default(),
        });
        if owner.audit_ready().is_err() {
            eprintln!("SKIPPED: /dev/full cannot be opened here");
            return;
        }
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let over = OverLimit {
            gpu: 0,
            uuid: "GPU-a".into(),
            pid: child.id(),
            used_bytes: 2 << 30,
            limit_bytes: 1 << 30,
        };
        let offender = Offender {
            over: over.clone(),
            name: "sleep".into(),
            since: SystemTime::now(),
        };
        let config = MemoryGuardConfig {
            action: GuardAction::Signal,
            dry_run: false,
            ..MemoryGuardConfig::default()
        };
        let label = act(&offender, &config, std::path::Path::new("/proc"), &owner);
        let alive = child.try_wait().map(|s| s.is_none()).unwrap_or(false);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            label,
            Err(()),
            "refused: its decision could not be recorded"
        );
        assert!(alive, "signalled without a record");
        // And it is due again at the next poll.
        let mut state = GuardState::default();
        state
            .signalled
            .insert(("GPU-a".into(), over.pid), SystemTime::now());
        state.not_signalled(&over);
        assert!(state.signalled.is_empty());
    }

    #[test]
    fn over_is_reported_then_signalled_once_after_the_grace() {
        let gpu = GpuState {
            index: 0,
            uuid: "GPU-a".into(),
            mig_enabled: false,
            healthy: true,
            present: true,
            mig_devices: Vec::new(),
        };
        let limits = limits(&ts(), &[gpu]);
        assert_eq!(limits["GPU-a"], 10 << 30);
        let config = MemoryGuardConfig {
            action: GuardAction::Signal,
            grace: Duration::from_secs(60),
            ..MemoryGuardConfig::default()
        };
        let mut state = GuardState::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let (over, due) = evaluate(
            &snapshot(5 << 10, "python"),
            &limits,
            &config,
            &mut state,
            t0,
        );
        assert!(over.is_empty() && due.is_empty(), "5 GiB is under 10 GiB");
        let (over, due) = evaluate(
            &snapshot(12 << 10, "python"),
            &limits,
            &config,
            &mut state,
            t0,
        );
        assert_eq!(over.len(), 1);
        assert!(due.is_empty(), "within the grace period");
        let later = t0 + Duration::from_secs(61);
        let (_, due) = evaluate(
            &snapshot(12 << 10, "python"),
            &limits,
            &config,
            &mut state,
            later,
        );
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].since, t0);
        let (over, due) = evaluate(
            &snapshot(12 << 10, "python"),
            &limits,
            &config,
            &mut state,
            later,
        );
        assert_eq!((over.len(), due.len()), (1, 0), "signalled once");
        // Exempt names are reported, never signalled; report-only never signals.
        let mut state = GuardState::default();
        let exempt = MemoryGuardConfig {
            exempt_processes: vec!["python".into()],
            ..config.clone()
        };
        evaluate(
            &snapshot(12 << 10, "python"),
            &limits,
            &exempt,
            &mut state,
            t0,
        );
        let (over, due) = evaluate(
            &snapshot(12 << 10, "python"),
            &limits,
            &exempt,
            &mut state,
            later,
        );
        assert_eq!((over.len(), due.len()), (1, 0));
        let mut state = GuardState::default();
        let report_only = MemoryGuardConfig::default();
        evaluate(
            &snapshot(12 << 10, "x"),
            &limits,
            &report_only,
            &mut state,
            t0,
        );
        let (_, due) = evaluate(
            &snapshot(12 << 10, "x"),
            &limits,
            &report_only,
            &mut state,
            later,
        );
        assert!(due.is_empty());
    }
}
