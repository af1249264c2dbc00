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
//! Must not: block or fail the start. The file is opened, for reading and for append, through
//! [`crate::bounded`] (no symlink, a regular file only, never waiting on a FIFO). A line is
//! written whole or not at all: a short write (a full disk) is cut back, and a last line
//! without its newline found at start (a crash mid-write) is cut off, every whole line kept. A
//! file that cannot be read back whole otherwise (a line that is not an event, a symlink, a
//! FIFO, a file over the limit) is set aside as `<name>.damaged`, reported (log line and a
//! `/health` agent warning) and the agent starts with what could be read; when it cannot be set
//! aside (something is in the way at `<name>.damaged`), or the file cannot be written, the
//! journal is kept in memory only, and that is reported the same way.

use std::fs::{self, File};
use std::io::{self, Write};
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
/// be opened, or when a damaged file could not be set aside), the events read back (oldest
/// first, marked `before_restart`), and what went wrong.
pub fn load(dir: &Path) -> (Option<JournalFile>, Vec<HealthEvent>, Vec<String>) {
    let path = dir.join(FILE_NAME);
    let mut problems = Vec::new();
    let mut earlier = Vec::new();
    let mut stuck = false;
    for p in [dir.join(ROTATED_NAME), path.clone()] {
        let back = read_back(&p, &mut problems);
        earlier.extend(back.events);
        stuck |= p == path && back.stuck;
    }
    for e in &mut earlier {
        e.before_restart = true;
    }
    if stuck {
        // Appending to what is there would block (a FIFO), write through it, or glue new lines
        // to damage: the journal goes on in memory.
        problems.push(format!(
            "the journal is kept in memory only: events of this run will not outlive a restart; \
             remove '{}' (and '{}.damaged'), then restart the agent",
            path.display(),
            path.display()
        ));
        return (None, earlier, problems);
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

/// What [`read_back`] found in one file.
struct ReadBack {
    events: Vec<HealthEvent>,
    /// The file is damaged and could not be set aside: it stays where it is.
    stuck: bool,
}

/// The events in `path`, oldest first. A last line without its newline (a write cut short by a
/// full disk or a crash) is cut off the file, and every whole line kept. A file that is not
/// whole otherwise is set aside (renamed to `<path>.damaged`) after the events that could be
/// read are taken.
fn read_back(path: &Path, problems: &mut Vec<String>) -> ReadBack {
    let limits = crate::bounded::Limits::own(MAX_FILE_BYTES * 2);
    let mut events = Vec::new();
    let damage = match crate::bounded::read(path, limits) {
        Err(e) if e.is_not_found() => {
            return ReadBack {
                events,
                stuck: false,
            }
        }
        Err(e) => Some(e.to_string()),
        Ok(bytes) => {
            let whole = whole_lines(&bytes);
            if whole < bytes.len() {
                // Logged, not a warning: what was lost is the one event being written.
                let said = cut_torn_line(path, whole, bytes.len());
                tracing::warn!("{said}");
            }
            let text = String::from_utf8_lossy(&bytes[..whole]);
            let mut bad = 0usize;
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                match serde_json::from_str::<HealthEvent>(line) {
                    Ok(e) => events.push(e),
                    Err(_) => bad += 1,
                }
            }
            (bad > 0).then(|| format!("{bad} line(s) are not journal events"))
        }
    };
    let mut stuck = false;
    if let Some(why) = damage {
        let aside = PathBuf::from(format!("{}.damaged", path.display()));
        let outcome = match fs::rename(path, &aside) {
            Ok(()) => format!("set aside as '{}'", aside.display()),
            Err(e) => {
                stuck = true;
                format!("could not be set aside as '{}' ({e})", aside.display())
            }
        };
        problems.push(format!(
            "the journal file '{}' is damaged ({why}): {outcome}; {} event(s) from it kept; \
             look at the file, then delete it",
            path.display(),
            events.len()
        ));
    }
    ReadBack { events, stuck }
}

/// The length of `bytes` up to and with its last newline: its whole lines.
fn whole_lines(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1)
}

/// Cuts the torn last line (bytes `whole..len`) off `path`; what happened, for the log.
fn cut_torn_line(path: &Path, whole: usize, len: usize) -> String {
    let cut = append_to(path).and_then(|f| f.set_len(whole as u64));
    let torn = len - whole;
    match cut {
        Ok(()) => format!(
            "the journal file '{}' ended in a torn line ({torn} bytes without a newline, from a \
             write cut short by a full disk or a crash): cut off, every whole line kept",
            path.display()
        ),
        Err(e) => format!(
            "the journal file '{}' ends in a torn line ({torn} bytes without a newline) that \
             cannot be cut off ({e}); every whole line kept",
            path.display()
        ),
    }
}

/// Opens `path` for append (created mode 0640) through [`crate::bounded::open_append`]: never
/// through a symlink planted there, never blocking on a FIFO, a regular file only.
fn append_to(path: &Path) -> io::Result<File> {
    let limits = crate::bounded::Limits::own(MAX_FILE_BYTES * 2);
    Ok(crate::bounded::open_append(path, 0o640, limits)?)
}

/// Writes `line` whole or not at all: a short write (ENOSPC half-way) is cut back to the
/// length before it, as the audit log does, so that the next line is not glued to half a
/// line. No fsync: the journal answers "what happened lately".
fn append_whole(file: &mut File, line: &[u8]) -> io::Result<()> {
    let before = file.metadata()?.len();
    file.write_all(line).inspect_err(|_| {
        if let Err(e) = file.set_len(before) {
            tracing::warn!(error = %e, "cannot cut a partial journal line off");
        }
    })
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
            append_whole(file, line.as_bytes())
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
