//! Runs promtool's rule unit-test files (`promtool test rules`) through the agent's evaluator,
//! so that one file is checked by Prometheus and by the agent: the same input series, the same
//! evaluation times, the same expected alerts and samples.
//!
//! Supported: `rule_files`, `evaluation_interval`, `tests[].interval`, `input_series` (the
//! expanding notation `a+bxn`, `a-bxn`, `axn`, `_`, `_xn`, `stale`), `alert_rule_test` and
//! `promql_expr_test`. Times start at the Unix epoch, as in promtool.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use super::eval::{self, Value};
use super::file::parse_duration;
use super::history::stale_nan;
use super::{Engine, RuleSet};

#[derive(Deserialize)]
struct TestFile {
    #[serde(default)]
    rule_files: Vec<String>,
    evaluation_interval: Option<String>,
    tests: Vec<TestGroup>,
}

#[derive(Deserialize)]
struct TestGroup {
    interval: Option<String>,
    #[serde(default)]
    input_series: Vec<InputSeries>,
    #[serde(default)]
    alert_rule_test: Vec<AlertTest>,
    #[serde(default)]
    promql_expr_test: Vec<ExprTest>,
    #[allow(dead_code)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct InputSeries {
    series: String,
    values: String,
}

#[derive(Deserialize)]
struct AlertTest {
    eval_time: String,
    alertname: String,
    #[serde(default)]
    exp_alerts: Vec<ExpAlert>,
}

#[derive(Deserialize)]
struct ExpAlert {
    #[serde(default)]
    exp_labels: BTreeMap<String, String>,
    #[serde(default)]
    exp_annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct ExprTest {
    expr: String,
    eval_time: String,
    #[serde(default)]
    exp_samples: Vec<ExpSample>,
}

#[derive(Deserialize)]
struct ExpSample {
    #[serde(default)]
    labels: String,
    value: f64,
}

fn duration(s: &str) -> Duration {
    parse_duration(s).unwrap_or_else(|e| panic!("{e}"))
}

/// Labels of a series written as a selector (`name{a="b"}`), sorted, `__name__` included.
fn series_labels(s: &str) -> Vec<(String, String)> {
    if s.is_empty() || s == "{}" {
        return Vec::new();
    }
    let e = promql_parser::parser::parse(s).unwrap_or_else(|e| panic!("series {s}: {e}"));
    let promql_parser::parser::Expr::VectorSelector(vs) = e else {
        panic!("series {s} is not a selector")
    };
    let mut labels: Vec<(String, String)> = vs
        .matchers
        .matchers
        .iter()
        .map(|m| (m.name.clone(), m.value.clone()))
        .collect();
    if let Some(n) = vs.name {
        if !labels.iter().any(|(k, _)| k == "__name__") {
            labels.push(("__name__".into(), n));
        }
    }
    labels.sort();
    labels
}

/// promtool's expanding notation; `None` is a missing sample.
fn expand(values: &str) -> Vec<Option<f64>> {
    let mut out = Vec::new();
    for tok in values.split_whitespace() {
        if tok == "_" {
            out.push(None);
        } else if let Some(n) = tok.strip_prefix("_x") {
            out.extend(std::iter::repeat_n(None, n.parse().expect("count")));
        } else if tok == "stale" {
            out.push(Some(stale_nan()));
        } else if let Some((head, n)) = tok.split_once('x') {
            let n: usize = n.parse().expect("count");
            // `a+b`, `a-b` or `a`; a leading sign belongs to a.
            let split = head[1..].find(['+', '-']).map(|i| i + 1);
            let (a, b) = match split {
                Some(i) => (
                    head[..i].parse::<f64>().expect("start"),
                    head[i..].parse::<f64>().expect("step"),
                ),
                None => (head.parse::<f64>().expect("value"), 0.0),
            };
            out.extend((0..=n).map(|k| Some(a + b * k as f64)));
        } else {
            out.push(Some(tok.parse().expect("value")));
        }
    }
    out
}

fn at(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64)
}

