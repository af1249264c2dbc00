//! The ladder: report → warn → reclaim, decided from the idleness verdicts. Pure: time is the
//! snapshot's, nothing is executed here; the caller audits and carries out the decisions.
//!
//! Per idle episode of a unit (it ends when the unit is active, unknown or released):
//!
//! - at `idle_after`: **report** (`Detected`: audit, health condition `idle_held`);
//! - then, with `[reclaim.warn]`: **warn** once (`Warn`), and wait its `grace`;
//! - then **reclaim** once (`Reclaim`), unless `max_reclaims_per_hour` were reached in the last
//!   hour (`RateLimited`, once; retried at each later snapshot).
//!
//! A warn or reclaim decided in dry run did nothing to the node: when dry run is turned off
//! (SIGHUP) during the same episode, the ladder decides them again for real (warn first, then
//! its grace), and the dry-run reclaim no longer counts against the hourly limit.
//!
//! Targets are the holders that can be acted on: alive when observed (a zombie or vanished
//! process is gone), holding the unit since the episode began, and not exempt. A unit with
//! none is reported and never warned nor reclaimed.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::idle::{Holder, UnitKey, UnitState, UnitStatus};
use crate::config::reclaim::{Exemptions, ReclaimConfig};

/// Why a holder is left alone, if it is.
pub fn exemption(holder: &Holder, unit: &UnitStatus, exempt: &Exemptions) -> Option<String> {
    let gpu = unit.gpu.to_string();
    if exempt
        .gpus
        .iter()
        .any(|g| *g == gpu || g.eq_ignore_ascii_case(&unit.key.uuid))
    {
        return Some(format!("GPU {gpu} is exempt"));
    }
    if let Some(name) = &holder.name {
        if let Some(p) = exempt.process_names.matches(name) {
            return Some(format!("process name '{name}' matches '{p}'"));
        }
    }
    if let Some(user) = holder.user.as_ref().filter(|u| exempt.users.contains(u)) {
        return Some(format!("user '{user}' is exempt"));
    }
    if let (Some(_), false) = (&holder.pod_uid, exempt.pod_labels.is_empty()) {
        let Some(labels) = &holder.pod_labels else {
            // Safety first: a pod whose labels cannot be read may be one that is exempt.
            return Some(
                "its pod's labels are not known (the container runtime has not listed it); \
                 exempt until they are"
                    .into(),
            );
        };
        if let Some(s) = exempt.pod_labels.iter().find(|s| s.matches(labels)) {
            return Some(format!("pod label '{s}' is exempt"));
        }
    }
    // The kubelet names the pods allocated the GPU, not which pod a process is in (that is the
    // process's pod UID): a process in any pod, on a GPU allocated to a pod in an exempt
    // namespace, is left alone.
    if holder.pod_uid.is_some() {
        if let Some(p) = unit
            .pods
            .iter()
            .find(|p| exempt.namespaces.contains(&p.namespace))
        {
            return Some(format!("namespace '{}' is exempt", p.namespace));
        }
    }
    None
}

/// The holders that would be acted on.
pub fn targets<'a>(unit: &'a UnitStatus, exempt: &Exemptions) -> Vec<&'a Holder> {
    let UnitState::Idle { since } = unit.state else {
        return Vec::new();
    };
    unit.holders
        .iter()
        .filter(|h| h.start_time.is_some() && h.since <= since)
        .filter(|h| exemption(h, unit, exempt).is_none())
        .collect()
}

/// One step decided for one unit.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Idle for `idle_after`: reported.
    Detected {
        unit: UnitStatus,
    },
    /// Allocated to a pod with no process for `idle_after` (report only).
    AllocatedUnused {
        unit: UnitStatus,
    },
    /// A reported episode ended.
    Cleared {
        key: UnitKey,
        gpu: u32,
        reason: String,
    },
    Warn {
        unit: UnitStatus,
        targets: Vec<Holder>,
    },
    Reclaim {
        unit: UnitStatus,
        targets: Vec<Holder>,
    },
    RateLimited {
        unit: UnitStatus,
    },
}

/// What happens next to a unit, for `GET /api/v1/reclaim`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Next {
    pub step: &'static str,
    #[serde(serialize_with = "crate::health::rfc3339")]
    pub at: SystemTime,
}

