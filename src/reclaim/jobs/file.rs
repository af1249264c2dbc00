//! The job reports' file in the state directory, so that a report outlives its job's processes
//! and agent restarts.
//!
//! One report per line (the JSON `/api/v1/jobs/...` serves), the whole file rewritten atomically
//! (a temporary file, fsynced, renamed over it) when reports changed, at most every
//! `[accounting] persist_every` and at shutdown. Read back at start with [`crate::bounded`]: no
//! symlink, a regular file, at most [`MAX_FILE_BYTES`], a deadline.
//!
//! Must not: block or fail the start. As the health journal's file: a file that cannot be read
//! back whole (a line that is not a report, a symlink, a FIFO, a file over the limit) is set
//! aside as `<name>.damaged`, reported (log line and the `jobs` agent warning of `/health`), and
//! the agent starts with the reports that could be read.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::Report;

/// The file's name in the state directory.
pub const FILE_NAME: &str = "jobs.jsonl";
/// The component name of the `/health` agent warning.
pub const COMPONENT: &str = "jobs";
/// The largest file read back: [`super::MAX_REPORTS`] reports of 8 GPUs with a full set of
/// XIDs and conditions stay below it (BENCHMARKS.md measures 10,000 typical ones).
pub const MAX_FILE_BYTES: u64 = 128 << 20;

/// The reports kept in `dir`, and what went wrong reading them.
pub fn load(dir: &Path) -> (Vec<Report>, Vec<String>) {
    let path = dir.join(FILE_NAME);
    let limits = crate::bounded::Limits::own(MAX_FILE_BYTES);
    let (reports, damage) = match crate::bounded::read(&path, limits) {
        Err(e) if e.is_not_found() => return (Vec::new(), Vec::new()),
        Err(e) => (Vec::new(), Some(e.to_string())),
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let mut reports = Vec::new();
            let mut bad = 0usize;
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                match serde_json::from_str::<Report>(line) {
                    Ok(r) if plausible(&r) => reports.push(r),
                    _ => bad += 1,
                }
            }
            let damage = (bad > 0).then(|| format!("{bad} line(s) are not job reports"));
            (reports, damage)
        }
    };
    let mut problems = Vec::new();
    if let Some(why) = damage {
        let aside = PathBuf::from(format!("{}.damaged", path.display()));
        let outcome = match fs::rename(&path, &aside) {
            Ok(()) => format!("set aside as '{}'", aside.display()),
            Err(e) => format!("could not be set aside as '{}' ({e})", aside.display()),
        };
        problems.push(format!(
            "the job reports file '{}' is damaged ({why}): {outcome}; {} report(s) from it kept; \
             look at the file, then delete it",
            path.display(),
            reports.len()
        ));
    }
    (reports, problems)
}

/// A century of seconds, or of 3 kW: more than any report of this agent can hold.
const MAX_SECONDS: f64 = 100.0 * 365.25 * 86_400.0;

/// Counters that cannot be ours (negative, not finite, beyond a century) make the line damaged.
fn plausible(r: &Report) -> bool {
    let ok = |v: f64, max: f64| v.is_finite() && (0.0..=max).contains(&v);
    r.gpus.iter().all(|g| {
        ok(g.held_seconds, MAX_SECONDS)
            && ok(g.busy_seconds, MAX_SECONDS)
            && ok(g.sampled_seconds, MAX_SECONDS)
            && g.energy_joules.is_none_or(|j| ok(j, MAX_SECONDS * 3000.0))
    }) && r.gpus.len() <= 1024
}

/// The file's content: one report per line.
pub fn serialize<'a>(reports: impl Iterator<Item = &'a Report>) -> Vec<u8> {
    let mut out = Vec::new();
    for r in reports {
        if serde_json::to_writer(&mut out, r).is_ok() {
            out.push(b'\n');
        }
    }
    out
}

/// Writes `body` as `dir/FILE_NAME` atomically: a temporary file (never through a link planted
/// at its name), fsynced, renamed over it, the directory synced.
pub fn save(dir: &Path, body: &[u8]) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{FILE_NAME}.tmp"));
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)?;
    if let Err(e) = f.write_all(body).and_then(|()| f.sync_all()) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, dir.join(FILE_NAME))?;
    fs::File::open(dir)?.sync_all()
}
