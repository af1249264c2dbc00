//! The audit log: one JSON object per line for every decision the agent takes about the node
//! (MIG changes, sharing, reclaim, remediation), appended and fsynced before the call returns,
//! so that what the agent did survives a crash right after doing it.
//!
//! Each line is `{"ts":"2026-11-22T22:30:01.123Z","component":"mig","event":"apply.start",...}`:
//! one typed [`Event`] (its component and event first, then its fields), after the time. The file is opened for append (a
//! rotated file is reopened by the next process, not by this one: rotate with `copytruncate`).
//!
//! A record is written *before* the change it describes, and a change whose record could not be
//! written does not happen: callers act only on `Ok`. Opened by the owner of changes
//! ([`crate::changes`]), once per process; every record goes through it. A failed or short write (ENOSPC, EIO) is
//! cut off again (`set_len` back to the length before it), so that every line of the file stays
//! one valid JSON object. Failures are counted per component and the last outcome is kept
//! process-wide ([`health`]), for `gpu_steward_audit_write_errors_total` and `/health`.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

pub mod event;
#[cfg(test)]
pub(crate) mod legacy_log;
pub mod mig;
mod read;
mod trust;
pub use event::{Entry, Event};
pub use read::{read_back, ReadBack, MAX_LINE, MAX_READ_BACK};
pub use trust::{check_places, check_trust};

pub use crate::config::DEFAULT_AUDIT_FILE;

/// The components that write the audit log, for metric series that exist from the start.
pub const COMPONENTS: &[&str] = &["api", "mig", "sharing", "reclaim", "remediation"];

/// The name of the refusal every component counts when a record could not be written: the
/// one spelling of it (metric labels, API answers).
pub const AUDIT_FAILED: &str = "audit_failed";

/// A record that could not be written: nothing was done. The text names the file and the cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AuditFailed(pub String);

impl AuditFailed {
    /// The label of this refusal ([`AUDIT_FAILED`]).
    pub fn name(&self) -> &'static str {
        AUDIT_FAILED
    }
}

/// An append-only, fsynced JSON-lines log; cheap to clone.
#[derive(Clone, Debug)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    file: Mutex<File>,
}

impl AuditLog {
    /// Opens (creating it) `path` for append, mode 0640. Its directory must exist, except the
    /// agent's state directory ([`state_dir`]), which is created (one level, mode 0750): a typo
    /// in `[audit] file` is an error naming the directory, not a tree made as root.
    ///
    /// A log that another user could replace ([`check_trust`]) is refused: its records are
    /// read back at start.
    pub fn open(path: &Path) -> io::Result<AuditLog> {
        let state = state_dir();
        check_trust(path, &state)
            .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
        open_in(path, &state)
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Appends one record and fsyncs it; `Ok` only once the record is on disk, so that the
    /// caller may act. The error names the file.
    pub fn record(&self, event: &Event) -> io::Result<()> {
        let component = event.component();
        let mut line =
            encode(SystemTime::now(), event).map_err(|e| with_path(e, &self.inner.path))?;
        line.push('\n');
        let written = self.append(line.as_bytes());
        note(component, &self.inner.path, written.as_ref().err());
        written.map_err(|e| with_path(e, &self.inner.path))
    }

    fn append(&self, line: &[u8]) -> io::Result<()> {
        // One write(2) per record under the lock: lines from threads never interleave, and an
        // O_APPEND write lands whole at the end even when another process appends too.
        let mut file = self
            .inner
            .file
            .lock()
            .map_err(|_| io::Error::other("audit log lock poisoned"))?;
        append_whole(&mut *file, line).map_err(|(e, cut)| {
            if let Some(c) = cut {
                tracing::error!(error = %c, file = %self.inner.path.display(), "cannot cut a partial audit record off");
            }
            e
        })
    }
}

/// What [`append_whole`] needs of a file; a trait so that tests can fail a write half-way.
trait Sink: Write {
    fn len(&self) -> io::Result<u64>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    fn sync(&self) -> io::Result<()>;
}

impl Sink for File {
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
    fn sync(&self) -> io::Result<()> {
        self.sync_data()
    }
}

/// Writes and syncs `line`, or leaves the file as it was: a short write (ENOSPC half-way)
/// would leave half a line that the next record is glued to, so the file is cut back to its
/// length before the write (shrinking needs no space). The error, and the cut's own error.
fn append_whole(file: &mut impl Sink, line: &[u8]) -> Result<(), (io::Error, Option<io::Error>)> {
    let before = file.len().map_err(|e| (e, None))?;
    let written = file.write_all(line).and_then(|()| file.sync());
    written.map_err(|e| {
        let cut = file.set_len(before).and_then(|()| file.sync()).err();
        (e, cut)
    })
}

/// How audit writes have gone in this process, for metrics and `/health`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditHealth {
    /// Failed writes per component (`mig`, `sharing`, `reclaim`, `remediation`).
    pub write_errors: BTreeMap<String, u64>,
    /// Set while the last write failed: what failed, naming the file.
    pub failing: Option<String>,
}

