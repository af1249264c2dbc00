use std::collections::HashMap;
use std::time::Duration;

use super::*;
use crate::config::reclaim::{Patterns, WarnStep};
use crate::reclaim::idle::{IdleConfig, IdleTracker};
use crate::reclaim::testkit::{alive, at, gpu, pod, proc, snap, with_info};
use crate::snapshot::{Attribution, Snapshot};

fn config() -> ReclaimConfig {
    ReclaimConfig {
        enabled: true,
        dry_run: false,
        idle_after: Duration::from_secs(60),
        max_reclaims_per_hour: 10,
        ..ReclaimConfig::default()
    }
}

fn idle_config(c: &ReclaimConfig) -> IdleConfig {
    IdleConfig {
        threshold: c.utilization_threshold,
        min_memory_bytes: c.min_memory_mib * 1024 * 1024,
    }
}

struct Run {
    tracker: IdleTracker,
    ladder: Ladder,
    config: ReclaimConfig,
}

impl Run {
    fn new(config: ReclaimConfig) -> Run {
        Run {
            tracker: IdleTracker::default(),
            ladder: Ladder::default(),
            config,
        }
    }
    fn at(&mut self, s: &Snapshot) -> Vec<Decision> {
        self.with(s, &alive(s))
    }
    fn with(&mut self, s: &Snapshot, starts: &HashMap<u32, u64>) -> Vec<Decision> {
        let units = self.tracker.observe(s, starts, &idle_config(&self.config));
        self.ladder.decide(&units, &self.config, s.taken_at)
    }
    fn units(&mut self, s: &Snapshot) -> Vec<UnitStatus> {
        self.tracker
            .observe(s, &alive(s), &idle_config(&self.config))
    }
}

fn kinds(d: &[Decision]) -> Vec<&'static str> {
    d.iter()
        .map(|d| match d {
            Decision::Detected { .. } => "detected",
            Decision::AllocatedUnused { .. } => "allocated_unused",
            Decision::Cleared { .. } => "cleared",
            Decision::Warn { .. } => "warn",
            Decision::Reclaim { .. } => "reclaim",
            Decision::RateLimited { .. } => "rate_limited",
        })
        .collect()
}

fn idle(t: u64) -> Snapshot {
    snap(t, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])])
}

#[test]
fn without_a_warn_step_the_holder_is_reclaimed_once_at_idle_after() {
    let mut r = Run::new(config());
    assert!(r.at(&idle(0)).is_empty());
    assert!(r.at(&idle(59)).is_empty());
    let d = r.at(&idle(60));
    assert_eq!(kinds(&d), ["detected", "reclaim"]);
    let Decision::Reclaim { targets, .. } = &d[1] else {
        panic!("{d:?}")
    };
    assert_eq!(targets[0].pid, 10);
    assert_eq!(targets[0].start_time, Some(100));
    assert!(r.at(&idle(61)).is_empty(), "once per episode");
    // Released: the reported episode is cleared.
    let d = r.at(&snap(62, vec![gpu(0, Some(0), vec![])]));
    assert_eq!(kinds(&d), ["cleared"]);
    let Decision::Cleared { gpu, .. } = &d[0] else {
        panic!()
    };
    assert_eq!(*gpu, 0);
}

#[test]
fn warn_then_grace_then_reclaim_and_activity_in_between_clears() {
    let mut c = config();
    c.warn = Some(WarnStep {
        hook: None,
        grace: Duration::from_secs(30),
    });
    let mut r = Run::new(c);
    r.at(&idle(0));
    assert_eq!(kinds(&r.at(&idle(60))), ["detected", "warn"]);
    assert!(r.at(&idle(89)).is_empty());
    assert_eq!(kinds(&r.at(&idle(90))), ["reclaim"]);

    // A second episode: warned, then the GPU is used: cleared, and the window starts again.
    let mut r = Run::new(r.config.clone());
    r.at(&idle(0));
    assert_eq!(kinds(&r.at(&idle(60))), ["detected", "warn"]);
    let busy = snap(70, vec![gpu(0, Some(50), vec![proc(10, 4096, Some(50))])]);
    let d = r.at(&busy);
    assert_eq!(kinds(&d), ["cleared"]);
    let Decision::Cleared { reason, .. } = &d[0] else {
        panic!()
    };
    assert!(
        reason.starts_with("active: GPU utilization 50%"),
        "{reason}"
    );
    assert!(r.at(&idle(80)).is_empty());
    assert!(r.at(&idle(139)).is_empty());
    assert_eq!(kinds(&r.at(&idle(140))), ["detected", "warn"]);
}

