//! `[rules]` and `[remediation]`: the TOML shape, validated while parsing so that errors carry
//! the position of the bad value.

use std::time::Duration;

use regex::Regex;
use serde::de;
use serde::{Deserialize, Deserializer};

use super::hooks::HookSection;

/// The default node-wide limit of hook runs per hour.
pub const DEFAULT_MAX_ACTIONS_PER_HOUR: u32 = 6;
/// The default quiet time of a route after it ran, per GPU.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(3600);

/// `[rules]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RulesSection {
    /// Glob patterns of Prometheus rule files; relative ones are relative to the config file.
    #[serde(deserialize_with = "patterns")]
    pub files: Vec<String>,
}

fn patterns<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    for p in &v {
        if let Err(e) = glob::Pattern::new(p) {
            return Err(de::Error::custom(format!(
                "invalid file pattern '{p}': {e}; write a path or a glob like '/etc/gpu-steward/rules/*.yml'"
            )));
        }
    }
    Ok(v)
}

/// `[remediation]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemediationSection {
    /// Decide and audit, but run nothing.
    pub dry_run: bool,
    /// Hook runs (dry runs included) allowed per rolling hour on this node.
    pub max_actions_per_hour: u32,
    pub hooks: Vec<HookSection>,
    /// Built-in actions, named like hooks and listed in routes the same way.
    pub actions: Vec<ActionSection>,
    pub routes: Vec<RouteSection>,
}

impl Default for RemediationSection {
    fn default() -> Self {
        RemediationSection {
            dry_run: false,
            max_actions_per_hour: DEFAULT_MAX_ACTIONS_PER_HOUR,
            hooks: Vec::new(),
            actions: Vec::new(),
            routes: Vec::new(),
        }
    }
}

/// `[[remediation.actions]]`: a built-in action.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionSection {
    pub name: toml::Spanned<String>,
    /// `signal_processes`, `power_limit` or `fence` (see [`ActionKind`]).
    #[serde(deserialize_with = "action_kind")]
    pub kind: String,
    /// For `signal_processes`: `SIGTERM` (default), `SIGKILL`, `SIGINT`, `SIGHUP`, `SIGUSR1`,
    /// `SIGUSR2`.
    #[serde(default = "default_signal", deserialize_with = "signal")]
    pub signal: nix::sys::signal::Signal,
    /// For `power_limit`: the limit to set, in watts.
    pub watts: Option<toml::Spanned<u32>>,
}

fn action_kind<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    match s.as_str() {
        "signal_processes" | "power_limit" | "fence" => Ok(s),
        _ => Err(de::Error::custom(format!(
            "unknown action kind '{s}'; the built-in kinds are 'signal_processes', \
             'power_limit' and 'fence'"
        ))),
    }
}

fn default_signal() -> nix::sys::signal::Signal {
    nix::sys::signal::Signal::SIGTERM
}

fn signal<'de, D: Deserializer<'de>>(d: D) -> Result<nix::sys::signal::Signal, D::Error> {
    use nix::sys::signal::Signal::*;
    let s = String::deserialize(d)?;
    match s.as_str() {
        "SIGTERM" => Ok(SIGTERM),
        "SIGKILL" => Ok(SIGKILL),
        "SIGINT" => Ok(SIGINT),
        "SIGHUP" => Ok(SIGHUP),
        "SIGUSR1" => Ok(SIGUSR1),
        "SIGUSR2" => Ok(SIGUSR2),
        _ => Err(de::Error::custom(format!(
            "signal '{s}' is not one of SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGUSR1, SIGUSR2"
        ))),
    }
}

/// `[[remediation.routes]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSection {
    #[serde(deserialize_with = "matchers")]
    pub matchers: Vec<LabelMatcher>,
    /// Hook names, each checked against `[[remediation.hooks]]` (with its position).
    pub hooks: Vec<toml::Spanned<String>>,
    #[serde(default = "default_cooldown", deserialize_with = "cooldown")]
    pub cooldown: Duration,
    #[serde(default)]
    pub on_resolved: bool,
}

fn default_cooldown() -> Duration {
    DEFAULT_COOLDOWN
}

fn cooldown<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| {
        de::Error::custom(format!(
            "invalid duration '{s}': {e}; write it like '1h' or '30m' ('0s' for none)"
        ))
    })
}

fn matchers<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<LabelMatcher>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    v.iter()
        .map(|s| LabelMatcher::parse(s).map_err(de::Error::custom))
        .collect()
}

