//! Idle-GPU reclaim and accounting of the real binary: processes the test really starts hold
//! simulated GPUs (their pids are in the scenario), windows are seconds long, and what the agent
//! does to them is observed in /proc, the audit log, the hooks' input, /metrics and the API.
//!
//! The test does not reap a child the agent kills, so it lingers as a zombie, as a process whose
//! parent ignores it would: the agent must count it as gone. The simulator keeps listing the
//! pid (a real driver would not), so the tests also see that a zombie is never signalled again.

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime};

use common::fullfs::SmallFs;
use common::{wait_for, Agent};

const WAIT: Duration = Duration::from_secs(30);

/// Children killed and reaped on drop.
struct Procs(Vec<Child>);

impl Procs {
    fn start(programs: &[&Path]) -> Procs {
        Procs(
            programs
                .iter()
                .map(|p| Command::new(p).arg("300").spawn().expect("spawn"))
                .collect(),
        )
    }
    fn sleep(n: usize) -> Procs {
        Procs::start(&vec![Path::new("sleep"); n])
    }
    fn pid(&self, i: usize) -> u32 {
        self.0[i].id()
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `R`unning/`S`leeping..., `Z` for a zombie, `None` once reaped.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].chars().next()
}

fn alive(pid: u32) -> bool {
    state(pid).is_some_and(|s| s != 'Z' && s != 'X')
}

/// One idle H100 per pid: GPU at 0 %, the process holding 4 GiB at 0 % SM.
fn scenario(pids: &[u32], util: u32) -> String {
    let mut s = String::from("version = 1\n");
    for pid in pids {
        s.push_str(&format!(
            "[[gpu]]\nmodel = \"H100-SXM5-80GB\"\ngpu_util_percent = {util}\nmemory_used_mib = 4096\n\
             [[gpu.process]]\npid = {pid}\nused_memory_mib = 4096\nsm_util_percent = {util}\n"
        ));
    }
    s
}

fn config(audit: &Path, extra: &str) -> String {
    format!(
        "[audit]\nfile = \"{}\"\n[reclaim]\nenabled = true\nidle_after = \"2s\"\n{extra}",
        audit.display()
    )
}

fn audit_events(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
        .collect()
}

fn events_named(path: &Path, event: &str) -> Vec<serde_json::Value> {
    audit_events(path)
        .into_iter()
        .filter(|e| e["event"] == event)
        .collect()
}

fn actions(agent: &Agent, action: &str, result: &str) -> f64 {
    agent
        .metrics()
        .value(
            "gpu_steward_reclaim_actions_total",
            &[("action", action), ("result", result)],
        )
        .unwrap_or(0.0)
}

/// `idle_after` in [`config`].
const IDLE_AFTER: Duration = Duration::from_secs(2);