#[test]
fn exempt_holders_are_reported_and_never_targeted() {
    let mut c = config();
    c.exempt.users = vec!["bob".into()];
    c.exempt.gpus = vec!["GPU-1".into()];
    c.exempt.namespaces = vec!["prod".into()];
    let attr = Attribution::default();
    let pod_attr = Attribution {
        pod_uid: Some("uid-1".into()),
        ..Attribution::default()
    };
    let mut in_pod = gpu(
        2,
        Some(0),
        vec![with_info(
            proc(30, 4096, Some(0)),
            "python",
            "carol",
            pod_attr,
        )],
    );
    in_pod.reading.pods = vec![pod("prod", "server-0")];
    let s = |t| {
        snap(
            t,
            vec![
                gpu(
                    0,
                    Some(0),
                    vec![
                        with_info(
                            proc(10, 4096, Some(0)),
                            "nvidia-persistenced",
                            "root",
                            attr.clone(),
                        ),
                        with_info(proc(11, 4096, Some(0)), "python", "bob", attr.clone()),
                        with_info(proc(12, 4096, Some(0)), "python", "alice", attr.clone()),
                    ],
                ),
                gpu(1, Some(0), vec![proc(20, 4096, Some(0))]),
                in_pod.clone(),
            ],
        )
    };
    let mut r = Run::new(c);
    r.at(&s(0));
    let d = r.at(&s(60));
    assert_eq!(kinds(&d), ["detected", "reclaim", "detected", "detected"]);
    let Decision::Reclaim { targets, .. } = &d[1] else {
        panic!()
    };
    assert_eq!(targets.iter().map(|h| h.pid).collect::<Vec<_>>(), [12]);
    let units = r.units(&s(61));
    let why: Vec<Option<String>> = units[0]
        .holders
        .iter()
        .map(|h| exemption(h, &units[0], &r.config.exempt))
        .collect();
    assert_eq!(
        why,
        [
            Some("process name 'nvidia-persistenced' matches '^nvidia-'".to_string()),
            Some("user 'bob' is exempt".to_string()),
            None
        ]
    );
    assert_eq!(
        exemption(&units[1].holders[0], &units[1], &r.config.exempt).as_deref(),
        Some("GPU 1 is exempt")
    );
    assert_eq!(
        exemption(&units[2].holders[0], &units[2], &r.config.exempt).as_deref(),
        Some("namespace 'prod' is exempt")
    );
}

#[test]
fn a_gone_or_new_holder_is_never_a_target() {
    let mut r = Run::new(config());
    r.at(&idle(0));
    // At the deadline the process is a zombie (no start time): reported, nothing to act on.
    let d = r.with(&idle(60), &HashMap::new());
    assert_eq!(kinds(&d), ["detected"]);
    // A process that joined the idle GPU late has not held it for the window.
    let mut r = Run::new(config());
    r.at(&idle(0));
    let late = |t| {
        snap(
            t,
            vec![gpu(
                0,
                Some(0),
                vec![proc(10, 4096, Some(0)), proc(11, 4096, Some(0))],
            )],
        )
    };
    r.at(&late(30));
    let d = r.at(&late(60));
    let Decision::Reclaim { targets, .. } = &d[1] else {
        panic!("{d:?}")
    };
    assert_eq!(targets.iter().map(|h| h.pid).collect::<Vec<_>>(), [10]);
}

