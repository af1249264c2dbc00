//! The safety rails, as one pure decision per (route, alert): idempotence by fingerprint,
//! per-route cooldown, the node-wide hourly limit, dry run. Time is an argument, so that tests
//! need neither a clock nor a runtime. (One action at a time per GPU is enforced where hooks
//! run, by a lock per GPU: it delays, it does not refuse.)
//!
//! Deciding and remembering are two steps: [`Rails::decide`] changes nothing that matters, and
//! only a decision whose audit record was written is [`Rails::remember`]ed, so that an alert
//! that could not be recorded is decided afresh when it comes again. The same records rebuild
//! the rails at start ([`super::replay`]): a restart, or a crash loop, forgets nothing.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use super::alert::{Alert, Status};
use crate::config::remediation::Route;

/// How long a handled alert is remembered when no resolution comes (Alertmanager resends a
/// firing alert every `repeat_interval`, 4 h by default).
const REMEMBER: Duration = Duration::from_secs(7 * 24 * 3600);
/// About this many handled alerts are remembered (a tenth more between prunings); the oldest go
/// first.
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
    handled: HashMap<(String, String, Status, String), SystemTime>,
    /// (route, GPU key) → last firing action.
    last_run: HashMap<(String, String), SystemTime>,
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

/// A decision to act, as the rails remember it (and as the audit log's `decision` records
/// carry it, to be remembered again after a restart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// The route's [`Route::id`].
    pub route: String,
    pub fingerprint: String,
    pub status: Status,
    pub starts_at: String,
    /// See [`gpu_key`].
    pub gpu: String,
    pub at: SystemTime,
}

impl Handled {
    pub fn of(route: &Route, alert: &Alert, at: SystemTime) -> Handled {
        Handled {
            route: route.id.clone(),
            fingerprint: alert.fingerprint.clone(),
            status: alert.status,
            starts_at: alert.starts_at.clone(),
            gpu: gpu_key(alert),
            at,
        }
    }
}

