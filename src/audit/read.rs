//! Reading the audit log back at start, for the actors that rebuild their limits from what they
//! recorded (remediation's rails, reclaim's hourly count), bounded in every way a file someone
//! else may have touched can be hostile:
//!
//! - opened with [`crate::bounded::open`] and [`Limits::own`]: a symlink at the path (the agent
//!   writes this file, and refuses a link there) is refused, not followed to `/dev/zero`; a
//!   FIFO, a socket or a device is refused at once, never waited on;
//! - at most the last [`MAX_READ_BACK`] bytes are read (older records are outside every window
//!   the actors keep: an hour for reclaim, a week for the rails, at a few hundred bytes a
//!   record);
//! - a line longer than [`MAX_LINE`] is skipped without being held: it is read through to its
//!   newline in pieces, never collected;
//! - reading stops at [`DEADLINE`], with what was read so far.
//!
//! This module must not fail a start: whatever cannot be read is logged, and the caller gets
//! what could be.

use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

use super::event::Entry;
use crate::bounded::{self, Limits};

/// The most bytes of the audit log read back: its last 64 MiB (some 200,000 records).
pub const MAX_READ_BACK: u64 = 64 << 20;

/// The longest record read back; a longer line is skipped (records are well under 4 KiB).
pub const MAX_LINE: usize = 64 << 10;

/// How long reading back may take before the start goes on with what was read.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// What [`read_back`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadBack {
    /// Lines of the wanted component and event, handed to the caller.
    pub records: u64,
    /// Lines that looked like one but are not JSON (a torn write from before short writes were
    /// cut back, or a damaged file); skipped.
    pub damaged: u64,
    /// Lines longer than [`MAX_LINE`]; skipped unread.
    pub too_long: u64,
    /// Bytes at the start of a file over [`MAX_READ_BACK`] that were not read.
    pub skipped_bytes: u64,
}

/// Hands every record of `component` and `event` in the audit log at `path` to `each`, oldest
/// first, read as the ledger's [`Entry`] (the caller matches the [`super::Event`] it wants). A missing
/// file is an empty log.
///
/// Every line starts with ts, component and event (see `encode`): the other lines are told
/// apart without parsing them. Reads the file once, line by line.
///
/// Never fails a start: damaged and overlong lines are skipped, an unreadable file (or the
/// rest of it) is logged, and the caller gets what could be read.
pub fn read_back(path: &Path, component: &str, event: &str, each: impl FnMut(Entry)) -> ReadBack {
    let found = read_back_inner(path, component, event, each);
    match &found {
        Ok(r) => {
            if r.damaged > 0 {
                tracing::warn!(file = %path.display(), lines = r.damaged, component, event, "audit log lines that are not JSON were skipped");
            }
            if r.too_long > 0 {
                tracing::warn!(file = %path.display(), lines = r.too_long, limit = MAX_LINE, component, event, "audit log lines over the length limit were skipped unread");
            }
            if r.skipped_bytes > 0 {
                tracing::info!(file = %path.display(), bytes = r.skipped_bytes, limit = MAX_READ_BACK, component, event, "only the end of the audit log was read back; rotate it (copytruncate) to keep starts quick");
            }
        }
        Err(e) => {
            tracing::error!(error = %e, component, event, "cannot read all past records back from the audit log: going on with what could be read");
        }
    }
    found.unwrap_or_default()
}

fn read_back_inner(
    path: &Path,
    component: &str,
    event: &str,
    mut each: impl FnMut(Entry),
) -> io::Result<ReadBack> {
    // Opened bounded (no symlink, regular files only); its size limit is not the one here: a
    // large log is read from its end, not refused.
    let mut file = match bounded::open(path, Limits::own(u64::MAX)) {
        Ok(f) => f,
        Err(e) if e.is_not_found() => return Ok(ReadBack::default()),
        Err(e) => return Err(e.into()),
    };
    let mut found = ReadBack::default();
    let size = file.metadata()?.len();
    if size > MAX_READ_BACK {
        found.skipped_bytes = size - MAX_READ_BACK;
        file.seek(SeekFrom::Start(found.skipped_bytes))?;
    }
    let marker = format!(
        ",\"component\":{},\"event\":{}",
        quoted(component),
        quoted(event)
    );
    let marker = marker.as_bytes();
    let mut reader = BufReader::with_capacity(64 << 10, Read::take(file, MAX_READ_BACK));
    if found.skipped_bytes > 0 {
        // The first line is cut at the seek: skip to the next whole one.
        let cut = reader.skip_until(b'\n')?;
        found.skipped_bytes += cut as u64;
    }
    let deadline = Instant::now() + DEADLINE;
    let stats = for_each_line(&mut reader, MAX_LINE, deadline, |line| {
        if !line.windows(marker.len()).any(|w| w == marker) {
            return;
        }
        match serde_json::from_slice::<Entry>(line) {
            Ok(record) => {
                found.records += 1;
                each(record);
            }
            Err(_) => found.damaged += 1,
        }
    })
    .map_err(|e| io::Error::new(e.kind(), format!("audit log '{}': {e}", path.display())))?;
    found.too_long = stats.too_long;
    Ok(found)
}

