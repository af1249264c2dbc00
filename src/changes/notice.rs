//! Changes made by another process (`gpu-steward mig apply`, `gpu-steward sharing apply`) reach
//! the daemon's poller within a poll: the owner of changes in that process writes a notice file,
//! `node-changed`, beside the audit log once it has changed the node; the daemon watches the
//! directory (inotify, no polling) and wakes its poller, whose next poll starts at once and reads
//! what changed, as after its own changes.
//!
//! The notice carries no data anyone acts on (the writer's pid and the time, for a person who
//! looks): the daemon only learns "read the node again". A notice the CLI cannot write (not
//! root, no state directory) leaves the change to show at the slow tier, as before.
//!
//! Must not: follow a symlink planted at the notice's path (O_NOFOLLOW), block on a FIFO there
//! (O_NONBLOCK), or read the notice (its content is not trusted and not needed).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use super::Waker;

/// The notice's name in the directory of the audit log.
pub const FILE_NAME: &str = "node-changed";

/// Where the notice for the audit log `audit_file` lives.
pub fn path(audit_file: &Path) -> PathBuf {
    crate::audit::dir_of(audit_file).join(FILE_NAME)
}

/// Writes the notice (best effort: a failure is logged at debug and changes nothing else).
pub fn write(audit_file: &Path) {
    let path = path(audit_file);
    let written = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o640)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(&path)
        .and_then(|mut f| {
            let now = humantime::format_rfc3339_millis(std::time::SystemTime::now());
            writeln!(f, "pid {} at {now}", std::process::id())
        });
    if let Err(e) = written {
        tracing::debug!(error = %e, file = %path.display(), "cannot write the node-changed notice; the daemon sees the change at its slow tier");
    }
}

/// At most one INFO line per this long about notices: anyone who can write the directory can
/// write notices as fast as the disk allows, and the log must not grow with them.
pub const SAY_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// When the next INFO line about notices is due, and how many were not said since the last.
#[derive(Debug, Default)]
struct Said {
    last: Option<std::time::Instant>,
    suppressed: u64,
}

impl Said {
    /// `Some(suppressed since the last line)` when a line is due at `now`; counts one more
    /// suppressed otherwise.
    fn due(&mut self, now: std::time::Instant) -> Option<u64> {
        if self.last.is_some_and(|l| now.duration_since(l) < SAY_EVERY) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// Watches the directory of `audit_file` for notices and wakes the poller (`wake`) at each, on a
/// thread of its own, for the poller's life. A directory that cannot be watched is logged once: the
/// other processes' changes then show at the slow tier.
pub fn watch(audit_file: &Path, wake: Waker) {
    let dir = crate::audit::dir_of(audit_file);
    let watched = Inotify::init(InitFlags::IN_CLOEXEC).and_then(|i| {
        i.add_watch(
            &dir,
            AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO,
        )?;
        Ok(i)
    });
    let inotify = match watched {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!(error = %e, dir = %dir.display(), "cannot watch for changes made by other processes (gpu-steward mig/sharing apply): they show at the slow tier");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("change-notices".into())
        .spawn(move || {
            let mut said = Said::default();
            loop {
                let Ok(events) = inotify.read_events() else {
                    return;
                };
                let noticed = events
                    .iter()
                    .any(|e| e.name.as_deref() == Some(std::ffi::OsStr::new(FILE_NAME)));
                if noticed {
                    if let Some(suppressed) = said.due(std::time::Instant::now()) {
                        tracing::info!(
                            suppressed,
                            "the node was changed by another process: reading it again (at most one such line per {} s; suppressed: the notices since the last)",
                            SAY_EVERY.as_secs()
                        );
                    } else {
                        tracing::debug!("the node was changed by another process: reading it again");
                    }
                    if !wake() {
                        return;
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the change-notice thread");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_says_how_many_it_left_out() {
        let mut said = Said::default();
        let t0 = std::time::Instant::now();
        assert_eq!(said.due(t0), Some(0));
        for i in 1..1000 {
            assert_eq!(said.due(t0 + std::time::Duration::from_millis(i)), None);
        }
        assert_eq!(said.due(t0 + SAY_EVERY), Some(999));
        assert_eq!(said.due(t0 + SAY_EVERY), None);
    }
}
