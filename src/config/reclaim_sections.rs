//! The TOML shape of `[reclaim]` and `[accounting]`, validated while parsing so that every
//! error carries the position of the bad value.

use std::path::PathBuf;
use std::time::Duration;

use serde::de;
use serde::{Deserialize, Deserializer};

use super::{
    AccountingConfig, ActionKind, Exemptions, HookCommand, LabelSelector, Patterns, ReclaimConfig,
    WarnStep,
};

/// `[reclaim.warn]` / `[reclaim.hook]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSection {
    #[serde(deserialize_with = "argv")]
    pub command: Vec<String>,
    #[serde(default, deserialize_with = "timeout")]
    pub timeout: Option<Duration>,
}

impl HookSection {
    fn into_command(self) -> HookCommand {
        HookCommand {
            command: self.command,
            timeout: self.timeout.unwrap_or(Duration::from_secs(30)),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarnSection {
    #[serde(default, deserialize_with = "argv_opt")]
    pub command: Option<Vec<String>>,
    #[serde(default, deserialize_with = "timeout")]
    pub timeout: Option<Duration>,
    #[serde(deserialize_with = "duration")]
    pub grace: Duration,
}

/// `[reclaim]` as written; every key optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReclaimSection {
    pub enabled: bool,
    pub dry_run: bool,
    #[serde(deserialize_with = "idle_after")]
    pub idle_after: Duration,
    #[serde(deserialize_with = "ratio")]
    pub utilization_threshold: f64,
    #[serde(deserialize_with = "at_least_one")]
    pub min_memory_mib: u64,
    pub action: toml::Spanned<ActionKind>,
    #[serde(deserialize_with = "duration")]
    pub grace: Duration,
    #[serde(deserialize_with = "patterns")]
    pub exempt_process_names: Patterns,
    pub exempt_users: Vec<String>,
    pub exempt_namespaces: Vec<String>,
    pub exempt_gpus: Vec<String>,
    #[serde(deserialize_with = "selectors")]
    pub exempt_pod_labels: Vec<LabelSelector>,
    #[serde(deserialize_with = "absolute_path")]
    pub cri_socket: PathBuf,
    pub max_reclaims_per_hour: u32,
    pub warn: Option<WarnSection>,
    pub hook: Option<HookSection>,
}

impl Default for ReclaimSection {
    fn default() -> Self {
        let d = ReclaimConfig::default();
        ReclaimSection {
            enabled: d.enabled,
            dry_run: d.dry_run,
            idle_after: d.idle_after,
            utilization_threshold: d.utilization_threshold,
            min_memory_mib: d.min_memory_mib,
            action: toml::Spanned::new(0..0, d.action),
            grace: d.grace,
            exempt_process_names: d.exempt.process_names,
            exempt_users: Vec::new(),
            exempt_namespaces: Vec::new(),
            exempt_gpus: Vec::new(),
            exempt_pod_labels: Vec::new(),
            cri_socket: d.cri_socket,
            max_reclaims_per_hour: d.max_reclaims_per_hour,
            warn: None,
            hook: None,
        }
    }
}

impl ReclaimSection {
    /// The first cross-key problem: its byte span and message.
    pub fn check(&self) -> Option<(std::ops::Range<usize>, String)> {
        if *self.action.get_ref() == ActionKind::Hook && self.hook.is_none() {
            return Some((
                self.action.span(),
                "action 'hook' needs a [reclaim.hook] section with `command = [..]`; add one, \
                 or use action = \"signal\""
                    .into(),
            ));
        }
        None
    }

    pub fn into_config(self) -> ReclaimConfig {
        ReclaimConfig {
            enabled: self.enabled,
            dry_run: self.dry_run,
            idle_after: self.idle_after,
            utilization_threshold: self.utilization_threshold,
            min_memory_mib: self.min_memory_mib,
            action: self.action.into_inner(),
            grace: self.grace,
            exempt: Exemptions {
                process_names: self.exempt_process_names,
                users: self.exempt_users,
                namespaces: self.exempt_namespaces,
                gpus: self.exempt_gpus,
                pod_labels: self.exempt_pod_labels,
            },
            max_reclaims_per_hour: self.max_reclaims_per_hour,
            warn: self.warn.map(|w| WarnStep {
                hook: w.command.map(|command| HookCommand {
                    command,
                    timeout: w.timeout.unwrap_or(Duration::from_secs(30)),
                }),
                grace: w.grace,
            }),
            hook: self.hook.map(HookSection::into_command),
            cri_socket: self.cri_socket,
        }
    }
}

/// `[accounting]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccountingSection {
    pub enabled: bool,
    #[serde(deserialize_with = "absolute_dir")]
    pub state_dir: Option<PathBuf>,
    #[serde(deserialize_with = "positive")]
    pub persist_every: Duration,
    #[serde(deserialize_with = "positive")]
    pub forget_after: Duration,
}

impl Default for AccountingSection {
    fn default() -> Self {
        let d = AccountingConfig::default();
        AccountingSection {
            enabled: d.enabled,
            state_dir: d.state_dir,
            persist_every: d.persist_every,
            forget_after: d.forget_after,
        }
    }
}

impl AccountingSection {
    /// Without `state_dir`, systemd's `$STATE_DIRECTORY` (set by `StateDirectory=` in the
    /// packaged unit: `/var/lib/gpu-steward`) is used, so that a packaged agent keeps its
    /// counters across restarts with no configuration.
    pub fn into_config(self) -> AccountingConfig {
        let systemd = std::env::var_os("STATE_DIRECTORY")
            .and_then(|v| std::env::split_paths(&v).next())
            .filter(|p| p.is_absolute());
        AccountingConfig {
            enabled: self.enabled,
            state_dir: self.state_dir.or(systemd),
            persist_every: self.persist_every,
            forget_after: self.forget_after,
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("invalid duration '{s}': {e}; write it like '30s', '5m' or '1h'"))
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    let v = parse_duration(&s).map_err(de::Error::custom)?;
    if v > Duration::from_secs(24 * 3600) {
        return Err(de::Error::custom(format!(
            "'{s}' is longer than a day; use '24h' or less"
        )));
    }
    Ok(v)
}

fn positive<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    match parse_duration(&s).map_err(de::Error::custom)? {
        v if v >= Duration::from_secs(1) => Ok(v),
        _ => Err(de::Error::custom(format!(
            "'{s}' is shorter than 1s; use '1s' or more"
        ))),
    }
}

fn idle_after<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    match parse_duration(&s).map_err(de::Error::custom)? {
        v if v < Duration::from_secs(1) => Err(de::Error::custom(format!(
            "idle_after '{s}' is shorter than 1s; a window needs several polls, use '1s' or more \
             (30m is usual)"
        ))),
        v if v > Duration::from_secs(30 * 24 * 3600) => Err(de::Error::custom(format!(
            "idle_after '{s}' is longer than 30 days; use '30d' or less"
        ))),
        v => Ok(v),
    }
}