/// Process-wide: every [`AuditLog`] (one per process, held by the owner of changes; tests open
/// their own) reports here.
static HEALTH: Mutex<AuditHealth> = Mutex::new(AuditHealth {
    write_errors: BTreeMap::new(),
    failing: None,
});

/// How audit writes have gone so far.
pub fn health() -> AuditHealth {
    HEALTH
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Counts a failure; logs once when writes start failing and once when they work again.
fn note(component: &str, path: &Path, error: Option<&io::Error>) {
    let mut h = HEALTH.lock().unwrap_or_else(PoisonError::into_inner);
    match error {
        Some(e) => {
            *h.write_errors.entry(component.to_string()).or_default() += 1;
            if h.failing.is_none() {
                tracing::error!(error = %e, file = %path.display(), component, "audit log write failed: changes to the node are refused until it can be written");
            }
            h.failing = Some(format!(
                "the audit log '{}' cannot be written ({e}): changes to the node are refused",
                path.display()
            ));
        }
        None => {
            if h.failing.take().is_some() {
                tracing::info!(file = %path.display(), "the audit log can be written again");
            }
        }
    }
}

fn encode(now: SystemTime, event: &Event) -> io::Result<String> {
    // The time leads every line, then the event's component and name (its tags), then its
    // fields: readable with `cut` and `grep` as well as `jq`.
    let body = serde_json::to_string(event).map_err(io::Error::other)?;
    let ts = humantime::format_rfc3339_millis(now).to_string();
    // An event serialises as a JSON object with its tags first: `{"component":…`.
    let rest = body.strip_prefix('{').ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "an audit event is not a JSON object",
        )
    })?;
    let mut line = String::with_capacity(body.len() + ts.len() + 10);
    line.push_str("{\"ts\":\"");
    line.push_str(&ts);
    line.push_str("\",");
    line.push_str(rest);
    Ok(line)
}

/// The directory of the audit log `file`, where the files beside it live (the MIG node lock and
/// intent record, the `node-changed` notice): its parent, `.` for a bare file name.
pub fn dir_of(file: &Path) -> PathBuf {
    file.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."))
        .to_path_buf()
}

