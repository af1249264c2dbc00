//! Durations written for people: one formatter for every measured duration a log line, a
//! reason or a screen shows (`67 ms`, `7.3 s`, `1m 7s`, `2h 5m`, `3d 4h`): two units at most,
//! rounded, never `1m 7ms 761us 352ns`.
//!
//! Must not: be used where the text is read back by a parser (configuration values keep
//! humantime's exact form, which `parse_duration` takes).

use std::time::Duration;

/// `d` in at most two units, rounded down in the smaller one.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        let us = d.as_micros();
        return if us < 1000 && us > 0 {
            format!("{:.1} ms", us as f64 / 1000.0)
        } else {
            format!("{ms} ms")
        };
    }
    let s = d.as_secs();
    match s {
        0..=59 => format!("{:.1} s", (ms / 100) as f64 / 10.0),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// [`duration`] of a number of seconds (negative and NaN read as 0).
pub fn seconds(s: f64) -> String {
    duration(Duration::try_from_secs_f64(s.max(0.0)).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_at_most_two_rounded_units() {
        let ns = |n: u64| duration(Duration::from_nanos(n));
        // The example: 1m 7ms 761us 352ns.
        assert_eq!(ns(60_007_761_352), "1m 0s");
        assert_eq!(ns(67_000_000), "67 ms");
        assert_eq!(ns(400_000), "0.4 ms");
        assert_eq!(ns(0), "0 ms");
        assert_eq!(ns(7_349_000_000), "7.3 s");
        assert_eq!(ns(67_900_000_000), "1m 7s");
        assert_eq!(seconds(2.0 * 3600.0 + 5.0 * 60.0 + 59.0), "2h 5m");
        assert_eq!(seconds(3.0 * 86_400.0 + 4.0 * 3600.0), "3d 4h");
        assert_eq!(seconds(-1.0), "0 ms");
        assert_eq!(seconds(f64::NAN), "0 ms");
    }
}