/// The validated remediation configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RemediationConfig {
    pub dry_run: bool,
    pub max_actions_per_hour: u32,
    pub hooks: Vec<super::hooks::CommandSpec>,
    pub actions: Vec<Action>,
    pub routes: Vec<Route>,
}

/// A built-in action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    pub name: String,
    pub kind: ActionKind,
}

/// What a built-in action does when its alert fires; when it resolves (with `on_resolved`),
/// `power_limit` and `fence` undo themselves and `signal_processes` does nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionKind {
    /// Signal every process NVML lists on the alert's GPU (PID identity re-checked).
    SignalProcesses(nix::sys::signal::Signal),
    /// Set the GPU's power limit to this many watts (back to the default on resolution).
    PowerLimit(u32),
    /// Compute mode `PROHIBITED`: no new CUDA contexts (`DEFAULT` again on resolution).
    Fence,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// What the rails and the audit log know the route by: its matchers and hooks, so that
    /// reordering routes (or adding one) keeps each route's cooldowns and past decisions.
    pub id: String,
    pub matchers: Vec<LabelMatcher>,
    pub hooks: Vec<String>,
    pub cooldown: Duration,
    pub on_resolved: bool,
}

impl RemediationSection {
    /// The first route hook that names no hook: its byte span and the message.
    pub fn unknown_hook(&self) -> Option<(std::ops::Range<usize>, String)> {
        for r in &self.routes {
            for h in &r.hooks {
                let known: Vec<&str> = self
                    .hooks
                    .iter()
                    .map(|k| k.name.as_str())
                    .chain(self.actions.iter().map(|a| a.name.get_ref().as_str()))
                    .collect();
                if !known.contains(&h.get_ref().as_str()) {
                    return Some((
                        h.span(),
                        format!(
                            "route hook '{}' is not defined; define it in [[remediation.hooks]] \
                             or [[remediation.actions]] (defined: {})",
                            h.get_ref(),
                            if known.is_empty() {
                                "none".to_string()
                            } else {
                                known.join(", ")
                            }
                        ),
                    ));
                }
            }
        }
        None
    }

    /// The first hook or action name given twice.
    pub fn duplicate_hook(&self) -> Option<String> {
        let names: Vec<&str> = self
            .hooks
            .iter()
            .map(|h| h.name.as_str())
            .chain(self.actions.iter().map(|a| a.name.get_ref().as_str()))
            .collect();
        names.iter().enumerate().find_map(|(i, n)| {
            names[..i]
                .contains(n)
                .then(|| format!("hook or action '{n}' is defined twice; give each its own name"))
        })
    }

    /// The first action whose keys do not fit its kind: the byte span and the message.
    pub fn bad_action(&self) -> Option<(std::ops::Range<usize>, String)> {
        self.actions.iter().find_map(|a| {
            let name = a.name.get_ref();
            match (a.kind.as_str(), &a.watts) {
                ("power_limit", None) => Some((
                    a.name.span(),
                    format!("action '{name}' of kind 'power_limit' needs watts = <limit in W>"),
                )),
                ("power_limit", Some(_)) => None,
                (kind, Some(w)) => Some((
                    w.span(),
                    format!("watts applies to kind 'power_limit', not '{kind}'; remove it"),
                )),
                _ => None,
            }
        })
    }

    pub fn into_config(self) -> RemediationConfig {
        RemediationConfig {
            dry_run: self.dry_run,
            max_actions_per_hour: self.max_actions_per_hour,
            hooks: self.hooks.iter().map(HookSection::spec).collect(),
            actions: self
                .actions
                .iter()
                .map(|a| Action {
                    name: a.name.get_ref().clone(),
                    kind: match (a.kind.as_str(), &a.watts) {
                        ("power_limit", Some(w)) => ActionKind::PowerLimit(*w.get_ref()),
                        ("fence", _) => ActionKind::Fence,
                        _ => ActionKind::SignalProcesses(a.signal),
                    },
                })
                .collect(),
            routes: self
                .routes
                .into_iter()
                .map(|r| {
                    let hooks: Vec<String> =
                        r.hooks.into_iter().map(toml::Spanned::into_inner).collect();
                    Route {
                        id: route_id(&r.matchers, &hooks),
                        matchers: r.matchers,
                        hooks,
                        cooldown: r.cooldown,
                        on_resolved: r.on_resolved,
                    }
                })
                .collect(),
        }
    }
}

