//! Go's `printf` as alert templates use it on a sample value: `{{ $value | printf "%.1f" }}` or
//! `{{ printf "%.1f" $value }}`, with one numeric verb (`%f`, `%e`, optional precision) and
//! literal text around it (`%%` for a percent sign).
//!
//! It must not accept what it cannot format exactly as Go's `fmt` does: other verbs, flags,
//! widths, several arguments are refused at load time, so that a file never expands
//! differently here than in Prometheus.

/// A parsed format with exactly one `%f` or `%e` verb.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Format {
    before: String,
    verb: char,
    /// Digits after the point; Go's default is 6 for both verbs.
    precision: usize,
    after: String,
}

impl Format {
    /// `quoted`: the format as written in the template, in Go double quotes.
    pub(super) fn parse(quoted: &str) -> Result<Format, String> {
        let inner = quoted
            .strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .filter(|s| !s.contains(['"', '\\']))
            .ok_or_else(|| {
                format!("printf's format {quoted} must be one double-quoted string without escapes")
            })?;
        let mut parts: Vec<(String, Option<(char, usize)>)> = vec![(String::new(), None)];
        let mut chars = inner.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                if let Some(last) = parts.last_mut() {
                    last.0.push(c);
                }
                continue;
            }
            if chars.peek() == Some(&'%') {
                chars.next();
                if let Some(last) = parts.last_mut() {
                    last.0.push('%');
                }
                continue;
            }
            let mut precision = None;
            if chars.peek() == Some(&'.') {
                chars.next();
                let mut digits = String::new();
                while let Some(d) = chars.next_if(char::is_ascii_digit) {
                    digits.push(d);
                }
                precision = Some(digits.parse::<usize>().unwrap_or(0).min(30));
            }
            match chars.next() {
                Some(v @ ('f' | 'e')) => {
                    parts.push((String::new(), Some((v, precision.unwrap_or(6)))))
                }
                other => {
                    return Err(format!(
                        "printf format {quoted}: verb '%{}' is not supported (use %f or %e, \
                         with an optional precision such as %.1f)",
                        other.map(String::from).unwrap_or_default()
                    ))
                }
            }
        }
        match parts.as_slice() {
            [(before, None), (after, Some((verb, precision)))] => Ok(Format {
                before: before.clone(),
                verb: *verb,
                precision: *precision,
                after: after.clone(),
            }),
            _ => Err(format!(
                "printf format {quoted} must hold exactly one %f or %e verb for $value"
            )),
        }
    }

    /// Formats `v` as Go's `fmt.Sprintf` does.
    pub(super) fn apply(&self, v: f64) -> String {
        let p = self.precision;
        let number = if v.is_nan() {
            "NaN".to_string()
        } else if v.is_infinite() {
            if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
        } else if self.verb == 'f' {
            format!("{v:.p$}")
        } else {
            let sci = format!("{v:.p$e}");
            let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
            go_exponent(mantissa, exp.parse().unwrap_or(0))
        };
        format!("{}{number}{}", self.before, self.after)
    }
}

/// Go's exponent spelling: `e+04`, `e-05` (sign and at least two digits).
pub(super) fn go_exponent(mantissa: &str, exp: i32) -> String {
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(format: &str, v: f64) -> String {
        Format::parse(format).expect("valid").apply(v)
    }

    #[test]
    fn formats_as_go_fmt_does() {
        // Expected strings from Go's fmt.Sprintf (Go 1.22).
        assert_eq!(f("\"%.1f\"", 12.345), "12.3");
        assert_eq!(f("\"%.1f\"", 0.05), "0.1");
        assert_eq!(f("\"%f\"", 2.5), "2.500000");
        assert_eq!(f("\"%.0f\"", 7.0), "7");
        assert_eq!(f("\"%.2f%%\"", 99.5), "99.50%");
        assert_eq!(f("\"%e\"", 1234.5678), "1.234568e+03");
        assert_eq!(f("\"%.2e\"", 0.000123), "1.23e-04");
        assert_eq!(f("\"%.1f\"", f64::NAN), "NaN");
        assert_eq!(f("\"%.1f\"", f64::INFINITY), "+Inf");
        assert_eq!(f("\"%.1f\"", -12.25), "-12.2");
    }

    #[test]
    fn refuses_what_go_would_format_differently() {
        for bad in [
            "\"%d\"",
            "\"%s\"",
            "\"%5.1f\"",
            "\"%.1f %.1f\"",
            "\"no verb\"",
            "'%.1f'",
            "\"%.1f\\n\"",
            "\"%v\"",
        ] {
            assert!(Format::parse(bad).is_err(), "{bad}");
        }
    }
}
