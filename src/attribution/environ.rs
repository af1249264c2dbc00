//! The Slurm job of a process from its environment (`/proc/<pid>/environ`, `SLURM_JOB_ID`),
//! for nodes where Slurm's cgroup plugins do not place jobs in cgroups of their own
//! (`ProctrackType=proctrack/linuxproc` or `proctrack/pgid`): `slurmstepd` starts every task
//! of a job with `SLURM_JOB_ID` set, and their children inherit it.
//!
//! The environment is the process's own claim: anyone can run `env SLURM_JOB_ID=31337 ./app`.
//! It is believed only for a descendant of a `slurmstepd` that runs as root
//! ([`under_slurmstepd`]: the parent chain in procfs, at most [`MAX_ANCESTORS`] up), unless
//! `[processes] trust_slurm_job_env` says to believe every process.
//!
//! The file belongs to another user and can be as large as the process made its environment:
//! it is read with [`crate::bounded`] under [`MAX_ENVIRON_BYTES`] and a deadline; a larger one
//! is skipped (the process keeps its cgroup attribution, which is the better source anyway).
//! Must not: keep or log anything else of the environment (it holds secrets).

use std::path::Path;

/// The most bytes of an environment read; Linux allows more, but a job's environment is a
/// few KiB to a few tens of KiB.
pub const MAX_ENVIRON_BYTES: u64 = 256 * 1024;

/// How far up the parent chain a `slurmstepd` is looked for (a job's task is its child; a
/// shell, a launcher and a few wrappers may come between).
pub const MAX_ANCESTORS: usize = 32;

/// The name `slurmstepd` runs under (`/proc/<pid>/comm`).
const STEPD: &str = "slurmstepd";

/// Whether the process of `pid` descends from a `slurmstepd` run by root, walking the parent
/// chain in the procfs at `root` (at most [`MAX_ANCESTORS`] up, stopping at pid 1 or a process
/// that cannot be read). Root, because any user can name a program `slurmstepd`.
pub fn under_slurmstepd(root: &Path, pid: u32) -> bool {
    let mut at = pid;
    for _ in 0..MAX_ANCESTORS {
        let Some(parent) = stat_of(root, at).map(|(_, ppid)| ppid) else {
            return false;
        };
        if parent <= 1 {
            return false;
        }
        let Some((comm, _)) = stat_of(root, parent) else {
            return false;
        };
        if comm == STEPD && real_uid(root, parent) == Some(0) {
            return true;
        }
        at = parent;
    }
    false
}

/// The command name and parent pid of `pid`, from `/proc/<pid>/stat` (the name may hold spaces
/// and parentheses: it runs from the first '(' to the last ')').
fn stat_of(root: &Path, pid: u32) -> Option<(String, u32)> {
    let stat = std::fs::read_to_string(root.join(pid.to_string()).join("stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    // After ')': the state, then the parent pid.
    let ppid = stat
        .get(close + 1..)?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((comm, ppid))
}

fn real_uid(root: &Path, pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(root.join(pid.to_string()).join("status")).ok()?;
    super::real_uid(&status)
}

/// `SLURM_JOB_ID` of the process whose procfs directory is `dir`, if it has a numeric one. The
/// process's own claim: see [`under_slurmstepd`].
pub fn slurm_job(dir: &Path) -> Option<String> {
    let limits = crate::bounded::Limits::own(MAX_ENVIRON_BYTES);
    let bytes = crate::bounded::read(&dir.join("environ"), limits).ok()?;
    parse(&bytes)
}

/// The `SLURM_JOB_ID=<digits>` entry of a NUL-separated environment block.
pub fn parse(environ: &[u8]) -> Option<String> {
    environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"SLURM_JOB_ID="))
        .filter(|v| !v.is_empty() && v.len() <= 20 && v.iter().all(u8::is_ascii_digit))
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_id_comes_from_its_entry_only() {
        assert_eq!(
            parse(b"PATH=/bin\0SLURM_JOB_ID=4242\0SLURM_JOBID=1\0").as_deref(),
            Some("4242")
        );
        assert_eq!(parse(b"XSLURM_JOB_ID=7\0").as_deref(), None);
        assert_eq!(parse(b"SLURM_JOB_ID=12; rm -rf /\0"), None);
        assert_eq!(parse(b"SLURM_JOB_ID=\0"), None);
        assert_eq!(parse(b""), None);
    }

    #[test]
    fn a_job_started_process_of_this_machine_is_read() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("SLURM_JOB_ID", "31337")
            .spawn()
            .expect("sleep");
        let dir = Path::new("/proc").join(child.id().to_string());
        // Read until the child shows its own environment: under a loaded test run the first
        // read can come before the kernel shows the exec'd image's environment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut found = slurm_job(&dir);
        while found.is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            found = slurm_job(&dir);
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found.as_deref(), Some("31337"));
    }
}
