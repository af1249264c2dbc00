//! Evaluates a checked PromQL expression at one instant over the local [`History`].
//!
//! Semantics follow Prometheus 2.x (`promql/engine.go`, `promql/functions.go`; 2.42 is the
//! promtool the tests compare with): instant selectors take the newest sample in `[t - 5m, t]`
//! unless it is a staleness marker; range selectors take the samples in `[t - range, t]`;
//! `rate`/`increase`/`delta` extrapolate as `extrapolatedRate` does. (Prometheus 3 made both
//! windows left-open and reordered the extrapolation clamps: results differ only when a sample
//! lies exactly on the window's start, which poll timestamps in milliseconds make rare.) arithmetic and `bool` comparisons drop the metric name; one-to-one
//! vector matching with `on`/`ignoring`; `and`/`or`/`unless` match on label sets. Only what
//! `check` admits reaches this code; anything else is an error, never a guess.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use promql_parser::label::Matcher;
use promql_parser::parser::token::{
    T_ADD, T_AVG, T_COUNT, T_DIV, T_EQLC, T_GROUP, T_GTE, T_GTR, T_LAND, T_LOR, T_LSS, T_LTE,
    T_LUNLESS, T_MAX, T_MIN, T_MOD, T_MUL, T_NEQ, T_POW, T_SUB, T_SUM,
};
use promql_parser::parser::{
    AggregateExpr, BinaryExpr, Call, Expr, LabelModifier, Offset, VectorSelector,
};

use super::history::{is_stale, History, Labels, LOOKBACK_MS};

/// A label set, sorted by name.
type LabelSet = Vec<(String, String)>;
/// Each matching series with its points in a range.
type RangeSeries = Vec<(Labels, Vec<(i64, f64)>)>;

/// One element of an instant vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Labels,
    pub value: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Scalar(f64),
    Vector(Vec<Sample>),
}

/// Evaluates `expr` at `ts_ms` (milliseconds since the epoch).
pub fn evaluate(expr: &Expr, history: &History, ts_ms: i64) -> Result<Value, String> {
    let v = Ctx { history, ts: ts_ms }.eval(expr)?;
    if let Value::Vector(samples) = &v {
        let mut seen = HashSet::with_capacity(samples.len());
        if samples.iter().any(|s| !seen.insert(&s.labels)) {
            return Err("vector cannot contain metrics with the same labelset".into());
        }
    }
    Ok(v)
}

struct Ctx<'a> {
    history: &'a History,
    ts: i64,
}

fn offset_ms(o: &Option<Offset>) -> i64 {
    match o {
        Some(Offset::Pos(d)) => d.as_millis() as i64,
        Some(Offset::Neg(d)) => -(d.as_millis() as i64),
        None => 0,
    }
}

fn label<'l>(labels: &'l [(String, String)], name: &str) -> &'l str {
    labels
        .iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

fn matches(labels: &[(String, String)], vs: &VectorSelector) -> bool {
    if let Some(name) = &vs.name {
        if label(labels, "__name__") != name {
            return false;
        }
    }
    vs.matchers
        .matchers
        .iter()
        .all(|m: &Matcher| m.is_match(label(labels, &m.name)))
}

fn drop_name(labels: &Labels) -> Labels {
    if labels.first().is_some_and(|(k, _)| k == "__name__") {
        Arc::new(labels[1..].to_vec())
    } else {
        labels.clone()
    }
}