#[derive(Debug, Clone, Default)]
struct Episode {
    gpu: u32,
    since: Option<SystemTime>,
    reported: bool,
    warned_at: Option<SystemTime>,
    reclaimed: bool,
    rate_limited: bool,
    /// The warn was decided in dry run (nobody was warned).
    warned_dry: bool,
    /// The reclaim was decided in dry run, at this time (nothing was done).
    reclaimed_dry: Option<SystemTime>,
}

/// A step [`Ladder::undo`] takes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undo {
    Warn,
    Reclaim,
}

/// The ladder's memory across snapshots.
#[derive(Debug, Default)]
pub struct Ladder {
    episodes: BTreeMap<UnitKey, Episode>,
    /// When reclaims were decided, over the last hour.
    reclaims: VecDeque<SystemTime>,
}

impl Ladder {
    /// Decides the steps due at `now` for `units` (every unit the tracker reported).
    pub fn decide(
        &mut self,
        units: &[UnitStatus],
        config: &ReclaimConfig,
        now: SystemTime,
    ) -> Vec<Decision> {
        let hour = Duration::from_secs(3600);
        while self
            .reclaims
            .front()
            .is_some_and(|t| now.duration_since(*t).unwrap_or_default() >= hour)
        {
            self.reclaims.pop_front();
        }
        let mut out = Vec::new();
        let mut next = BTreeMap::new();
        for unit in units {
            let mut ep = self.episodes.remove(&unit.key).unwrap_or_default();
            let since = match unit.state {
                UnitState::Idle { since } | UnitState::AllocatedUnused { since } => since,
                _ => {
                    if ep.reported {
                        out.push(cleared(unit.key.clone(), unit.gpu, &unit.state));
                    }
                    continue;
                }
            };
            if ep.since != Some(since) {
                if ep.reported {
                    out.push(cleared(unit.key.clone(), unit.gpu, &unit.state));
                }
                ep = Episode {
                    gpu: unit.gpu,
                    since: Some(since),
                    ..Episode::default()
                };
            }
            self.step(unit, since, &mut ep, config, now, &mut out);
            next.insert(unit.key.clone(), ep);
        }
        for (key, ep) in std::mem::take(&mut self.episodes) {
            if ep.reported {
                out.push(Decision::Cleared {
                    key,
                    gpu: ep.gpu,
                    reason: "released: no process holds it any more".into(),
                });
            }
        }
        self.episodes = next;
        out
    }

    fn step(
        &mut self,
        unit: &UnitStatus,
        since: SystemTime,
        ep: &mut Episode,
        config: &ReclaimConfig,
        now: SystemTime,
        out: &mut Vec<Decision>,
    ) {
        let idle_for = now.duration_since(since).unwrap_or_default();
        if idle_for < config.idle_after {
            return;
        }
        if !config.dry_run {
            // Dry run was turned off during this episode: what it only reported is still to do.
            if let Some(t) = ep.reclaimed_dry.take() {
                ep.reclaimed = false;
                ep.rate_limited = false;
                if let Some(i) = self.reclaims.iter().rposition(|r| *r == t) {
                    self.reclaims.remove(i);
                }
            }
            if std::mem::take(&mut ep.warned_dry) {
                ep.warned_at = None;
            }
        }
        if !ep.reported {
            ep.reported = true;
            out.push(match unit.state {
                UnitState::AllocatedUnused { .. } => {
                    Decision::AllocatedUnused { unit: unit.clone() }
                }
                _ => Decision::Detected { unit: unit.clone() },
            });
        }
        let targets: Vec<Holder> = targets(unit, &config.exempt).into_iter().cloned().collect();
        if targets.is_empty() || ep.reclaimed {
            return;
        }
        if let Some(warn) = &config.warn {
            let Some(warned) = ep.warned_at else {
                ep.warned_at = Some(now);
                ep.warned_dry = config.dry_run;
                out.push(Decision::Warn {
                    unit: unit.clone(),
                    targets,
                });
                return;
            };
            if now.duration_since(warned).unwrap_or_default() < warn.grace {
                return;
            }
        }
        if self.reclaims.len() >= config.max_reclaims_per_hour as usize {
            if !ep.rate_limited {
                ep.rate_limited = true;
                out.push(Decision::RateLimited { unit: unit.clone() });
            }
            return;
        }
        self.reclaims.push_back(now);
        ep.reclaimed = true;
        ep.reclaimed_dry = config.dry_run.then_some(now);
        out.push(Decision::Reclaim {
            unit: unit.clone(),
            targets,
        });
    }

