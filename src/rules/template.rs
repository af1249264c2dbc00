//! The subset of Prometheus's alert templates (Go `text/template`) that the agent expands.
//!
//! Supported actions, with optional `{{-` / `-}}` whitespace trimming:
//! - `{{ $labels.NAME }}` or `{{ .Labels.NAME }}`: the alert's label (empty when absent, as
//!   Prometheus's `missingkey=zero`);
//! - `{{ $value }}` or `{{ .Value }}`: the sample value, formatted as Go's `%v`;
//! - `{{ $value | F }}` with F one of `humanize`, `humanize1024`, `humanizeDuration`,
//!   `humanizePercentage`, formatted exactly as Prometheus's template functions do;
//! - `{{ $value | printf "%.1f" }}` or `{{ printf "%.1f" $value }}`: one `%f` or `%e` verb
//!   ([`super::printf`]).
//!
//! Anything else (`if`, `range`, other `printf` forms, `query`, ...) is refused at load time
//! with the action's text, so that a file never expands differently here than in Prometheus.

use super::printf::{go_exponent, Format};

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Label(String),
    Value(Option<Func>),
}

#[derive(Debug, Clone, PartialEq)]
enum Func {
    Humanize,
    Humanize1024,
    HumanizeDuration,
    HumanizePercentage,
    Printf(Format),
}

impl Template {
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        let mut trim_next = false;
        while let Some(open) = rest.find("{{") {
            let mut literal = &rest[..open];
            if trim_next {
                literal = literal.trim_start();
            }
            let after = &rest[open + 2..];
            let close = after
                .find("}}")
                .ok_or_else(|| format!("unclosed action '{}'", &rest[open..]))?;
            let mut action = &after[..close];
            if let Some(a) = action.strip_prefix('-') {
                literal = literal.trim_end();
                action = a;
            }
            trim_next = false;
            if let Some(a) = action.strip_suffix('-') {
                trim_next = true;
                action = a;
            }
            if !literal.is_empty() {
                parts.push(Part::Text(literal.to_string()));
            }
            parts.push(parse_action(action.trim())?);
            rest = &after[close + 2..];
        }
        let tail = if trim_next { rest.trim_start() } else { rest };
        if !tail.is_empty() {
            parts.push(Part::Text(tail.to_string()));
        }
        Ok(Template { parts })
    }

    /// Expands with `labels` (looked up by name) and `value`.
    pub fn expand(&self, labels: &[(String, String)], value: f64) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Label(name) => {
                    if let Some((_, v)) = labels.iter().find(|(k, _)| k == name) {
                        out.push_str(v);
                    }
                }
                Part::Value(None) => out.push_str(&go_float(value)),
                Part::Value(Some(f)) => out.push_str(&f.apply(value)),
            }
        }
        out
    }
}

fn parse_action(action: &str) -> Result<Part, String> {
    let unsupported = || {
        format!(
            "unsupported template action '{{{{ {action} }}}}' (supported: $labels.NAME, $value, \
             and $value piped to humanize, humanize1024, humanizeDuration, humanizePercentage \
             or printf \"%.Nf\")"
        )
    };
    // `printf "FMT" $value` is `$value | printf "FMT"` written the other way round.
    if let Some(args) = action.strip_prefix("printf ") {
        let args = args.trim();
        let format = args
            .strip_suffix("$value")
            .or_else(|| args.strip_suffix(".Value"))
            .ok_or_else(unsupported)?;
        return Ok(Part::Value(Some(Func::Printf(Format::parse(
            format.trim(),
        )?))));
    }
    let stages = split_pipeline(action);
    let mut pipeline = stages.iter().map(|s| s.trim());
    let head = pipeline.next().unwrap_or("");
    let func = match pipeline.next() {
        None => None,
        Some("humanize") => Some(Func::Humanize),
        Some("humanize1024") => Some(Func::Humanize1024),
        Some("humanizeDuration") => Some(Func::HumanizeDuration),
        Some("humanizePercentage") => Some(Func::HumanizePercentage),
        Some(s) if s.starts_with("printf ") => {
            Some(Func::Printf(Format::parse(s["printf ".len()..].trim())?))
        }
        Some(_) => return Err(unsupported()),
    };
    if pipeline.next().is_some() {
        return Err(unsupported());
    }
    if head == "$value" || head == ".Value" {
        return Ok(Part::Value(func));
    }
    let name = head
        .strip_prefix("$labels.")
        .or_else(|| head.strip_prefix(".Labels."));
    match name {
        Some(n) if func.is_none() && is_label_name(n) => Ok(Part::Label(n.to_string())),
        _ => Err(unsupported()),
    }
}

