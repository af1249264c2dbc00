//! The safety rails, as one pure decision per (route, alert): idempotence by fingerprint,
//! per-route cooldown, the node-wide hourly limit, dry run. Time is an argument, so that tests
//! need neither a clock nor a runtime. (One action at a time per GPU is enforced where hooks
//! run, by a lock per GPU: it delays, it does not refuse.)

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use super::alert::{Alert, Status};
use super::config::Route;

/// How long a handled alert is remembered when no resolution comes (Alertmanager resends a
/// firing alert every `repeat_interval`, 4 h by default).
const REMEMBER: Duration = Duration::from_secs(7 * 24 * 3600);
/// At most this many handled alerts are remembered; the oldest go first.
const REMEMBER_MAX: usize = 10_000;
const HOUR: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run the route's hooks.
    Run,
    /// Dry run: audit what would run, run nothing.
    DryRun,
    Skip(SkipReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// A resolved alert on a route with `on_resolved = false`.
    Resolved,
    /// This alert (fingerprint, status, start) was handled on this route already.
    Duplicate,
    /// The route ran for this GPU less than `cooldown` ago.
    Cooldown,
    /// The node-wide hourly limit is reached.
    RateLimited,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Resolved => "resolved alert and on_resolved = false",
            SkipReason::Duplicate => "duplicate: this alert was handled already",
            SkipReason::Cooldown => "route in cooldown for this GPU",
            SkipReason::RateLimited => "node-wide max_actions_per_hour reached",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            SkipReason::Resolved => "resolved",
            SkipReason::Duplicate => "duplicate",
            SkipReason::Cooldown => "cooldown",
            SkipReason::RateLimited => "rate_limited",
        }
    }
}

/// What the rails remember between decisions.
#[derive(Debug, Default)]
pub struct Rails {
    /// (route, fingerprint, status, startsAt) → when handled.
    handled: HashMap<(usize, String, Status, String), SystemTime>,
    /// (route, GPU key) → last firing action.
    last_run: HashMap<(usize, String), SystemTime>,
    /// Starts of actions in the last hour, node-wide.
    recent: VecDeque<SystemTime>,
}

/// The GPU an alert is about, for cooldowns and the per-GPU lock: its UUID, else its index,
/// else the node.
pub fn gpu_key(alert: &Alert) -> String {
    alert
        .gpu_uuid()
        .or(alert.gpu())
        .map_or_else(|| "node".to_string(), str::to_string)
}

impl Rails {
    pub fn decide(
        &mut self,
        route_index: usize,
        route: &Route,
        alert: &Alert,
        dry_run: bool,
        max_per_hour: u32,
        now: SystemTime,
    ) -> Decision {
        self.forget(now);
        if alert.status == Status::Resolved && !route.on_resolved {
            return Decision::Skip(SkipReason::Resolved);
        }
        let key = (
            route_index,
            alert.fingerprint.clone(),
            alert.status,
            alert.starts_at.clone(),
        );
        if self.handled.contains_key(&key) {
            return Decision::Skip(SkipReason::Duplicate);
        }
        let gpu = (route_index, gpu_key(alert));
        // Cooldown holds back repeated firing actions; a resolution always gets through (its
        // firing action is what started the cooldown).
        if alert.status == Status::Firing {
            if let Some(last) = self.last_run.get(&gpu) {
                if since(*last, now) < route.cooldown {
                    return Decision::Skip(SkipReason::Cooldown);
                }
            }
        }
        if self.recent.len() >= max_per_hour as usize {
            return Decision::Skip(SkipReason::RateLimited);
        }
        self.handled.insert(key, now);
        if self.handled.len() > REMEMBER_MAX {
            if let Some(oldest) = self
                .handled
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(k, _)| k.clone())
            {
                self.handled.remove(&oldest);
            }
        }
        if alert.status == Status::Firing {
            self.last_run.insert(gpu, now);
        } else {
            // The alert is over: a new firing of it (new startsAt) is a new alert.
            self.handled.retain(|(r, fp, status, _), _| {
                !(*r == route_index && *fp == alert.fingerprint && *status == Status::Firing)
            });
        }
        self.recent.push_back(now);
        if dry_run {
            Decision::DryRun
        } else {
            Decision::Run
        }
    }

    fn forget(&mut self, now: SystemTime) {
        while self.recent.front().is_some_and(|t| since(*t, now) >= HOUR) {
            self.recent.pop_front();
        }
        self.handled.retain(|_, t| since(*t, now) < REMEMBER);
    }
}