impl Rails {
    /// Decides for (`route`, `alert`) at `now`; a `Run` or `DryRun` is remembered only once
    /// [`Rails::remember`] is called with it.
    pub fn decide(
        &mut self,
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
            route.id.clone(),
            alert.fingerprint.clone(),
            alert.status,
            alert.starts_at.clone(),
        );
        if self.handled.contains_key(&key) {
            return Decision::Skip(SkipReason::Duplicate);
        }
        let gpu = (route.id.clone(), gpu_key(alert));
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
        if dry_run {
            Decision::DryRun
        } else {
            Decision::Run
        }
    }

    /// Remembers a decision to act (recorded in the audit log): idempotence, cooldown and the
    /// hourly count. Records older than what the rails keep change nothing.
    pub fn remember(&mut self, h: Handled, now: SystemTime) {
        let Handled {
            route,
            fingerprint,
            status,
            starts_at,
            gpu,
            at,
        } = h;
        // A decision is never later than now (a clock set back since): read as made now.
        let at = at.min(now);
        if since(at, now) >= REMEMBER {
            return;
        }
        let key = (route.clone(), fingerprint, status, starts_at);
        self.handled.insert(key, at);
        // Pruned in batches, down to REMEMBER_MAX: one scan per REMEMBER_MAX / 10 inserts rather
        // than one per insert, which matters when a week of decisions is replayed at start.
        if self.handled.len() > REMEMBER_MAX + REMEMBER_MAX / 10 {
            let mut times: Vec<SystemTime> = self.handled.values().copied().collect();
            times.sort_unstable();
            if let Some(cut) = times.get(times.len() - REMEMBER_MAX).copied() {
                self.handled.retain(|_, t| *t >= cut);
            }
        }
        // The firing stays remembered after its resolution: a new firing of the alert has a
        // new startsAt (a new key), while the same firing replayed (Alertmanager resending, a
        // receiver retrying after the resolution) must not run the route again.
        if status == Status::Firing {
            let last = self.last_run.entry((route, gpu)).or_insert(at);
            *last = (*last).max(at);
        }
        if since(at, now) < HOUR {
            let pos = self.recent.partition_point(|t| *t <= at);
            self.recent.insert(pos, at);
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
            id: "-> h".into(),
            matchers: Vec::new(),
            hooks: vec!["h".into()],
            cooldown: Duration::from_secs(cooldown_s),
            on_resolved,
        }
    }

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + s)
    }

    impl Rails {
        /// Decides, and remembers what it decided to do (as the dispatcher does once the
        /// decision is recorded).
        fn take(
            &mut self,
            route: &Route,
            a: &Alert,
            dry_run: bool,
            max: u32,
            now: SystemTime,
        ) -> Decision {
            let d = self.decide(route, a, dry_run, max, now);
            if !matches!(d, Decision::Skip(_)) {
                self.remember(Handled::of(route, a, now), now);
            }
            d
        }
    }

    #[test]
    fn the_oldest_are_forgotten_beyond_the_limit() {
        let mut r = Rails::default();
        let route = route(0, false);
        let now = at(100_000);
        for i in 0..(2 * REMEMBER_MAX) {
            let a = alert(Status::Firing, "0", &format!("f{i}"), "t");
            r.remember(Handled::of(&route, &a, at(i as u64)), now);
        }
        assert!(r.handled.len() <= REMEMBER_MAX + REMEMBER_MAX / 10);
        let newest = alert(
            Status::Firing,
            "0",
            &format!("f{}", 2 * REMEMBER_MAX - 1),
            "t",
        );
        assert_eq!(
            r.decide(&route, &newest, false, u32::MAX, now),
            Decision::Skip(SkipReason::Duplicate)
        );
        let oldest = alert(Status::Firing, "0", "f0", "t");
        assert_eq!(
            r.decide(&route, &oldest, false, u32::MAX, now),
            Decision::Run
        );
    }

    #[test]
    fn a_decision_not_remembered_leaves_no_trace() {
        let mut r = Rails::default();
        let a = alert(Status::Firing, "0", "f1", "t0");
        let route = route(3600, false);
        assert_eq!(r.decide(&route, &a, false, 1, at(0)), Decision::Run);
        // Its record could not be written: the re-send is decided afresh, and runs.
        assert_eq!(r.take(&route, &a, false, 1, at(5)), Decision::Run);
        assert_eq!(
            r.take(&route, &a, false, 1, at(6)),
            Decision::Skip(SkipReason::Duplicate)
        );
    }

    /// Issue 33 defect 11: a decision dated a day ahead (the clock set back since) holds its
    /// cooldown and hourly slot from now, not until a day and an hour from now.
    #[test]
    fn a_decision_dated_in_the_future_is_read_as_made_now() {
        let route = route(600, false);
        let a = alert(Status::Firing, "0", "f0", "t0");
        let now = at(0);
        let mut r = Rails::default();
        r.remember(
            Handled::of(&route, &a, now + Duration::from_secs(86_400)),
            now,
        );
        let b = alert(Status::Firing, "0", "g0", "t1");
        assert_eq!(
            r.decide(&route, &b, false, 10, now + Duration::from_secs(60)),
            Decision::Skip(SkipReason::Cooldown),
            "within the cooldown from now"
        );
        let later = now + Duration::from_secs(3_601);
        assert_eq!(
            r.decide(&route, &b, false, 1, later),
            Decision::Run,
            "an hour on"
        );
    }

    #[test]
    fn remembered_records_rebuild_the_same_rails_in_any_order() {
        let route = route(3600, true);
        let a = alert(Status::Firing, "0", "f0", "t0");
        let b = alert(Status::Firing, "1", "f1", "t0");
        let old = alert(Status::Firing, "2", "f2", "t0");
        let mut r = Rails::default();
        let now = at(8 * 24 * 3600);
        let hour_ago = now - Duration::from_secs(1800);
        r.remember(Handled::of(&route, &b, hour_ago), now);
        r.remember(Handled::of(&route, &a, now - Duration::from_secs(60)), now);
        r.remember(Handled::of(&route, &old, at(0)), now);
        assert_eq!(
            r.decide(&route, &a, false, 10, now),
            Decision::Skip(SkipReason::Duplicate)
        );
        let a2 = alert(Status::Firing, "0", "g0", "t1");
        assert_eq!(
            r.decide(&route, &a2, false, 10, now),
            Decision::Skip(SkipReason::Cooldown)
        );
        let c = alert(Status::Firing, "3", "f3", "t0");
        assert_eq!(r.decide(&route, &c, false, 3, now), Decision::Run);
        assert_eq!(
            r.decide(&route, &c, false, 2, now),
            Decision::Skip(SkipReason::RateLimited)
        );
        // A week-old record is forgotten.
        assert_eq!(r.decide(&route, &old, false, 10, now), Decision::Run);
    }

    #[test]
    fn a_firing_replayed_after_its_resolution_runs_nothing_more() {
        let mut r = Rails::default();
        let route = route(0, true);
        let firing = alert(Status::Firing, "0", "f1", "t0");
        let resolved = alert(Status::Resolved, "0", "f1", "t0");
        assert_eq!(r.take(&route, &firing, false, 10, at(0)), Decision::Run);
        assert_eq!(r.take(&route, &resolved, false, 10, at(1)), Decision::Run);
        assert_eq!(
            r.take(&route, &firing, false, 10, at(2)),
            Decision::Skip(SkipReason::Duplicate)
        );
        // A new firing of the same alert (new startsAt) is a new alert.
        let again = alert(Status::Firing, "0", "f1", "t3");
        assert_eq!(r.take(&route, &again, false, 10, at(3)), Decision::Run);
    }

    #[test]
    fn a_resent_alert_runs_once() {
        let mut r = Rails::default();
        let a = alert(Status::Firing, "0", "f1", "t0");
        let route = route(0, false);
        assert_eq!(r.take(&route, &a, false, 10, at(0)), Decision::Run);
        assert_eq!(
            r.take(&route, &a, false, 10, at(1)),
            Decision::Skip(SkipReason::Duplicate)
        );
        // Another route handles it on its own.
        let other = Route {
            id: "-> other".into(),
            ..route.clone()
        };
        assert_eq!(r.take(&other, &a, false, 10, at(2)), Decision::Run);
    }

    #[test]
    fn cooldown_is_per_route_and_gpu_and_resolutions_pass() {
        let mut r = Rails::default();
        let route = route(3600, true);
        let a0 = alert(Status::Firing, "0", "f0", "t0");
        let b0 = alert(Status::Firing, "0", "g0", "t0");
        let a1 = alert(Status::Firing, "1", "f1", "t0");
        assert_eq!(r.take(&route, &a0, false, 10, at(0)), Decision::Run);
        assert_eq!(
            r.take(&route, &b0, false, 10, at(10)),
            Decision::Skip(SkipReason::Cooldown)
        );
        assert_eq!(r.take(&route, &a1, false, 10, at(10)), Decision::Run);
        let resolved = alert(Status::Resolved, "0", "f0", "t0");
        assert_eq!(r.take(&route, &resolved, false, 10, at(20)), Decision::Run);
        assert_eq!(r.take(&route, &b0, false, 10, at(3601)), Decision::Run);
        // After its resolution, the same alert firing again (a new start) is new, past cooldown.
        let again = alert(Status::Firing, "0", "f0", "t1");
        assert_eq!(
            r.take(&route, &again, false, 10, at(3700)),
            Decision::Skip(SkipReason::Cooldown)
        );
        assert_eq!(r.take(&route, &again, false, 10, at(7300)), Decision::Run);
    }

    #[test]
    fn resolved_needs_on_resolved_and_dry_run_decides_the_same() {
        let mut r = Rails::default();
        let resolved = alert(Status::Resolved, "0", "f0", "t0");
        assert_eq!(
            r.take(&route(0, false), &resolved, false, 10, at(0)),
            Decision::Skip(SkipReason::Resolved)
        );
        let a = alert(Status::Firing, "0", "f0", "t0");
        assert_eq!(
            r.take(&route(0, false), &a, true, 10, at(0)),
            Decision::DryRun
        );
        assert_eq!(
            r.take(&route(0, false), &a, true, 10, at(1)),
            Decision::Skip(SkipReason::Duplicate)
        );
    }

    #[test]
    fn the_hourly_limit_is_node_wide_and_rolls() {
        let mut r = Rails::default();
        let route = route(0, false);
        for i in 0..3 {
            let a = alert(Status::Firing, &i.to_string(), &format!("f{i}"), "t");
            assert_eq!(r.take(&route, &a, false, 3, at(i as u64)), Decision::Run);
        }
        let a = alert(Status::Firing, "9", "f9", "t");
        assert_eq!(
            r.take(&route, &a, false, 3, at(100)),
            Decision::Skip(SkipReason::RateLimited)
        );
        assert_eq!(r.take(&route, &a, false, 3, at(3600)), Decision::Run);
    }
}
