//! A real single-node Slurm cluster for a test: `slurmctld -D` and `slurmd -D` from Debian's
//! `slurm-wlm`, in a temporary directory with their own ports, state and spool, killed when
//! dropped. `AuthType=auth/none` (Slurm 22.05 ships the plugin): no munge key to make, and
//! nothing leaves 127.0.0.1.

// Shared by test crates that use different parts of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::wait_for;

/// The node's name in the test cluster (given to `slurmd -N`).
pub const NODE: &str = "gsnode";

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub conf: PathBuf,
    daemons: Vec<Child>,
}

/// Whether Slurm's programs are installed; prints why a test is skipped when not.
pub fn available(test: &str) -> bool {
    let missing: Vec<&str> = [
        "/usr/sbin/slurmctld",
        "/usr/sbin/slurmd",
        "/usr/bin/scontrol",
        "/usr/bin/sbatch",
    ]
    .into_iter()
    .filter(|p| !Path::new(p).exists())
    .collect();
    if !missing.is_empty() {
        eprintln!("SKIP {test}: Slurm is not installed ({missing:?} missing); apt-get install slurm-wlm munge");
    }
    missing.is_empty()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The slurm.conf of a cluster in `dir` on these ports, with `extra` lines.
fn conf(dir: &Path, ctld: u16, slurmd: u16, extra: &str) -> String {
    let d = dir.display();
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into());
    format!(
        "ClusterName=gstest\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={ctld}\nSlurmdPort={slurmd}\n\
         AuthType=auth/none\nCredType=cred/none\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
         SelectType=select/cons_tres\nStateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
         SlurmctldPidFile={d}/ctld.pid\nSlurmdPidFile={d}/slurmd.pid\nSlurmctldLogFile={d}/ctld.log\n\
         SlurmdLogFile={d}/slurmd.log\nSlurmUser=root\nReturnToService=2\nMpiDefault=none\n\
         NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN\n\
         PartitionName=main Nodes={NODE} Default=YES MaxTime=INFINITE State=UP\n{extra}"
    )
}

impl Cluster {
    /// Starts the controller and the node daemon and waits until the node is idle.
    pub fn start() -> Cluster {
        Cluster::start_with(|_| String::new())
    }

    /// As [`Cluster::start`], with the slurm.conf lines `extra` makes for the cluster's
    /// directory (e.g. `Epilog=`).
    pub fn start_with(extra: impl FnOnce(&Path) -> String) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let extra = extra(dir.path());
        for sub in ["state", "spool"] {
            std::fs::create_dir(dir.path().join(sub)).expect("mkdir");
        }
        let conf_path = dir.path().join("slurm.conf");
        std::fs::write(
            &conf_path,
            conf(dir.path(), free_port(), free_port(), &extra),
        )
        .expect("conf");
        let spawn = |program: &str, args: &[&str]| {
            Command::new(program)
                .args(args)
                .env("SLURM_CONF", &conf_path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start a Slurm daemon")
        };
        let conf_arg = conf_path.display().to_string();
        let daemons = vec![
            spawn("/usr/sbin/slurmctld", &["-D", "-c", "-f", &conf_arg]),
            spawn("/usr/sbin/slurmd", &["-D", "-N", NODE, "-f", &conf_arg]),
        ];
        let cluster = Cluster {
            dir,
            conf: conf_path,
            daemons,
        };
        wait_for("the Slurm node to be idle", Duration::from_secs(60), || {
            let state = cluster.node_state()?;
            (state.0.starts_with("IDLE") && !state.0.contains("NOT_RESPONDING")).then_some(())
        });
        cluster
    }

    /// A client command of this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    /// `scontrol` with these arguments; its stdout, or `None` when it fails.
    pub fn scontrol(&self, args: &[&str]) -> Option<String> {
        let out = self.command("scontrol").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The node's State= and Reason= (without the `[user@time]` stamp).
    pub fn node_state(&self) -> Option<(String, String)> {
        let line = self.scontrol(&["show", "node", "-o", NODE])?;
        let state = line
            .split(' ')
            .find_map(|f| f.strip_prefix("State="))?
            .to_string();
        let reason = line
            .split(" Reason=")
            .nth(1)
            .map(|r| r.rsplit_once(" [").map_or(r, |(a, _)| a).trim().to_string())
            .unwrap_or_default();
        Some((state, reason))
    }

    /// `sinfo -R -h -o %E|%N`: the reasons Slurm lists for down and drained nodes.
    pub fn sinfo_reasons(&self) -> String {
        self.command("sinfo")
            .args(["-R", "-h", "-o", "%E|%N"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
        // A job's slurmstepd outlives a killed slurmd (it listens on a socket in the spool, which
        // goes with the directory): every process that inherited this cluster's SLURM_CONF goes.
        for pid in self.leftovers() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Cluster {
    /// The processes, other than this one, whose environment names this cluster's slurm.conf.
    fn leftovers(&self) -> Vec<i32> {
        let want = format!("SLURM_CONF={}", self.conf.display()).into_bytes();
        let me = std::process::id() as i32;
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| *pid != me)
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == want.as_slice()))
            })
            .collect()
    }
}
