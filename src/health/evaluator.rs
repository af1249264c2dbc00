//! The state that health evaluation carries from one poll to the next, and the diff that turns
//! successive verdicts into events.
//!
//! `Evaluator::evaluate(snapshot, now)` is deterministic: the same snapshots at the same times
//! give the same verdicts and events. It never reads the clock and performs no I/O; the poller
//! logs and journals the events it returns.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::SystemTime;

use super::conditions::{self, finding, Finding};
use super::xid::XidHistory;
use super::{
    catalog, Condition, EventKind, GpuHealth, GpuVerdict, HealthConfig, HealthEvent, NodeHealth,
    Status,
};
use crate::snapshot::{
    GpuSnapshot, GpuStatus, NvmlStatus, Snapshot, FORGET_ABSENT_GPU_AFTER_POLLS,
};

#[derive(Debug, Default)]
pub struct Evaluator {
    config: HealthConfig,
    gpus: BTreeMap<Key, GpuState>,
}

/// Whose history a state is. History follows the board (UUID) like the poller's cumulative
/// counts, so that a re-enumeration neither hands one board's XIDs to another nor re-counts a
/// board's cumulative XID counts as new. A GPU never identified is known by its index until
/// its UUID is read, and then its history moves to the UUID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Uuid(String),
    Index(u32),
}

impl Key {
    fn of(gpu: &GpuSnapshot) -> Key {
        match gpu.uuid() {
            "" => Key::Index(gpu.index),
            uuid => Key::Uuid(uuid.to_string()),
        }
    }
}

/// What is remembered about one GPU.
#[derive(Debug, Default)]
struct GpuState {
    uuid: String,
    /// Consecutive evaluations (with NVML up) in which the GPU was not in the snapshot.
    absent: u32,
    active: BTreeMap<String, Condition>,
    xids: XidHistory,
    /// (time, cumulative replay count) samples covering the replay window.
    replays: VecDeque<(SystemTime, u32)>,
    links: super::nvlink::LinkHistory,
    degraded: super::degraded::DegradedHistory,
}

impl Evaluator {
    pub fn new(config: HealthConfig) -> Self {
        Evaluator {
            config,
            gpus: BTreeMap::new(),
        }
    }

    pub fn config(&self) -> &HealthConfig {
        &self.config
    }

    /// Takes a new configuration; history is kept, and the next evaluation applies it.
    pub fn set_config(&mut self, config: HealthConfig) {
        self.config = config;
    }

    /// Evaluates every GPU of `snapshot` at `now`; returns the verdicts and what changed.
    /// While NVML is down there is nothing to judge: the history is kept for when it returns.
    pub fn evaluate(
        &mut self,
        snapshot: &Snapshot,
        now: SystemTime,
    ) -> (NodeHealth, Vec<HealthEvent>) {
        self.evaluate_with(snapshot, &BTreeMap::new(), now)
    }

    /// As `evaluate`, with findings other stages made about GPUs, by index (reclaim's
    /// `idle_held`): they are raised, kept and cleared like the evaluator's own.
    pub fn evaluate_with(
        &mut self,
        snapshot: &Snapshot,
        extra: &BTreeMap<u32, Vec<Finding>>,
        now: SystemTime,
    ) -> (NodeHealth, Vec<HealthEvent>) {
        let mut health = NodeHealth {
            gpus: Vec::new(),
            xid_count_window_ms: self.config.xid_count_window.as_millis() as u64,
        };
        let mut events = Vec::new();
        if snapshot.nvml != NvmlStatus::Up {
            return (health, events);
        }
        for gpu in &snapshot.gpus {
            let key = Key::of(gpu);
            if matches!(key, Key::Uuid(_)) && !self.gpus.contains_key(&key) {
                if let Some(state) = self.gpus.remove(&Key::Index(gpu.index)) {
                    self.gpus.insert(key, state);
                }
            }
        }
        // The same rule as the poller's (`FORGET_ABSENT_GPU_AFTER_POLLS`), on the same
        // snapshots: history is never kept longer or shorter than the counts it is built from.
        let present: BTreeSet<Key> = snapshot.gpus.iter().map(Key::of).collect();
        self.gpus.retain(|key, state| {
            if present.contains(key) {
                state.absent = 0;
                return true;
            }
            state.absent = state.absent.saturating_add(1);
            matches!(key, Key::Uuid(_)) && state.absent <= FORGET_ABSENT_GPU_AFTER_POLLS
        });
        for gpu in &snapshot.gpus {
            let state = self.gpus.entry(Key::of(gpu)).or_default();
            if !gpu.uuid().is_empty() {
                state.uuid = gpu.uuid().to_string();
            }
            let extra = extra.get(&gpu.index).map_or(&[][..], Vec::as_slice);
            health
                .gpus
                .push(state.evaluate(gpu, extra, &self.config, now, &mut events));
        }
        (health, events)
    }
}