fn since(t: SystemTime, now: SystemTime) -> Duration {
    now.duration_since(t).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn alert(status: Status, gpu: &str, fp: &str, starts: &str) -> Alert {
        let mut labels = BTreeMap::new();
        labels.insert("alertname".to_string(), "A".to_string());
        labels.insert("gpu".to_string(), gpu.to_string());
        Alert {
            status,
            labels,
            annotations: BTreeMap::new(),
            starts_at: starts.into(),
            ends_at: String::new(),
            generator_url: String::new(),
            fingerprint: fp.into(),
        }
    }

    fn route(cooldown_s: u64, on_resolved: bool) -> Route {
        Route {
            matchers: Vec::new(),
            hooks: vec!["h".into()],
            cooldown: Duration::from_secs(cooldown_s),
            on_resolved,
        }
    }

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + s)
    }

    #[test]
    fn a_resent_alert_runs_once() {
        let mut r = Rails::default();
        let a = alert(Status::Firing, "0", "f1", "t0");
        let route = route(0, false);
        assert_eq!(r.decide(0, &route, &a, false, 10, at(0)), Decision::Run);
        assert_eq!(
            r.decide(0, &route, &a, false, 10, at(1)),
            Decision::Skip(SkipReason::Duplicate)
        );
        // Another route handles it on its own.
        assert_eq!(r.decide(1, &route, &a, false, 10, at(2)), Decision::Run);
    }

    #[test]
    fn cooldown_is_per_route_and_gpu_and_resolutions_pass() {
        let mut r = Rails::default();
        let route = route(3600, true);
        let a0 = alert(Status::Firing, "0", "f0", "t0");
        let b0 = alert(Status::Firing, "0", "g0", "t0");
        let a1 = alert(Status::Firing, "1", "f1", "t0");
        assert_eq!(r.decide(0, &route, &a0, false, 10, at(0)), Decision::Run);
        assert_eq!(
            r.decide(0, &route, &b0, false, 10, at(10)),
            Decision::Skip(SkipReason::Cooldown)
        );
        assert_eq!(r.decide(0, &route, &a1, false, 10, at(10)), Decision::Run);
        let resolved = alert(Status::Resolved, "0", "f0", "t0");
        assert_eq!(
            r.decide(0, &route, &resolved, false, 10, at(20)),
            Decision::Run
        );
        assert_eq!(r.decide(0, &route, &b0, false, 10, at(3601)), Decision::Run);
        // After its resolution, the same alert firing again (a new start) is new, past cooldown.
        let again = alert(Status::Firing, "0", "f0", "t1");
        assert_eq!(
            r.decide(0, &route, &again, false, 10, at(3700)),
            Decision::Skip(SkipReason::Cooldown)
        );
        assert_eq!(
            r.decide(0, &route, &again, false, 10, at(7300)),
            Decision::Run
        );
    }

    #[test]
    fn resolved_needs_on_resolved_and_dry_run_decides_the_same() {
        let mut r = Rails::default();
        let resolved = alert(Status::Resolved, "0", "f0", "t0");
        assert_eq!(
            r.decide(0, &route(0, false), &resolved, false, 10, at(0)),
            Decision::Skip(SkipReason::Resolved)
        );
        let a = alert(Status::Firing, "0", "f0", "t0");
        assert_eq!(
            r.decide(0, &route(0, false), &a, true, 10, at(0)),
            Decision::DryRun
        );
        assert_eq!(
            r.decide(0, &route(0, false), &a, true, 10, at(1)),
            Decision::Skip(SkipReason::Duplicate)
        );
    }

    #[test]
    fn the_hourly_limit_is_node_wide_and_rolls() {
        let mut r = Rails::default();
        let route = route(0, false);
        for i in 0..3 {
            let a = alert(Status::Firing, &i.to_string(), &format!("f{i}"), "t");
            assert_eq!(
                r.decide(i, &route, &a, false, 3, at(i as u64)),
                Decision::Run
            );
        }
        let a = alert(Status::Firing, "9", "f9", "t");
        assert_eq!(
            r.decide(5, &route, &a, false, 3, at(100)),
            Decision::Skip(SkipReason::RateLimited)
        );
        assert_eq!(r.decide(5, &route, &a, false, 3, at(3600)), Decision::Run);
    }
}
