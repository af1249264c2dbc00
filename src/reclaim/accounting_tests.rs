use std::time::Duration;

use super::*;
use crate::reclaim::idle::{IdleConfig, IdleTracker};
use crate::reclaim::testkit::{alive, gpu, pod, proc, snap, with_info};
use crate::snapshot::Attribution;

const SECOND: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);

fn add(a: &mut Accounts, t: &mut IdleTracker, s: &Snapshot) {
    let c = IdleConfig {
        threshold: 0.01,
        min_memory_bytes: 256 * 1024 * 1024,
    };
    let units = t.observe(s, &alive(s), &c);
    a.add(s, &units, SECOND, HOUR);
}

fn get<'a>(a: &'a Accounts, kind: OwnerKind, owner: &str) -> &'a Totals {
    a.owners
        .iter()
        .find(|(k, _)| k.kind == kind && k.owner == owner)
        .map(|(_, t)| t)
        .unwrap_or_else(|| panic!("no {owner}: {:?}", a.owners))
}

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-9, "{a} != {b}");
}

#[test]
fn held_busy_and_energy_split_by_utilization_share() {
    let unit = Attribution {
        systemd_unit: Some("trainer.service".into()),
        ..Attribution::default()
    };
    let job = Attribution {
        systemd_unit: Some("slurmstepd.scope".into()),
        slurm_job: Some("4242".into()),
        ..Attribution::default()
    };
    let g = |sm_a, sm_b| {
        gpu(
            0,
            Some(50),
            vec![
                with_info(proc(10, 4096, Some(sm_a)), "train", "svc", unit.clone()),
                with_info(proc(11, 4096, Some(sm_b)), "job", "bob", job.clone()),
                with_info(proc(12, 1, Some(0)), "shell", "bob", job.clone()),
            ],
        )
    };
    let mut a = Accounts::default();
    let mut t = IdleTracker::default();
    add(&mut a, &mut t, &snap(0, vec![g(75, 25)]));
    assert!(
        a.owners.is_empty(),
        "the first snapshot only sets the clock"
    );
    add(&mut a, &mut t, &snap(1, vec![g(75, 25)]));
    add(&mut a, &mut t, &snap(2, vec![g(0, 0)]));
    let svc = get(&a, OwnerKind::SystemdUnit, "trainer.service");
    let slurm = get(&a, OwnerKind::SlurmJob, "4242");
    close(svc.held_seconds, 2.0);
    close(slurm.held_seconds, 2.0);
    close(svc.busy_seconds, 0.75);
    close(slurm.busy_seconds, 0.25);
    // 100 W: second 1 split 75/25, second 2 (nobody computes) split equally.
    close(svc.energy_joules, 75.0 + 50.0);
    close(slurm.energy_joules, 25.0 + 50.0);
    close(
        a.idle_held
            .get(&(0, "GPU-0".into()))
            .copied()
            .unwrap_or(0.0),
        0.0,
    );
}

#[test]
fn idle_held_seconds_count_only_idle_polls_and_gaps_are_capped() {
    let mut a = Accounts::default();
    let mut t = IdleTracker::default();
    let idle = |s| snap(s, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]);
    add(&mut a, &mut t, &idle(0));
    add(&mut a, &mut t, &idle(1));
    add(&mut a, &mut t, &idle(2));
    let busy = snap(3, vec![gpu(0, Some(80), vec![proc(10, 4096, Some(80))])]);
    add(&mut a, &mut t, &busy);
    close(a.idle_held[&(0, "GPU-0".into())], 2.0);
    // A 100 s stall counts three intervals, not 100 s.
    add(&mut a, &mut t, &idle(103));
    close(get(&a, OwnerKind::User, "alice").held_seconds, 3.0 + 3.0);
}

#[test]
fn owners_are_pods_then_jobs_then_units_then_users() {
    let pod_attr = Attribution {
        pod_uid: Some("0b1c-uid".into()),
        systemd_unit: Some("cri-containerd-x.scope".into()),
        ..Attribution::default()
    };
    let mut g = gpu(
        0,
        Some(0),
        vec![with_info(proc(1, 10, None), "py", "u", pod_attr.clone())],
    );
    g.reading.pods = vec![pod("team-a", "nb-0"), pod("team-a", "nb-0")];
    let k = owner(&g, &g.reading.processes.as_ref().expect("procs")[0]);
    assert_eq!(
        (k.kind, k.owner.as_str(), k.namespace.as_str()),
        (OwnerKind::Pod, "nb-0", "team-a")
    );
    // Time-sliced between two pods: the pod is known by its UID only.
    g.reading.pods.push(pod("team-b", "nb-1"));
    let k = owner(&g, &g.reading.processes.as_ref().expect("procs")[0]);
    assert_eq!((k.owner.as_str(), k.namespace.as_str()), ("0b1c-uid", ""));
    let mut p = proc(2, 10, None);
    p.info = None;
    assert_eq!(owner(&g, &p).owner, "unknown");
    assert_eq!(owner(&g, &proc(3, 10, None)).kind, OwnerKind::User);
}