#[test]
fn an_idle_holder_is_warned_then_signalled_and_its_zombie_counts_as_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    let warned = dir.path().join("warned.json");
    let procs = Procs::sleep(1);
    let pid = procs.pid(0);
    let agent = Agent::with_scenario(&scenario(&[pid], 0))
        .config(&config(
            &audit,
            &format!(
                "dry_run = false\ngrace = \"5s\"\n[reclaim.warn]\ngrace = \"1s\"\n\
                 command = [\"/bin/sh\", \"-c\", \"cat > {}\"]\n",
                warned.display()
            ),
        ))
        .start();

    // Report: the health condition and the API say what happens next.
    let health = wait_for("idle_held on gpu:0", WAIT, || {
        let h = agent.get("/health").json();
        let c = h["checks"]["gpu:0"].to_string();
        c.contains("idle_held").then_some(c)
    });
    assert!(health.contains(&pid.to_string()), "{health}");

    // Warn: the hook got the GPU and the pid on stdin.
    let doc: serde_json::Value = wait_for("the warn hook's input", WAIT, || {
        serde_json::from_slice(&std::fs::read(&warned).ok()?).ok()
    });
    assert_eq!(doc["step"], "warn");
    assert_eq!(doc["gpu"], 0);
    assert_eq!(doc["processes"][0]["pid"], pid);
    assert_eq!(doc["processes"][0]["name"], "sleep");

    // Reclaim: SIGTERM; the child becomes a zombie (not reaped), which counts as gone.
    wait_for("the holder to be a zombie", WAIT, || {
        (state(pid) == Some('Z')).then_some(())
    });
    wait_for("signal success", WAIT, || {
        (actions(&agent, "signal", "success") == 1.0).then_some(())
    });
    assert_eq!(actions(&agent, "warn", "success"), 1.0);
    let result = wait_for("the audited outcome", WAIT, || {
        events_named(&audit, "reclaim.result").pop()
    });
    assert_eq!(result["processes"][0]["pid"], pid);
    assert_eq!(result["processes"][0]["sigterm"], "sent");
    assert_eq!(result["processes"][0]["gone"], true);
    let order: Vec<String> = audit_events(&audit)
        .iter()
        .map(|e| e["event"].as_str().unwrap_or("").to_string())
        .filter(|e| e != "idle_cleared")
        .collect();
    assert_eq!(
        order,
        [
            "idle_detected",
            "warn",
            "warn.result",
            "reclaim",
            "reclaim.result"
        ]
    );
    let warn = &events_named(&audit, "warn")[0];
    let reclaim = &events_named(&audit, "reclaim")[0];
    let ts = |e: &serde_json::Value| {
        humantime::parse_rfc3339(e["ts"].as_str().expect("ts")).expect("RFC 3339")
    };
    // The ladder decides on snapshot times: the warning comes at the first snapshot idle for
    // `idle_after`, the reclaim at the first one `grace` after that. A record's `ts` is when it
    // was written, some time after its snapshot (more on a loaded machine), so each bound is
    // checked from the idle episode's start, which both records carry: written late can only
    // make a record later, never earlier, and the bounds cannot pass if a step came early.
    let since = humantime::parse_rfc3339(warn["idle_since"].as_str().expect("idle_since"))
        .expect("RFC 3339");
    assert_eq!(warn["idle_since"], reclaim["idle_since"], "one episode");
    let after = |e: &serde_json::Value| ts(e).duration_since(since).unwrap_or_default();
    assert!(
        after(warn) >= IDLE_AFTER,
        "warned before idle_after: {warn}"
    );
    assert!(
        after(reclaim) >= IDLE_AFTER + Duration::from_secs(1),
        "the warn grace was kept: {warn} {reclaim}"
    );

    // The zombie still listed by the simulator is never acted on again.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(events_named(&audit, "reclaim").len(), 1);
    let api = agent.get("/api/v1/reclaim").json();
    assert_eq!(api["enabled"], true);
    assert_eq!(api["dry_run"], false);
    assert_eq!(
        api["candidates"][0]["holders"][0]["start_time"],
        serde_json::Value::Null
    );
    assert_eq!(api["candidates"][0]["targets"], serde_json::json!([]));
}

#[test]
fn exempt_holders_survive_while_the_others_are_reclaimed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    // A process named like NVIDIA's daemons: exempt by the default name patterns.
    let nvidia = dir.path().join("nvidia-idle");
    std::fs::copy(which("sleep"), &nvidia).expect("copy sleep");
    let procs = Procs::start(&[Path::new("sleep"), &nvidia, Path::new("sleep")]);
    let (gpu_exempt, name_exempt, target) = (procs.pid(0), procs.pid(1), procs.pid(2));
    let agent = Agent::with_scenario(&scenario(&[gpu_exempt, name_exempt, target], 0))
        .config(&config(
            &audit,
            "dry_run = false\ngrace = \"2s\"\nexempt_gpus = [\"0\"]\n",
        ))
        .start();
    wait_for("the target to be gone", WAIT, || {
        (!alive(target)).then_some(())
    });
    let api = wait_for("all three reported", WAIT, || {
        let api = agent.get("/api/v1/reclaim").json();
        (events_named(&audit, "idle_detected").len() == 3).then_some(api)
    });
    let candidates = api["candidates"].as_array().expect("candidates");
    let exempt = |gpu: u64| {
        candidates
            .iter()
            .find(|c| c["gpu"] == gpu)
            .map(|c| c["exempt"][0].clone())
            .expect("candidate")
    };
    assert_eq!(exempt(0), "GPU 0 is exempt");
    assert_eq!(exempt(1), "process name 'nvidia-idle' matches '^nvidia-'");
    std::thread::sleep(Duration::from_secs(1));
    assert!(alive(gpu_exempt), "the process on the exempt GPU survives");
    assert!(alive(name_exempt), "the exempt process survives");
    assert_eq!(events_named(&audit, "reclaim").len(), 1);
}