/// `s` as a JSON string, as the writer spells it.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// What [`for_each_line`] saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lines {
    pub lines: u64,
    pub too_long: u64,
    /// The largest the line buffer ever was (its capacity): bounded by `max_line`, whatever
    /// the input.
    pub peak: usize,
}

/// Hands each line of `reader` (without its newline) to `each`; a line longer than `max_line`
/// is read through to its newline without being kept, and counted. Stops with an error at
/// `deadline`.
pub(crate) fn for_each_line(
    reader: &mut impl BufRead,
    max_line: usize,
    deadline: Instant,
    mut each: impl FnMut(&[u8]),
) -> io::Result<Lines> {
    let mut stats = Lines::default();
    let mut line = Vec::with_capacity(max_line + 1);
    loop {
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "reading back took over {} s; going on with the records read so far",
                    DEADLINE.as_secs()
                ),
            ));
        }
        line.clear();
        // At most one byte over the limit is taken: enough to know the line is too long.
        let n = reader
            .by_ref()
            .take(max_line as u64 + 1)
            .read_until(b'\n', &mut line)?;
        stats.peak = stats.peak.max(line.capacity());
        if n == 0 {
            return Ok(stats);
        }
        let ended = line.last() == Some(&b'\n');
        if ended {
            line.pop();
        } else if line.len() > max_line {
            stats.too_long += 1;
            reader.skip_until(b'\n')?;
            continue;
        }
        stats.lines += 1;
        each(&line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn a_200_mb_line_is_skipped_without_being_held() {
        // 200 MB of one line between two records, generated, never in memory at once.
        let huge = io::repeat(b'x').take(200 << 20);
        let input = Cursor::new(b"first\n".to_vec())
            .chain(huge)
            .chain(Cursor::new(b"\nlast\n".to_vec()));
        let mut reader = BufReader::with_capacity(64 << 10, input);
        let mut seen = Vec::new();
        let stats =
            for_each_line(&mut reader, 1024, later(), |l| seen.push(l.to_vec())).expect("read");
        assert_eq!(seen, vec![b"first".to_vec(), b"last".to_vec()]);
        assert_eq!((stats.lines, stats.too_long), (2, 1));
        assert!(
            stats.peak <= 2 * 1025,
            "the line buffer grew to {}",
            stats.peak
        );
    }

    #[test]
    fn a_line_at_the_limit_is_kept_and_one_over_is_not() {
        let input = b"12345\n123456\nabc".to_vec();
        let mut seen = Vec::new();
        let stats = for_each_line(&mut Cursor::new(input), 5, later(), |l| {
            seen.push(String::from_utf8_lossy(l).into_owned())
        })
        .expect("read");
        assert_eq!(
            seen,
            ["12345", "abc"],
            "an unterminated last line is a line"
        );
        assert_eq!(stats.too_long, 1);
    }

    #[test]
    fn a_deadline_passed_stops_the_read() {
        let e = for_each_line(
            &mut Cursor::new(b"a\n".to_vec()),
            5,
            Instant::now() - Duration::from_secs(1),
            |_| {},
        )
        .expect_err("too late");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn a_symlink_a_fifo_or_a_device_gives_an_empty_read_back_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = dir.path().join("audit.jsonl");
        std::os::unix::fs::symlink("/dev/zero", &link).expect("symlink");
        let e = read_back_inner(&link, "reclaim", "reclaim", |_| {}).expect_err("symlink");
        assert!(e.to_string().contains("symlink"), "{e}");
        std::fs::remove_file(&link).expect("rm");
        nix::unistd::mkfifo(&link, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let e = read_back_inner(&link, "reclaim", "reclaim", |_| {}).expect_err("fifo");
        assert!(e.to_string().contains("FIFO"), "{e}");
        assert_eq!(
            read_back(&link, "reclaim", "reclaim", |_| {}),
            ReadBack::default()
        );
    }

    #[test]
    fn a_log_over_the_limit_is_read_from_its_last_whole_line() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let mut f = std::fs::File::create(&path).expect("create");
        let rec = |i: u64| {
            format!(
                "{{\"ts\":\"t\",\"component\":\"slurm\",\"event\":\"drain\",\"node\":\"n{i}\",\
                 \"reason\":null,\"reason_before\":\"\",\"state_before\":\"IDLE\",\"trigger\":\"t\"}}\n"
            )
        };
        // Old records beyond the limit, then one known record at the end.
        let filler = "y".repeat(1 << 20);
        for _ in 0..(MAX_READ_BACK >> 20) + 1 {
            writeln!(f, "{filler}").expect("write");
        }
        f.write_all(rec(7).as_bytes()).expect("write");
        drop(f);
        let mut got = Vec::new();
        let r = read_back(&path, "slurm", "drain", |e| {
            if let crate::audit::Event::Slurm(crate::audit::event::Slurm::Drain(d)) = e.event {
                got.push(d.node)
            }
        });
        assert_eq!(got, ["n7"]);
        assert!(r.skipped_bytes > 0, "{r:?}");
    }
}
