//! The audit log: one JSON object per line for every decision the agent takes about the node
//! (MIG changes, sharing, reclaim, remediation), appended and fsynced before the call returns,
//! so that what the agent did survives a crash right after doing it.
//!
//! Each line is `{"ts":"2026-11-22T22:30:01.123Z","component":"mig","event":"apply.start",...}`
//! with the caller's fields merged in after those three. The file is opened for append (a
//! rotated file is reopened by the next process, not by this one: rotate with `copytruncate`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::Value;

/// The default place of the audit log.
pub const DEFAULT_FILE: &str = "/var/lib/gpu-steward/audit.jsonl";

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
    /// Opens (creating it and its parent directories) `path` for append, mode 0640.
    pub fn open(path: &Path) -> io::Result<AuditLog> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(|e| with_path(e, parent))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            // A symlink planted at the path would send the records (appended as the agent's
            // user, often root) into any file: refuse it (ELOOP).
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| with_path(e, path))?;
        Ok(AuditLog {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                file: Mutex::new(file),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Appends one record and fsyncs it. `fields` should be a JSON object; anything else is
    /// kept under the key `value`. The three leading keys cannot be overwritten by `fields`.
    pub fn record(&self, component: &str, event: &str, fields: Value) -> io::Result<()> {
        let mut line = encode(SystemTime::now(), component, event, fields);
        line.push('\n');
        // One write(2) per record under the lock: lines from threads never interleave, and an
        // O_APPEND write lands whole at the end even when another process appends too.
        let mut file = self
            .inner
            .file
            .lock()
            .map_err(|_| io::Error::other("audit log lock poisoned"))?;
        file.write_all(line.as_bytes())?;
        file.sync_data()
    }
}

fn encode(now: SystemTime, component: &str, event: &str, fields: Value) -> String {
    // Written by hand so that time, component and event lead every line (serde_json's map
    // sorts its keys), which keeps the log readable with `cut` and `grep` as well as `jq`.
    let mut line = format!(
        "{{\"ts\":{},\"component\":{},\"event\":{}",
        Value::String(humantime::format_rfc3339_millis(now).to_string()),
        Value::String(component.into()),
        Value::String(event.into()),
    );
    let mut push = |k: &str, v: &Value| {
        line.push(',');
        line.push_str(&Value::String(k.into()).to_string());
        line.push(':');
        line.push_str(&v.to_string());
    };
    match fields {
        Value::Object(extra) => {
            for (k, v) in extra
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "ts" | "component" | "event"))
            {
                push(k, v);
            }
        }
        Value::Null => {}
        other => push("value", &other),
    }
    line.push('}');
    line
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("audit log {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    #[test]
    fn a_record_is_one_line_with_time_component_and_event_first() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_386_601_123);
        let line = encode(t, "mig", "apply.start", json!({"gpu": 0, "event": "spoof"}));
        assert_eq!(
            line,
            r#"{"ts":"2026-11-22T22:30:01.123Z","component":"mig","event":"apply.start","gpu":0}"#
        );
        let s = encode(t, "x", "y", json!("text\nwith newline"));
        assert!(!s.contains('\n'), "{s}");
        assert!(s.ends_with(r#""value":"text\nwith newline"}"#), "{s}");
    }

    #[test]
    fn records_append_across_opens_and_threads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/dir/audit.jsonl");
        let log = AuditLog::open(&path).expect("open");
        std::thread::scope(|s| {
            for t in 0..4 {
                let log = log.clone();
                s.spawn(move || {
                    for i in 0..25 {
                        log.record("test", "tick", json!({"thread": t, "i": i}))
                            .expect("record");
                    }
                });
            }
        });
        AuditLog::open(&path)
            .expect("reopen")
            .record("test", "last", Value::Null)
            .expect("record");
        let text = fs::read_to_string(&path).expect("read");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect();
        assert_eq!(lines.len(), 101);
        assert_eq!(lines[100]["event"], "last");
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(
            mode & 0o007,
            0,
            "others may not read the audit log: {mode:o}"
        );
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

    #[test]
    fn an_unwritable_place_names_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        fs::write(&file, "").expect("write");
        let e = AuditLog::open(&file.join("audit.jsonl")).expect_err("parent is a file");
        assert!(e.to_string().contains(&file.display().to_string()), "{e}");
    }
}
