//! A small real file system to fill up, for the audit log: a tmpfs of a few hundred KiB.
//!
//! Mounted directly where the tests may mount (root, as in CI); else inside a user and mount
//! namespace (`unshare -rm`, unprivileged) held open by a `sleep`, which the processes under
//! test join with `nsenter` ([`SmallFs::command`]) and which the test reads and fills through
//! `/proc/PID/root` ([`SmallFs::path`]). Where neither works, [`SmallFs::new`] prints why and
//! returns `None`: the test then says it is skipped, it never passes silently.
//! `GPU_STEWARD_TEST_FULLFS=namespace` forces the namespace way, to test it as root.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub struct SmallFs {
    /// The mount point, as the processes under test see it.
    dir: tempfile::TempDir,
    /// The namespace holder, when mounting directly was refused.
    holder: Option<Child>,
}

impl SmallFs {
    /// A tmpfs of `kib` KiB; `None` (with the reason printed) where none can be had.
    pub fn new(test: &str, kib: u32) -> Option<SmallFs> {
        let dir = tempfile::tempdir().expect("tempdir");
        let size = format!("size={kib}k,mode=0755");
        let forced = std::env::var("GPU_STEWARD_TEST_FULLFS").as_deref() == Ok("namespace");
        let direct = if forced {
            Err("GPU_STEWARD_TEST_FULLFS=namespace".to_string())
        } else {
            run(Command::new("mount")
                .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
                .arg(dir.path()))
        };
        let why = match direct {
            Ok(()) => return Some(SmallFs { dir, holder: None }),
            Err(e) => e,
        };
        let script = "mount -t tmpfs -o \"$1\" tmpfs \"$2\" && echo mounted && exec sleep 3600";
        let holder = Command::new("unshare")
            .args(["-rm", "sh", "-c", script, "sh", &size])
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut holder = match holder {
            Ok(h) => h,
            Err(e) => {
                eprintln!("SKIPPED {test}: cannot mount a tmpfs ({why}) nor start unshare ({e})");
                return None;
            }
        };
        let mut line = String::new();
        let out = holder.stdout.take().expect("stdout piped");
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
        if line.trim() != "mounted" {
            let _ = holder.kill();
            let err = holder
                .wait_with_output()
                .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                .unwrap_or_default();
            eprintln!(
                "SKIPPED {test}: cannot mount a tmpfs ({why}) nor in a namespace (unshare -rm: {})",
                err.trim()
            );
            return None;
        }
        Some(SmallFs {
            dir,
            holder: Some(holder),
        })
    }

    /// The mount point as processes started by [`SmallFs::command`] see it.
    pub fn inside(&self) -> &Path {
        self.dir.path()
    }

    /// `name` in the small file system, as this test process reaches it.
    pub fn path(&self, name: &str) -> PathBuf {
        match &self.holder {
            None => self.dir.path().join(name),
            Some(h) => {
                let rel = self.dir.path().strip_prefix("/").expect("absolute");
                PathBuf::from(format!("/proc/{}/root", h.id()))
                    .join(rel)
                    .join(name)
            }
        }
    }

    /// The argv prefix that runs a program where it sees the small file system: nothing, or
    /// `nsenter` into the namespace.
    pub fn prefix(&self) -> Vec<String> {
        match &self.holder {
            None => Vec::new(),
            Some(h) => [
                "nsenter",
                "-t",
                &h.id().to_string(),
                "-U",
                "-m",
                "--preserve-credentials",
                "--",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        }
    }

    /// A command that sees the small file system.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let prefix = self.prefix();
        match prefix.split_first() {
            None => Command::new(program),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(program);
                c
            }
        }
    }

    /// Writes a filler file until the file system is full (ENOSPC).
    pub fn fill(&self) {
        let mut f = std::fs::File::create(self.path("filler")).expect("create filler");
        let chunk = vec![b'x'; 4096];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling the small file system: {e}"),
            }
        }
        // Also the last bytes of a page: tmpfs counts pages, not bytes.
        let _ = f.write(b"x");
        let _ = f.sync_all();
    }

    /// Removes the filler.
    pub fn free(&self) {
        std::fs::remove_file(self.path("filler")).expect("remove filler");
    }

    /// Every line of `name` parsed as JSON; panics naming the first line that is not.
    pub fn json_lines(&self, name: &str) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.path(name)).unwrap_or_default();
        text.lines()
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("{name} line {}: {e}: {l:?}", i + 1))
            })
            .collect()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        match &mut self.holder {
            None => {
                // Lazy: an agent killed a moment ago may still hold the audit log open.
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(self.dir.path())
                    .status();
            }
            Some(h) => {
                let _ = h.kill();
                let _ = h.wait();
            }
        }
    }
}

fn run(c: &mut Command) -> Result<(), String> {
    match c.output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => Err(e.to_string()),
    }
}
