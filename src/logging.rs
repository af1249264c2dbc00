//! Logging through `tracing-subscriber`, as text or JSON on stderr (journald and container
//! runtimes collect it), with a level that a config reload can change.
//!
//! Level precedence: `--log-level` / `GPU_STEWARD_LOG_LEVEL` > `RUST_LOG` > `[log] level` >
//! `info`. The format is fixed at start: changing it needs a restart.
//!
//! A text log line is one event: a newline inside a field (a hook's output, a multi-line
//! report) is written as `\n` ([`OneLine`]), so grep, journald and log shippers see one record
//! per line. JSON escapes newlines itself.
//!
//! Text fields are terminal-safe ([`safe_fields`]): a process name, pod name, hook output,
//! alert label or HTTP peer can carry `ESC ] 0 ; … BEL` or `ESC [ 31 m`, and tracing-subscriber
//! 0.3.23 escapes only the message and error values (ESC, BEL, BS, FF, DEL and C1; not `\r`, VT
//! or NUL), never a `%value` field. Every field is written through [`crate::terminal::escape`]
//! instead, so no call site has to remember. JSON escapes C0 controls itself (serde_json);
//! DEL and C1 stay as their UTF-8 encoding, which a JSON reader does not execute.

use std::io::{self, IsTerminal, Write};

use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

use crate::config::{parse_log_level, LogFormat};

/// Lets a reload change the level.
pub struct LogHandle {
    handle: reload::Handle<EnvFilter, Registry>,
    /// The level from the flag or environment, which wins over any config file.
    flag_level: Option<String>,
}

/// The filter directive in force given the flag, `RUST_LOG` and the config. An empty
/// `RUST_LOG` is unset; one `--log-level` would refuse is refused at start ([`check_rust_log`])
/// and, should it appear later, ignored here rather than read as a target name (`verbose` as
/// `EnvFilter` reads it is "trace for target `verbose`": every other line silenced).
fn directive(flag: Option<&str>, rust_log: Option<&str>, config: Option<&str>) -> String {
    if let Some(l) = flag {
        return l.to_string();
    }
    if let Some(l) = rust_log.filter(|l| !l.trim().is_empty() && parse_log_level(l).is_ok()) {
        return l.to_string();
    }
    config.unwrap_or("info").to_string()
}

fn rust_log() -> Option<String> {
    std::env::var("RUST_LOG").ok()
}

/// `RUST_LOG` checked as `--log-level` and `[log] level` are, when no flag overrides it: the
/// same words are refused with the same reason, and the daemon does not start silenced.
pub fn check_rust_log(flag: Option<&str>) -> Result<(), String> {
    check(flag, rust_log().as_deref())
}

fn check(flag: Option<&str>, rust_log: Option<&str>) -> Result<(), String> {
    match (flag, rust_log) {
        (None, Some(l)) if !l.trim().is_empty() => parse_log_level(l)
            .map(|_| ())
            .map_err(|e| format!("RUST_LOG: {e}; or unset RUST_LOG")),
        _ => Ok(()),
    }
}

/// Installs the global subscriber. Call once, before anything logs.
pub fn init(
    flag_level: Option<String>,
    config_level: Option<&str>,
    format: LogFormat,
) -> LogHandle {
    let filter = EnvFilter::new(directive(
        flag_level.as_deref(),
        rust_log().as_deref(),
        config_level,
    ));
    let (filter, handle) = reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .fmt_fields(safe_fields())
                    .with_writer(|| OneLine(std::io::stderr())),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    if let Err(e) = result {
        eprintln!("gpu-steward: logging was already initialised: {e}");
    }
    LogHandle { handle, flag_level }
}

/// The text layer's field formatter: `name=value` (the message bare), separated by spaces as
/// tracing-subscriber's own, every value with its control characters made visible.
pub fn safe_fields() -> impl for<'w> FormatFields<'w> + Send + Sync + 'static {
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = format!("{value:?}");
        let safe = crate::terminal::escape(&text);
        match field.name() {
            "message" => write!(w, "{safe}"),
            name => write!(w, "{}={safe}", name.strip_prefix("r#").unwrap_or(name)),
        }
    })
    .delimited(" ")
}

/// A writer that keeps each event on one line: the formatter hands it one whole event per
/// write (ending in its newline); newlines and carriage returns before that end are escaped.
pub struct OneLine<W>(pub W);

