//! Evaluates a checked PromQL expression at one instant over the local [`History`].
//!
//! Semantics follow Prometheus 2.x (`promql/engine.go`, `promql/functions.go`; 2.42 is the
//! promtool the tests compare with): instant selectors take the newest sample in `[t - 5m, t]`
//! unless it is a staleness marker; range selectors take the samples in `[t - range, t]`;
//! `rate`/`increase`/`delta` extrapolate as `extrapolatedRate` does ([`super::functions`]);
//! arithmetic and `bool` comparisons drop the metric name; one-to-one vector matching with
//! `on`/`ignoring`; `and`/`or`/`unless` match on label sets ([`super::binary`]). (Prometheus 3
//! made both windows left-open and reordered the extrapolation clamps: results differ only when
//! a sample lies exactly on the window's start, which poll timestamps in milliseconds make
//! rare.) Only what `check` admits reaches this code; anything else is an error, never a guess.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use promql_parser::label::Matcher;
use promql_parser::parser::token::{
    T_AVG, T_COUNT, T_GROUP, T_LAND, T_LOR, T_LUNLESS, T_MAX, T_MIN, T_SUM,
};
use promql_parser::parser::{
    AggregateExpr, BinaryExpr, Call, Expr, LabelModifier, Offset, VectorSelector,
};

use super::binary::{is_comparison, scalar_op, set_op, vector_scalar, vector_vector, Signature};
use super::functions::{absent_labels, range_function};
use super::history::{is_stale, History, Labels, LOOKBACK_MS};
use super::sample::{drop_name, LabelSet, Sample};

/// Each matching series with its points in a range.
type RangeSeries = Vec<(Labels, Vec<(i64, f64)>)>;

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