fn timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    match parse_duration(&s).map_err(de::Error::custom)? {
        v if v >= Duration::from_millis(100) && v <= Duration::from_secs(3600) => Ok(Some(v)),
        _ => Err(de::Error::custom(format!(
            "timeout '{s}' is out of range; use 100ms .. 1h"
        ))),
    }
}

fn ratio<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(de::Error::custom(format!(
            "utilization_threshold {v} is not a ratio; write it from 0 to 1 (0.01 = 1%)"
        )))
    }
}

fn at_least_one<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match u64::deserialize(d)? {
        0 => Err(de::Error::custom(
            "must be 1 or more (MiB); every process holds some memory",
        )),
        v => Ok(v),
    }
}

fn patterns<'de, D: Deserializer<'de>>(d: D) -> Result<Patterns, D::Error> {
    Patterns::new(Vec::<String>::deserialize(d)?).map_err(|(p, e)| {
        de::Error::custom(format!(
            "invalid pattern '{p}': {}; write a regular expression like '^nvidia-'",
            e.to_string().lines().last().unwrap_or("")
        ))
    })
}

fn argv<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    match v.first() {
        Some(first) if !first.is_empty() => Ok(v),
        _ => Err(de::Error::custom(
            "command is empty; write it as argv, e.g. [\"/usr/local/bin/notify\", \"--idle\"] \
             (it runs without a shell)",
        )),
    }
}

fn argv_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    argv(d).map(Some)
}

fn selectors<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<LabelSelector>, D::Error> {
    Vec::<String>::deserialize(d)?
        .into_iter()
        .map(|s| {
            let (key, value) = match s.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (s.clone(), None),
            };
            if key.is_empty() || key.contains(char::is_whitespace) {
                return Err(de::Error::custom(format!(
                    "invalid pod label selector '{s}'; write 'key=value' or 'key', e.g. \
                     'app=jupyter' or 'gpu-steward.io/exempt'"
                )));
            }
            Ok(LabelSelector { key, value })
        })
        .collect()
}

fn absolute_path<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
    Ok(absolute_dir(d)?.unwrap_or_default())
}

fn absolute_dir<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    let s = String::deserialize(d)?;
    if s.starts_with('/') {
        Ok(Some(PathBuf::from(s)))
    } else {
        Err(de::Error::custom(format!(
            "path '{s}' is not absolute; write it from the root, e.g. '/var/lib/gpu-steward'"
        )))
    }
}
