//! Per-process facts NVML does not give: the process name, its user, and who it belongs to
//! (container, Kubernetes pod, systemd unit, Slurm job: its cgroup, else its environment), read
//! from procfs.
//!
//! The procfs root is configurable (`/host/proc` in a container with `hostPID`; a fixture tree
//! in tests). Reading happens on the poller thread, at most once per process per poll: one
//! `stat` read tells the process's start time, and a process already seen with the same
//! (pid, start time) is served from the cache, so a reused pid is never given the previous
//! owner's name. A process that vanished or cannot be read is simply left unattributed.

pub use crate::snapshot::ProcessInfo;
mod attach;
pub mod cgroup;
pub mod environ;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use attach::attach;
pub use cgroup::Attribution;

/// The cache of process facts, keyed by pid and validated by start time.
#[derive(Debug)]
pub struct ProcTable {
    root: PathBuf,
    /// Believe `SLURM_JOB_ID` of any process, not only under slurmstepd (see [`environ`]).
    trust_slurm_job_env: bool,
    cache: HashMap<u32, (u64, Arc<ProcessInfo>)>,
    users: HashMap<u32, String>,
}

impl ProcTable {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ProcTable {
            root: root.into(),
            trust_slurm_job_env: false,
            cache: HashMap::new(),
            users: HashMap::new(),
        }
    }

    /// The same table believing `SLURM_JOB_ID` of any process (`[processes]
    /// trust_slurm_job_env`), or only under slurmstepd.
    pub fn trusting_slurm_job_env(mut self, trust: bool) -> Self {
        self.trust_slurm_job_env = trust;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn trusts_slurm_job_env(&self) -> bool {
        self.trust_slurm_job_env
    }

    /// The facts of `pid`, reading procfs only when the (pid, start time) pair is new.
    pub fn lookup(&mut self, pid: u32) -> Option<Arc<ProcessInfo>> {
        let dir = self.root.join(pid.to_string());
        let Some(start) = start_time(&dir) else {
            self.cache.remove(&pid);
            return None;
        };
        if let Some((seen, info)) = self.cache.get(&pid) {
            if *seen == start {
                return Some(info.clone());
            }
        }
        let info = Arc::new(self.read(pid, &dir)?);
        self.cache.insert(pid, (start, info.clone()));
        Some(info)
    }

    /// Forgets processes not in `alive` (call once per poll with every pid seen).
    pub fn retain(&mut self, alive: &HashSet<u32>) {
        self.cache.retain(|pid, _| alive.contains(pid));
    }

    fn read(&mut self, pid: u32, dir: &Path) -> Option<ProcessInfo> {
        let name = std::fs::read_to_string(dir.join("comm"))
            .ok()?
            .trim_end_matches('\n')
            .to_string();
        let uid = std::fs::read_to_string(dir.join("status"))
            .ok()
            .and_then(|s| real_uid(&s));
        let user = uid.map(|u| self.user_name(u)).unwrap_or_default();
        let mut attribution = std::fs::read_to_string(dir.join("cgroup"))
            .map(|t| cgroup::parse(&t))
            .unwrap_or_default();
        if attribution.slurm_job.is_none()
            && (self.trust_slurm_job_env || environ::under_slurmstepd(&self.root, pid))
        {
            // No Slurm cgroup (proctrack/linuxproc): the environment of a job's task says it.
            attribution.slurm_job = environ::slurm_job(dir);
        }
        Some(ProcessInfo {
            name,
            user,
            attribution,
        })
    }

    fn user_name(&mut self, uid: u32) -> String {
        self.users
            .entry(uid)
            .or_insert_with(|| {
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                    .ok()
                    .flatten()
                    .map_or_else(|| uid.to_string(), |u| u.name)
            })
            .clone()
    }
}

