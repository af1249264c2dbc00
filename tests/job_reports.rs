//! Per-job GPU reports against a real Slurm cluster (`slurmctld`/`slurmd` started by the test,
//! tests/fleet_support/slurm.rs): an `sbatch` job whose process the scenario puts on GPU 0, its
//! report over the API and `gpu-steward job report`, the epilog in the cluster's slurm.conf
//! writing it when the job ends, and a restarted agent answering it still.
//! Run under `flock /tmp/slurm-test.lock` (one cluster at a time).

mod common;
#[path = "fleet_support/slurm.rs"]
mod slurm;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{wait_for, Agent};
use slurm::Cluster;

const MIB: u64 = 1 << 20;
/// The uid of `nobody`, whom the job runs as.
const NOBODY: u32 = 65534;

/// The scenario: one H100 at 300 W with the job's process at 60 % SM and 1000 MiB (and, once
/// `xid`, XID 13 delivered), or without the process once it ended.
fn scenario(pid: Option<u32>, xid: bool) -> String {
    let mut s = String::from(
        "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\npower_w = 300.0\ngpu_util_percent = 60\n",
    );
    if let Some(pid) = pid {
        s.push_str(&format!(
            "[[gpu.process]]\npid = {pid}\nused_memory_mib = 1000\nsm_util_percent = 60\n"
        ));
    }
    if xid {
        s.push_str("[[gpu.event]]\nid = 1\nxid = 13\n");
    }
    s
}

/// The epilog as slurmd runs it, told where the agent (`DIR/agent-url`, written once it
/// listens), the reports and this build's binary are.
fn epilog_wrapper(dir: &Path) -> String {
    let d = dir.display();
    let wrapper = dir.join("epilog.sh");
    let epilog = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/slurm/epilog");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nGPU_STEWARD_URL=$(cat {d}/agent-url) GPU_STEWARD_JOB_REPORTS={d}/reports \
             GPU_STEWARD_BIN={bin} exec {epilog} 2>>{d}/epilog.log\n",
            bin = common::bin(),
            epilog = epilog.display()
        ),
    )
    .expect("epilog wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    format!("Epilog={}\n", wrapper.display())
}

fn job_report(agent_port: u16, args: &[&str]) -> std::process::Output {
    Command::new(common::bin())
        .args(["job", "report"])
        .args(args)
        .args(["--url", &format!("http://127.0.0.1:{agent_port}")])
        .env_remove("GPU_STEWARD_URL")
        .output()
        .expect("gpu-steward job report")
}

fn close(got: f64, want: f64, within: f64) -> bool {
    (got - want).abs() <= within
}