/// The stages of a pipeline: split at `|` outside double quotes (a printf format may hold one).
fn split_pipeline(action: &str) -> Vec<&str> {
    let mut stages = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in action.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '|' if !quoted => {
                stages.push(&action[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    stages.push(&action[start..]);
    stages
}

fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Func {
    /// Prometheus's template functions (`template/template.go`).
    fn apply(&self, v: f64) -> String {
        match self {
            Func::Humanize => humanize(v, 1000.0, &["k", "M", "G", "T", "P", "E", "Z", "Y"], true),
            Func::Humanize1024 => humanize(
                v,
                1024.0,
                &["ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"],
                false,
            ),
            Func::HumanizeDuration => humanize_duration(v),
            Func::HumanizePercentage => format!("{}%", go_g4(v * 100.0)),
            Func::Printf(format) => format.apply(v),
        }
    }
}

fn humanize(mut v: f64, base: f64, big: &[&str], small: bool) -> String {
    if v == 0.0 || v.is_nan() || v.is_infinite() {
        return go_g4(v);
    }
    let mut prefix = "";
    if v.abs() >= 1.0 || !small {
        for p in big {
            if v.abs() < base {
                break;
            }
            prefix = p;
            v /= base;
        }
    } else {
        for p in ["m", "u", "n", "p", "f", "a", "z", "y"] {
            if v.abs() >= 1.0 {
                break;
            }
            prefix = p;
            v *= 1000.0;
        }
    }
    format!("{}{prefix}", go_g4(v))
}

fn humanize_duration(v: f64) -> String {
    if v.is_nan() || v.is_infinite() {
        return go_g4(v);
    }
    if v == 0.0 {
        return format!("{}s", go_g4(v));
    }
    if v.abs() >= 1.0 {
        let sign = if v < 0.0 { "-" } else { "" };
        let v = v.abs();
        let d = v as i64;
        let (days, hours, minutes, seconds) = (d / 86400, (d / 3600) % 24, (d / 60) % 60, d % 60);
        return if days != 0 {
            format!("{sign}{days}d {hours}h {minutes}m {seconds}s")
        } else if hours != 0 {
            format!("{sign}{hours}h {minutes}m {seconds}s")
        } else if minutes != 0 {
            format!("{sign}{minutes}m {seconds}s")
        } else {
            format!("{sign}{}s", go_g4(v))
        };
    }
    let mut v = v;
    let mut prefix = "";
    for p in ["m", "u", "n", "p", "f", "a", "z", "y"] {
        if v.abs() >= 1.0 {
            break;
        }
        prefix = p;
        v *= 1000.0;
    }
    format!("{}{prefix}s", go_g4(v))
}

fn special(v: f64) -> Option<String> {
    if v.is_nan() {
        Some("NaN".into())
    } else if v.is_infinite() {
        Some(if v > 0.0 { "+Inf" } else { "-Inf" }.into())
    } else {
        None
    }
}

fn strip_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// Go's `fmt.Sprintf("%.4g", v)`.
pub fn go_g4(v: f64) -> String {
    if let Some(s) = special(v) {
        return s;
    }
    if v == 0.0 {
        return "0".into();
    }
    let sci = format!("{v:.3e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..4).contains(&exp) {
        go_exponent(strip_zeros(mantissa), exp)
    } else {
        let decimals = (3 - exp).max(0) as usize;
        strip_zeros(&format!("{v:.decimals$}")).to_string()
    }
}

/// Go's `%v` of a float64 (`strconv.FormatFloat(v, 'g', -1, 64)`): shortest, exponent below
/// 1e-4 and from 1e21.
pub fn go_float(v: f64) -> String {
    if let Some(s) = special(v) {
        return s;
    }
    if v == 0.0 {
        return "0".into();
    }
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..21).contains(&exp) {
        go_exponent(mantissa, exp)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> Vec<(String, String)> {
        vec![("gpu".into(), "3".into()), ("uuid".into(), "GPU-x".into())]
    }

    #[test]
    fn expands_labels_and_values() {
        let t = Template::parse(
            "GPU {{ $labels.gpu }} ({{.Labels.uuid}}) at {{ $value }} on {{ $labels.instance }}.",
        )
        .expect("valid");
        assert_eq!(t.expand(&labels(), 85.5), "GPU 3 (GPU-x) at 85.5 on .");
        let t = Template::parse("a  {{- $value -}}  b").expect("valid");
        assert_eq!(t.expand(&[], 2.0), "a2b");
    }

    #[test]
    fn formats_as_go_and_prometheus_do() {
        // Expected strings from Go 1.22: fmt.Sprintf and prometheus/template's functions.
        assert_eq!(go_float(85.0), "85");
        assert_eq!(go_float(0.1), "0.1");
        assert_eq!(go_float(1e21), "1e+21");
        assert_eq!(go_float(1.5e-5), "1.5e-05");
        assert_eq!(go_float(123456789.0), "123456789");
        assert_eq!(go_g4(1234.5), "1234");
        assert_eq!(go_g4(12345.0), "1.234e+04");
        assert_eq!(go_g4(0.5), "0.5");
        assert_eq!(go_g4(0.00001234), "1.234e-05");
        let h = |s: &str, v: f64| Template::parse(s).expect("valid").expand(&[], v);
        assert_eq!(h("{{ $value | humanize }}", 1234567.0), "1.235M");
        assert_eq!(h("{{ $value | humanize }}", 0.0012), "1.2m");
        assert_eq!(h("{{ $value | humanize }}", 3.0), "3");
        assert_eq!(h("{{ $value | humanize1024 }}", 2048.0), "2ki");
        assert_eq!(h("{{ $value | humanizeDuration }}", 90061.0), "1d 1h 1m 1s");
        assert_eq!(h("{{ $value | humanizeDuration }}", 75.0), "1m 15s");
        assert_eq!(h("{{ $value | humanizeDuration }}", 1.5), "1.5s");
        assert_eq!(h("{{ $value | humanizeDuration }}", 0.25), "250ms");
        assert_eq!(h("{{ $value | humanizePercentage }}", 0.1234), "12.34%");
        // The shipped NVLink rules file's form, and Go's other spelling of it.
        assert_eq!(h("{{ $value | printf \"%.1f\" }}", 2.25), "2.2");
        assert_eq!(
            h("{{ printf \"%.1f\" $value }} per min", 12.34),
            "12.3 per min"
        );
        assert_eq!(h("{{ $value | printf \"a|%.0f\" }}", 3.0), "a|3");
    }

    #[test]
    fn refuses_what_it_cannot_expand() {
        for bad in [
            "{{ if $value }}x{{ end }}",
            "{{ printf \"%d\" $value }}",
            "{{ printf \"%.2f\" $labels.gpu }}",
            "{{ $value | printf \"%.1f\" | humanize }}",
            "{{ $labels.gpu | humanize }}",
            "{{ $value | title }}",
            "{{ $labels.gpu",
            "{{ query \"up\" }}",
        ] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }
}
