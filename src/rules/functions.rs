//! Functions over a series' points in a range (`rate`, `increase`, `delta`, `changes`,
//! `*_over_time`) and the labels of `absent`, as Prometheus's `promql/functions.go` (2.x).

use std::collections::HashMap;

use promql_parser::parser::Expr;

use super::sample::LabelSet;

/// Labels of `absent(selector)`: its equality matchers, except names matched more than once.
pub(super) fn absent_labels(arg: &Expr) -> LabelSet {
    let Expr::VectorSelector(vs) = arg else {
        return Vec::new();
    };
    let mut seen: HashMap<&str, Option<&str>> = HashMap::new();
    for m in &vs.matchers.matchers {
        if m.name == "__name__" {
            continue;
        }
        let eq = matches!(m.op, promql_parser::label::MatchOp::Equal).then_some(m.value.as_str());
        seen.entry(m.name.as_str())
            .and_modify(|v| *v = None)
            .or_insert(eq);
    }
    let mut out: LabelSet = seen
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), v?.to_string())))
        .collect();
    out.sort();
    out
}

/// The value of a range function over one series' points, `None` when Prometheus gives none.
pub(super) fn range_function(name: &str, pts: &[(i64, f64)], start: i64, end: i64) -> Option<f64> {
    match name {
        "rate" => extrapolated_rate(pts, start, end, true, true),
        "increase" => extrapolated_rate(pts, start, end, true, false),
        "delta" => extrapolated_rate(pts, start, end, false, false),
        "changes" => {
            let mut n = 0.0;
            for w in pts.windows(2) {
                let (a, b) = (w[0].1, w[1].1);
                if a != b && !(a.is_nan() && b.is_nan()) {
                    n += 1.0;
                }
            }
            Some(n)
        }
        "avg_over_time" => Some(pts.iter().map(|p| p.1).sum::<f64>() / pts.len() as f64),
        "max_over_time" => pts
            .iter()
            .map(|p| p.1)
            .reduce(|m, v| if v > m || m.is_nan() { v } else { m }),
        "min_over_time" => pts
            .iter()
            .map(|p| p.1)
            .reduce(|m, v| if v < m || m.is_nan() { v } else { m }),
        _ => None,
    }
}

/// Prometheus's `extrapolatedRate` (promql/functions.go, 2.x) for float samples.
fn extrapolated_rate(
    pts: &[(i64, f64)],
    range_start: i64,
    range_end: i64,
    is_counter: bool,
    is_rate: bool,
) -> Option<f64> {
    if pts.len() < 2 {
        return None;
    }
    let (first_t, first_v) = pts[0];
    let (last_t, last_v) = pts[pts.len() - 1];
    let mut result = last_v - first_v;
    if is_counter {
        let mut prev = first_v;
        for &(_, v) in &pts[1..] {
            if v < prev {
                result += prev;
            }
            prev = v;
        }
    }
    let to_start = (first_t - range_start) as f64 / 1000.0;
    let to_end = (range_end - last_t) as f64 / 1000.0;
    let sampled = (last_t - first_t) as f64 / 1000.0;
    let average = sampled / (pts.len() - 1) as f64;
    let mut to_start = to_start;
    if is_counter && result > 0.0 && first_v >= 0.0 {
        // A counter cannot have been below zero: do not extrapolate past the point where it
        // would have been 0.
        let to_zero = sampled * (first_v / result);
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    let threshold = average * 1.1;
    let mut interval = sampled;
    interval += if to_start < threshold {
        to_start
    } else {
        average / 2.0
    };
    interval += if to_end < threshold {
        to_end
    } else {
        average / 2.0
    };
    let mut factor = interval / sampled;
    if is_rate {
        factor /= (range_end - range_start) as f64 / 1000.0;
    }
    Some(result * factor)
}