/// Runs the promtool test file at `path`; panics with every mismatch.
pub fn run(path: &Path) {
    let text = std::fs::read_to_string(path).expect("test file");
    let file: TestFile = serde_yaml::from_str(&text).expect("test file parses");
    let dir = path.parent().expect("dir");
    let mut set = RuleSet::default();
    for f in &file.rule_files {
        let p = dir.join(f);
        let t = std::fs::read_to_string(&p).expect("rule file");
        set.add(&p, t).unwrap_or_else(|e| panic!("{e}"));
    }
    let set = Arc::new(set);
    let every = duration(file.evaluation_interval.as_deref().unwrap_or("1m"));
    let mut failures = Vec::new();
    for (ti, test) in file.tests.iter().enumerate() {
        let interval = duration(test.interval.as_deref().unwrap_or("1m"));
        // Every sample, in time order; fed as time advances so that the ring buffers hold
        // what they would hold live.
        let mut samples: Vec<Point> = Vec::new();
        for s in &test.input_series {
            let labels = series_labels(&s.series);
            for (i, v) in expand(&s.values).into_iter().enumerate() {
                if let Some(v) = v {
                    let ts = (interval.as_millis() as i64) * i as i64;
                    samples.push((ts, labels.clone(), v));
                }
            }
        }
        samples.sort_by_key(|s| s.0);
        let feed = |engine: &mut Engine, upto: i64, next: &mut usize| {
            while *next < samples.len() && samples[*next].0 <= upto {
                let (ts, l, v) = &samples[*next];
                engine.history_mut().push_sample(l.clone(), *ts, *v);
                *next += 1;
            }
        };
        for e in &test.promql_expr_test {
            let ts = duration(&e.eval_time).as_millis() as i64;
            let mut engine = Engine::new(set.clone(), interval);
            feed(&mut engine, ts, &mut 0);
            let q = promql_parser::parser::parse(&e.expr).expect("expr parses");
            let mut needs = super::check::Needs::default();
            super::check::check(&q, &mut needs).unwrap_or_else(|c| panic!("{}: {c}", e.expr));
            let got = match eval::evaluate(&q, engine.history(), ts) {
                Ok(Value::Vector(v)) => v
                    .into_iter()
                    .map(|s| ((*s.labels).clone(), s.value))
                    .collect::<Vec<_>>(),
                Ok(Value::Scalar(v)) => vec![(Vec::new(), v)],
                Err(err) => {
                    failures.push(format!("test {ti}: {} at {}: {err}", e.expr, e.eval_time));
                    continue;
                }
            };
            let mut want: Vec<(Vec<(String, String)>, f64)> = e
                .exp_samples
                .iter()
                .map(|s| (series_labels(&s.labels), s.value))
                .collect();
            let mut got = got;
            got.sort_by(|a, b| a.0.cmp(&b.0));
            want.sort_by(|a, b| a.0.cmp(&b.0));
            let same = got.len() == want.len()
                && got.iter().zip(&want).all(|(g, w)| {
                    g.0 == w.0
                        && (g.1 == w.1
                            || (g.1.is_nan() && w.1.is_nan())
                            || ((g.1 - w.1).abs() <= 1e-6 * w.1.abs().max(1.0)))
                });
            if !same {
                failures.push(format!(
                    "test {ti}: {} at {}:\n  got  {got:?}\n  want {want:?}",
                    e.expr, e.eval_time
                ));
            }
        }
        // Alert tests: evaluate every `evaluation_interval` from 0, as promtool does, and
        // compare the firing alerts at each eval_time.
        let mut checks: Vec<(i64, &AlertTest)> = test
            .alert_rule_test
            .iter()
            .map(|a| (duration(&a.eval_time).as_millis() as i64, a))
            .collect();
        checks.sort_by_key(|c| c.0);
        let last = checks.last().map_or(0, |c| c.0);
        let step = every.as_millis() as i64;
        let mut ts = 0;
        let mut engine = Engine::new(set.clone(), interval.min(every));
        let mut next = 0;
        while ts <= last {
            feed(&mut engine, ts, &mut next);
            let out = engine.evaluate(at(ts));
            for (rule, err) in out.failures {
                failures.push(format!("test {ti}: {rule} at {ts} ms: {err}"));
            }
            for (_, check) in checks.iter().filter(|c| c.0 >= ts && c.0 < ts + step) {
                let got = firing(&engine, &check.alertname);
                let mut want: Vec<(BTreeMap<String, String>, BTreeMap<String, String>)> = check
                    .exp_alerts
                    .iter()
                    .map(|a| {
                        let mut l = a.exp_labels.clone();
                        l.insert("alertname".into(), check.alertname.clone());
                        (l, a.exp_annotations.clone())
                    })
                    .collect();
                want.sort();
                if got != want {
                    failures.push(format!(
                        "test {ti}: {} at {}:\n  got  {got:?}\n  want {want:?}",
                        check.alertname, check.eval_time
                    ));
                }
            }
            ts += step;
        }
    }
    assert!(
        failures.is_empty(),
        "{}: {} mismatches:\n{}",
        path.display(),
        failures.len(),
        failures.join("\n")
    );
}

