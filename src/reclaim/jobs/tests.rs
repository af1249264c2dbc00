use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::health::{Action, Condition, GpuHealth, GpuVerdict, Journal, NodeHealth, Status};
use crate::publication::Page;
use crate::reclaim::testkit::{at, gpu, proc, snap, with_info, MIB};
use crate::snapshot::{Attribution, GpuSnapshot, XidStat};

fn published(t: u64, gpus: Vec<GpuSnapshot>, health: NodeHealth) -> Published {
    Published {
        snapshot: Arc::new(snap(t, gpus)),
        health: Arc::new(health),
        journal: Arc::new(Mutex::new(Journal::default())),
        page: Page::from_text(""),
        interval: Duration::from_secs(1),
    }
}

fn job(pid: u32, mib: u64, sm: Option<u32>, id: &str) -> crate::snapshot::GpuProcess {
    let a = Attribution {
        slurm_job: Some(id.into()),
        systemd_unit: Some("slurmstepd.scope".into()),
        ..Attribution::default()
    };
    with_info(proc(pid, mib, sm), "python", "alice", a)
}

fn xid(mut g: GpuSnapshot, xid: u64, count: u64, t: u64) -> GpuSnapshot {
    g.xids.insert(
        xid,
        XidStat {
            count,
            last_seen: at(t),
        },
    );
    g
}

/// A job alone on GPU 0 at 60 % SM and 1000 MiB, 300 W, for 10 one-second polls, with XID 13
/// in the middle: the report the issue asks for, computed by hand.
#[test]
fn a_job_alone_on_a_gpu_gets_its_time_utilization_memory_energy_and_xids() {
    let mut jobs = Jobs::default();
    let g0 = |count: u64| {
        let mut g = gpu(0, Some(60), vec![job(10, 1000, Some(60), "42")]);
        g.reading.power_mw = Some(300_000);
        if count > 0 {
            g = xid(g, 13, count, 5);
        }
        g
    };
    // GPU 1 runs someone else; an XID there is not the job's.
    let g1 = |t: u64| xid(gpu(1, Some(0), vec![proc(20, 10, Some(0))]), 31, t, t);
    for t in 0..=10 {
        let count = u64::from(t >= 5);
        jobs.observe(
            &published(t, vec![g0(count), g1(t)], NodeHealth::default()),
            &[],
        );
    }
    let r = jobs.get(&Key::slurm("42")).expect("a report");
    assert_eq!(r.gpus.len(), 1, "GPU 0 alone: {r:?}");
    assert_eq!((r.gpus[0].index, r.gpus[0].uuid.as_str()), (0, "GPU-0"));
    assert_eq!(r.first_seen, at(0));
    assert_eq!(r.last_seen, at(10));
    assert_eq!(r.held_seconds, 10.0, "the first poll only sets the clock");
    assert!((r.busy_seconds - 6.0).abs() < 1e-9, "{}", r.busy_seconds);
    assert!((r.sm_utilization.mean.expect("mean") - 0.6).abs() < 1e-9);
    assert_eq!(r.sm_utilization.max, Some(0.6));
    assert_eq!(r.memory_used_bytes.max, Some(1000 * MIB));
    assert!((r.energy_joules.expect("energy") - 3000.0).abs() < 1e-6);
    assert_eq!(r.xids.len(), 1, "{:?}", r.xids);
    assert_eq!((r.xids[0].xid, r.xids[0].gpu, r.xids[0].count), (13, 0, 1));
    assert_eq!(r.xids[0].time, at(5));
    assert!((r.busy_share().expect("held") - 0.6).abs() < 1e-9);
    assert_eq!((r.sampled_seconds, r.sampled_share()), (10.0, Some(1.0)));
    // The other owner is the user who ran the process outside any job or unit.
    let other = jobs
        .get(&Key {
            kind: OwnerKind::User,
            namespace: String::new(),
            id: "alice".into(),
        })
        .expect("alice's report");
    assert_eq!(other.xids.iter().map(|x| x.count).sum::<u64>(), 10);
}

