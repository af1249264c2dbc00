//! The TOML schema of `/etc/gpu-steward/config.toml`, validated while parsing so that every
//! error carries the position of the offending key or value.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

/// Shortest poll interval accepted: NVML's own sampling periods are 1/6 s to 1 s, and faster
/// polling only burns CPU.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    pub server: ServerSection,
    pub nvml: NvmlSection,
    pub poller: PollerSection,
    pub metrics: MetricsSection,
    pub log: LogSection,
    pub api: ApiSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    #[serde(deserialize_with = "listen")]
    pub listen: Option<SocketAddr>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvmlSection {
    pub library: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PollerSection {
    #[serde(deserialize_with = "interval")]
    pub interval: Option<Duration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    pub dcgm: bool,
    pub native: bool,
    pub hostname: Option<String>,
    #[serde(deserialize_with = "hostname_label")]
    pub hostname_label: String,
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection {
            dcgm: true,
            native: true,
            hostname: None,
            hostname_label: "Hostname".into(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    #[serde(deserialize_with = "log_level")]
    pub level: Option<String>,
    pub format: Option<LogFormat>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiSection {
    pub enabled: bool,
    pub token_file: PathBuf,
}

impl Default for ApiSection {
    fn default() -> Self {
        ApiSection {
            enabled: false,
            token_file: PathBuf::from("/etc/gpu-steward/api-token"),
        }
    }
}

/// Parses a duration like `500ms`, `5s`, `2m` and checks it is a usable poll interval.
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("invalid duration '{s}': {e}; write it like '500ms', '5s' or '1m'"))?;
    if d < MIN_INTERVAL {
        return Err(format!(
            "interval '{s}' is shorter than the minimum of 100ms; use 100ms or more"
        ));
    }
    if d > MAX_INTERVAL {
        return Err(format!(
            "interval '{s}' is longer than the maximum of 1h; use 1h or less"
        ));
    }
    Ok(d)
}

/// Parses a listen address like `0.0.0.0:9400` or `[::]:9400`.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        format!("invalid listen address '{s}'; write IP:PORT, e.g. '0.0.0.0:9400' or '[::]:9400'")
    })
}

/// Checks a log level or `tracing` filter directive (`info`, `gpu_steward=debug,warn`).
pub fn parse_log_level(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("invalid log level '{s}': {e}; use error, warn, info, debug or trace"))
}

fn interval<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    parse_interval(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn listen<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let s = String::deserialize(d)?;
    parse_listen(&s).map(Some).map_err(serde::de::Error::custom)
}

fn log_level<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let s = String::deserialize(d)?;
    parse_log_level(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn hostname_label<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    let valid = s.is_empty()
        || (s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit())
            && !s.starts_with("__"));
    if valid {
        Ok(s)
    } else {
        Err(serde::de::Error::custom(format!(
            "invalid label name '{s}'; use letters, digits and '_' (e.g. 'Hostname' or \
             'hostname'), or '' to leave the label out"
        )))
    }
}
