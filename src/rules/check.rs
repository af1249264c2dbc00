//! The supported subset of PromQL, checked once at load time.
//!
//! Everything `eval` can evaluate passes; anything else is refused with the construct's name,
//! so that a rule never fails only at 3 a.m. when its branch is first reached. The walk also
//! collects what the history must keep: the metric names selected and the longest range plus
//! offset read.

use std::collections::HashSet;
use std::time::Duration;

use promql_parser::label::MatchOp;
use promql_parser::parser::token::{
    T_ADD, T_AVG, T_COUNT, T_DIV, T_EQLC, T_GROUP, T_GTE, T_GTR, T_LAND, T_LOR, T_LSS, T_LTE,
    T_LUNLESS, T_MAX, T_MIN, T_MOD, T_MUL, T_NEQ, T_POW, T_SUB, T_SUM,
};
use promql_parser::parser::{Expr, Offset, VectorMatchCardinality, VectorSelector};

/// The range and instant-vector functions evaluated locally (plus `time()`).
pub const FUNCTIONS: &[&str] = &[
    "rate",
    "increase",
    "delta",
    "changes",
    "avg_over_time",
    "max_over_time",
    "min_over_time",
    "absent",
    "time",
];

/// The most history a selector may read (range plus offset). The history keeps every sample
/// of the selected series over that span, one per poll: an hour is 3,900 samples of 16 bytes
/// per series at 1 s polls (with the 5-minute lookback), 39,000 at 100 ms. A month-long range,
/// fine in Prometheus, would be gigabytes here.
pub const MAX_WINDOW: Duration = Duration::from_secs(3600);

/// What the history must hold for a set of expressions.
#[derive(Debug, Default, Clone)]
pub struct Needs {
    pub names: HashSet<String>,
    /// The longest range + offset any selector reads.
    pub longest: Duration,
}

/// Checks `expr` against the subset; `Err` names the first unsupported construct.
pub fn check(expr: &Expr, needs: &mut Needs) -> Result<(), String> {
    match expr {
        Expr::NumberLiteral(_) => Ok(()),
        Expr::StringLiteral(_) => Err("a string literal".into()),
        Expr::Paren(p) => check(&p.expr, needs),
        Expr::Unary(u) => check(&u.expr, needs),
        Expr::VectorSelector(vs) => selector(vs, Duration::ZERO, needs),
        Expr::MatrixSelector(_) => {
            Err("a range selector outside rate/increase/delta/changes/*_over_time".into())
        }
        Expr::Subquery(_) => Err("a subquery".into()),
        Expr::Extension(_) => Err("an extension expression".into()),
        Expr::Aggregate(a) => {
            let id = a.op.id();
            if ![T_SUM, T_AVG, T_MIN, T_MAX, T_COUNT, T_GROUP].contains(&id) {
                return Err(format!(
                    "the aggregation '{}' (supported: sum, avg, min, max, count, group)",
                    a.op
                ));
            }
            if a.param.is_some() {
                return Err(format!("a parameter to '{}'", a.op));
            }
            check(&a.expr, needs)
        }
        Expr::Binary(b) => {
            let id = b.op.id();
            let known = [
                T_ADD, T_SUB, T_MUL, T_DIV, T_MOD, T_POW, T_EQLC, T_NEQ, T_GTR, T_LSS, T_GTE,
                T_LTE, T_LAND, T_LOR, T_LUNLESS,
            ];
            if !known.contains(&id) {
                return Err(format!("the operator '{}'", b.op));
            }
            if let Some(m) = &b.modifier {
                match &m.card {
                    VectorMatchCardinality::ManyToOne(_) => return Err("group_left".into()),
                    VectorMatchCardinality::OneToMany(_) => return Err("group_right".into()),
                    _ => {}
                }
                if m.fill_values.lhs.is_some() || m.fill_values.rhs.is_some() {
                    return Err("fill modifiers".into());
                }
            }
            check(&b.lhs, needs)?;
            check(&b.rhs, needs)
        }
        Expr::Call(c) => {
            let name = c.func.name;
            if !FUNCTIONS.contains(&name) {
                return Err(format!(
                    "the function '{name}' (supported: {})",
                    FUNCTIONS.join(", ")
                ));
            }
            for arg in &c.args.args {
                match arg.as_ref() {
                    Expr::MatrixSelector(ms) => selector(&ms.vs, ms.range, needs)?,
                    Expr::Subquery(_) => return Err(format!("a subquery inside '{name}'")),
                    other => check(other, needs)?,
                }
            }
            Ok(())
        }
    }
}