/// Two owners on one GPU split its energy by utilization, as the accounting does; a poll
/// without a utilization sample counts as held, not as busy nor in the mean.
#[test]
fn owners_sharing_a_gpu_split_energy_by_utilization() {
    let mut jobs = Jobs::default();
    let procs = |sm_a: Option<u32>| {
        let mut g = gpu(
            0,
            Some(100),
            vec![job(1, 100, sm_a, "a"), job(2, 300, Some(25), "b")],
        );
        g.reading.power_mw = Some(400_000);
        g
    };
    jobs.observe(
        &published(0, vec![procs(Some(75))], NodeHealth::default()),
        &[],
    );
    jobs.observe(
        &published(1, vec![procs(Some(75))], NodeHealth::default()),
        &[],
    );
    jobs.observe(&published(2, vec![procs(None)], NodeHealth::default()), &[]);
    let a = jobs.get(&Key::slurm("a")).expect("a");
    let b = jobs.get(&Key::slurm("b")).expect("b");
    assert_eq!((a.held_seconds, b.held_seconds), (2.0, 2.0));
    assert_eq!(
        a.sm_utilization.mean,
        Some(0.75),
        "the unsampled second is not in the mean"
    );
    assert_eq!(a.busy_seconds, 0.75);
    // The busy share is over the sampled second, not the two held ones.
    assert_eq!((a.busy_share(), a.sampled_share()), (Some(0.75), Some(0.5)));
    // Second 1: 400 J split 3:1; second 2: only b computes, all 400 J are b's.
    assert_eq!(a.energy_joules, Some(300.0));
    assert_eq!(b.energy_joules, Some(500.0));
    assert_eq!(b.memory_used_bytes.max, Some(300 * MIB));
}

/// Conditions active on its GPU while it held it are listed once per raise; a reclaim step on
/// its pids is listed; a step on another owner's pids is not.
#[test]
fn conditions_and_reclaim_steps_are_kept_with_the_owner() {
    let mut jobs = Jobs::default();
    let g = || gpu(0, Some(0), vec![job(7, 4096, Some(0), "9")]);
    let health = |sev: Status| NodeHealth {
        gpus: vec![GpuHealth {
            index: 0,
            uuid: "GPU-0".into(),
            verdict: GpuVerdict::new(vec![Condition {
                name: "idle_held".into(),
                severity: sev,
                reason: "held idle".into(),
                action: Action::None,
                since: at(1),
            }]),
            xid_window_counts: Default::default(),
        }],
        ..NodeHealth::default()
    };
    jobs.observe(&published(0, vec![g()], NodeHealth::default()), &[]);
    jobs.observe(&published(1, vec![g()], health(Status::Warn)), &[]);
    let step = Acted {
        at: at(2),
        gpu: 0,
        uuid: "GPU-0".into(),
        step: "reclaim",
        action: "signal",
        dry_run: true,
        pids: vec![7, 99],
    };
    jobs.observe(&published(2, vec![g()], health(Status::Fail)), &[step]);
    let r = jobs.get(&Key::slurm("9")).expect("report");
    assert_eq!(r.conditions.len(), 1, "{:?}", r.conditions);
    let c = &r.conditions[0];
    assert_eq!(
        (c.condition.as_str(), c.severity, c.since, c.last),
        ("idle_held", Status::Fail, at(1), at(2))
    );
    assert_eq!(r.reclaim_actions.len(), 1);
    assert_eq!(r.reclaim_actions[0].pids, vec![7], "only its own pid");
    assert!(r.reclaim_actions[0].dry_run);
}