#[test]
fn activity_resets_the_clock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    let procs = Procs::sleep(1);
    let pid = procs.pid(0);
    let agent = Agent::with_scenario(&scenario(&[pid], 0))
        .config(
            &config(&audit, "dry_run = false\nidle_after = \"4s\"\n")
                .replace("idle_after = \"2s\"\n", ""),
        )
        .start();
    let idle_seconds = |agent: &Agent| {
        agent
            .metrics()
            .value("gpu_steward_gpu_idle_seconds", &[("gpu", "0")])
    };
    let first_idle = wait_for("two idle seconds", WAIT, || {
        idle_seconds(&agent).filter(|s| *s >= 2.0)
    });
    let busy_from = SystemTime::now();
    agent.rewrite_scenario(&scenario(&[pid], 60));
    wait_for("the clock to reset", WAIT, || {
        (idle_seconds(&agent) == Some(0.0)).then_some(())
    });
    let api = agent.get("/api/v1/reclaim").json();
    assert_eq!(api["candidates"][0]["state"], "active", "{api}");
    // Busy past the moment the first window would have ended.
    std::thread::sleep(Duration::from_secs_f64(4.5 - first_idle));
    assert!(alive(pid), "not reclaimed: the window started again");
    assert!(events_named(&audit, "reclaim").is_empty());
    agent.rewrite_scenario(&scenario(&[pid], 0));
    wait_for("the holder to be gone", WAIT, || {
        (!alive(pid)).then_some(())
    });
    let detected = &events_named(&audit, "idle_detected")[0];
    let since = humantime::parse_rfc3339(detected["idle_since"].as_str().expect("idle_since"))
        .expect("RFC 3339");
    assert!(
        since > busy_from,
        "the idle episode began after the activity"
    );
}

#[test]
fn dry_run_reports_and_audits_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    let procs = Procs::sleep(1);
    let pid = procs.pid(0);
    // dry_run is the default.
    let agent = Agent::with_scenario(&scenario(&[pid], 0))
        .config(&config(&audit, "grace = \"1s\"\n"))
        .start();
    wait_for("a dry-run reclaim", WAIT, || {
        (actions(&agent, "signal", "dry_run") == 1.0).then_some(())
    });
    let reclaim = &events_named(&audit, "reclaim")[0];
    assert_eq!(reclaim["dry_run"], true);
    assert_eq!(reclaim["processes"][0]["pid"], pid);
    std::thread::sleep(Duration::from_secs(2));
    assert!(alive(pid), "dry run changes nothing");
    assert_eq!(actions(&agent, "signal", "success"), 0.0);
    assert!(events_named(&audit, "reclaim.result").is_empty());
    let m = agent.metrics();
    assert_eq!(m.value("gpu_steward_reclaim_dry_run", &[]), Some(1.0));
    assert_eq!(
        m.value("gpu_steward_idle_held_memory_bytes", &[("gpu", "0")]),
        Some(4096.0 * 1024.0 * 1024.0)
    );
    assert_eq!(agent.get("/api/v1/reclaim").json()["dry_run"], true);
}

#[test]
fn off_by_default_measures_and_accounts_but_never_reports_nor_acts() {
    let procs = Procs::sleep(1);
    let pid = procs.pid(0);
    let agent = Agent::with_scenario(&scenario(&[pid], 0)).start();
    // Measured while off: held, idle and idle-held time all grow (waited for together, so that
    // a slow poll on a loaded machine does not make one lag the others at the moment of reading).
    let m = wait_for("held, idle and idle-held seconds", WAIT, || {
        let m = agent.metrics();
        let held = m.value(
            "gpu_steward_owner_held_seconds_total",
            &[("gpu", "0"), ("owner_kind", "user")],
        )?;
        let idle = m.value("gpu_steward_gpu_idle_seconds", &[("gpu", "0")])?;
        let idle_held = m.value("gpu_steward_gpu_idle_held_seconds_total", &[("gpu", "0")])?;
        (held >= 3.0 && idle >= 1.0 && idle_held >= 1.0).then_some(m)
    });
    assert!(m.find("gpu_steward_reclaim_actions_total", &[]).is_empty());
    let api = agent.get("/api/v1/reclaim").json();
    assert_eq!(api["enabled"], false);
    assert_eq!(api["candidates"], serde_json::json!([]));
    assert!(!agent.get("/health").text().contains("idle_held"));
    assert!(alive(pid));
}