impl<W: Write> Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let (body, end) = match buf.strip_suffix(b"\n") {
            Some(b) => (b, true),
            None => (buf, false),
        };
        if !body.iter().any(|c| *c == b'\n' || *c == b'\r') {
            self.0.write_all(buf)?;
            return Ok(buf.len());
        }
        let mut out = Vec::with_capacity(buf.len() + 16);
        for &c in body {
            match c {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                c => out.push(c),
            }
        }
        if end {
            out.push(b'\n');
        }
        self.0.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl LogHandle {
    /// Applies the level of a reloaded config (unless a flag or `RUST_LOG` overrides it).
    pub fn set_config_level(&self, config_level: Option<&str>) {
        let d = directive(
            self.flag_level.as_deref(),
            rust_log().as_deref(),
            config_level,
        );
        if let Err(e) = self.handle.reload(EnvFilter::new(&d)) {
            tracing::error!(error = %e, "cannot change the log level");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{check, directive, safe_fields, OneLine};
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Issue 26 bug 10: a hook's multi-line output stays inside its one log line.
    #[test]
    fn a_multi_line_field_stays_on_one_text_line() {
        let buf = Buf::default();
        let w = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || OneLine(w.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(hook = "drain", stdout = %"line one\nline two\r\n", "hook failed");
            tracing::info!("next event");
        });
        let text = String::from_utf8(buf.0.lock().expect("lock").clone()).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].contains(r"stdout=line one\nline two\r\n"),
            "{text}"
        );
        assert!(lines[1].ends_with("next event"), "{text}");
    }

    /// Deliver 5: outside text in any field (`%`, `?`, plain, the message, an error) reaches a
    /// text log with no raw control character, and cannot forge a second line.
    #[test]
    fn control_characters_in_every_kind_of_field_are_made_visible() {
        let buf = Buf::default();
        let w = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(safe_fields())
            .with_writer(move || OneLine(w.clone()))
            .finish();
        let hostile = "\u{1b}]0;x\u{7}\u{1b}[31mred\u{b}\u{0}\u{9b}\nFORGED line";
        let error = std::io::Error::other(hostile);
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(
                process = %hostile,
                pod = ?hostile,
                label = hostile,
                error = &error as &dyn std::error::Error,
                "hook said {hostile}"
            );
        });
        let text = String::from_utf8(buf.0.lock().expect("lock").clone()).expect("utf-8");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            !text.trim_end_matches('\n').chars().any(|c| c.is_control()),
            "{text:?}"
        );
        let seen = r"\u{1b}]0;x\u{7}\u{1b}[31mred\u{b}\u{0}\u{9b}\nFORGED line";
        assert!(text.contains(&format!("hook said {seen}")), "{text}");
        assert!(text.contains(&format!("process={seen}")), "{text}");
        assert!(text.contains(&format!("error={seen}")), "{text}");
        // `?` and plain string fields are Debug-quoted, as tracing-subscriber writes them.
        assert!(text.contains(r#"pod="\u{1b}]0;x\u{7}"#), "{text}");
    }

    #[test]
    fn flag_wins_then_rust_log_then_config_then_info() {
        assert_eq!(
            directive(Some("debug"), Some("warn"), Some("error")),
            "debug"
        );
        assert_eq!(directive(None, Some("warn"), Some("error")), "warn");
        assert_eq!(directive(None, None, Some("error")), "error");
        assert_eq!(directive(None, None, None), "info");
        assert_eq!(
            directive(None, Some(""), Some("error")),
            "error",
            "empty RUST_LOG"
        );
        assert_eq!(
            directive(None, Some("=[bad"), None),
            "info",
            "invalid RUST_LOG"
        );
        // Not "trace for target verbose", which would silence every other line.
        assert_eq!(directive(None, Some("verbose"), Some("warn")), "warn");
    }

    #[test]
    fn rust_log_refuses_what_log_level_refuses() {
        let e = check(None, Some("verbose")).expect_err("refused");
        assert_eq!(
            e,
            format!(
                "RUST_LOG: {}; or unset RUST_LOG",
                crate::config::parse_log_level("verbose").expect_err("refused")
            )
        );
        assert!(e.contains("'verbose' is not a level"), "{e}");
        assert_eq!(check(None, Some("gpu_steward=debug,warn")), Ok(()));
        assert_eq!(check(None, Some("")), Ok(()));
        assert_eq!(
            check(Some("info"), Some("verbose")),
            Ok(()),
            "the flag wins"
        );
    }
}