#[test]
fn an_sbatch_jobs_gpu_report_is_served_kept_by_the_epilog_and_outlives_a_restart() {
    let test = "an_sbatch_jobs_gpu_report_is_served_kept_by_the_epilog_and_outlives_a_restart";
    if !slurm::available(test) {
        return;
    }
    let cluster = Cluster::start_with(epilog_wrapper);
    let dir = cluster.dir.path().to_path_buf();
    // The job runs as another user than the test's (root), so that its report's owner and
    // mode are tested for that user: `nobody` reaches the reports through the cluster's
    // directory (0711, as the reports directory the epilog makes).
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o711))
        .expect("chmod the cluster directory");
    let out = cluster
        .command("sbatch")
        .args(["--parsable", "--uid", "nobody", "--gid", "nogroup"])
        .args(["-o", "/dev/null", "--chdir", "/tmp"])
        .args(["--wrap", "exec sleep 300"])
        .output()
        .expect("sbatch");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = String::from_utf8_lossy(&out.stdout)
        .trim()
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    let pid = wait_for("the job's sleep process", Duration::from_secs(30), || {
        let list = cluster.scontrol(&["listpids", &job])?;
        list.lines().skip(1).find_map(|l| {
            let pid: u32 = l.split_whitespace().next()?.parse().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            (comm.trim() == "sleep").then_some(pid)
        })
    });

    let state = tempfile::tempdir().expect("state dir");
    let state_dir = state.path().display().to_string();
    // The job's process is on GPU 0 from the agent's start until it is taken off below: the
    // time the job ran while the agent watched.
    let watched_from = Instant::now();
    let mut agent = Agent::with_scenario(&scenario(Some(pid), false))
        .env("STATE_DIRECTORY", &state_dir)
        .start();
    std::fs::write(
        dir.join("agent-url"),
        format!("http://127.0.0.1:{}", agent.port),
    )
    .expect("agent url");
    let path = format!("/api/v1/jobs/slurm/{job}");
    wait_for("the job's report", Duration::from_secs(20), || {
        (agent.get(&path).status == 200).then_some(())
    });
    agent.rewrite_scenario(&scenario(Some(pid), true));
    wait_for(
        "XID 13 in the job's report",
        Duration::from_secs(20),
        || {
            let r = agent.get(&path).json();
            (r["xids"][0]["xid"] == 13).then_some(())
        },
    );
    std::thread::sleep(Duration::from_secs(4));
    // The job ends: its process leaves the GPU, then Slurm ends the job and runs the epilog.
    agent.rewrite_scenario(&scenario(None, true));
    let watched = watched_from.elapsed().as_secs_f64();
    wait_for(
        "the agent to see GPU 0 free",
        Duration::from_secs(10),
        || {
            let gpus = agent.get("/api/v1/gpus").json();
            gpus["gpus"][0]["processes"]
                .as_array()
                .is_some_and(|p| p.is_empty())
                .then_some(())
        },
    );
    let _ = cluster.command("scancel").arg(&job).status();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );

    let r = agent.get(&path).json();
    let gpus = r["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 1, "GPU 0 alone: {r}");
    assert_eq!(gpus[0]["index"], 0, "{r}");
    assert!(
        gpus[0]["uuid"]
            .as_str()
            .is_some_and(|u| u.starts_with("GPU-")),
        "{r}"
    );
    assert_eq!(gpus[0]["model"], "NVIDIA H100 80GB HBM3", "{r}");
    let held = r["held_seconds"].as_f64().expect("held");
    assert!(
        close(held, watched, 3.0),
        "held {held} s, the job ran {watched:.1} s while the agent watched: {r}"
    );
    for stat in ["mean", "max"] {
        let v = r["sm_utilization"][stat].as_f64().expect("sm");
        assert!(close(v, 0.60, 0.05), "SM {stat} {v}: {r}");
    }
    assert_eq!(r["memory_used_bytes"]["max"], 1000 * MIB, "{r}");
    let energy = r["energy_joules"].as_f64().expect("energy");
    assert!(
        close(energy, 300.0 * held, 0.2 * 300.0 * held),
        "energy {energy} J for {held} s at 300 W: {r}"
    );
    let xids = r["xids"].as_array().expect("xids");
    assert_eq!(xids.len(), 1, "{r}");
    assert_eq!(
        (xids[0]["xid"].as_u64(), xids[0]["gpu"].as_u64()),
        (Some(13), Some(0))
    );

    // The epilog, run by slurmd when the job ended, kept the same report, owned by the job's
    // user and readable by that user alone.
    let reports = dir.join("reports");
    let kept = wait_for("the epilog's report", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(reports.join(format!("{job}.txt"))).ok()?;
        let json = std::fs::read_to_string(reports.join(format!("{job}.json"))).ok()?;
        Some((text, json))
    });
    let epilog_log = std::fs::read_to_string(dir.join("epilog.log")).unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(&kept.1).expect("JSON report");
    assert_eq!(json["id"], job.as_str(), "{json}\n{epilog_log}");
    assert_eq!(json["memory_used_bytes"]["max"], 1000 * MIB);
    assert!(
        close(json["held_seconds"].as_f64().expect("held"), held, 1.0),
        "the epilog ran after the job's process left the GPU: {json}"
    );
    assert!(
        kept.0.lines().all(|l| l.chars().count() <= 80),
        "{}",
        kept.0
    );
    assert_eq!(
        kept.0
            .lines()
            .filter(|l| l.starts_with("busy: 60% of the GPU time"))
            .count(),
        1,
        "{}",
        kept.0
    );
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(reports.join(format!("{job}.json"))).expect("meta");
    let job_uid: u32 = cluster
        .scontrol(&["show", "job", "-o", &job])
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|f| f.strip_prefix("UserId="))
                .and_then(|u| u.split_once('(')?.1.strip_suffix(')')?.parse().ok())
        })
        .expect("the job's UserId");
    assert_eq!(job_uid, NOBODY, "the job ran as nobody");
    assert_eq!((meta.uid(), meta.mode() & 0o777), (job_uid, 0o400));
    // The directory the epilog made lets the user reach their file by name, and list nothing.
    let dir_mode = std::fs::metadata(&reports).expect("reports dir").mode() & 0o777;
    assert_eq!(dir_mode, 0o711, "{dir_mode:o}");
    let as_user = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .args(args)
            .output()
            .expect("setpriv")
    };
    let txt = reports.join(format!("{job}.txt"));
    let read = as_user(&["cat", &txt.display().to_string()]);
    assert!(
        read.status.success() && read.stdout == kept.0.as_bytes(),
        "the job's user cannot read its report: {}",
        String::from_utf8_lossy(&read.stderr)
    );
    let list = as_user(&["ls", &reports.display().to_string()]);
    assert!(!list.status.success(), "the user lists every report");

    // The agent restarts: the report is read back from the state directory.
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(agent.wait_exit(Duration::from_secs(5)).success());
    let before = r;
    let after = Agent::with_scenario(&scenario(None, false))
        .env("STATE_DIRECTORY", &state_dir)
        .start();
    let again = wait_for(
        "the report after a restart",
        Duration::from_secs(10),
        || {
            let a = after.get(&path);
            (a.status == 200).then(|| a.json())
        },
    );
    for field in [
        "gpus",
        "first_seen",
        "memory_used_bytes",
        "sm_utilization",
        "xids",
    ] {
        assert_eq!(again[field], before[field], "{field}: {again}");
    }
    assert!(close(
        again["held_seconds"].as_f64().expect("held"),
        held,
        0.5
    ));

    // The command: text by default, one line and exit 1 for a job it has no report of.
    let out = job_report(after.port, &[&job]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("GPU report of Slurm job {job}")),
        "{text}"
    );
    assert!(text.contains("XID 13"), "{text}");
    let out = job_report(after.port, &["999999"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no report of Slurm job 999999 on this node"),
        "{err}"
    );
}