#[test]
fn accounting_is_exact_across_an_agent_restart() {
    let state = tempfile::tempdir().expect("tempdir");
    let procs = Procs::sleep(1);
    let pid = procs.pid(0);
    let text = scenario(&[pid], 0);
    let cfg = format!(
        "[accounting]\nstate_dir = \"{}\"\npersist_every = \"1s\"\n",
        state.path().display()
    );
    let held = |agent: &Agent| {
        agent.metrics().value(
            "gpu_steward_owner_held_seconds_total",
            &[("gpu", "0"), ("owner_kind", "user")],
        )
    };
    let mut agent = Agent::with_scenario(&text).config(&cfg).start();
    let before = wait_for("two held seconds", WAIT, || {
        held(&agent).filter(|s| *s >= 2.0)
    });
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(agent.wait_exit(Duration::from_secs(10)).success());
    let saved: serde_json::Value = serde_json::from_slice(
        &std::fs::read(state.path().join("accounting.json")).expect("state file"),
    )
    .expect("state JSON");
    let saved_held = saved["owners"][0][1]["held_seconds"]
        .as_f64()
        .expect("held_seconds");
    assert!(
        saved_held >= before,
        "written at shutdown: {saved_held} < {before}"
    );
    let started = Instant::now();
    let agent = Agent::with_scenario(&text).config(&cfg).start();
    let after = held(&agent).expect("held after restart");
    assert!(
        after >= saved_held,
        "{after} < {saved_held}: the counter went back"
    );
    // Exact: the new agent adds only its own poll intervals on top of the saved total.
    let bound = started.elapsed().as_secs_f64() + 0.001;
    assert!(
        after - saved_held <= bound,
        "{after} - {saved_held} > {bound}"
    );
}

fn which(program: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
        .expect("program in PATH")
}

mod pod_labels {
    //! Exemption by pod label end to end: the processes are real, their pod membership comes from
    //! a procfs tree the test writes (their real `stat`, a kubepods cgroup), and the labels from
    //! a fake container runtime answering `ListPodSandbox` on a Unix socket.

    use std::collections::HashMap;
    use std::path::Path;
    use std::time::Duration;

    use gpu_steward::reclaim::cri::{
        ListPodSandboxRequest, ListPodSandboxResponse, PodSandbox, PodSandboxMetadata,
    };

    use super::common::{fake_grpc, wait_for, Agent};
    use super::{events_named, scenario, state, Procs, WAIT};

    /// A container runtime's CRI, as far as the agent uses it.
    struct RuntimeService;

    impl fake_grpc::Unary for RuntimeService {
        const SERVICE: &'static str = "runtime.v1.RuntimeService";
        type Request = ListPodSandboxRequest;
        type Response = ListPodSandboxResponse;
    }

    fn sandbox(uid: &str, app: &str) -> PodSandbox {
        PodSandbox {
            id: format!("sandbox-{uid}"),
            metadata: Some(PodSandboxMetadata {
                name: format!("{app}-0"),
                uid: uid.into(),
                namespace: "ml".into(),
            }),
            state: 0,
            labels: HashMap::from([("app".to_string(), app.to_string())]),
        }
    }

    /// `root/PID/{stat,comm,status,cgroup}`: the real stat (so the start time is the real one
    /// and signals reach the real process), in the pod `uid`.
    fn in_pod(root: &Path, pid: u32, uid: &str) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).expect("mkdir");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        std::fs::write(dir.join("stat"), stat).expect("write stat");
        std::fs::write(dir.join("comm"), "python\n").expect("comm");
        std::fs::write(dir.join("status"), "Name:\tpython\nUid:\t0\t0\t0\t0\n").expect("status");
        std::fs::write(
            dir.join("cgroup"),
            format!("0::/kubepods/burstable/pod{uid}/{}\n", "ab".repeat(32)),
        )
        .expect("cgroup");
    }

    #[test]
    fn a_pod_with_an_exempt_label_survives_and_the_other_pod_is_reclaimed() {
        const JUPYTER: &str = "11111111-1111-4111-8111-111111111111";
        const TRAINER: &str = "22222222-2222-4222-8222-222222222222";
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("containerd.sock");
        fake_grpc::serve::<RuntimeService>(
            &socket,
            ListPodSandboxResponse {
                items: vec![sandbox(JUPYTER, "jupyter"), sandbox(TRAINER, "trainer")],
            },
        );
        let procfs = dir.path().join("proc");
        let procs = Procs::sleep(2);
        let (exempt, target) = (procs.pid(0), procs.pid(1));
        in_pod(&procfs, exempt, JUPYTER);
        in_pod(&procfs, target, TRAINER);
        let audit = dir.path().join("audit.jsonl");
        let agent = Agent::with_scenario(&scenario(&[exempt, target], 0))
            .config(&format!(
                "[processes]\nprocfs = \"{}\"\n[audit]\nfile = \"{}\"\n[reclaim]\nenabled = true\n\
                 dry_run = false\nidle_after = \"2s\"\ngrace = \"1s\"\n\
                 exempt_pod_labels = [\"app=jupyter\"]\ncri_socket = \"{}\"\n",
                procfs.display(),
                audit.display(),
                socket.display()
            ))
            .start();
        wait_for("the trainer reclaimed", WAIT, || {
            (state(target) == Some('Z')).then_some(())
        });
        let api = agent.get("/api/v1/reclaim").json();
        assert_eq!(api["pod_labels"]["up"], true, "{api}");
        let gpu0 = &api["candidates"][0];
        assert_eq!(gpu0["holders"][0]["pod_labels"]["app"], "jupyter");
        assert_eq!(gpu0["exempt"][0], "pod label 'app=jupyter' is exempt");
        assert_eq!(
            agent
                .metrics()
                .value("gpu_steward_reclaim_pod_labels_up", &[]),
            Some(1.0)
        );
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(
            state(exempt),
            Some('S'),
            "the exempt pod's process survives"
        );
        let reclaims = events_named(&audit, "reclaim");
        assert_eq!(reclaims.len(), 1);
        assert_eq!(reclaims[0]["processes"][0]["pid"], target);
    }
}