#[test]
fn the_hourly_limit_holds_reclaims_back_and_says_so_once() {
    let mut c = config();
    c.max_reclaims_per_hour = 1;
    let two = |t| {
        snap(
            t,
            vec![
                gpu(0, Some(0), vec![proc(10, 4096, Some(0))]),
                gpu(1, Some(0), vec![proc(11, 4096, Some(0))]),
            ],
        )
    };
    let mut r = Run::new(c);
    r.at(&two(0));
    let d = r.at(&two(60));
    assert_eq!(
        kinds(&d),
        ["detected", "reclaim", "detected", "rate_limited"]
    );
    assert!(r.at(&two(120)).is_empty());
    let units = r.units(&two(121));
    assert_eq!(
        r.ladder.next(&units[1], &r.config).map(|n| n.step),
        Ok("reclaim (rate limited)")
    );
    // An hour after the first reclaim, the second may go.
    assert_eq!(kinds(&r.at(&two(3660))), ["reclaim"]);
    assert_eq!(r.ladder.reclaims_last_hour(), 1);
}

#[test]
fn allocated_but_unused_is_reported_and_never_acted_on() {
    let mut r = Run::new(config());
    let mut g = gpu(0, Some(0), vec![]);
    g.reading.pods = vec![pod("team-a", "nb-0")];
    r.at(&snap(0, vec![g.clone()]));
    assert_eq!(
        kinds(&r.at(&snap(60, vec![g.clone()]))),
        ["allocated_unused"]
    );
    assert!(r.at(&snap(600, vec![g])).is_empty());
}

#[test]
fn next_says_what_happens_when() {
    let mut c = config();
    c.warn = Some(WarnStep {
        hook: None,
        grace: Duration::from_secs(30),
    });
    c.exempt.process_names = Patterns::default();
    let mut r = Run::new(c);
    let units = r.units(&idle(0));
    r.ladder.decide(&units, &r.config, at(0));
    let n = r.ladder.next(&units[0], &r.config).expect("next");
    assert_eq!((n.step, n.at), ("report", at(60)));
    r.at(&idle(60));
    let units = r.units(&idle(61));
    let n = r.ladder.next(&units[0], &r.config).expect("next");
    assert_eq!((n.step, n.at), ("reclaim", at(90)));
    r.at(&idle(90));
    let units = r.units(&idle(91));
    let why = r.ladder.next(&units[0], &r.config).expect_err("done");
    assert!(why.starts_with("reclaimed in this idle episode"), "{why}");
}

/// Issue 26 bug 9: a reclaim (and its warn) decided in dry run did nothing; turning dry run
/// off during the same idle episode acts on it, warn first, and the dry-run reclaim does not
/// hold the real one back under the hourly limit.
#[test]
fn turning_dry_run_off_acts_on_the_episode_that_dry_run_only_reported() {
    let mut c = config();
    c.dry_run = true;
    c.max_reclaims_per_hour = 1;
    c.warn = Some(WarnStep {
        hook: None,
        grace: Duration::from_secs(30),
    });
    let mut r = Run::new(c);
    r.at(&idle(0));
    assert_eq!(kinds(&r.at(&idle(60))), ["detected", "warn"]);
    assert_eq!(kinds(&r.at(&idle(90))), ["reclaim"]);
    assert!(r.at(&idle(120)).is_empty(), "once per episode in dry run");
    let units = r.units(&idle(121));
    let why = r
        .ladder
        .next(&units[0], &r.config)
        .expect_err("no next in dry run");
    assert!(why.contains("dry run"), "{why}");

    // SIGHUP with dry_run = false: the same episode is warned for real, then reclaimed.
    r.config.dry_run = false;
    let units = r.units(&idle(122));
    let n = r.ladder.next(&units[0], &r.config).expect("next");
    assert_eq!(n.step, "warn");
    assert_eq!(kinds(&r.at(&idle(130))), ["warn"]);
    assert!(r.at(&idle(140)).is_empty(), "its grace");
    assert_eq!(kinds(&r.at(&idle(160))), ["reclaim"]);
    assert_eq!(r.ladder.reclaims_last_hour(), 1);
    let units = r.units(&idle(161));
    let why = r.ladder.next(&units[0], &r.config).expect_err("done");
    assert!(why.starts_with("reclaimed in this idle episode"), "{why}");
}

