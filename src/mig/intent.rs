//! The node's MIG apply lock and intent record, both in the agent's state directory beside the
//! audit log, for the daemon's applies and `gpu-steward mig apply` alike.
//!
//! - `mig-apply.lock`, the node lock: one applier at a time on the node, MIG layouts and sharing
//!   settings alike (the sharing apply takes it through the owner of changes; the file keeps
//!   the name it had when only MIG took it, so that an older CLI still excludes a newer daemon). An `flock` held for the whole of
//!   an apply (observe, plan, act, roll back) by whichever process applies; the holder writes
//!   its pid into the file so that the next one can say whom it waits for. The kernel drops the
//!   lock when the holder dies, kill -9 included: no stale lock to clean up.
//! - `mig-apply.intent`: written (temp file, `O_EXCL|O_NOFOLLOW`, fsync, rename) before an
//!   apply's first change and removed once the layout is settled, so that a record found at
//!   start means an apply was killed half-way. Only the apply holding the lock writes or
//!   removes it. A record found by the next apply is read under the lock first, said (log,
//!   audit `intent.found`, the CLI), carried in that apply's own record, and put back when that
//!   apply changes nothing or is undone: a record goes only once the node is in a known layout.
//!
//! This module must not follow a symlink planted at either path (the agent often runs as root),
//! nor block on a FIFO put there: the record is read with [`crate::bounded`].

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

use super::apply::{ApplyError, Outcome};
use crate::bounded::{self, Limits};

/// The most bytes of an intent record read: a layout name, a pid and a time.
const MAX_INTENT: u64 = 4096;

/// How long a start-time or reload apply, or `gpu-steward mig apply`, waits for another
/// applier before giving up (an apply with slow creations takes tens of seconds).
pub const LOCK_WAIT: Duration = Duration::from_secs(120);

/// How many earlier records an intent record carries at most (the newest are kept).
const MAX_EARLIER: usize = 8;

/// An apply that left its intent record behind (the record's shape is the ledger's: the
/// `intent.found` audit record carries it).
pub use crate::audit::mig::IntentRecord as Interrupted;

impl Interrupted {
    /// This record and those it carries, oldest first, each without its own `earlier`.
    fn chain(&self) -> Vec<Interrupted> {
        let mut all = self.earlier.clone();
        all.push(Interrupted {
            earlier: Vec::new(),
            ..self.clone()
        });
        let extra = all.len().saturating_sub(MAX_EARLIER);
        all.drain(..extra);
        all
    }
}

/// The node lock, held until dropped.
#[derive(Debug)]
pub struct NodeLock {
    _lock: Flock<File>,
}

/// `mig-apply.lock` in the directory `dir`.
pub fn lock_path(dir: &Path) -> PathBuf {
    dir.join("mig-apply.lock")
}

/// `mig-apply.intent` beside the audit log, in the agent's state directory.
pub fn intent_path(audit_file: &Path) -> PathBuf {
    state_of(audit_file).join("mig-apply.intent")
}

fn state_of(audit_file: &Path) -> PathBuf {
    crate::audit::dir_of(audit_file)
}