#[test]
fn state_survives_a_restart_exactly_and_is_replaced_atomically() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = Accounts::default();
    let mut t = IdleTracker::default();
    let idle = |s| snap(s, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]);
    for s in 0..=10 {
        add(&mut a, &mut t, &idle(s));
    }
    a.save(dir.path()).expect("save");
    let mut b = Accounts::load(dir.path()).expect("load");
    assert_eq!(b.owners, a.owners);
    assert_eq!(b.idle_held, a.idle_held);
    // The restarted agent's first snapshot sets its clock; then it counts on from the total.
    add(&mut b, &mut t, &idle(500));
    add(&mut b, &mut t, &idle(501));
    close(get(&b, OwnerKind::User, "alice").held_seconds, 11.0);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, [STATE_FILE], "no temporary file left behind");
    // Bit for bit, also for values whose shortest decimal form takes 17 digits: the one below
    // came back one ulp lower before serde_json parsed floats exactly (`float_roundtrip`).
    for t in a.owners.values_mut() {
        t.held_seconds = 2.0029015070000002;
        t.busy_seconds = 0.1 + 0.2;
        t.energy_joules = 123_456.789_012_345_68;
    }
    a.save(dir.path()).expect("save");
    let c = Accounts::load(dir.path()).expect("load");
    let bits = |a: &Accounts| -> Vec<[u64; 3]> {
        a.owners
            .values()
            .map(|t| {
                [
                    t.held_seconds.to_bits(),
                    t.busy_seconds.to_bits(),
                    t.energy_joules.to_bits(),
                ]
            })
            .collect()
    };
    assert_eq!(bits(&c), bits(&a));
    assert!(Accounts::load(&dir.path().join("absent"))
        .expect("empty")
        .owners
        .is_empty());
    std::fs::write(dir.path().join(STATE_FILE), "{").expect("write");
    let e = Accounts::load(dir.path()).expect_err("corrupt");
    assert!(e.to_string().contains(STATE_FILE), "{e}");
}

#[test]
fn an_owner_gone_for_forget_after_is_dropped() {
    let mut a = Accounts::default();
    let mut t = IdleTracker::default();
    add(
        &mut a,
        &mut t,
        &snap(0, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]),
    );
    add(
        &mut a,
        &mut t,
        &snap(1, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]),
    );
    assert_eq!(a.owners.len(), 1);
    add(&mut a, &mut t, &snap(3600, vec![gpu(0, Some(0), vec![])]));
    assert_eq!(a.owners.len(), 1, "kept for forget_after");
    add(&mut a, &mut t, &snap(3602, vec![gpu(0, Some(0), vec![])]));
    assert!(a.owners.is_empty());
}

#[test]
fn counters_that_cannot_be_ours_are_refused_when_read_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let owner = r#"{"gpu":0,"uuid":"GPU-0","kind":"user","owner":"alice","namespace":""}"#;
    for totals in [
        r#"{"held_seconds":-5.0,"busy_seconds":0.0,"energy_joules":0.0,"last_held":0}"#,
        r#"{"held_seconds":1.0,"busy_seconds":1e300,"energy_joules":0.0,"last_held":0}"#,
        r#"{"held_seconds":1.0,"busy_seconds":0.0,"energy_joules":-1e-9,"last_held":0}"#,
    ] {
        let text = format!(r#"{{"version":1,"owners":[[{owner},{totals}]],"idle_held":[]}}"#);
        std::fs::write(dir.path().join(STATE_FILE), &text).expect("write");
        let e = Accounts::load(dir.path()).expect_err(&text);
        assert!(e.to_string().contains("not a plausible total"), "{e}");
    }
    let text = r#"{"version":1,"owners":[],"idle_held":[[[0,"GPU-0"],-3.0]]}"#;
    std::fs::write(dir.path().join(STATE_FILE), text).expect("write");
    assert!(Accounts::load(dir.path()).is_err());
    let text = r#"{"version":1,"owners":[],"idle_held":[[[0,"GPU-0"],3.0]]}"#;
    std::fs::write(dir.path().join(STATE_FILE), text).expect("write");
    assert_eq!(
        Accounts::load(dir.path())
            .expect("plausible")
            .idle_held
            .len(),
        1
    );
}