    /// Takes back a step that was decided but not carried out (its audit record could not be
    /// written): it is decided again at the next poll, and a reclaim no longer counts against
    /// `max_reclaims_per_hour`.
    pub fn undo(&mut self, key: &UnitKey, step: Undo) {
        let Some(ep) = self.episodes.get_mut(key) else {
            return;
        };
        match step {
            Undo::Warn => {
                ep.warned_at = None;
                ep.warned_dry = false;
            }
            Undo::Reclaim => {
                if ep.reclaimed {
                    ep.reclaimed = false;
                    ep.reclaimed_dry = None;
                    self.reclaims.pop_back();
                }
            }
        }
    }

    /// The next step due for `unit`, or why there is none (`GET /api/v1/reclaim` never shows
    /// a missing next step without its reason). `config` is the one in force (dry run
    /// included).
    pub fn next(&self, unit: &UnitStatus, config: &ReclaimConfig) -> Result<Next, String> {
        let since = match &unit.state {
            UnitState::Idle { since } => *since,
            UnitState::AllocatedUnused { .. } => {
                return Err(
                    "allocated to a pod that runs nothing on it: reported only, never \
                            acted on"
                        .into(),
                )
            }
            UnitState::Active { reason } => return Err(format!("not idle: {reason}")),
            UnitState::Unknown { reason } => {
                return Err(format!(
                    "activity unknown ({reason}): nothing is done until it is known"
                ))
            }
        };
        let ep = self.episodes.get(&unit.key).cloned().unwrap_or_default();
        let due = since + config.idle_after;
        if !ep.reported {
            return Ok(Next {
                step: "report",
                at: due,
            });
        }
        let redo = !config.dry_run;
        if ep.reclaimed && !(redo && ep.reclaimed_dry.is_some()) {
            return Err(match ep.reclaimed_dry {
                Some(_) => "reclaimed in dry run (nothing was done); it is done for real at the \
                            first poll after dry run ends (dry_run = false and a writable \
                            audit log), while this episode lasts"
                    .into(),
                None => "reclaimed in this idle episode: nothing more until the GPU is active \
                         or released"
                    .into(),
            });
        }
        if targets(unit, &config.exempt).is_empty() {
            let why: Vec<String> = unit
                .holders
                .iter()
                .map(|h| match exemption(h, unit, &config.exempt) {
                    Some(e) => format!("pid {}: {e}", h.pid),
                    None if h.start_time.is_none() => format!("pid {}: gone", h.pid),
                    None => format!("pid {}: holds it since after the episode began", h.pid),
                })
                .collect();
            return Err(format!(
                "reported only: no holder can be acted on ({})",
                if why.is_empty() {
                    "no holders".to_string()
                } else {
                    why.join("; ")
                }
            ));
        }
        let warned_at = ep.warned_at.filter(|_| !(redo && ep.warned_dry));
        let reclaim = match (&config.warn, warned_at) {
            (Some(_), None) => {
                return Ok(Next {
                    step: "warn",
                    at: due,
                })
            }
            (Some(w), Some(warned)) => warned + w.grace,
            (None, _) => due,
        };
        Ok(Next {
            step: if ep.rate_limited {
                "reclaim (rate limited)"
            } else {
                "reclaim"
            },
            at: reclaim,
        })
    }

    /// Counts reclaims decided before this ladder existed (read back from the audit log at
    /// start) against `max_reclaims_per_hour`: those of the hour before `now`, oldest first.
    pub fn restore_reclaims(&mut self, mut at: Vec<SystemTime>, now: SystemTime) {
        let hour = Duration::from_secs(3600);
        at.retain(|t| *t <= now && now.duration_since(*t).unwrap_or_default() < hour);
        at.extend(self.reclaims.drain(..));
        at.sort();
        self.reclaims = at.into();
    }

    /// Reclaims decided in the hour before the last decision.
    pub fn reclaims_last_hour(&self) -> usize {
        self.reclaims.len()
    }
}

fn cleared(key: UnitKey, gpu: u32, state: &UnitState) -> Decision {
    let reason = match state {
        UnitState::Active { reason } => format!("active: {reason}"),
        UnitState::Unknown { reason } => format!("activity unknown: {reason}"),
        UnitState::Idle { .. } => "a new idle episode began (holders changed)".into(),
        UnitState::AllocatedUnused { .. } => "no process holds it any more".into(),
    };
    Decision::Cleared { key, gpu, reason }
}

#[cfg(test)]
#[path = "ladder_tests.rs"]
mod tests;