#[test]
fn a_missing_next_step_always_says_why() {
    let mut c = config();
    c.exempt.gpus = vec!["0".into()];
    let mut r = Run::new(c);
    r.at(&idle(0));
    assert_eq!(kinds(&r.at(&idle(60))), ["detected"]);
    let units = r.units(&idle(61));
    let why = r.ladder.next(&units[0], &r.config).expect_err("exempt");
    assert!(
        why.contains("no holder can be acted on") && why.contains("pid 10: GPU 0 is exempt"),
        "{why}"
    );
    // Not idle: the state says why.
    let units = r.units(&snap(
        62,
        vec![gpu(0, Some(90), vec![proc(10, 4096, Some(90))])],
    ));
    let why = r.ladder.next(&units[0], &r.config).expect_err("active");
    assert!(why.starts_with("not idle: "), "{why}");
}

#[test]
fn pod_labels_exempt_and_unknown_labels_are_exempt_too() {
    use crate::config::reclaim::LabelSelector;
    let mut c = config();
    c.exempt.pod_labels = vec![
        LabelSelector {
            key: "app".into(),
            value: Some("jupyter".into()),
        },
        LabelSelector {
            key: "gpu-steward.io/exempt".into(),
            value: None,
        },
    ];
    let in_pod = Attribution {
        pod_uid: Some("uid-1".into()),
        ..Attribution::default()
    };
    let g = gpu(
        0,
        Some(0),
        vec![with_info(proc(10, 4096, Some(0)), "python", "u", in_pod)],
    );
    let mut r = Run::new(c);
    let mut units = r.units(&snap(0, vec![g]));
    let mut h = units[0].holders[0].clone();
    let labels = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    let exempt = r.config.exempt.clone();
    let why = |h: &Holder, u: &UnitStatus| exemption(h, u, &exempt);
    assert_eq!(
        why(&h, &units[0]).as_deref(),
        Some(
            "its pod's labels are not known (the container runtime has not listed it); exempt \
             until they are"
        )
    );
    h.pod_labels = labels(&[("app", "jupyter")]);
    assert_eq!(
        why(&h, &units[0]).as_deref(),
        Some("pod label 'app=jupyter' is exempt")
    );
    h.pod_labels = labels(&[("gpu-steward.io/exempt", "")]);
    assert_eq!(
        why(&h, &units[0]).as_deref(),
        Some("pod label 'gpu-steward.io/exempt' is exempt")
    );
    h.pod_labels = labels(&[("app", "trainer")]);
    assert_eq!(why(&h, &units[0]), None);
    units[0].holders[0] = h;
    assert_eq!(targets(&units[0], &exempt).len(), 1);
    // A process outside pods is not concerned.
    let plain = r.units(&idle(1));
    assert_eq!(why(&plain[0].holders[0], &plain[0]), None);
}

#[test]
fn reclaims_from_before_a_restart_count_against_the_hourly_limit() {
    let mut c = config();
    c.max_reclaims_per_hour = 1;
    let one = |t| snap(t, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]);
    let mut r = Run::new(c);
    // The last life reclaimed 30 min before this one's first snapshot (t = 1800 s), and once
    // more 2 h before: only the recent one is counted.
    let long_ago = at(0) - Duration::from_secs(5400);
    r.ladder.restore_reclaims(vec![at(0), long_ago], at(1800));
    assert_eq!(r.ladder.reclaims_last_hour(), 1);
    r.at(&one(1800));
    assert_eq!(kinds(&r.at(&one(1860))), ["detected", "rate_limited"]);
    // An hour after the restored reclaim, this one may go.
    assert_eq!(kinds(&r.at(&one(3600))), ["reclaim"]);
}
