//! The PromQL of the shipped Grafana dashboards, with Grafana's template variables replaced by
//! values a test Prometheus (1 s scrapes, a few seconds of data) can answer.

use std::path::Path;

/// One query of a dashboard: where it comes from and the PromQL to run.
#[derive(Debug)]
pub struct DashboardQuery {
    pub origin: String,
    pub expr: String,
    /// The query as the dashboard has it, Grafana's variables unreplaced.
    pub raw: String,
}

/// Every `targets[].expr` of every panel (rows' nested panels included), and the series selector
/// of every `label_values(SELECTOR, label)` template variable, of every `*.json` in `dir`.
pub fn queries(dir: &Path) -> Vec<DashboardQuery> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("read the dashboards directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no dashboards in {}", dir.display());
    let mut out = Vec::new();
    for file in files {
        let name = file
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let text = std::fs::read_to_string(&file).expect("read a dashboard");
        let json: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not valid JSON: {e}"));
        collect_panels(&name, &json["panels"], &mut out);
        for var in json["templating"]["list"].as_array().into_iter().flatten() {
            let q = var["query"]["query"]
                .as_str()
                .or_else(|| var["query"].as_str());
            if let Some(selector) = q.and_then(label_values_selector) {
                out.push(DashboardQuery {
                    origin: format!("{name} variable '{}'", var["name"].as_str().unwrap_or("?")),
                    expr: substitute(selector),
                    raw: selector.to_string(),
                });
            }
        }
    }
    out
}

fn collect_panels(file: &str, panels: &serde_json::Value, out: &mut Vec<DashboardQuery>) {
    for panel in panels.as_array().into_iter().flatten() {
        let title = panel["title"].as_str().unwrap_or("?");
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push(DashboardQuery {
                    origin: format!(
                        "{file} panel '{title}' ref {}",
                        target["refId"].as_str().unwrap_or("?")
                    ),
                    expr: substitute(expr),
                    raw: expr.to_string(),
                });
            }
        }
        collect_panels(file, &panel["panels"], out);
    }
}

/// `label_values(up{job="x"}, instance)` → `up{job="x"}`; `label_values(instance)` → None.
fn label_values_selector(q: &str) -> Option<&str> {
    let inner = q.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (selector, _label) = inner.rsplit_once(',')?;
    Some(selector.trim())
}

/// Grafana's variables as the "All" choice and a short test's time ranges: `$__rate_interval`
/// must hold at least two 1 s scrapes, `$__range` the whole of the test's data.
pub fn substitute(expr: &str) -> String {
    expr.replace("${instance}", ".*")
        .replace("$instance", ".*")
        .replace("${gpu}", ".*")
        .replace("$gpu", ".*")
        .replace("$__rate_interval", "10s")
        .replace("$__interval", "2s")
        .replace("$__range", "1m")
}

/// The left-hand side of `LHS or vector(0)` (or `LHS or on() vector(0)`): such a query always
/// returns data, so a test must look at `LHS` to know whether the panel's series exist.
/// None when the expression does not end in that fallback.
pub fn without_vector0_fallback(expr: &str) -> Option<&str> {
    let s = expr
        .trim_end()
        .strip_suffix(')')?
        .trim_end()
        .strip_suffix('0')?
        .trim_end()
        .strip_suffix('(')?
        .trim_end()
        .strip_suffix("vector")?
        .trim_end();
    let s = match s.strip_suffix(')') {
        Some(rest) => rest
            .trim_end()
            .strip_suffix('(')?
            .trim_end()
            .strip_suffix("on")?
            .trim_end(),
        None => s,
    };
    let lhs = s.strip_suffix("or")?;
    // `or` as an operator, not the end of a name such as `color`.
    lhs.ends_with(|c: char| c.is_whitespace() || c == ')')
        .then(|| lhs.trim_end())
}

/// The metric names a PromQL expression mentions (identifiers followed by `{`, or bare names
/// starting with the project's prefixes).
pub fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut word = String::new();
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            if word.starts_with("gpu_steward_") || word.starts_with("DCGM_") {
                names.push(std::mem::take(&mut word));
            }
            word.clear();
        }
    }
    names.sort();
    names.dedup();
    names
}