impl Ctx<'_> {
    fn eval(&self, expr: &Expr) -> Result<Value, String> {
        match expr {
            Expr::NumberLiteral(n) => Ok(Value::Scalar(n.val)),
            Expr::Paren(p) => self.eval(&p.expr),
            Expr::Unary(u) => Ok(match self.eval(&u.expr)? {
                Value::Scalar(v) => Value::Scalar(-v),
                Value::Vector(vs) => Value::Vector(
                    vs.into_iter()
                        .map(|s| Sample {
                            labels: drop_name(&s.labels),
                            value: -s.value,
                        })
                        .collect(),
                ),
            }),
            Expr::VectorSelector(vs) => Ok(Value::Vector(self.instant(vs))),
            Expr::Aggregate(a) => self.aggregate(a),
            Expr::Binary(b) => self.binary(b),
            Expr::Call(c) => self.call(c),
            other => Err(format!("unsupported expression {other}")),
        }
    }

    fn instant(&self, vs: &VectorSelector) -> Vec<Sample> {
        let t = self.ts - offset_ms(&vs.offset);
        self.history
            .iter()
            .filter(|s| matches(&s.labels, vs))
            .filter_map(|s| {
                let (st, v) = s.samples.iter().rev().find(|(st, _)| *st <= t)?;
                (*st >= t - LOOKBACK_MS && !is_stale(*v)).then(|| Sample {
                    labels: s.labels.clone(),
                    value: *v,
                })
            })
            .collect()
    }

    /// Each matching series with its samples in `[t - range, t]` (staleness markers skipped),
    /// and the range's bounds.
    fn range(&self, arg: &Expr) -> Result<(RangeSeries, i64, i64), String> {
        let Expr::MatrixSelector(ms) = arg else {
            return Err(format!("expected a range selector, got {arg}"));
        };
        let end = self.ts - offset_ms(&ms.vs.offset);
        let start = end - ms.range.as_millis() as i64;
        let out = self
            .history
            .iter()
            .filter(|s| matches(&s.labels, &ms.vs))
            .map(|s| {
                let pts: Vec<(i64, f64)> = s
                    .samples
                    .iter()
                    .filter(|(t, v)| *t >= start && *t <= end && !is_stale(*v))
                    .copied()
                    .collect();
                (s.labels.clone(), pts)
            })
            .filter(|(_, pts)| !pts.is_empty())
            .collect();
        Ok((out, start, end))
    }

    fn call(&self, c: &Call) -> Result<Value, String> {
        let args = &c.args.args;
        let name = c.func.name;
        match name {
            "time" => Ok(Value::Scalar(self.ts as f64 / 1000.0)),
            "absent" => {
                let arg = args.first().ok_or("absent needs an argument")?;
                match self.eval(arg)? {
                    Value::Vector(v) if v.is_empty() => Ok(Value::Vector(vec![Sample {
                        labels: Arc::new(absent_labels(arg)),
                        value: 1.0,
                    }])),
                    _ => Ok(Value::Vector(Vec::new())),
                }
            }
            _ => {
                let arg = args
                    .first()
                    .ok_or_else(|| format!("{name} needs an argument"))?;
                let (series, start, end) = self.range(arg)?;
                let out = series
                    .into_iter()
                    .filter_map(|(labels, pts)| {
                        let value = range_function(name, &pts, start, end)?;
                        Some(Sample {
                            labels: drop_name(&labels),
                            value,
                        })
                    })
                    .collect();
                Ok(Value::Vector(out))
            }
        }
    }

    fn aggregate(&self, a: &AggregateExpr) -> Result<Value, String> {
        let Value::Vector(input) = self.eval(&a.expr)? else {
            return Err("aggregation over a scalar".into());
        };
        let key = |labels: &Labels| -> LabelSet {
            match &a.modifier {
                Some(LabelModifier::Include(by)) => labels
                    .iter()
                    .filter(|(k, _)| by.labels.contains(k))
                    .cloned()
                    .collect(),
                Some(LabelModifier::Exclude(without)) => labels
                    .iter()
                    .filter(|(k, _)| k != "__name__" && !without.labels.contains(k))
                    .cloned()
                    .collect(),
                None => Vec::new(),
            }
        };
        // (sum or extreme, count), in first-seen order.
        let mut groups: Vec<(LabelSet, f64, f64)> = Vec::new();
        let mut index: HashMap<LabelSet, usize> = HashMap::new();
        let id = a.op.id();
        for s in input {
            let k = key(&s.labels);
            match index.get(&k) {
                None => {
                    index.insert(k.clone(), groups.len());
                    groups.push((k, s.value, 1.0));
                }
                Some(&i) => {
                    let g = &mut groups[i];
                    g.2 += 1.0;
                    g.1 = match id {
                        T_MIN if s.value < g.1 || g.1.is_nan() => s.value,
                        T_MAX if s.value > g.1 || g.1.is_nan() => s.value,
                        T_MIN | T_MAX => g.1,
                        _ => g.1 + s.value,
                    };
                }
            }
        }
        let out = groups
            .into_iter()
            .map(|(labels, acc, n)| {
                let value = match id {
                    T_SUM | T_MIN | T_MAX => acc,
                    T_AVG => acc / n,
                    T_COUNT => n,
                    T_GROUP => 1.0,
                    _ => f64::NAN,
                };
                Sample {
                    labels: Arc::new(labels),
                    value,
                }
            })
            .collect();
        Ok(Value::Vector(out))
    }

    fn binary(&self, b: &BinaryExpr) -> Result<Value, String> {
        let lhs = self.eval(&b.lhs)?;
        let rhs = self.eval(&b.rhs)?;
        let op = b.op.id();
        let return_bool = b.return_bool();
        match (lhs, rhs) {
            (Value::Scalar(l), Value::Scalar(r)) => {
                let (v, keep) = scalar_op(op, l, r)?;
                Ok(Value::Scalar(if is_comparison(op) {
                    if keep {
                        1.0
                    } else {
                        0.0
                    }
                } else {
                    v
                }))
            }
            (Value::Vector(l), Value::Scalar(r)) => {
                vector_scalar(op, return_bool, l, r, false).map(Value::Vector)
            }
            (Value::Scalar(l), Value::Vector(r)) => {
                vector_scalar(op, return_bool, r, l, true).map(Value::Vector)
            }
            (Value::Vector(l), Value::Vector(r)) => {
                let sig = Signature::of(b);
                if [T_LAND, T_LOR, T_LUNLESS].contains(&op) {
                    Ok(Value::Vector(set_op(op, l, r, &sig)))
                } else {
                    vector_vector(op, return_bool, l, r, &sig).map(Value::Vector)
                }
            }
        }
    }
}