fn selector(vs: &VectorSelector, range: Duration, needs: &mut Needs) -> Result<(), String> {
    if vs.at.is_some() {
        return Err("the '@' modifier".into());
    }
    if !vs.matchers.or_matchers.is_empty() {
        return Err("'or' inside a selector's braces".into());
    }
    let name = vs.name.clone().or_else(|| {
        vs.matchers
            .matchers
            .iter()
            .find(|m| m.name == "__name__" && matches!(m.op, MatchOp::Equal))
            .map(|m| m.value.clone())
    });
    let Some(name) = name else {
        return Err("a selector without a metric name (select one metric per selector)".into());
    };
    let offset = match &vs.offset {
        None => Duration::ZERO,
        Some(Offset::Pos(d)) => *d,
        Some(Offset::Neg(_)) => return Err("a negative offset".into()),
    };
    let window = range.saturating_add(offset);
    if window > MAX_WINDOW {
        return Err(format!(
            "a selector reaching back {} (range plus offset; the agent keeps at most {} of \
             history per series: evaluate longer windows in Prometheus)",
            humantime::format_duration(window),
            humantime::format_duration(MAX_WINDOW)
        ));
    }
    needs.names.insert(name);
    needs.longest = needs.longest.max(window);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(q: &str) -> Needs {
        let mut n = Needs::default();
        let e = promql_parser::parser::parse(q).expect("parses");
        check(&e, &mut n).unwrap_or_else(|e| panic!("{q}: {e}"));
        n
    }

    fn refused(q: &str) -> String {
        let e = promql_parser::parser::parse(q).expect("parses");
        check(&e, &mut Needs::default()).expect_err("must be refused")
    }

    #[test]
    fn the_subset_passes_and_collects_needs() {
        let n = ok("sum by (gpu) (rate(a_total{x=~\"1|2\"}[5m])) > bool 2 \
                    and on(gpu) (b offset 10m) or -c unless absent(d) + time()");
        let mut names: Vec<_> = n.names.into_iter().collect();
        names.sort();
        assert_eq!(names, ["a_total", "b", "c", "d"]);
        assert_eq!(n.longest, Duration::from_secs(600));
        ok("max_over_time(a[1m] offset 5m) - avg without (x) (a) / count(a) % 2 ^ min(a)");
        ok("increase(a[2m]) + delta(a[2m]) + changes(a[2m]) + min_over_time(a[1m]) + group(a)");
        ok("a > ignoring(threshold) (b - 5)");
    }

    #[test]
    fn everything_else_is_named() {
        assert!(refused("topk(3, a)").contains("'topk'"));
        assert!(refused("histogram_quantile(0.9, a)").contains("'histogram_quantile'"));
        assert!(refused("max_over_time(rate(a[1m])[5m:1m])").contains("subquery"));
        assert_eq!(refused("a @ 100"), "the '@' modifier");
        assert_eq!(refused("a * on(x) group_left b"), "group_left");
        assert!(refused("{job=\"x\"}").contains("without a metric name"));
        assert!(refused("a atan2 b").contains("atan2"));
        assert!(
            refused("label_replace(a, \"x\", \"$1\", \"y\", \"(.*)\")").contains("label_replace")
        );
    }

    /// The history holds every sample of a window: a month-long range would be gigabytes.
    #[test]
    fn windows_longer_than_the_history_kept_are_refused_with_the_limit() {
        assert_eq!(ok("rate(a[1h])").longest, MAX_WINDOW);
        assert_eq!(
            ok("a offset 30m + rate(b[30m] offset 30m)").longest,
            MAX_WINDOW
        );
        let e = refused("increase(a_total[30d])");
        assert!(
            e.contains("reaching back 30days") && e.contains("at most 1h"),
            "{e}"
        );
        assert!(refused("rate(a[59m] offset 2m)").contains("reaching back 1h 1m"));
        assert!(refused("a offset 2h").contains("reaching back 2h"));
        // Durations near the parser's maximum neither overflow nor pass.
        assert!(refused("rate(a[292y] offset 292y)").contains("reaching back"));
    }
}