impl GpuState {
    fn evaluate(
        &mut self,
        gpu: &GpuSnapshot,
        extra: &[Finding],
        config: &HealthConfig,
        now: SystemTime,
        events: &mut Vec<HealthEvent>,
    ) -> GpuHealth {
        let mut findings = conditions::check(gpu, config);
        findings.extend_from_slice(extra);
        for new in self.xids.ingest(&gpu.xids) {
            let (severity, action) = match catalog::verdict(new.xid, &config.xid_overrides) {
                catalog::Verdict::Ignore => (Status::Pass, super::Action::None),
                catalog::Verdict::Raise { severity, action } => (severity, action),
            };
            let (mnemonic, description) = catalog::describe(new.xid);
            events.push(self.event(
                new.at,
                gpu.index,
                EventKind::Observed,
                format!("xid_{}", new.xid),
                severity,
                action,
                format!(
                    "XID {} ({mnemonic}: {description}) received {} time(s)",
                    new.xid, new.count
                ),
            ));
        }
        self.xids
            .prune(now, config.xid_window.max(config.xid_count_window));
        let xid_findings = self.xids.findings(now, config);
        findings.extend(self.links.findings(gpu, config, now, &xid_findings));
        findings.extend(xid_findings);
        findings.extend(self.pcie_replays(gpu, config, now));
        findings.extend(self.degraded.findings(gpu, config, now));
        findings.extend(self.failing_calls(gpu, config));
        self.diff(gpu.index, findings, now, events);
        let mut conditions: Vec<Condition> = self.active.values().cloned().collect();
        conditions.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.name.cmp(&b.name)));
        GpuHealth {
            index: gpu.index,
            uuid: self.uuid.clone(),
            verdict: GpuVerdict::new(conditions),
            xid_window_counts: self.xids.counts(now, config.xid_count_window),
        }
    }

    /// Replays over the last `pcie_replay_window`, scaled to a minute, against DCGM's
    /// per-generation limit. No verdict until the window is covered.
    fn pcie_replays(
        &mut self,
        gpu: &GpuSnapshot,
        config: &HealthConfig,
        now: SystemTime,
    ) -> Option<Finding> {
        let r = &gpu.reading;
        let count = r
            .pcie_replay_count
            .filter(|_| gpu.status == GpuStatus::Up)?;
        if self.replays.back().is_some_and(|(_, c)| *c > count) {
            self.replays.clear(); // the counter restarted (driver reload or reset)
        }
        self.replays.push_back((now, count));
        let old = |t: &SystemTime| {
            now.duration_since(*t).unwrap_or_default() >= config.pcie_replay_window
        };
        while self.replays.len() > 2 && self.replays.get(1).is_some_and(|(t, _)| old(t)) {
            self.replays.pop_front();
        }
        let (start, base) = *self.replays.front()?;
        let span = now.duration_since(start).unwrap_or_default();
        if !old(&start) || span.is_zero() {
            return None;
        }
        let per_minute = f64::from(count - base) * 60.0 / span.as_secs_f64();
        let limit = config.pcie_replay_limit(r.pcie_generation?, r.pcie_width?)?;
        (per_minute > limit).then(|| {
            finding(
                conditions::PCIE_REPLAY_RATE,
                Status::Warn,
                super::Action::None,
                format!(
                    "{per_minute:.1} PCIe replays per minute over the last {}, above the {limit} \
                     expected of a Gen{} x{} link; check the slot, riser and cabling",
                    crate::human::duration(span),
                    r.pcie_generation.unwrap_or(0),
                    r.pcie_width.unwrap_or(0),
                ),
            )
        })
    }

    /// A read of the GPU that failed in each of its last `failing_calls_polls` runs. Runs, not
    /// polls: a slow-tier read runs every `slow_interval`, and its one failure must not count
    /// once per poll until it runs again.
    fn failing_calls(&mut self, gpu: &GpuSnapshot, config: &HealthConfig) -> Option<Finding> {
        let failing = gpu.status == GpuStatus::Up
            && gpu.failed_calls > 0
            && config.failing_calls_polls > 0
            && gpu.failing_runs >= config.failing_calls_polls;
        failing.then(|| {
            finding(
                conditions::NVML_CALLS_FAILING,
                Status::Warn,
                super::Action::None,
                format!(
                    "{} NVML call(s) on this GPU failed, in each of the last {} reads; its \
                     metrics are incomplete (see gpu_steward_nvml_errors_total)",
                    gpu.failed_calls, gpu.failing_runs
                ),
            )
        })
    }

    /// Updates the active conditions and emits one event per change.
    fn diff(
        &mut self,
        gpu: u32,
        findings: Vec<Finding>,
        now: SystemTime,
        events: &mut Vec<HealthEvent>,
    ) {
        let mut next = BTreeMap::new();
        for f in findings {
            if next.contains_key(&f.name) {
                continue;
            }
            let kind = match self.active.get(&f.name) {
                None => Some(EventKind::Raised),
                Some(old) if (f.severity, f.action) == (old.severity, old.action) => None,
                Some(old)
                    if f.severity > old.severity
                        || (f.severity == old.severity && f.action > old.action) =>
                {
                    Some(EventKind::Escalated)
                }
                Some(_) => Some(EventKind::Changed),
            };
            let since = self.active.get(&f.name).map_or(now, |c| c.since);
            if let Some(kind) = kind {
                events.push(self.event(
                    now,
                    gpu,
                    kind,
                    f.name.clone(),
                    f.severity,
                    f.action,
                    f.reason.clone(),
                ));
            }
            next.insert(
                f.name.clone(),
                Condition {
                    name: f.name,
                    severity: f.severity,
                    reason: f.reason,
                    action: f.action,
                    since,
                },
            );
        }
        for (name, old) in &self.active {
            if !next.contains_key(name) {
                let active_for = now.duration_since(old.since).unwrap_or_default();
                events.push(self.event(
                    now,
                    gpu,
                    EventKind::Cleared,
                    name.clone(),
                    Status::Pass,
                    super::Action::None,
                    format!(
                        "cleared after {}; was: {}",
                        crate::human::duration(active_for),
                        old.reason
                    ),
                ));
            }
        }
        self.active = next;
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &self,
        time: SystemTime,
        gpu: u32,
        kind: EventKind,
        condition: String,
        severity: Status,
        action: super::Action,
        reason: String,
    ) -> HealthEvent {
        HealthEvent {
            time,
            gpu,
            uuid: self.uuid.clone(),
            kind,
            condition,
            severity,
            action,
            reason,
            before_restart: false,
        }
    }
}
