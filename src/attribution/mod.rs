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
    cache: HashMap<u32, (u64, Arc<ProcessInfo>)>,
    users: HashMap<u32, String>,
}

impl ProcTable {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ProcTable {
            root: root.into(),
            cache: HashMap::new(),
            users: HashMap::new(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
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
        let info = Arc::new(self.read(&dir)?);
        self.cache.insert(pid, (start, info.clone()));
        Some(info)
    }

    /// Forgets processes not in `alive` (call once per poll with every pid seen).
    pub fn retain(&mut self, alive: &HashSet<u32>) {
        self.cache.retain(|pid, _| alive.contains(pid));
    }

    fn read(&mut self, dir: &Path) -> Option<ProcessInfo> {
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
        if attribution.slurm_job.is_none() {
            // No Slurm cgroup (proctrack/linuxproc): the job's environment says it.
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

    #[test]
    fn parses_the_real_proc_of_this_test() {
        let mut t = ProcTable::new("/proc");
        let info = t.lookup(std::process::id()).expect("self");
        assert!(!info.name.is_empty());
        assert!(!info.user.is_empty());
    }
}