/// The agent's state directory: systemd's `$STATE_DIRECTORY` (its first entry; the unit's
/// `StateDirectory=`, the DaemonSet's env), else the directory of [`DEFAULT_AUDIT_FILE`].
pub fn state_dir() -> PathBuf {
    std::env::var_os("STATE_DIRECTORY")
        .and_then(|v| {
            v.to_str()
                .and_then(|s| s.split(':').next())
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| {
            Path::new(DEFAULT_AUDIT_FILE)
                .parent()
                .map_or_else(PathBuf::new, Path::to_path_buf)
        })
}

fn open_in(path: &Path, state: &Path) -> io::Result<AuditLog> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.is_dir() {
            if parent == state && parent.parent().is_some_and(Path::is_dir) {
                fs::DirBuilder::new()
                    .mode(0o750)
                    .create(parent)
                    .or_else(|e| match e.kind() {
                        io::ErrorKind::AlreadyExists => Ok(()),
                        _ => Err(e),
                    })
                    .map_err(|e| with_path(e, parent))?;
            } else if !parent.exists() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "audit log '{}': directory '{}' does not exist; create it, or fix \
                         [audit] file (the agent creates only its state directory '{}')",
                        path.display(),
                        parent.display(),
                        state.display()
                    ),
                ));
            }
        }
    }
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        // A symlink planted at the path would send the records (appended as the agent's
        // user, often root) into any file: refuse it (ELOOP).
        // A FIFO there would block the open until a reader came: O_NONBLOCK, then refused below.
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| with_path(e, path))?;
    if !file.metadata().map_err(|e| with_path(e, path))?.is_file() {
        return Err(with_path(
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file; replace it with one (or remove it: the agent creates it)",
            ),
            path,
        ));
    }
    Ok(AuditLog {
        inner: Arc::new(Inner {
            path: path.to_path_buf(),
            file: Mutex::new(file),
        }),
    })
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("audit log '{}': {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::time::Duration;

    fn api(peer: &str) -> Event {
        Event::Api(event::Api::Request {
            auth: "token".into(),
            method: "POST".into(),
            path: "/api/v1/mig/apply".into(),
            peer: peer.into(),
            trigger: "api".into(),
        })
    }

    #[test]
    fn a_record_is_one_line_with_time_component_and_event_first() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_386_601_123);
        let line = encode(t, &api("10.0.0.1")).expect("encode");
        assert_eq!(
            line,
            r#"{"ts":"2026-11-22T22:30:01.123Z","component":"api","event":"request","auth":"token","method":"POST","path":"/api/v1/mig/apply","peer":"10.0.0.1","trigger":"api"}"#
        );
        let s = encode(t, &api("text\nwith newline")).expect("encode");
        assert!(!s.contains('\n'), "{s}");
        assert!(s.contains(r#""peer":"text\nwith newline""#), "{s}");
    }

    #[test]
    fn records_append_across_opens_and_threads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).expect("open");
        std::thread::scope(|s| {
            for t in 0..4 {
                let log = log.clone();
                s.spawn(move || {
                    for i in 0..25 {
                        log.record(&api(&format!("{t}.{i}"))).expect("record");
                    }
                });
            }
        });
        AuditLog::open(&path)
            .expect("reopen")
            .record(&api("last"))
            .expect("record");
        let text = fs::read_to_string(&path).expect("read");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect();
        assert_eq!(lines.len(), 101);
        assert_eq!(lines[100]["peer"], "last");
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(
            mode & 0o007,
            0,
            "others may not read the audit log: {mode:o}"
        );
    }

    /// A file that takes `room` bytes, then answers ENOSPC (as a full file system does).
    struct Full {
        data: std::cell::RefCell<Vec<u8>>,
        room: usize,
    }

    impl Write for Full {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut d = self.data.borrow_mut();
            let n = buf.len().min(self.room.saturating_sub(d.len()));
            if n == 0 {
                return Err(io::Error::from_raw_os_error(28));
            }
            d.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Sink for Full {
        fn len(&self) -> io::Result<u64> {
            Ok(self.data.borrow().len() as u64)
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.data.borrow_mut().truncate(len as usize);
            Ok(())
        }
        fn sync(&self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_short_write_is_cut_off_so_every_line_stays_json() {
        let first = b"{\"n\":1}\n";
        let mut f = Full {
            data: std::cell::RefCell::new(Vec::new()),
            room: first.len() + 5,
        };
        append_whole(&mut f, first).expect("fits");
        let (e, cut) = append_whole(&mut f, b"{\"n\":2,\"long\":true}\n").expect_err("full");
        assert_eq!(e.raw_os_error(), Some(28));
        assert!(cut.is_none());
        assert_eq!(f.data.borrow().as_slice(), first, "the half record stayed");
        // Room again: the next record starts a line of its own.
        f.room = 1000;
        append_whole(&mut f, b"{\"n\":3}\n").expect("fits");
        let data = f.data.borrow();
        let text = std::str::from_utf8(&data).expect("utf-8");
        for line in text.lines() {
            serde_json::from_str::<Value>(line).expect("each line is JSON");
        }
        assert_eq!(text.lines().count(), 2);
    }

    #[test]
    fn failures_are_counted_and_the_next_success_clears_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = AuditLog::open(&dir.path().join("a.jsonl")).expect("open");
        note(
            "test-only",
            log.path(),
            Some(&io::Error::from_raw_os_error(28)),
        );
        let h = health();
        assert!(h.write_errors.get("test-only").is_some_and(|n| *n >= 1));
        log.record(&api("ok")).expect("record");
        // Other tests may fail writes concurrently; this one's own count stays.
        assert!(health()
            .write_errors
            .get("test-only")
            .is_some_and(|n| *n >= 1));
    }

    #[test]
    fn a_symlink_at_the_path_is_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("elsewhere");
        fs::write(&target, "precious\n").expect("write");
        let link = dir.path().join("audit.jsonl");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let e = AuditLog::open(&link).expect_err("a symlink");
        assert!(e.to_string().contains("audit.jsonl"), "{e}");
        assert_eq!(fs::read_to_string(&target).expect("read"), "precious\n");
    }

    /// Issue 26 bug 10: a typo in `[audit] file` is refused with the directory named; only
    /// the state directory itself is created.
    #[test]
    fn a_missing_directory_is_refused_and_only_the_state_directory_is_created() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("gpu-steward");
        let typo = dir.path().join("gpu-stewrad/audit.jsonl");
        let e = open_in(&typo, &state).expect_err("a typo");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(
            e.to_string().contains("gpu-stewrad' does not exist")
                && e.to_string().contains("[audit] file"),
            "{e}"
        );
        assert!(!dir.path().join("gpu-stewrad").exists(), "nothing created");
        let deep = state.join("sub/audit.jsonl");
        assert!(
            open_in(&deep, &state).is_err(),
            "not below the state directory"
        );
        assert!(!state.exists());
        open_in(&state.join("audit.jsonl"), &state).expect("the state directory is created");
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&state).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode & 0o027, 0, "{mode:o}");
    }

    #[test]
    fn an_unwritable_place_names_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        fs::write(&file, "").expect("write");
        let e = AuditLog::open(&file.join("audit.jsonl")).expect_err("parent is a file");
        assert!(e.to_string().contains(&file.display().to_string()), "{e}");
    }
}
