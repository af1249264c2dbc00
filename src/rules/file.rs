//! Prometheus rule files (`groups:` → `rules:` → `alert`, `expr`, `for`, `keep_firing_for`,
//! `labels`, `annotations`), loaded and checked once so that a bad file is refused at start
//! with `FILE:LINE:COLUMN`, the rule's name and the construct, never at evaluation time.
//!
//! serde_yaml gives positions for syntax and shape errors only; positions of a rule and of its
//! `expr` come from a scan of the text for `alert:`/`record:` and `expr:` keys in document
//! order (block-style YAML, as every rule file in practice; a flow-style file gets the rule's
//! position or line 1).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::check::{self, Needs};
use super::template::Template;

/// A rule file that cannot be used: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct RuleError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileYaml {
    #[serde(default)]
    groups: Vec<GroupYaml>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupYaml {
    name: String,
    interval: Option<String>,
    limit: Option<u64>,
    query_offset: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    rules: Vec<RuleYaml>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleYaml {
    record: Option<String>,
    alert: Option<String>,
    expr: Option<serde_yaml::Value>,
    #[serde(rename = "for")]
    for_: Option<String>,
    keep_firing_for: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// One alerting rule, parsed and checked.
#[derive(Debug, Clone)]
pub struct Rule {
    pub name: String,
    /// The expression's text, for logs and the audit log.
    pub query: String,
    pub expr: promql_parser::parser::Expr,
    pub hold: Duration,
    pub keep_firing_for: Duration,
    /// Group labels then rule labels (rule labels win), values templated.
    pub labels: Vec<(String, Template)>,
    pub annotations: Vec<(String, Template)>,
    /// `FILE:LINE:COLUMN` of the rule, for logs.
    pub origin: String,
}

#[derive(Debug, Clone)]
pub struct Group {
    pub name: String,
    pub file: PathBuf,
    /// `interval:` of the group; `None` evaluates at every publication.
    pub interval: Option<Duration>,
    pub rules: Vec<Rule>,
}

/// Parses one rule file's text (`name` is used in errors) into groups, adding to `needs`.
pub fn parse(name: &Path, text: &str, needs: &mut Needs) -> Result<Vec<Group>, RuleError> {
    let file = name.display().to_string();
    let at = |(line, column): (usize, usize), message: String| RuleError {
        file: file.clone(),
        line,
        column,
        message,
    };
    let parsed: FileYaml = serde_yaml::from_str(text).map_err(|e| {
        let pos = e.location().map_or((1, 1), |l| (l.line(), l.column()));
        let msg = e.to_string();
        // serde_yaml appends " at line L column C"; the position is already in front.
        let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
        at(pos, msg)
    })?;
    let positions = scan(text);
    let mut index = 0;
    let mut groups = Vec::new();
    for g in parsed.groups {
        let group_pos = find_group(text, &g.name);
        let interval = group_interval(&g, group_pos, &at)?;
        let mut rules = Vec::new();
        for r in g.rules {
            let (rule_pos, expr_pos) = positions.get(index).copied().unwrap_or(((1, 1), None));
            index += 1;
            let expr_pos = expr_pos.unwrap_or(rule_pos);
            rules.push(rule(r, &g.labels, (rule_pos, expr_pos), &file, needs, &at)?);
        }
        groups.push(Group {
            name: g.name,
            file: name.to_path_buf(),
            interval,
            rules,
        });
    }
    Ok(groups)
}

/// Where a rule error points: a (line, column) and the message.
type At<'a> = dyn Fn(Pos, String) -> RuleError + 'a;

/// A group's evaluation interval, refusing the group settings the agent does not honour.
fn group_interval(g: &GroupYaml, group_pos: Pos, at: &At) -> Result<Option<Duration>, RuleError> {
    let interval = match &g.interval {
        None => None,
        Some(s) => Some(
            parse_duration(s)
                .map_err(|m| at(group_pos, format!("group '{}': interval {m}", g.name)))?,
        ),
    };
    if g.limit.is_some_and(|l| l > 0) {
        return Err(at(
            group_pos,
            format!(
                "group '{}': 'limit' is not supported by the agent; remove it or set it to 0",
                g.name
            ),
        ));
    }
    if let Some(o) = &g.query_offset {
        if parse_duration(o).map_err(|m| at(group_pos, format!("query_offset {m}")))?
            > Duration::ZERO
        {
            return Err(at(group_pos, format!("group '{}': 'query_offset' is not supported by the agent (it evaluates its own fresh series); remove it", g.name)));
        }
    }
    Ok(interval)
}

/// One alerting rule, checked: its expression against the supported subset (adding what it
/// selects to `needs`), its durations and its templates. Recording rules are refused.
fn rule(
    r: RuleYaml,
    group_labels: &BTreeMap<String, String>,
    (rule_pos, expr_pos): (Pos, Pos),
    file: &str,
    needs: &mut Needs,
    at: &At,
) -> Result<Rule, RuleError> {
    let Some(alert) = r.alert else {
        let what = r.record.map_or("a rule without 'alert'".to_string(), |n| {
            format!("recording rule '{n}'")
        });
        return Err(at(rule_pos, format!("{what}: the agent evaluates alerting rules only; keep recording rules in a file of their own for Prometheus")));
    };
    let origin = format!("{file}:{}:{}", rule_pos.0, rule_pos.1);
    let query = match r.expr {
        Some(serde_yaml::Value::String(s)) => s,
        Some(serde_yaml::Value::Number(n)) => n.to_string(),
        _ => {
            return Err(at(
                rule_pos,
                format!("rule '{alert}': 'expr' is missing or not a string"),
            ))
        }
    };
    super::limits::check(&query).map_err(|m| at(expr_pos, format!("rule '{alert}': {m}")))?;
    let expr = promql_parser::parser::parse(&query).map_err(|e| {
        at(
            expr_pos,
            format!("rule '{alert}': invalid expression: {}", e.trim()),
        )
    })?;
    check::check(&expr, needs).map_err(|construct| {
        at(expr_pos, format!("rule '{alert}': {construct} is not supported by the agent's evaluator (see docs/rules.md)"))
    })?;
    let duration = |key: &str, v: &Option<String>| -> Result<Duration, RuleError> {
        v.as_deref().map_or(Ok(Duration::ZERO), |s| {
            parse_duration(s).map_err(|m| at(rule_pos, format!("rule '{alert}': {key} {m}")))
        })
    };
    let hold = duration("for", &r.for_)?;
    let keep_firing_for = duration("keep_firing_for", &r.keep_firing_for)?;
    let template = |kind: &str, k: &str, v: &str| {
        Template::parse(v).map_err(|m| at(rule_pos, format!("rule '{alert}': {kind} '{k}': {m}")))
    };
    let mut label_map = group_labels.clone();
    label_map.extend(r.labels);
    let labels = label_map
        .iter()
        .map(|(k, v)| Ok((k.clone(), template("label", k, v)?)))
        .collect::<Result<_, RuleError>>()?;
    let annotations = r
        .annotations
        .iter()
        .map(|(k, v)| Ok((k.clone(), template("annotation", k, v)?)))
        .collect::<Result<_, RuleError>>()?;
    Ok(Rule {
        name: alert,
        query,
        expr,
        hold,
        keep_firing_for,
        labels,
        annotations,
        origin,
    })
}

/// For each rule in document order: the position of its `alert:`/`record:` key and of the
/// `expr:` key of the same list item, when found.
type Pos = (usize, usize);

fn scan(text: &str) -> Vec<(Pos, Option<Pos>)> {
    let mut rules: Vec<(Pos, Option<Pos>)> = Vec::new();
    // `expr:` keys seen since the current list item started (it may precede `alert:`).
    let mut pending_expr: Option<Pos> = None;
    for (i, line) in yaml_lines(text).enumerate() {
        let indent = line.len() - line.trim_start().len();
        let mut body = line.trim_start();
        let mut col = indent + 1;
        let item_start = body.starts_with("- ");
        if let Some(b) = body.strip_prefix("- ") {
            let trimmed = b.trim_start();
            col += body.len() - trimmed.len();
            body = trimmed;
        }
        if item_start {
            pending_expr = None;
        }
        if body.starts_with("alert:") || body.starts_with("record:") {
            rules.push(((i + 1, col), pending_expr.take()));
        } else if body.starts_with("expr:") {
            match rules.last_mut() {
                Some((_, e @ None)) if !item_start => *e = Some((i + 1, col)),
                _ => pending_expr = Some((i + 1, col)),
            }
        }
    }
    rules
}

/// The lines of `text` as the YAML parser numbers them, so that positions found here agree with
/// its own: `\r\n`, `\n` and a lone `\r` end a line, and so do YAML 1.1's NEL, LS and PS.
fn yaml_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let t = rest?;
        match t
            .char_indices()
            .find(|&(_, c)| matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}'))
        {
            Some((i, c)) => {
                let mut end = i + c.len_utf8();
                if c == '\r' && t[end..].starts_with('\n') {
                    end += 1;
                }
                rest = Some(&t[end..]);
                Some(&t[..i])
            }
            None => {
                rest = None;
                (!t.is_empty()).then_some(t)
            }
        }
    })
}