#[test]
fn reports_are_kept_seven_days_and_at_most_max_reports() {
    let now = at(0) + KEEP + Duration::from_secs(10);
    let report = |id: &str, seen: SystemTime| {
        let mut r = Report::new(&Key::slurm(id), seen);
        r.last_seen = seen;
        r
    };
    let mut jobs = Jobs {
        reports: [report("old", at(0)), report("recent", at(20))]
            .into_iter()
            .map(|r| (r.key(), r))
            .collect(),
        ..Jobs::default()
    };
    jobs.prune(now);
    assert!(jobs.get(&Key::slurm("old")).is_none());
    assert!(jobs.get(&Key::slurm("recent")).is_some());
    let mut many = Jobs::default();
    for i in 0..(MAX_REPORTS + 5) {
        let r = report(&i.to_string(), at(100 + i as u64));
        many.reports.insert(r.key(), r);
    }
    many.prune(at(100 + MAX_REPORTS as u64 + 5));
    assert_eq!(many.len(), MAX_REPORTS);
    assert!(
        many.get(&Key::slurm("4")).is_none(),
        "the least recently seen go"
    );
    assert!(many.get(&Key::slurm("5")).is_some());
}

#[test]
fn reports_come_back_from_the_file_and_a_damaged_file_is_set_aside() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shared = Shared::default();
    let mut store = Store::new(shared.clone(), Some(dir.path().to_path_buf()));
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("now")
        .as_secs()
        - 1_000_000;
    for t in 0..3 {
        let mut g = gpu(0, Some(50), vec![job(3, 512, Some(50), "77")]);
        g.reading.power_mw = Some(200_000);
        store.observe(
            &published(now + t, vec![g], NodeHealth::default()),
            &[],
            Duration::from_secs(3600),
        );
    }
    store.persist(Duration::from_secs(3600), true);
    let want = shared.get(&Key::slurm("77")).expect("report");
    assert_eq!(want.held_seconds, 2.0);

    let again = Store::new(Shared::default(), Some(dir.path().to_path_buf()));
    again.load();
    assert_eq!(
        again.shared.get(&Key::slurm("77")),
        Some(want.clone()),
        "read back exactly"
    );

    // A torn line: the readable reports are kept, the file set aside and reported.
    let path = dir.path().join(file::FILE_NAME);
    let mut text = std::fs::read(&path).expect("file");
    text.extend_from_slice(b"{\"kind\":\"slurm_job\",\"id\":\"torn\n");
    std::fs::write(&path, text).expect("damage");
    let (reports, problems) = file::load(dir.path());
    assert_eq!(reports, vec![want]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("is damaged (1 line(s) are not job reports)"),
        "{}",
        problems[0]
    );
    assert!(dir.path().join("jobs.jsonl.damaged").is_file());
    assert!(!path.exists());

    // A link planted at the name is not followed.
    std::os::unix::fs::symlink("/dev/zero", &path).expect("symlink");
    let (reports, problems) = file::load(dir.path());
    assert!(reports.is_empty() && problems.len() == 1, "{problems:?}");
}

#[test]
fn the_text_fits_80_columns_and_says_the_busy_share() {
    let mut jobs = Jobs::default();
    let cond = NodeHealth {
        gpus: vec![GpuHealth {
            index: 0,
            uuid: "GPU-0".into(),
            verdict: GpuVerdict::new(vec![Condition {
                name: "xid_13".into(),
                severity: Status::Warn,
                reason: "XID 13 (Graphics Engine Exception) seen 1 time(s) in the last 10m, a long reason that goes on and on".into(),
                action: Action::RestartApp,
                since: at(1),
            }]),
            xid_window_counts: Default::default(),
        }],
        ..NodeHealth::default()
    };
    // The first polls have no per-process sample yet (it comes on the expensive tier): they
    // count as held and sampled-not, so the busy share is over the two sampled seconds.
    for t in 0..5 {
        let sm = (t >= 3).then_some(25);
        let g = xid(gpu(0, Some(25), vec![job(1, 1000, sm, "5")]), 13, 1, 1);
        jobs.observe(&published(t, vec![g], cond.clone()), &[]);
    }
    let text = text::render(jobs.get(&Key::slurm("5")).expect("report"));
    assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
    let busy: Vec<&str> = text.lines().filter(|l| l.starts_with("busy:")).collect();
    assert_eq!(
        busy,
        ["busy: 25% of the GPU time it held (sampled 2 of 4 GPU-s, 50%)"],
        "{text}"
    );
    assert!(text.contains("XID 13 (x1)"), "{text}");
    assert!(text.contains("GPU 0 xid_13 [warn]"), "{text}");
}