/// Takes the node lock in `dir`, waiting up to `wait` for another holder (`on_wait` is called
/// once, with its pid when known, when the wait starts; a stop asked for ends the wait). The
/// error says who holds it and what to do.
pub fn lock(
    dir: &Path,
    wait: Duration,
    on_wait: impl FnOnce(Option<u32>),
) -> Result<NodeLock, String> {
    let path = lock_path(dir);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o640)
        // A symlink planted here would make us truncate its target as root; a FIFO would
        // block the open.
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| {
            format!(
                "cannot open the node lock '{}': {e}; it must be a regular file in the \
                 agent's state directory (remove whatever is there)",
                path.display()
            )
        })?;
    let is_file = file.metadata().map(|m| m.is_file()).unwrap_or(false);
    if !is_file {
        return Err(format!(
            "the node lock '{}' is not a regular file; remove it",
            path.display()
        ));
    }
    let started = Instant::now();
    let mut file = file;
    let mut on_wait = Some(on_wait);
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut held) => {
                // Who holds it, for the next one's message; a failure here costs only that.
                let _ = held
                    .set_len(0)
                    .and_then(|()| held.write_all(std::process::id().to_string().as_bytes()));
                return Ok(NodeLock { _lock: held });
            }
            Err((f, nix::errno::Errno::EWOULDBLOCK)) => file = f,
            Err((_, e)) => {
                return Err(format!(
                    "cannot lock the node lock '{}': {e}",
                    path.display()
                ))
            }
        }
        let holder = holder(&mut file);
        if started.elapsed() >= wait || crate::shutdown::requested() {
            let who = holder.map_or_else(|| "another process".to_string(), |p| format!("pid {p}"));
            let waited = if wait.is_zero() {
                String::new()
            } else {
                format!(" (waited {} s)", started.elapsed().as_secs())
            };
            return Err(format!(
                "another apply ({who}) holds the node lock '{}'{waited}: one MIG or sharing \
                 apply at a time; nothing was changed, try again when it has finished",
                path.display()
            ));
        }
        if let Some(f) = on_wait.take() {
            f(holder);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid the holder wrote, if it did yet.
fn holder(file: &mut File) -> Option<u32> {
    use std::io::Seek as _;
    let mut text = String::new();
    file.rewind().ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Runs `apply` (a real one, not a dry run) holding the node lock, with its intent record
/// written before: the record outlives a kill -9 (or power loss) in the middle of the apply,
/// so that the next start knows the layout may be half-made. `wait`: how long to wait for
/// another applier (`on_wait` says so once).
///
/// A record already there (an apply killed half-way, whoever ran it) is read under the lock
/// first and given to `found`, which says it (log, audit, the CLI) or refuses the apply with
/// its error (nothing is changed then). This apply's record carries it (`earlier`).
///
/// Once the apply has settled: the record is removed when the node reached the layout
/// (applied, or nothing to do); the found one is put back when this apply changed nothing or
/// undid what it did (the node is as it was: half-made); this apply's record, carrying the
/// found one, is kept when the rollback failed too (the node is not in a known layout).
pub fn with_intent(
    audit_file: &Path,
    layout: &str,
    wait: Duration,
    on_wait: impl FnOnce(Option<u32>),
    found: impl FnOnce(&Interrupted) -> Result<(), ApplyError>,
    apply: impl FnOnce() -> Result<Outcome, ApplyError>,
) -> Result<Outcome, ApplyError> {
    let _lock = lock(&state_of(audit_file), wait, on_wait).map_err(ApplyError::Busy)?;
    let path = intent_path(audit_file);
    let leftover = read_intent(&path);
    if let Some(l) = &leftover {
        found(l)?;
    }
    let earlier = leftover
        .as_ref()
        .map(Interrupted::chain)
        .unwrap_or_default();
    if let Err(e) = write_intent(&path, layout, earlier) {
        tracing::warn!(file = %path.display(), error = %e, "cannot write the MIG apply intent record");
    }
    let r = apply();
    let reached = matches!(r, Ok(Outcome::Applied { .. } | Outcome::NothingToDo(_)));
    match &leftover {
        _ if matches!(r, Err(ApplyError::Failed { undone: false, .. })) => {}
        Some(l) if !reached => {
            if let Err(e) = write_record(&path, l) {
                tracing::error!(file = %path.display(), error = %e, layout = %l.layout, pid = l.pid, "cannot put the interrupted apply's intent record back; the GPUs may still be half-made: check `gpu-steward mig show`");
            }
        }
        _ => {
            // unlink(2) removes a link planted here, never its target.
            let _ = std::fs::remove_file(&path);
            if let Some(l) = &leftover {
                tracing::info!(layout = %l.layout, pid = l.pid, "the interrupted MIG apply's intent record is settled: the node is in layout '{layout}'");
            }
        }
    }
    r
}

fn write_intent(path: &Path, layout: &str, earlier: Vec<Interrupted>) -> std::io::Result<()> {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let record = Interrupted {
        layout: layout.to_string(),
        pid: std::process::id(),
        started,
        earlier,
    };
    write_record(path, &record)
}

/// Writes `record` at `path`: temp file, fsync, rename, fsync of the directory.
fn write_record(path: &Path, record: &Interrupted) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    // Left by a killed apply of a process with our pid: removed, never written through.
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&tmp)?;
    let written = f
        .write_all(serde_json::to_string(record).unwrap_or_default().as_bytes())
        .and_then(|()| f.sync_all())
        // rename(2) replaces whatever is at the path (a symlink, a FIFO) without following it.
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    // The rename itself must survive a power loss for the record to mean anything.
    if let Some(dir) = path.parent() {
        let _ = File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

/// The record at `path`, if any. A record that cannot be read or understood (not a regular
/// file, too large, not UTF-8, not JSON) still says that an apply was interrupted: it is
/// logged, and reported with the reason in place of the layout.
pub fn read_intent(path: &Path) -> Option<Interrupted> {
    let unreadable = |why: String| {
        tracing::warn!(file = %path.display(), "the MIG apply intent record cannot be read: {why}");
        Interrupted {
            layout: format!("(unreadable intent record: {why})"),
            pid: 0,
            started: 0,
            earlier: Vec::new(),
        }
    };
    let text = match bounded::read_to_string(path, Limits::own(MAX_INTENT)) {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return None,
        Err(e) => return Some(unreadable(e.to_string())),
    };
    Some(serde_json::from_str(&text).unwrap_or_else(|e| {
        unreadable(format!(
            "'{}' is not an intent record ({e}); check `gpu-steward mig show`, then remove it",
            path.display()
        ))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(undone: bool) -> Result<Outcome, ApplyError> {
        Err(ApplyError::Failed {
            reason: "GPU 0: create failed".into(),
            restored: String::new(),
            undone,
            left: None,
        })
    }

    fn applied() -> Result<Outcome, ApplyError> {
        Ok(Outcome::Applied {
            plan: crate::mig::plan::Plan { gpus: Vec::new() },
            steps: 1,
            pending: Vec::new(),
            warnings: Vec::new(),
        })
    }

    /// Issue 26, defect 7: a record left by an apply killed half-way was overwritten by the
    /// next apply and removed even when that apply was rolled back. Now it is read under the
    /// lock and handed to `found`, carried in the new record, and put back unless the node
    /// reached the layout.
    #[test]
    fn a_leftover_record_is_said_carried_and_kept_until_the_node_is_in_a_known_layout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let audit = dir.path().join("audit.jsonl");
        let path = intent_path(&audit);
        let leftover = Interrupted {
            layout: "seven".into(),
            pid: 4242,
            started: 1_767_322_245,
            earlier: Vec::new(),
        };
        let text = serde_json::to_string(&leftover).expect("json");
        for (outcome, kept) in [
            (failed(true), Some(leftover.clone())),
            (
                Err(ApplyError::Refused("processes".into())),
                Some(leftover.clone()),
            ),
            (
                Err(ApplyError::Infeasible(crate::mig::plan::Infeasible {
                    index: 0,
                    uuid: "GPU-0".into(),
                    reason: "too much".into(),
                })),
                Some(leftover.clone()),
            ),
            (applied(), None),
        ] {
            std::fs::write(&path, &text).expect("write");
            let mut said = None;
            let mut during = None;
            let r = with_intent(
                &audit,
                "balanced",
                Duration::ZERO,
                |_| {},
                |l| {
                    said = Some(l.clone());
                    Ok(())
                },
                || {
                    during = read_intent(&path);
                    outcome
                },
            );
            assert_eq!(said.as_ref(), Some(&leftover), "said before the apply");
            let during = during.expect("the apply's own record");
            assert_eq!(
                (during.layout.as_str(), during.pid, &during.earlier),
                ("balanced", std::process::id(), &vec![leftover.clone()]),
                "the apply's record carries the one it found"
            );
            assert_eq!(read_intent(&path), kept, "after {r:?}");
        }
        // The rollback failed too: this apply's record stays, carrying the found one.
        std::fs::write(&path, &text).expect("write");
        let _ = with_intent(
            &audit,
            "balanced",
            Duration::ZERO,
            |_| {},
            |_| Ok(()),
            || failed(false),
        );
        let left = read_intent(&path).expect("kept");
        assert_eq!(
            (left.layout.as_str(), &left.earlier),
            ("balanced", &vec![leftover.clone()])
        );
        // Refused where it cannot be said (the audit log): nothing runs, the record stays.
        std::fs::write(&path, &text).expect("write");
        let mut ran = false;
        let r = with_intent(
            &audit,
            "balanced",
            Duration::ZERO,
            |_| {},
            |_| Err(ApplyError::Audit("disk full".into())),
            || {
                ran = true;
                applied()
            },
        );
        assert!(matches!(r, Err(ApplyError::Audit(_))) && !ran);
        assert_eq!(std::fs::read_to_string(&path).expect("read"), text);
    }

    #[test]
    fn a_record_carries_at_most_eight_earlier_ones_the_newest() {
        let mut r = Interrupted {
            layout: "l0".into(),
            pid: 1,
            started: 0,
            earlier: Vec::new(),
        };
        for n in 1..20 {
            r = Interrupted {
                layout: format!("l{n}"),
                pid: 1,
                started: n,
                earlier: r.chain(),
            };
        }
        let chain = r.chain();
        assert_eq!(chain.len(), 8);
        assert_eq!(chain[7].layout, "l19");
        assert_eq!(chain[0].layout, "l12");
        assert!(chain.iter().all(|e| e.earlier.is_empty()));
    }

    #[test]
    fn a_symlink_at_the_intent_path_is_replaced_and_its_target_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("precious");
        std::fs::write(&target, "precious\n").expect("write");
        let path = intent_path(&dir.path().join("audit.jsonl"));
        std::os::unix::fs::symlink(&target, &path).expect("symlink");
        write_intent(&path, "balanced", Vec::new()).expect("written");
        assert_eq!(
            std::fs::read_to_string(&target).expect("read"),
            "precious\n"
        );
        let r = read_intent(&path).expect("a record");
        assert_eq!((r.layout.as_str(), r.pid), ("balanced", std::process::id()));
    }

    #[test]
    fn a_fifo_garbage_or_invalid_utf8_is_reported_not_waited_on_nor_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("mig-apply.intent");
        assert_eq!(read_intent(&path), None, "no record, no interrupted apply");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let r = read_intent(&path).expect("reported");
        assert!(r.layout.contains("FIFO"), "{r:?}");
        std::fs::remove_file(&path).expect("rm");
        std::fs::write(&path, b"{\"layout\":\"\xff\xfe\"}").expect("write");
        let r = read_intent(&path).expect("reported");
        assert!(r.layout.contains("not valid UTF-8"), "{r:?}");
        std::fs::write(&path, b"garbage").expect("write");
        let r = read_intent(&path).expect("reported");
        assert!(r.layout.contains("is not an intent record"), "{r:?}");
    }

    #[test]
    fn a_second_applier_is_refused_naming_the_holder_and_gets_the_lock_once_it_is_free() {
        let dir = tempfile::tempdir().expect("tempdir");
        let held = lock(dir.path(), Duration::ZERO, |_| {}).expect("free");
        // flock locks belong to the open file description: a second open in this process
        // contends as another process would.
        let e = lock(dir.path(), Duration::ZERO, |_| {}).expect_err("held");
        assert!(
            e.contains(&format!("pid {}", std::process::id())) && e.contains("mig-apply.lock"),
            "{e}"
        );
        let mut told = None;
        let e = lock(dir.path(), Duration::from_millis(120), |h| told = Some(h))
            .expect_err("still held");
        assert_eq!(
            told,
            Some(Some(std::process::id())),
            "the wait is announced"
        );
        assert!(e.contains("waited"), "{e}");
        drop(held);
        lock(dir.path(), Duration::ZERO, |_| {}).expect("free again");
    }

    #[test]
    fn a_symlink_or_fifo_at_the_lock_path_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("precious");
        std::fs::write(&target, "precious\n").expect("write");
        std::os::unix::fs::symlink(&target, lock_path(dir.path())).expect("symlink");
        assert!(lock(dir.path(), Duration::ZERO, |_| {}).is_err());
        assert_eq!(
            std::fs::read_to_string(&target).expect("read"),
            "precious\n"
        );
        std::fs::remove_file(lock_path(dir.path())).expect("rm");
        nix::unistd::mkfifo(
            &lock_path(dir.path()),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .expect("mkfifo");
        let e = lock(dir.path(), Duration::ZERO, |_| {}).expect_err("fifo");
        assert!(e.contains("not a regular file"), "{e}");
    }
}