fn find_group(text: &str, name: &str) -> Pos {
    for (i, line) in yaml_lines(text).enumerate() {
        let t = line.trim_start().trim_start_matches("- ").trim_start();
        if let Some(rest) = t.strip_prefix("name:") {
            if rest.trim().trim_matches(['"', '\'']) == name {
                return (i + 1, line.len() - line.trim_start().len() + 1);
            }
        }
    }
    (1, 1)
}

/// A Prometheus duration: `1h30m`, `5m`, `10s`, `500ms`, `1d`, `1w`, `1y` (365 days).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("'{s}' is not a duration; write it like '5m', '1h30m' or '30s'");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total: u64 = 0;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let ms = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 604_800_000,
            "y" => 31_536_000_000,
            _ => return Err(bad()),
        };
        total = n
            .checked_mul(ms)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_millis(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Vec<Group>, String> {
        parse(Path::new("r.yml"), text, &mut Needs::default()).map_err(|e| e.to_string())
    }

    #[test]
    fn loads_rules_with_positions() {
        let text = "groups:\n  - name: g\n    interval: 30s\n    rules:\n      - alert: A\n        expr: up == 0\n        for: 1m\n        keep_firing_for: 2m\n        labels:\n          severity: critical\n        annotations:\n          summary: \"{{ $labels.gpu }} down\"\n      - expr: rate(x[5m]) > 1\n        alert: B\n";
        let g = load(text).expect("valid");
        assert_eq!(g[0].interval, Some(Duration::from_secs(30)));
        let a = &g[0].rules[0];
        assert_eq!(
            (a.name.as_str(), a.hold, a.keep_firing_for),
            ("A", Duration::from_secs(60), Duration::from_secs(120))
        );
        assert_eq!(a.origin, "r.yml:5:9");
        assert_eq!(g[0].rules[1].name, "B");
    }

    /// Lines are YAML's: a lone CR (an old Mac file, as editors show it) ends one too. Found by
    /// the `rules` fuzz target: the parser's own errors counted it, the positions found here
    /// did not, so a rule in such a file was reported at 1:1.
    #[test]
    fn error_lines_count_lone_carriage_returns_as_yaml_does() {
        assert_eq!(
            yaml_lines("a\r\nb\rc\nd\u{2028}e\n").collect::<Vec<_>>(),
            ["a", "b", "c", "d", "e"]
        );
        assert_eq!(yaml_lines("").count(), 0);
        let e =
            load("groups:\r  - name: g\r    rules:\r      - alert: A\r        expr: topk(1, up)\r")
                .expect_err("refused");
        assert!(e.starts_with("r.yml:5:9: rule 'A'"), "{e}");
    }

    #[test]
    fn errors_name_position_rule_and_construct() {
        let e = load("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n      - alert: B\n        expr: topk(1, up)\n").expect_err("refused");
        assert!(
            e.starts_with("r.yml:7:9: rule 'B': the aggregation 'topk'"),
            "{e}"
        );
        let e = load("groups:\n  - name: g\n    rules:\n      - record: r\n        expr: up\n")
            .expect_err("refused");
        assert!(e.starts_with("r.yml:4:9: recording rule 'r'"), "{e}");
        let e = load("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        for: soon\n").expect_err("refused");
        assert!(
            e.starts_with("r.yml:4:9: rule 'A': for 'soon' is not a duration"),
            "{e}"
        );
        let e = load("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up +\n")
            .expect_err("refused");
        assert!(
            e.starts_with("r.yml:5:9: rule 'A': invalid expression"),
            "{e}"
        );
        let e = load("groups:\n  - name: g\n    rules:\n      - alert: A\n        exp: up\n")
            .expect_err("refused");
        assert!(
            e.starts_with("r.yml:5:9: groups[0].rules[0]: unknown field `exp`"),
            "{e}"
        );
        let e = load("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        annotations:\n          s: \"{{ printf \\\"%d\\\" 1 }}\"\n").expect_err("refused");
        assert!(
            e.contains("rule 'A': annotation 's': unsupported template action"),
            "{e}"
        );
    }

    #[test]
    fn durations_as_prometheus_writes_them() {
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86400)));
        assert!(
            parse_duration("5").is_err()
                && parse_duration("m").is_err()
                && parse_duration("").is_err()
        );
    }
}
