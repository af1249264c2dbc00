//! What a dashboard query must answer, known before it is asked: expectations built from the
//! scenario a test writes (or a shipped scenario file it reads) and from NVIDIA's published
//! model facts, never from what the agent serves. A query is run with Grafana's `$instance`
//! set to one agent, so that each answer is that agent's alone.
//!
//! Must not take an expected value from the agent, and must not accept a missing or extra
//! series: "0 where the scenario says 1" and "No data where it says 1" both fail.

use std::collections::BTreeMap;

use super::Prometheus;

/// The expected answer of one query.
#[derive(Debug, Clone)]
pub enum Expect {
    /// Exactly these series, identified by the values of `key` labels (missing label = ""),
    /// each within `tol` (relative, with an absolute floor of 1e-9).
    Series {
        key: Vec<&'static str>,
        series: Vec<(Vec<String>, f64)>,
        tol: f64,
    },
    /// One series (any labels) whose value lies in [lo, hi]: times and ages.
    Between(f64, f64),
    /// No data: Grafana's "No data", for a panel whose condition nothing meets.
    Empty,
    /// Data whose value the scenario cannot know (the agent's own poll duration).
    Present,
}

/// Shorthands: `by("gpu", &[("0", 1.0)])`, `one(3.0)`.
pub fn by(label: &'static str, values: &[(&str, f64)]) -> Expect {
    by_tol(label, values, 0.0)
}

pub fn by_tol(label: &'static str, values: &[(&str, f64)], tol: f64) -> Expect {
    Expect::Series {
        key: vec![label],
        series: values
            .iter()
            .map(|(k, v)| (vec![k.to_string()], *v))
            .collect(),
        tol,
    }
}

pub fn by2(a: &'static str, b: &'static str, values: &[(&str, &str, f64)]) -> Expect {
    Expect::Series {
        key: vec![a, b],
        series: values
            .iter()
            .map(|(x, y, v)| (vec![x.to_string(), y.to_string()], *v))
            .collect(),
        tol: 0.0,
    }
}

pub fn one(v: f64) -> Expect {
    one_tol(v, 0.0)
}

pub fn one_tol(v: f64, tol: f64) -> Expect {
    Expect::Series {
        key: Vec::new(),
        series: vec![(Vec::new(), v)],
        tol,
    }
}

/// Grafana's variables for one agent and a short test's windows. `$__range` is 10 s (not the
/// "All data" of the presence test) so that increases over it are known from the scenario.
pub fn substitute_for(expr: &str, instance: &str) -> String {
    substitute_with(expr, instance, "10s", "10s")
}

/// As Grafana fills the variables for one instance, with its rate interval and range.
pub fn substitute_with(expr: &str, instance: &str, rate_interval: &str, range: &str) -> String {
    expr.replace("${instance}", instance)
        .replace("$instance", instance)
        .replace("${gpu}", ".*")
        .replace("$gpu", ".*")
        .replace("$__rate_interval", rate_interval)
        .replace("$__interval", "2s")
        .replace("$__range", range)
}

/// Runs `expr` at `time` (Unix seconds) and compares with `want`: `Err` with what differs.
pub fn check(prom: &Prometheus, expr: &str, time: f64, want: &Expect) -> Result<(), String> {
    let got = prom.query_at(expr, time)?;
    let rows: Vec<(BTreeMap<String, String>, f64)> = match &got {
        serde_json::Value::Array(a) => a
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                            .collect()
                    })
                    .unwrap_or_default();
                let v = s["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN);
                (labels, v)
            })
            .collect(),
        other => return Err(format!("not a vector: {other}")),
    };
    let shown = || {
        rows.iter()
            .map(|(l, v)| format!("{l:?} {v}"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    match want {
        Expect::Empty if rows.is_empty() => Ok(()),
        Expect::Empty => Err(format!("wanted No data, got {}", shown())),
        Expect::Present if !rows.is_empty() => Ok(()),
        Expect::Present => Err("no data".into()),
        Expect::Between(lo, hi) => match rows.as_slice() {
            [(_, v)] if v >= lo && v <= hi => Ok(()),
            _ => Err(format!("wanted one value in [{lo}, {hi}], got {}", shown())),
        },
        Expect::Series { key, series, tol } => {
            let mut got: Vec<(Vec<String>, f64)> = rows
                .iter()
                .map(|(l, v)| {
                    let k = key
                        .iter()
                        .map(|k| l.get(*k).cloned().unwrap_or_default())
                        .collect();
                    (k, *v)
                })
                .collect();
            let mut want = series.clone();
            let order = |a: &(Vec<String>, f64), b: &(Vec<String>, f64)| {
                a.0.cmp(&b.0).then(a.1.total_cmp(&b.1))
            };
            got.sort_by(order);
            want.sort_by(order);
            let same = got.len() == want.len()
                && got.iter().zip(&want).all(|((gk, gv), (wk, wv))| {
                    gk == wk && (gv - wv).abs() <= (tol * wv.abs()).max(1e-9)
                });
            if same {
                Ok(())
            } else {
                Err(format!(
                    "wanted {want:?} by {key:?} (±{}%), got {got:?}",
                    tol * 100.0
                ))
            }
        }
    }
}

/// Runs every query of `queries` that `table` knows against the agent at `target`, at `time`;
/// `dashboards`: the files whose every query `table` must know.
pub fn check_table(
    prom: &Prometheus,
    queries: &[super::dashboards::DashboardQuery],
    table: &super::expected::Table,
    (name, target): (&str, &str),
    time: f64,
    dashboards: &[&str],
    failures: &mut Vec<String>,
) {
    // An expectation no dashboard query has: a renamed panel would otherwise go unchecked.
    for origin in table.keys() {
        if !queries.iter().any(|q| q.origin == *origin) {
            failures.push(format!("{origin}: expected, but no dashboard has it"));
        }
    }
    for q in queries {
        let want = match table.get(&q.origin) {
            // A variable over every agent (no $instance in it): the presence test's.
            _ if !q.raw.contains("$instance") && q.origin.contains(" variable ") => continue,
            Some(w) => w,
            None if dashboards.iter().any(|d| q.origin.starts_with(d)) => {
                failures.push(format!("{}: no expected value (add one)", q.origin));
                continue;
            }
            None => continue,
        };
        let expr = substitute_for(&q.raw, target);
        if let Err(e) = check(prom, &expr, time, want) {
            failures.push(format!("[{name}] {}: {e}\n    {expr}", q.origin));
        }
    }
}

/// The (alertname, gpu, xid) of the firing alerts of one instance, sorted.
pub fn firing(prom: &Prometheus, target: &str) -> Vec<(String, String, String)> {
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let mut out: Vec<_> = prom
        .alerts()
        .iter()
        .filter(|a| a["labels"]["instance"] == target && a["state"] == "firing")
        .map(|a| {
            let l = &a["labels"];
            (s(&l["alertname"]), s(&l["gpu"]), s(&l["xid"]))
        })
        .collect();
    out.sort();
    out
}

pub fn alerts_of(list: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = list
        .iter()
        .map(|(a, g, x)| (a.to_string(), g.to_string(), x.to_string()))
        .collect();
    v.sort();
    v
}