/// Field 22 of `/proc/<pid>/stat` (start time in clock ticks since boot). The command name
/// (field 2) may contain spaces and parentheses, so fields are counted after the last ')'.
fn start_time(dir: &Path) -> Option<u64> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    // After ')': field 3 (state) is the first; field 22 is the 20th.
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The real uid from `/proc/<pid>/status` (`Uid:\treal\teffective\tsaved\tfs`).
fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, comm: &str, start: u64) -> String {
        format!("{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 {start} 1000 100 18446744073709551615\n")
    }

    fn fake(root: &Path, pid: u32, comm: &str, start: u64, uid: u32, cgroup: &str) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("stat"), stat(pid, comm, start)).expect("stat");
        std::fs::write(dir.join("comm"), format!("{comm}\n")).expect("comm");
        std::fs::write(
            dir.join("status"),
            format!("Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
        )
        .expect("status");
        std::fs::write(dir.join("cgroup"), cgroup).expect("cgroup");
    }

    #[test]
    fn reads_name_user_and_attribution() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fake(
            tmp.path(),
            42,
            "python (x) y",
            1000,
            0,
            "0::/system.slice/trainer.service\n",
        );
        let mut t = ProcTable::new(tmp.path());
        let info = t.lookup(42).expect("found");
        assert_eq!(info.name, "python (x) y");
        assert_eq!(info.user, "root");
        assert_eq!(
            info.attribution.systemd_unit.as_deref(),
            Some("trainer.service")
        );
        assert!(t.lookup(43).is_none(), "absent pid");
    }

    #[test]
    fn a_reused_pid_is_read_again_and_a_known_one_is_not() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fake(tmp.path(), 7, "old", 1000, 4242, "0::/\n");
        let mut t = ProcTable::new(tmp.path());
        assert_eq!(t.lookup(7).expect("found").name, "old");
        assert_eq!(t.lookup(7).expect("found").user, "4242");
        // Same start time: served from the cache even though comm changed on disk.
        std::fs::write(tmp.path().join("7/comm"), "renamed\n").expect("comm");
        assert_eq!(t.lookup(7).expect("found").name, "old");
        // A new process with the same pid: new start time, read again.
        fake(tmp.path(), 7, "new", 2000, 0, "0::/\n");
        assert_eq!(t.lookup(7).expect("found").name, "new");
        t.retain(&HashSet::new());
        assert!(t.cache.is_empty());
    }

    /// A fixture process with a parent and an environment (`SLURM_JOB_ID=<job>`).
    fn child(root: &Path, pid: u32, ppid: u32, comm: &str, uid: u32, job: Option<&str>) {
        fake(
            root,
            pid,
            comm,
            1000 + u64::from(pid),
            uid,
            "0::/user.slice\n",
        );
        let stat =
            stat(pid, comm, 1000 + u64::from(pid)).replacen(" S 1 ", &format!(" S {ppid} "), 1);
        std::fs::write(root.join(pid.to_string()).join("stat"), stat).expect("stat");
        let env = job.map_or(String::new(), |j| format!("PATH=/bin\0SLURM_JOB_ID={j}\0"));
        std::fs::write(root.join(pid.to_string()).join("environ"), env).expect("environ");
    }

    /// Issue 26, defect 6: a process's own `SLURM_JOB_ID` was believed. Now only under a
    /// slurmstepd run by root, or where `[processes] trust_slurm_job_env` says so.
    #[test]
    fn slurm_job_id_is_believed_only_under_a_root_slurmstepd() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        child(root, 100, 1, "slurmstepd", 0, None);
        child(root, 200, 100, "bash", 1000, Some("77"));
        child(root, 300, 200, "python (x) y", 1000, Some("77"));
        // Not under slurmstepd: a user's `env SLURM_JOB_ID=31337 ./app`.
        child(root, 400, 1, "app", 1000, Some("31337"));
        // Under a "slurmstepd" a user runs (any user can name a program so).
        child(root, 500, 1, "slurmstepd", 1000, None);
        child(root, 600, 500, "app", 1000, Some("31337"));
        // A loop in the parent chain ends at the bound.
        child(root, 700, 800, "a", 1000, Some("1"));
        child(root, 800, 700, "b", 1000, Some("1"));
        let job =
            |t: &mut ProcTable, pid| t.lookup(pid).expect("found").attribution.slurm_job.clone();
        let mut t = ProcTable::new(root);
        assert_eq!(job(&mut t, 300).as_deref(), Some("77"), "a task's child");
        assert_eq!(job(&mut t, 200).as_deref(), Some("77"), "a task");
        assert_eq!(job(&mut t, 400), None, "its own claim");
        assert_eq!(job(&mut t, 600), None, "a user's slurmstepd");
        assert_eq!(job(&mut t, 700), None, "a loop");
        let mut t = ProcTable::new(root).trusting_slurm_job_env(true);
        assert_eq!(
            job(&mut t, 400).as_deref(),
            Some("31337"),
            "trusted by config"
        );
        assert_eq!(job(&mut t, 300).as_deref(), Some("77"));
    }

    /// Waits until `pid` runs `comm` with `SLURM_JOB_ID=31337` in its environment (the exec
    /// may come after the spawn returns): the claim is there to be believed or not.
    fn claiming(pid: u32, comm: &str) {
        let dir = Path::new("/proc").join(pid.to_string());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let now = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if now.trim() == comm && environ::slurm_job(&dir).as_deref() == Some("31337") {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{pid} never ran {comm}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The children of `pid` once it has one (the kernel's list of them).
    fn children_of(pid: u32) -> Vec<u32> {
        let list = format!("/proc/{pid}/task/{pid}/children");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let found: Vec<u32> = std::fs::read_to_string(&list)
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            if !found.is_empty() || std::time::Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The same with real processes: `env SLURM_JOB_ID=31337 sleep` started by this test is
    /// not labelled; the same started by a root program named `slurmstepd` is.
    #[test]
    fn a_real_process_is_labelled_only_under_a_real_slurmstepd() {
        let mut own = std::process::Command::new("sleep")
            .arg("30")
            .env("SLURM_JOB_ID", "31337")
            .spawn()
            .expect("sleep");
        let tmp = tempfile::tempdir().expect("tempdir");
        let stepd = tmp.path().join("slurmstepd");
        std::fs::copy("/bin/sh", &stepd).expect("a copy of sh named slurmstepd");
        let mut job = std::process::Command::new(&stepd)
            .args(["-c", "env SLURM_JOB_ID=31337 sleep 30 & wait"])
            .spawn()
            .expect("slurmstepd");
        claiming(own.id(), "sleep");
        let task = children_of(job.id());
        let mut t = ProcTable::new("/proc");
        let own_job = t.lookup(own.id()).map(|i| i.attribution.slurm_job.clone());
        let task_job = task.first().and_then(|&p| {
            claiming(p, "sleep");
            t.lookup(p).map(|i| i.attribution.slurm_job.clone())
        });
        for c in [&mut own, &mut job] {
            let _ = c.kill();
            let _ = c.wait();
        }
        for p in &task {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        assert_eq!(own_job, Some(None), "its own claim is not believed");
        assert_eq!(task_job, Some(Some("31337".into())), "{task:?}");
    }

    #[test]
    fn parses_the_real_proc_of_this_test() {
        let mut t = ProcTable::new("/proc");
        let info = t.lookup(std::process::id()).expect("self");
        assert!(!info.name.is_empty());
        assert!(!info.user.is_empty());
    }
}