impl RemediationConfig {
    pub fn describe(&self) -> String {
        if self.routes.is_empty() {
            return "remediation: no routes (alerts run nothing)\n".into();
        }
        let mut s = format!(
            "remediation: {} route(s), {} hook(s), {} built-in action(s){}, at most {} action(s) per hour\n",
            self.routes.len(),
            self.hooks.len(),
            self.actions.len(),
            if self.dry_run {
                ", DRY RUN (nothing runs)"
            } else {
                ""
            },
            self.max_actions_per_hour
        );
        for r in &self.routes {
            let m: Vec<String> = r.matchers.iter().map(|m| m.text.clone()).collect();
            s.push_str(&format!(
                "  route [{}] -> {} (cooldown {}, on resolved: {})\n",
                m.join(", "),
                r.hooks.join(", "),
                humantime::format_duration(r.cooldown),
                r.on_resolved
            ));
        }
        s
    }
}

/// A route's identity: `alertname="GpuXid", gpu=~"0|1" -> drain, reset`. Two routes with the
/// same matchers and hooks are the same route to the rails.
pub fn route_id(matchers: &[LabelMatcher], hooks: &[String]) -> String {
    let m: Vec<&str> = matchers.iter().map(|m| m.text.as_str()).collect();
    format!("{} -> {}", m.join(", "), hooks.join(", "))
}

/// An Alertmanager-style matcher: `name="value"`, `name!="value"`, `name=~"regex"`,
/// `name!~"regex"` (the value may be unquoted; regexes are anchored).
#[derive(Debug, Clone)]
pub struct LabelMatcher {
    pub text: String,
    name: String,
    op: Op,
}

#[derive(Debug, Clone)]
enum Op {
    Eq(String),
    Ne(String),
    Re(Regex),
    NotRe(Regex),
}

impl PartialEq for LabelMatcher {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl LabelMatcher {
    pub fn parse(s: &str) -> Result<LabelMatcher, String> {
        let bad = |why: &str| {
            format!(
                "invalid matcher '{s}': {why}; write it like 'alertname=\"GpuFatalXid\"', \
                 'severity!=\"info\"' or 'gpu=~\"0|1\"'"
            )
        };
        let at = s.find(['=', '!']).ok_or_else(|| bad("no operator"))?;
        let name = s[..at].trim();
        let valid_name = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            return Err(bad(&format!("'{name}' is not a label name")));
        }
        let rest = &s[at..];
        let (op, value) = ["=~", "!~", "!=", "="]
            .iter()
            .find_map(|op| rest.strip_prefix(op).map(|v| (*op, v.trim())))
            .ok_or_else(|| bad("unknown operator"))?;
        let value = if let Some(q) = value.strip_prefix('"') {
            let inner = q
                .strip_suffix('"')
                .ok_or_else(|| bad("unterminated quote"))?;
            serde_json::from_str::<String>(&format!("\"{inner}\""))
                .map_err(|_| bad("invalid escape in the value"))?
        } else {
            value.to_string()
        };
        let regex = |v: &str| {
            Regex::new(&format!("^(?:{v})$")).map_err(|e| bad(&format!("invalid regex: {e}")))
        };
        let op = match op {
            "=" => Op::Eq(value),
            "!=" => Op::Ne(value),
            "=~" => Op::Re(regex(&value)?),
            _ => Op::NotRe(regex(&value)?),
        };
        Ok(LabelMatcher {
            text: s.to_string(),
            name: name.to_string(),
            op,
        })
    }

    /// Whether the label set (absent labels read as "") matches.
    pub fn matches(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.name).map_or("", String::as_str);
        match &self.op {
            Op::Eq(x) => v == x,
            Op::Ne(x) => v != x,
            Op::Re(r) => r.is_match(v),
            Op::NotRe(r) => !r.is_match(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn matchers_as_alertmanager_writes_them() {
        let l: BTreeMap<String, String> = [("alertname", "GpuFatalXid"), ("severity", "critical")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let m = |s: &str| LabelMatcher::parse(s).expect("valid").matches(&l);
        assert!(m("alertname=\"GpuFatalXid\""));
        assert!(m("severity=critical"));
        assert!(m("severity!=\"info\""));
        assert!(m("alertname=~\"Gpu.*\""));
        assert!(!m("alertname=~\"Fatal\""), "anchored");
        assert!(m("gpu=\"\""), "absent reads as empty");
        assert!(m("alertname!~\"Other|Else\""));
        for bad in ["alertname", "1x=\"a\"", "a=\"b", "a=~\"(\""] {
            assert!(LabelMatcher::parse(bad).is_err(), "{bad}");
        }
    }
}