#[test]
fn a_full_audit_disk_holds_the_signal_back_until_it_can_be_recorded() {
    let Some(fs) = SmallFs::new(
        "a_full_audit_disk_holds_the_signal_back_until_it_can_be_recorded",
        256,
    ) else {
        return;
    };
    let procs = Procs::sleep(1);
    let pid = procs.pid(0);
    let agent = Agent::with_scenario(&scenario(&[pid], 0))
        .config(&config(
            &fs.inside().join("audit.jsonl"),
            "dry_run = false\ngrace = \"1s\"\n",
        ))
        .prefix(fs.prefix())
        .start();
    fs.fill();

    // Due after idle_after, decided at every poll, refused every time: the process lives.
    wait_for("reclaims refused for the audit log", WAIT, || {
        (actions(&agent, "signal", "audit_failed") >= 3.0).then_some(())
    });
    assert!(
        alive(pid) && state(pid) != Some('Z'),
        "signalled unrecorded"
    );
    assert_eq!(actions(&agent, "signal", "success"), 0.0);
    let m = agent.metrics();
    assert!(
        m.get(
            "gpu_steward_audit_write_errors_total",
            &[("component", "reclaim")]
        ) >= 3.0
    );
    assert_eq!(agent.get("/health").json()["status"], "warn");

    // Room again: the step the ladder took back is decided again, recorded, and carried out.
    fs.free();
    wait_for("the holder to be a zombie", WAIT, || {
        (state(pid) == Some('Z')).then_some(())
    });
    wait_for("signal success", WAIT, || {
        (actions(&agent, "signal", "success") == 1.0).then_some(())
    });
    let records = wait_for("the audited outcome", WAIT, || {
        let r = fs.json_lines("audit.jsonl");
        r.iter()
            .any(|e| e["event"] == "reclaim.result")
            .then_some(r)
    });
    let reclaims: Vec<_> = records.iter().filter(|e| e["event"] == "reclaim").collect();
    assert_eq!(reclaims.len(), 1, "{records:?}");
    assert_eq!(reclaims[0]["processes"][0]["pid"], pid);
}

#[test]
fn reclaims_before_a_restart_count_against_the_hourly_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    // The agent's last life reclaimed ten minutes ago: with max_reclaims_per_hour = 1, this life
    // must hold the next reclaim back, not start the hour afresh.
    let ten_minutes_ago = SystemTime::now() - Duration::from_secs(600);
    std::fs::write(
        &audit,
        format!(
            "{{\"ts\":\"{}\",\"component\":\"reclaim\",\"event\":\"reclaim\",\"step\":\"reclaim\",\"dry_run\":false,\"gpu\":3}}\n",
            humantime::format_rfc3339_millis(ten_minutes_ago)
        ),
    )
    .expect("write the earlier life's record");
    let procs = Procs::sleep(1);
    let holder = procs.pid(0);
    let agent = Agent::with_scenario(&scenario(&[holder], 0))
        .config(&config(
            &audit,
            "dry_run = false\ngrace = \"1s\"\nmax_reclaims_per_hour = 1\n",
        ))
        .start();
    let held = wait_for("the reclaim held back", WAIT, || {
        events_named(&audit, "rate_limited").pop()
    });
    assert_eq!(held["max_reclaims_per_hour"], 1);
    assert_eq!(
        events_named(&audit, "reclaim").len(),
        1,
        "only the earlier life's"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        alive(holder),
        "a restart let the agent reclaim beyond its hourly limit"
    );
    assert_eq!(
        agent.get("/api/v1/reclaim").json()["candidates"][0]["next"]["step"],
        "reclaim (rate limited)"
    );
}
