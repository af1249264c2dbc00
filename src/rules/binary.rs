//! Binary operators between scalars and vectors: arithmetic, comparisons (with and without
//! `bool`), one-to-one matching with `on`/`ignoring`, and the set operators, as Prometheus's
//! `VectorBinop`, `VectorscalarBinop` and `resultMetric` do.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use promql_parser::parser::token::{
    T_ADD, T_DIV, T_EQLC, T_GTE, T_GTR, T_LAND, T_LSS, T_LTE, T_LUNLESS, T_MOD, T_MUL, T_NEQ,
    T_POW, T_SUB,
};
use promql_parser::parser::{BinaryExpr, LabelModifier};

use super::history::Labels;
use super::sample::{drop_name, LabelSet, Sample};

pub(super) fn is_comparison(op: u16) -> bool {
    [T_EQLC, T_NEQ, T_GTR, T_LSS, T_GTE, T_LTE].contains(&op)
}

/// `(value, keep)`: arithmetic gives the value; comparisons give lhs and whether it holds.
pub(super) fn scalar_op(op: u16, l: f64, r: f64) -> Result<(f64, bool), String> {
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

pub(super) fn vector_scalar(
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
pub(super) struct Signature {
    on: bool,
    labels: Vec<String>,
}

impl Signature {
    pub(super) fn of(b: &BinaryExpr) -> Self {
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

pub(super) fn vector_vector(
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

pub(super) fn set_op(op: u16, lhs: Vec<Sample>, rhs: Vec<Sample>, sig: &Signature) -> Vec<Sample> {
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