fn is_comparison(op: u16) -> bool {
    [T_EQLC, T_NEQ, T_GTR, T_LSS, T_GTE, T_LTE].contains(&op)
}

/// `(value, keep)`: arithmetic gives the value; comparisons give lhs and whether it holds.
fn scalar_op(op: u16, l: f64, r: f64) -> Result<(f64, bool), String> {
    Ok(match op {
        T_ADD => (l + r, true),
        T_SUB => (l - r, true),
        T_MUL => (l * r, true),
        T_DIV => (l / r, true),
        // Go's math.Mod and Rust's `%` both keep the dividend's sign.
        T_MOD => (l % r, true),
        T_POW => (l.powf(r), true),
        T_EQLC => (l, l == r),
        T_NEQ => (l, l != r),
        T_GTR => (l, l > r),
        T_LSS => (l, l < r),
        T_GTE => (l, l >= r),
        T_LTE => (l, l <= r),
        _ => return Err(format!("operator {op} between numbers")),
    })
}

fn vector_scalar(
    op: u16,
    return_bool: bool,
    vector: Vec<Sample>,
    scalar: f64,
    scalar_on_left: bool,
) -> Result<Vec<Sample>, String> {
    let mut out = Vec::with_capacity(vector.len());
    for s in vector {
        let (l, r) = if scalar_on_left {
            (scalar, s.value)
        } else {
            (s.value, scalar)
        };
        let (v, keep) = scalar_op(op, l, r)?;
        if is_comparison(op) {
            if return_bool {
                out.push(Sample {
                    labels: drop_name(&s.labels),
                    value: if keep { 1.0 } else { 0.0 },
                });
            } else if keep {
                // The vector's element keeps its own value, whichever side it is on.
                out.push(s);
            }
        } else {
            out.push(Sample {
                labels: drop_name(&s.labels),
                value: v,
            });
        }
    }
    Ok(out)
}

/// How two vectors' elements are matched: `on(..)` or `ignoring(..)` (always ignoring the
/// metric name).
struct Signature {
    on: bool,
    labels: Vec<String>,
}

