//! The acting path against real processes this test starts.

use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use super::*;
use crate::config::reclaim::WarnStep;
use crate::reclaim::idle::UnitKey;

const PROC: &str = "/proc";

fn sleeper() -> Child {
    Command::new("sleep")
        .arg("300")
        .spawn()
        .expect("spawn sleep")
}

/// Children killed and reaped on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn holder(pid: u32, start_time: Option<u64>) -> Holder {
    Holder {
        pid,
        start_time,
        memory_bytes: 1 << 30,
        sm_util_percent: Some(0),
        name: Some("sleep".into()),
        user: Some("root".into()),
        pod_uid: None,
        systemd_unit: None,
        slurm_job: None,
        pod_labels: None,
        since: SystemTime::UNIX_EPOCH,
    }
}

fn unit(holders: Vec<Holder>) -> UnitStatus {
    UnitStatus {
        key: UnitKey {
            uuid: "GPU-0".into(),
            gpu_instance: None,
        },
        gpu: 0,
        state: UnitState::Idle {
            since: SystemTime::UNIX_EPOCH,
        },
        held_memory_bytes: 1 << 30,
        holders,
        pods: Vec::new(),
    }
}

fn actor(dir: &Path) -> Actor {
    Actor {
        procfs: PathBuf::from(PROC),
        owner: Some(crate::changes::Owner::with(crate::changes::Setup {
            nvml_lib: String::new(),
            audit_file: dir.join("audit.jsonl"),
            mig: Default::default(),
        })),
        counts: ActionCounts::default(),
    }
}

fn wait_count(a: &Actor, key: (&'static str, &'static str)) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while a
        .counts
        .lock()
        .expect("lock")
        .get(&key)
        .copied()
        .unwrap_or(0)
        == 0
    {
        assert!(Instant::now() < deadline, "no {key:?}: {:?}", a.counts);
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn audit_events(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

#[test]
fn sigterm_ends_a_process_and_its_unreaped_zombie_counts_as_gone() {
    // The child is not reaped until the end: after SIGTERM it lingers as a zombie.
    let mut child = sleeper();
    let who = procs::identify(Path::new(PROC), child.id()).expect("alive");
    let report = terminate(Path::new(PROC), &[who], Duration::from_secs(10));
    assert_eq!(report[0].term, SignalResult::Sent);
    assert_eq!(report[0].kill, None, "gone within the grace: no SIGKILL");
    assert!(report[0].gone);
    let state = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).expect("stat");
    assert!(state.contains(") Z "), "still a zombie: {state}");
    let _ = child.wait();
}

#[test]
fn a_process_that_ignores_sigterm_gets_sigkill_after_the_grace() {
    let child = Reaped(
        Command::new("sh")
            .args(["-c", "trap '' TERM; while true; do sleep 0.05; done"])
            .spawn()
            .expect("spawn sh"),
    );
    // Let the shell install its trap.
    std::thread::sleep(Duration::from_millis(200));
    let who = procs::identify(Path::new(PROC), child.0.id()).expect("alive");
    let started = Instant::now();
    let report = terminate(Path::new(PROC), &[who], Duration::from_millis(300));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(report[0].term, SignalResult::Sent);
    assert_eq!(report[0].kill, Some(SignalResult::Sent));
    assert!(report[0].gone);
}

#[test]
fn a_pid_that_names_another_process_since_the_decision_is_not_signalled() {
    // The decision saw process A; A ends and the pid now names B (another start time). The
    // kernel will not hand us A's pid on demand, so the identity pairs B's pid with A's start
    // time: exactly what the agent holds after a pid is reused.
    let mut a = sleeper();
    let seen = procs::identify(Path::new(PROC), a.id()).expect("alive");
    std::thread::sleep(Duration::from_millis(50)); // at least one clock tick apart
    let _ = a.kill();
    let _ = a.wait();
    let mut b = Reaped(sleeper());
    let now = procs::identify(Path::new(PROC), b.0.id()).expect("alive");
    assert_ne!(now.start_time, seen.start_time, "distinct start times");
    let decided = holder(b.0.id(), Some(seen.start_time));
    let report = terminate(
        Path::new(PROC),
        &identities(&[decided]),
        Duration::from_millis(100),
    );
    assert_eq!(report[0].term, SignalResult::Replaced);
    assert_eq!(report[0].kill, None);
    assert!(b.0.try_wait().expect("try_wait").is_none(), "B was not hit");
}

#[test]
fn dry_run_audits_and_counts_and_touches_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Reaped(sleeper());
    let who = procs::identify(Path::new(PROC), child.0.id()).expect("alive");
    let a = actor(dir.path());
    let config = ReclaimConfig {
        enabled: true,
        dry_run: true,
        grace: Duration::from_millis(10),
        ..ReclaimConfig::default()
    };
    let h = holder(who.pid, Some(who.start_time));
    a.reclaim(&unit(vec![h.clone()]), &[h], &config);
    assert_eq!(
        a.counts.lock().expect("lock").get(&("signal", "dry_run")),
        Some(&1)
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(child.0.try_wait().expect("try_wait").is_none(), "untouched");
    let events = audit_events(dir.path());
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["event"], "reclaim");
    assert_eq!(events[0]["dry_run"], true);
    assert_eq!(events[0]["processes"][0]["pid"], who.pid);
}

