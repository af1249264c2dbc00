//! The health journal's file in the state directory, so that `/api/v1/events` still shows what
//! happened before a restart, an upgrade or a crash.
//!
//! One JSON object per line (the event as `/api/v1/events` shows it), appended as the poller
//! journals it. Bounded: the file is rotated at [`MAX_FILE_BYTES`] (the previous one becomes
//! [`ROTATED_NAME`], replacing an older one), so the journal takes at most twice that on disk,
//! and at start the newest [`super::journal::CAPACITY`] events of both come back, marked
//! `before_restart`. They are read with [`crate::bounded`]: no symlink, a regular file, the size
//! limit and a deadline.
//!
//! Must not: block or fail the start. A file that cannot be read back whole (a line that is not
//! an event, a symlink, a FIFO, a file over the limit) is set aside as `<name>.damaged`,
//! reported (log line and a `/health` agent warning) and the agent starts with what could be
//! read; a file that cannot be written leaves the journal in memory only.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::event::HealthEvent;

/// The journal file's name in the state directory.
pub const FILE_NAME: &str = "journal.jsonl";
/// The previous file after a rotation.
pub const ROTATED_NAME: &str = "journal.jsonl.1";
/// A file is rotated before it grows past this (about 4000 events).
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// The component name of the `/health` agent warning.
pub const COMPONENT: &str = "journal";

/// The journal's file, open for append.
#[derive(Debug)]
pub struct JournalFile {
    path: PathBuf,
    file: Option<File>,
    len: u64,
    /// Set while writes fail, so that the failure is logged once, not per event.
    failing: bool,
}

/// The directory of the journal: `$STATE_DIRECTORY` (its first entry; created one level deep
/// when missing, as systemd would), else `/var/lib/gpu-steward` when it exists (the packages
/// and the DaemonSet make it), else none: the journal stays in memory.
pub fn state_dir() -> Option<PathBuf> {
    let dir = crate::audit::state_dir();
    if std::env::var_os("STATE_DIRECTORY").is_some() && !dir.is_dir() {
        let _ = fs::create_dir(&dir);
    }
    dir.is_dir().then_some(dir)
}

/// What a previous run left in `dir`: the file to append to from now on (`None` when it cannot
/// be opened), the events read back (oldest first, marked `before_restart`), and what went
/// wrong.
pub fn load(dir: &Path) -> (Option<JournalFile>, Vec<HealthEvent>, Vec<String>) {
    let path = dir.join(FILE_NAME);
    let mut problems = Vec::new();
    let mut earlier = Vec::new();
    for p in [dir.join(ROTATED_NAME), path.clone()] {
        earlier.extend(read_back(&p, &mut problems));
    }
    for e in &mut earlier {
        e.before_restart = true;
    }
    match append_to(&path) {
        Ok(file) => {
            let len = file.metadata().map_or(0, |m| m.len());
            let file = JournalFile {
                path,
                file: Some(file),
                len,
                failing: false,
            };
            (Some(file), earlier, problems)
        }
        Err(e) => {
            problems.push(format!(
                "cannot open the journal file '{}' ({e}): events of this run will not outlive a \
                 restart; check that the state directory is writable",
                path.display()
            ));
            (None, earlier, problems)
        }
    }
}

/// The events in `path`, oldest first; a file that is not whole is set aside (renamed to
/// `<path>.damaged`) after the events that could be read are taken.
fn read_back(path: &Path, problems: &mut Vec<String>) -> Vec<HealthEvent> {
    let limits = crate::bounded::Limits::own(MAX_FILE_BYTES * 2);
    let (events, damage) = match crate::bounded::read(path, limits) {
        Err(e) if e.is_not_found() => return Vec::new(),
        Err(e) => (Vec::new(), Some(e.to_string())),
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let mut events = Vec::new();
            let mut bad = 0usize;
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                match serde_json::from_str::<HealthEvent>(line) {
                    Ok(e) => events.push(e),
                    Err(_) => bad += 1,
                }
            }
            let damage = (bad > 0).then(|| format!("{bad} line(s) are not journal events"));
            (events, damage)
        }
    };
    if let Some(why) = damage {
        let aside = PathBuf::from(format!("{}.damaged", path.display()));
        let outcome = match fs::rename(path, &aside) {
            Ok(()) => format!("set aside as '{}'", aside.display()),
            Err(e) => format!("could not be set aside as '{}' ({e})", aside.display()),
        };
        problems.push(format!(
            "the journal file '{}' is damaged ({why}): {outcome}; {} event(s) from it kept; \
             look at the file, then delete it",
            path.display(),
            events.len()
        ));
    }
    events
}

/// Opens `path` for append (created mode 0640), never through a symlink planted there.
fn append_to(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

impl JournalFile {
    /// Appends `event` as one line, rotating first when the file would grow past the limit.
    /// A failure is logged once and set as the agent warning; the in-memory journal goes on.
    pub fn write(&mut self, event: &HealthEvent) {
        let Ok(mut line) = serde_json::to_string(event) else {
            return;
        };
        line.push('\n');
        let result = self.rotate_if_full(line.len() as u64).and_then(|()| {
            let file = self
                .file
                .as_mut()
                .ok_or_else(|| io::Error::other("the journal file is not open"))?;
            file.write_all(line.as_bytes())
        });
        match result {
            Ok(()) => {
                self.len += line.len() as u64;
                if std::mem::take(&mut self.failing) {
                    tracing::info!(file = %self.path.display(), "the journal file can be written again");
                    crate::warnings::set(COMPONENT, None);
                }
            }
            Err(e) if !self.failing => {
                self.failing = true;
                let text = format!(
                    "cannot write the journal file '{}' ({e}): events from now on will not \
                     outlive a restart; free space or fix the state directory",
                    self.path.display()
                );
                tracing::warn!("{text}");
                crate::warnings::set(COMPONENT, Some(text));
            }
            Err(_) => {}
        }
    }

    fn rotate_if_full(&mut self, adding: u64) -> io::Result<()> {
        if self.len + adding <= MAX_FILE_BYTES && self.file.is_some() {
            return Ok(());
        }
        if self.len > 0 {
            let rotated = self.path.with_file_name(ROTATED_NAME);
            self.file = None;
            fs::rename(&self.path, rotated)?;
        }
        self.file = Some(append_to(&self.path)?);
        self.len = 0;
        Ok(())
    }
}

#[cfg(test)]
#[path = "journal_file_tests.rs"]
mod tests;