/// The epilog with the agent down: exit 0 well within 5 s, a log line, no file.
#[test]
fn the_epilog_with_the_agent_down_exits_0_at_once_and_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let epilog = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/slurm/epilog");
    let start = Instant::now();
    let out = Command::new(&epilog)
        .env("SLURM_JOB_ID", "4242")
        .env("SLURM_JOB_UID", "0")
        .env("GPU_STEWARD_URL", format!("http://127.0.0.1:{port}"))
        .env("GPU_STEWARD_JOB_REPORTS", dir.path())
        .env("GPU_STEWARD_BIN", common::bin())
        .output()
        .expect("run the epilog");
    let took = start.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(
        err.contains("gpu-steward-epilog: job 4242: cannot ask the agent"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// The epilog with an agent that accepts the connection and never answers: exit 0 within 5 s
/// (both questions together), a log line, no file.
#[test]
fn the_epilog_with_a_hung_agent_exits_0_within_5_s() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The kernel completes connections into the backlog; nothing ever reads or answers.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = hung.local_addr().expect("addr").port();
    let epilog = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/slurm/epilog");
    let start = Instant::now();
    let out = Command::new(&epilog)
        .env("SLURM_JOB_ID", "4343")
        .env("SLURM_JOB_UID", "0")
        .env("GPU_STEWARD_URL", format!("http://127.0.0.1:{port}"))
        .env("GPU_STEWARD_JOB_REPORTS", dir.path())
        .env("GPU_STEWARD_BIN", common::bin())
        .output()
        .expect("run the epilog");
    let took = start.elapsed();
    drop(hung);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(took < Duration::from_secs(5), "{took:?}: {err}");
    assert!(err.contains("gpu-steward-epilog: job 4343: "), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