#[test]
fn signal_reclaim_is_audited_with_its_outcome() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = sleeper();
    let who = procs::identify(Path::new(PROC), child.id()).expect("alive");
    let a = actor(dir.path());
    let config = ReclaimConfig {
        enabled: true,
        dry_run: false,
        ..ReclaimConfig::default()
    };
    let h = holder(who.pid, Some(who.start_time));
    a.reclaim(&unit(vec![h.clone()]), &[h], &config);
    wait_count(&a, ("signal", "success"));
    let events = audit_events(dir.path());
    assert_eq!(events[1]["event"], "reclaim.result");
    // Each record says what started it.
    assert!(
        events.iter().all(|e| e["trigger"] == "reclaim"),
        "{events:?}"
    );
    assert_eq!(events[1]["processes"][0]["sigterm"], "sent");
    assert_eq!(events[1]["processes"][0]["gone"], true);
    let _ = child.wait();
}

#[test]
fn hooks_get_the_unit_as_json_on_stdin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("stdin.json");
    let a = actor(dir.path());
    let config = ReclaimConfig {
        enabled: true,
        dry_run: false,
        action: ActionKind::Hook,
        warn: Some(WarnStep {
            hook: Some(HookCommand {
                command: vec!["/bin/false".into()],
                timeout: Duration::from_secs(5),
            }),
            grace: Duration::ZERO,
        }),
        hook: Some(HookCommand {
            command: vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("cat > {}", out.display()),
            ],
            timeout: Duration::from_secs(5),
        }),
        ..ReclaimConfig::default()
    };
    let h = holder(4242, Some(7));
    a.warn(&unit(vec![h.clone()]), std::slice::from_ref(&h), &config);
    wait_count(&a, ("warn", "failure"));
    a.reclaim(&unit(vec![h.clone()]), &[h], &config);
    wait_count(&a, ("hook", "success"));
    let doc: Value =
        serde_json::from_slice(&std::fs::read(&out).expect("hook output")).expect("json");
    assert_eq!(doc["step"], "reclaim");
    assert_eq!(doc["uuid"], "GPU-0");
    assert_eq!(doc["processes"][0]["pid"], 4242);
    assert_eq!(doc["processes"][0]["start_time"], 7);
    assert_eq!(doc["processes"][0]["user"], "root");
    let events: Vec<String> = audit_events(dir.path())
        .iter()
        .map(|e| e["event"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(events, ["warn", "warn.result", "reclaim", "hook.result"]);
}
