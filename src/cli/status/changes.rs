//! LAST CHANGES: the tail of the audit log as one line per change, newest first.
//!
//! Each record becomes `TIME component event key=value ...`, its values escaped (hook output
//! with newlines or escape sequences stays on its line and cannot paint the terminal), the date
//! written when the record is not from today (UTC, as the records are), and consecutive records
//! that read the same folded into one line with a count (`×5`).
//!
//! Must not: read more than the tail of the log, nor follow a symlink or block on a FIFO at its
//! path (`bounded::open`).

use std::io::{Read as _, Seek, SeekFrom};
use std::path::Path;
use std::time::SystemTime;

use serde_json::Value;

use crate::bounded;
use crate::terminal::escape;

/// The tail read: the last 256 KiB hold far more than a screen of records.
const TAIL: u64 = 256 * 1024;

/// The last `n` records of the audit log at `file`, newest first, one line each, at `now`.
pub(super) fn last(file: &Path, n: usize, now: SystemTime) -> Result<Vec<String>, String> {
    // No size limit: the log grows, and only its tail is read.
    let mut f = bounded::open(file, bounded::Limits::own(u64::MAX)).map_err(|e| e.to_string())?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(TAIL);
    f.seek(SeekFrom::Start(from))
        .map_err(|e| format!("'{}': {e}", file.display()))?;
    let mut bytes = Vec::new();
    f.take(TAIL)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("'{}': {e}", file.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<&str> = text.lines().collect();
    if from > 0 && !lines.is_empty() {
        lines.remove(0); // cut mid-line
    }
    let today = day(&humantime::format_rfc3339_seconds(now).to_string()).to_string();
    let records = lines
        .iter()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|r| change_text(&r, &today));
    Ok(fold(records).take(n).collect())
}

/// `2026-11-25T18:17:57.629Z` → `2026-11-25`.
fn day(ts: &str) -> &str {
    ts.get(..10).unwrap_or(ts)
}

/// (when, what) of one record: `18:17:57` today, `2026-11-20 18:17:57` before.
fn change_text(r: &Value, today: &str) -> (String, String) {
    let ts = r["ts"].as_str().unwrap_or("?");
    let time = ts.get(11..19).unwrap_or(ts);
    let when = if day(ts) == today {
        time.to_string()
    } else {
        format!("{} {time}", day(ts))
    };
    let mut detail = Vec::new();
    if let Some(o) = r.as_object() {
        for (k, v) in o {
            if matches!(k.as_str(), "ts" | "component" | "event") {
                continue;
            }
            let v = match v {
                Value::String(s) => s.clone(),
                Value::Null | Value::Array(_) | Value::Object(_) => continue,
                other => other.to_string(),
            };
            detail.push(format!("{}={}", escape(k), escape(&v)));
        }
    }
    let what = format!(
        "{} {} {}",
        escape(r["component"].as_str().unwrap_or("?")),
        escape(r["event"].as_str().unwrap_or("?")),
        detail.join(" ")
    )
    .trim_end()
    .to_string();
    (escape(&when).into_owned(), what)
}

/// Consecutive records that read the same (`what` and `when`) as one line with their count.
fn fold(records: impl Iterator<Item = (String, String)>) -> impl Iterator<Item = String> {
    let mut out: Vec<((String, String), usize)> = Vec::new();
    for r in records {
        match out.last_mut() {
            Some((last, n)) if *last == r => *n += 1,
            _ => out.push((r, 1)),
        }
    }
    out.into_iter().map(|((when, what), n)| {
        if n == 1 {
            format!("{when} {what}")
        } else {
            // The count before the details: a narrow screen cuts the end of the line.
            let (head, rest) = split_after_event(&what);
            format!("{when} {head} ×{n}{rest}")
        }
    })
}

/// `mig apply.step gpu=0` → (`mig apply.step`, ` gpu=0`).
fn split_after_event(what: &str) -> (&str, &str) {
    let mut spaces = what.match_indices(' ').map(|(i, _)| i);
    match (spaces.next(), spaces.next()) {
        (Some(_), Some(second)) => what.split_at(second),
        _ => (what, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(rfc3339: &str) -> SystemTime {
        humantime::parse_rfc3339(rfc3339).expect("time")
    }

    fn write(dir: &Path, lines: &[&str]) -> std::path::PathBuf {
        let f = dir.join("audit.jsonl");
        std::fs::write(&f, lines.join("\n") + "\n").expect("write");
        f
    }

    #[test]
    fn hook_output_stays_on_one_line_and_cannot_paint_the_terminal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = write(
            dir.path(),
            &[
                r#"{"ts":"2026-11-25T10:00:00.000Z","component":"remediation","event":"hook.end","output":"line one\nline two \u001b[31mred\u001b]0;title\u0007"}"#,
            ],
        );
        let got = last(&f, 10, at("2026-11-25T12:00:00Z")).expect("read");
        assert_eq!(
            got,
            vec![
                r"10:00:00 remediation hook.end output=line one\nline two \u{1b}[31mred\u{1b}]0;title\u{7}"
            ]
        );
    }

    #[test]
    fn identical_steps_fold_into_one_line_with_their_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        let step = r#"{"ts":"2026-11-25T10:00:01.100Z","component":"mig","event":"apply.step","gpu":0,"step":"create_gi"}"#;
        let end =
            r#"{"ts":"2026-11-25T10:00:02.000Z","component":"mig","event":"apply.end","ok":true}"#;
        let f = write(dir.path(), &[step, step, step, step, step, end]);
        let got = last(&f, 10, at("2026-11-25T12:00:00Z")).expect("read");
        assert_eq!(
            got,
            vec![
                "10:00:02 mig apply.end ok=true",
                "10:00:01 mig apply.step ×5 gpu=0 step=create_gi",
            ]
        );
    }

    #[test]
    fn a_record_from_before_today_shows_its_date() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = write(
            dir.path(),
            &[
                r#"{"ts":"2026-11-20T18:17:57.629Z","component":"sharing","event":"apply.end"}"#,
                r#"{"ts":"2026-11-25T09:00:00.000Z","component":"sharing","event":"apply.end"}"#,
            ],
        );
        let now = at("2026-11-25T12:00:00Z") + Duration::from_secs(1);
        let got = last(&f, 10, now).expect("read");
        assert_eq!(
            got,
            vec![
                "09:00:00 sharing apply.end",
                "2026-11-20 18:17:57 sharing apply.end"
            ]
        );
    }
}