/// (time, series labels, value) of one input sample.
type Point = (i64, Vec<(String, String)>, f64);

type Firing = Vec<(BTreeMap<String, String>, BTreeMap<String, String>)>;

fn firing(engine: &Engine, name: &str) -> Firing {
    let mut out = Vec::new();
    for (g, states) in engine.set.groups.iter().zip(&engine.states) {
        for (rule, st) in g.rules.iter().zip(states) {
            if rule.name == name {
                out.extend(st.firing_with_annotations());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_shipped_alert_tests_pass_on_the_agent() {
    run(&Path::new(env!("CARGO_MANIFEST_DIR")).join("alerts/tests/gpu-steward.test.yml"));
}

/// The shipped alerting rules files (every `alerts/*.rules.yml` without recording rules, which
/// the agent does not evaluate).
fn shipped_alerting_files() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("alerts");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the alerts directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".rules.yml"))
        .filter(|p| {
            let text = std::fs::read_to_string(p).expect("a rules file");
            !text
                .lines()
                .any(|l| l.trim_start().starts_with("- record:"))
        })
        .collect();
    files.sort();
    files
}

/// A `[rules] files` glob over the .deb's alerts directory must not stop the agent: every
/// shipped alerting file loads in the agent's own evaluator, annotations included.
#[test]
fn every_shipped_alerting_rules_file_loads_in_the_agent() {
    let files = shipped_alerting_files();
    assert!(files.len() >= 3, "only {files:?}");
    for f in &files {
        let patterns = [f.to_string_lossy().into_owned()];
        RuleSet::load(&patterns).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
}

/// promtool and the agent agree on every shipped alerting rule: each promtool test file whose
/// rules are all alerting rules runs through the agent too (alerts/test.sh runs promtool).
#[test]
fn every_shipped_alerting_test_file_passes_on_the_agent() {
    let alerting = shipped_alerting_files();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("alerts/tests");
    let mut ran = Vec::new();
    for e in std::fs::read_dir(&dir).expect("alerts/tests").flatten() {
        let path = e.path();
        let text = std::fs::read_to_string(&path).expect("a test file");
        let file: TestFile = serde_yaml::from_str(&text).expect("a test file parses");
        let all_alerting = file.rule_files.iter().all(|r| {
            let p = dir.join(r);
            alerting.iter().any(|a| a.file_name() == p.file_name())
        });
        if all_alerting {
            run(&path);
            ran.push(path);
        }
    }
    // gpu-steward, nvlink and operations; accounting holds recording rules.
    assert_eq!(ran.len(), alerting.len(), "ran {ran:?} for {alerting:?}");
}

#[test]
fn construct_tests_pass_on_the_agent() {
    run(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/rules/testdata/constructs.test.yml"));
}

#[test]
fn expanding_notation() {
    assert_eq!(
        expand("-2+4x3 1-2x2 1x1 _x2 _ 7"),
        vec![
            Some(-2.0),
            Some(2.0),
            Some(6.0),
            Some(10.0),
            Some(1.0),
            Some(-1.0),
            Some(-3.0),
            Some(1.0),
            Some(1.0),
            None,
            None,
            None,
            Some(7.0)
        ]
    );
}
