//! Whether the audit log, and the directories it lives in, can be trusted: the agent reads its
//! own records back at start (remediation's rails, reclaim's hourly count), so a user who can
//! replace the file, or rename it away in its directory, can forge records that put real alerts
//! into cooldown or use up the hourly limits. As with the API token file
//! (`config/token.rs`), such a place is refused with its owner and mode and the fix.
//!
//! The rules, what a careful operator expects:
//! - the audit log and its directory are owned by root or the agent's user;
//! - none of them, nor any directory above, is writable by other users, or by a group other
//!   than the agent's own; a directory with the sticky bit (`/tmp`, mode 1777) is allowed
//!   above, as others there can neither rename nor remove what is not theirs;
//! - the same for the agent's state directory (`$STATE_DIRECTORY`), when it exists.
//!
//! Ancestors are checked for their mode only: in a user namespace, directories of the host's
//! root show up as owned by the overflow uid, and their owner is root there anyway.
//!
//! This module must not change anything: it only looks.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Checks the audit log at `audit_file` (if it exists), its directory and the ones above, and
/// the agent's state directory `state` (if it exists). The error names the path, its owner and
/// mode, and what to do.
pub fn check_trust(audit_file: &Path, state: &Path) -> Result<(), String> {
    let ids = Ids::current();
    match std::fs::symlink_metadata(audit_file) {
        // A symlink, FIFO or device there is refused where the log is opened or read back,
        // with its own message; its mode says nothing.
        Ok(meta) if meta.is_file() => ids.check(audit_file, &meta, "audit log", true)?,
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("audit log '{}': {e}", audit_file.display())),
    }
    if let Some(dir) = audit_file.parent().filter(|p| !p.as_os_str().is_empty()) {
        check_dir(&ids, dir, "the audit log's directory")?;
    }
    if state.is_dir() {
        check_dir(&ids, state, "the agent's state directory")?;
    }
    Ok(())
}

/// The check `run` makes before it starts and `check-config` makes too, with the same text:
/// the audit log `audit_file` and the agent's state directory ([`super::state_dir`]).
pub fn check_places(audit_file: &Path) -> Result<(), String> {
    check_trust(audit_file, &super::state_dir())
}

/// `dir` (owner and mode) and every directory above it (mode), after resolving links.
fn check_dir(ids: &Ids, dir: &Path, what: &str) -> Result<(), String> {
    let Ok(real) = dir.canonicalize() else {
        // A missing directory is reported where the file is opened, naming it.
        return Ok(());
    };
    let mut first = true;
    for d in real.ancestors() {
        let meta = std::fs::metadata(d).map_err(|e| format!("{what} '{}': {e}", d.display()))?;
        ids.check(d, &meta, what, first)?;
        first = false;
    }
    Ok(())
}

struct Ids {
    euid: u32,
    egid: u32,
}

impl Ids {
    fn current() -> Ids {
        Ids {
            euid: nix::unistd::geteuid().as_raw(),
            egid: nix::unistd::getegid().as_raw(),
        }
    }

    /// One file or directory: owner (when `owner` is checked) and who may write it.
    fn check(
        &self,
        path: &Path,
        meta: &std::fs::Metadata,
        what: &str,
        owner: bool,
    ) -> Result<(), String> {
        let mode = meta.permissions().mode() & 0o7777;
        let p = path.display();
        if owner && meta.uid() != 0 && meta.uid() != self.euid {
            return Err(format!(
                "{what} '{p}' is owned by uid {} (mode {mode:04o}), neither root nor the agent's \
                 user (uid {}): that user could replace the audit log and forge the records read \
                 back at start; the agent does not start until it is fixed (chown root '{p}', or \
                 to the agent's user)",
                meta.uid(),
                self.euid
            ));
        }
        let sticky_dir = meta.is_dir() && mode & 0o1000 != 0;
        let others_write = mode & 0o002 != 0;
        let group_write = mode & 0o020 != 0 && meta.gid() != self.egid;
        // A sticky directory above the log's own is fine: others cannot rename what is ours.
        let sticky_above = sticky_dir && !owner;
        if (others_write || group_write) && !sticky_above {
            let who = if others_write { "every user" } else { "group" };
            return Err(format!(
                "{what} '{p}' has mode {mode:04o} (owner uid {}, group gid {}): {who} may write \
                 it, and could replace the audit log and forge the records read back at start; \
                 the agent does not start until it is fixed (chmod go-w '{p}')",
                meta.uid(),
                meta.gid()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn an_audit_log_or_directory_others_may_write_is_refused_with_owner_and_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("none");
        let log = dir.path().join("audit.jsonl");
        check_trust(&log, &state).expect("a private temp dir, no log yet");
        fs::write(&log, "").expect("write");
        check_trust(&log, &state).expect("our own file");
        fs::set_permissions(&log, fs::Permissions::from_mode(0o646)).expect("chmod");
        let e = check_trust(&log, &state).expect_err("world-writable log");
        assert!(e.contains("mode 0646") && e.contains("chmod go-w"), "{e}");
        fs::set_permissions(&log, fs::Permissions::from_mode(0o640)).expect("chmod");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = check_trust(&log, &state).expect_err("world-writable directory");
        assert!(
            e.contains("the audit log's directory") && e.contains("mode 0777"),
            "{e}"
        );
        // Sticky (as /tmp) is still refused for the directory the log is in: another user
        // could have made the log there first.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o1777)).expect("chmod");
        assert!(check_trust(&log, &state).is_err());
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
        // The state directory too.
        let state = dir.path().join("state");
        fs::create_dir(&state).expect("mkdir");
        fs::set_permissions(&state, fs::Permissions::from_mode(0o757)).expect("chmod");
        let e = check_trust(&log, &state).expect_err("state dir");
        assert!(e.contains("state directory"), "{e}");
    }

    #[test]
    fn an_audit_log_owned_by_another_user_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("audit.jsonl");
        fs::write(&log, "").expect("write");
        let other = nix::unistd::Uid::from_raw(nix::unistd::geteuid().as_raw().max(1) + 4242);
        match nix::unistd::chown(&log, Some(other), None) {
            Ok(()) => {}
            // Only root can give a file away; as another user the case cannot be made here.
            Err(nix::errno::Errno::EPERM) => return,
            Err(e) => panic!("chown: {e}"),
        }
        let e = check_trust(&log, &dir.path().join("none")).expect_err("another owner");
        assert!(
            e.contains(&format!("owned by uid {}", other.as_raw())) && e.contains("chown"),
            "{e}"
        );
        nix::unistd::chown(dir.path(), Some(other), None).expect("chown dir");
        fs::remove_file(&log).expect("rm");
        let e = check_trust(&log, &dir.path().join("none")).expect_err("dir of another owner");
        assert!(e.contains("directory"), "{e}");
    }
}