impl Signature {
    fn of(b: &BinaryExpr) -> Self {
        match b.modifier.as_ref().and_then(|m| m.matching.as_ref()) {
            Some(LabelModifier::Include(l)) => Signature {
                on: true,
                labels: l.labels.clone(),
            },
            Some(LabelModifier::Exclude(l)) => Signature {
                on: false,
                labels: l.labels.clone(),
            },
            None => Signature {
                on: false,
                labels: Vec::new(),
            },
        }
    }

    fn key(&self, labels: &[(String, String)]) -> LabelSet {
        labels
            .iter()
            .filter(|(k, _)| {
                if self.on {
                    self.labels.contains(k)
                } else {
                    k != "__name__" && !self.labels.contains(k)
                }
            })
            .cloned()
            .collect()
    }

    /// Labels of a one-to-one result: `on` keeps only its labels, `ignoring` drops its own.
    fn result(&self, labels: &Labels, drop_metric_name: bool) -> Labels {
        let kept: LabelSet = labels
            .iter()
            .filter(|(k, _)| {
                if k == "__name__" {
                    return !drop_metric_name && !self.on;
                }
                if self.on {
                    self.labels.contains(k)
                } else {
                    !self.labels.contains(k)
                }
            })
            .cloned()
            .collect();
        Arc::new(kept)
    }
}

fn vector_vector(
    op: u16,
    return_bool: bool,
    lhs: Vec<Sample>,
    rhs: Vec<Sample>,
    sig: &Signature,
) -> Result<Vec<Sample>, String> {
    let mut right: HashMap<LabelSet, &Sample> = HashMap::with_capacity(rhs.len());
    for s in &rhs {
        if right.insert(sig.key(&s.labels), s).is_some() {
            return Err(
                "found duplicate series for the match group on the right hand-side of the \
                 operation; many-to-many matching not allowed"
                    .into(),
            );
        }
    }
    let mut out = Vec::new();
    let mut matched_left = HashSet::new();
    let comparison = is_comparison(op);
    for l in &lhs {
        let key = sig.key(&l.labels);
        let Some(r) = right.get(&key) else { continue };
        let (v, keep) = scalar_op(op, l.value, r.value)?;
        let drop = !comparison || return_bool;
        if comparison && !return_bool && !keep {
            continue;
        }
        // As Prometheus, only elements that made it into the result count as duplicates.
        if !matched_left.insert(key) {
            return Err(
                "multiple matches for labels: many-to-one matching must be explicit \
                 (group_left/group_right)"
                    .into(),
            );
        }
        let value = match (comparison, return_bool) {
            (true, true) => {
                if keep {
                    1.0
                } else {
                    0.0
                }
            }
            (true, false) => l.value,
            _ => v,
        };
        out.push(Sample {
            labels: sig.result(&l.labels, drop),
            value,
        });
    }
    Ok(out)
}

fn set_op(op: u16, lhs: Vec<Sample>, rhs: Vec<Sample>, sig: &Signature) -> Vec<Sample> {
    let right: HashSet<LabelSet> = rhs.iter().map(|s| sig.key(&s.labels)).collect();
    match op {
        T_LAND => lhs
            .into_iter()
            .filter(|s| right.contains(&sig.key(&s.labels)))
            .collect(),
        T_LUNLESS => lhs
            .into_iter()
            .filter(|s| !right.contains(&sig.key(&s.labels)))
            .collect(),
        _ => {
            let left: HashSet<LabelSet> = lhs.iter().map(|s| sig.key(&s.labels)).collect();
            let mut out = lhs;
            out.extend(
                rhs.into_iter()
                    .filter(|s| !left.contains(&sig.key(&s.labels))),
            );
            out
        }
    }
}

/// Labels of `absent(selector)`: its equality matchers, except names matched more than once.
fn absent_labels(arg: &Expr) -> LabelSet {
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
fn range_function(name: &str, pts: &[(i64, f64)], start: i64, end: i64) -> Option<f64> {
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
