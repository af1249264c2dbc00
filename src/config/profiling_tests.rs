//! `[poller] profiling_interval`: the GPM window, its default, and the errors that point at it.
//! Tests only; the expected positions are counted by hand from the texts below.

use std::time::Duration;

use super::{from_text, ConfigError, Overrides};

fn invalid(text: &str, o: &Overrides) -> (usize, usize, String) {
    match from_text("c.toml", text, o) {
        Err(ConfigError::Invalid {
            file,
            line,
            column,
            message,
        }) => {
            assert_eq!(file, "c.toml");
            (line, column, message)
        }
        other => panic!("{text:?} must be refused with a position, got {other:?}"),
    }
}

#[test]
fn the_default_window_is_5s_or_the_poll_interval_when_that_is_longer() {
    let o = Overrides::default();
    let c = from_text("c.toml", "", &o).expect("valid");
    assert_eq!(c.profiling_interval, Duration::from_secs(5));
    let c = from_text("c.toml", "[poller]\ninterval = \"100ms\"\n", &o).expect("valid");
    assert_eq!(c.profiling_interval, Duration::from_secs(5));
    let c = from_text("c.toml", "[poller]\ninterval = \"10s\"\n", &o).expect("valid");
    assert_eq!(c.profiling_interval, Duration::from_secs(10));
    let flag = Overrides {
        interval: Some(Duration::from_secs(30)),
        ..Overrides::default()
    };
    let c = from_text("c.toml", "", &flag).expect("valid");
    assert_eq!(c.profiling_interval, Duration::from_secs(30));
}

#[test]
fn a_window_as_long_as_the_poll_or_longer_is_taken_as_written() {
    let o = Overrides::default();
    let text = "[poller]\ninterval = \"1s\"\nprofiling_interval = \"1s\"\n";
    let c = from_text("c.toml", text, &o).expect("valid");
    assert_eq!(c.profiling_interval, Duration::from_secs(1));
    let text = "[poller]\ninterval = \"100ms\"\nprofiling_interval = \"1m\"\n";
    let c = from_text("c.toml", text, &o).expect("valid");
    assert_eq!(c.profiling_interval, Duration::from_secs(60));
}

#[test]
fn a_window_shorter_than_the_poll_is_refused_at_its_position() {
    let o = Overrides::default();
    let text = "[poller]\ninterval = \"10s\"\nprofiling_interval = \"5s\"\n";
    let (line, column, message) = invalid(text, &o);
    assert_eq!((line, column), (3, 22), "{message}");
    assert!(message.contains("profiling_interval '5s'"), "{message}");
    assert!(message.contains("'10s' ([poller] interval)"), "{message}");
    assert!(message.contains("use '10s' or more"), "{message}");
}

#[test]
fn a_window_shorter_than_the_interval_flag_names_the_flag() {
    let flag = Overrides {
        interval: Some(Duration::from_secs(30)),
        ..Overrides::default()
    };
    let text = "# node\n[poller]\nprofiling_interval = \"5s\"\n";
    let (line, column, message) = invalid(text, &flag);
    assert_eq!((line, column), (3, 22), "{message}");
    assert!(message.contains("--interval"), "{message}");
}

#[test]
fn zero_or_not_a_duration_is_refused_at_its_position() {
    let o = Overrides::default();
    for (value, says) in [
        ("0s", "shorter than the minimum of 100ms"),
        ("0", "profiling_interval"),
        ("fast", "invalid duration 'fast'"),
    ] {
        let text = format!("[poller]\nprofiling_interval = \"{value}\"\n");
        let (line, column, message) = invalid(&text, &o);
        assert_eq!((line, column), (2, 22), "{value}: {message}");
        assert!(message.contains(says), "{value}: {message}");
        assert!(message.contains("profiling_interval"), "{value}: {message}");
    }
    let (line, _, message) = invalid("[poller]\nprofiling_interval = 5\n", &o);
    assert_eq!(line, 2, "{message}");
}
