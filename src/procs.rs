//! Signalling processes without ever hitting the wrong one.
//!
//! A PID names a process only while it lives: once it exits, the kernel may give the number to a
//! new process. Everything that signals a process (reclaim, the memory guard, remediation)
//! therefore remembers a [`ProcessIdentity`] (PID and start time, which the kernel never reuses
//! together) from when the process was seen doing what it is blamed for, and checks it again
//! immediately before `kill(2)`.
//!
//! A zombie (state `Z`, or `X`) counts as gone: it holds no GPU memory and cannot be signalled
//! into anything, and its parent may never reap it.

use std::path::Path;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;

/// A process as the kernel tells it apart: its PID and its start time in clock ticks since boot
/// (field 22 of `/proc/<pid>/stat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ProcessIdentity {
    pub pid: u32,
    pub start_time: u64,
}

/// What `/proc/<pid>/stat` says: the state letter and the start time.
fn stat(procfs: &Path, pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(procfs.join(pid.to_string()).join("stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after the last ')'.
    let mut after = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = after.next()?.chars().next()?;
    // After ')': field 3 (state) came first; field 22 is 19 further on.
    let start = after.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// The identity of a live process; `None` when it is gone or a zombie.
pub fn identify(procfs: &Path, pid: u32) -> Option<ProcessIdentity> {
    match stat(procfs, pid)? {
        ('Z' | 'X', _) => None,
        (_, start_time) => Some(ProcessIdentity { pid, start_time }),
    }
}

/// True while the very process `who` names is alive (same start time, not a zombie).
pub fn is_alive(procfs: &Path, who: &ProcessIdentity) -> bool {
    identify(procfs, who.pid).is_some_and(|now| now == *who)
}

/// What became of a signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalResult {
    /// Delivered to the very process.
    Sent,
    /// The process had exited (or is a zombie); nothing was sent.
    Gone,
    /// The PID now names another process; nothing was sent.
    Replaced,
    /// `kill(2)` refused (permissions, say).
    Failed(String),
}

impl SignalResult {
    /// `sent`, `gone`, `replaced` or `failed`: for metric labels and the audit log.
    pub fn label(&self) -> &'static str {
        match self {
            SignalResult::Sent => "sent",
            SignalResult::Gone => "gone",
            SignalResult::Replaced => "replaced",
            SignalResult::Failed(_) => "failed",
        }
    }
}

/// Sends `sig` to `who` only if the PID still names that process.
///
/// The check and the `kill(2)` are two steps: a process that exits and whose PID is handed to a
/// new process within the microseconds between them would be hit. On Linux PIDs are handed out
/// in increasing order up to `pid_max` before wrapping, so that window needs a full wrap of the
/// PID space in microseconds; pidfd_send_signal would close it and needs a pidfd kept from the
/// time the process was seen, which is not possible for processes seen only through NVML.
pub fn signal_verified(procfs: &Path, who: &ProcessIdentity, sig: Signal) -> SignalResult {
    match stat(procfs, who.pid) {
        None | Some(('Z' | 'X', _)) => return SignalResult::Gone,
        Some((_, start)) if start != who.start_time => return SignalResult::Replaced,
        Some(_) => {}
    }
    let Ok(pid) = i32::try_from(who.pid) else {
        return SignalResult::Failed(format!("pid {} is out of range", who.pid));
    };
    match kill(Pid::from_raw(pid), sig) {
        Ok(()) => SignalResult::Sent,
        Err(nix::errno::Errno::ESRCH) => SignalResult::Gone,
        Err(e) => SignalResult::Failed(format!("kill({}, {sig}): {e}", who.pid)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::Duration;

    const PROC: &str = "/proc";

    #[test]
    fn a_live_process_is_signalled_and_then_gone() {
        let mut child = Command::new("sleep")
            .arg("300")
            .spawn()
            .expect("spawn sleep");
        let procfs = Path::new(PROC);
        let who = identify(procfs, child.id()).expect("alive");
        assert!(is_alive(procfs, &who));
        assert_eq!(
            signal_verified(procfs, &who, Signal::SIGTERM),
            SignalResult::Sent
        );
        let status = child.wait().expect("wait");
        assert!(!status.success());
        assert!(!is_alive(procfs, &who));
        assert_eq!(
            signal_verified(procfs, &who, Signal::SIGTERM),
            SignalResult::Gone
        );
    }

    #[test]
    fn a_zombie_counts_as_gone() {
        let mut child = Command::new("true").spawn().expect("spawn true");
        let procfs = Path::new(PROC);
        // Not reaped yet: once it exits it is a zombie until wait().
        let mut zombie = false;
        for _ in 0..200 {
            if matches!(stat(procfs, child.id()), Some(('Z', _))) {
                zombie = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(zombie, "the unreaped child never showed as a zombie");
        assert_eq!(identify(procfs, child.id()), None);
        let who = ProcessIdentity {
            pid: child.id(),
            start_time: 0,
        };
        assert_eq!(
            signal_verified(procfs, &who, Signal::SIGKILL),
            SignalResult::Gone
        );
        child.wait().expect("reap");
    }

    #[test]
    fn a_reused_pid_is_never_signalled() {
        let mut child = Command::new("sleep")
            .arg("300")
            .spawn()
            .expect("spawn sleep");
        let procfs = Path::new(PROC);
        let now = identify(procfs, child.id()).expect("alive");
        // The identity remembered from an earlier process that had the same PID.
        let earlier = ProcessIdentity {
            pid: now.pid,
            start_time: now.start_time.saturating_sub(1),
        };
        assert_eq!(
            signal_verified(procfs, &earlier, Signal::SIGKILL),
            SignalResult::Replaced
        );
        assert!(is_alive(procfs, &now), "the new process was hit");
        child.kill().expect("kill");
        child.wait().expect("reap");
    }

    #[test]
    fn names_with_parentheses_and_spaces_parse() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("42");
        std::fs::create_dir(&p).expect("mkdir");
        std::fs::write(
            p.join("stat"),
            "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 100 1\n",
        )
        .expect("write");
        assert_eq!(
            identify(dir.path(), 42),
            Some(ProcessIdentity {
                pid: 42,
                start_time: 987_654
            })
        );
        assert_eq!(identify(dir.path(), 43), None);
    }
}
