//! The TOML schema of `/etc/gpu-steward/config.toml`, validated while parsing so that every
//! error carries the position of the offending key or value.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::health::{Action, HealthConfig, Status, XidOverride};

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
    pub audit: AuditSection,
    pub health: HealthSection,
    pub processes: super::sections::ProcessesConfig,
    pub kubernetes: super::sections::KubernetesSection,
    pub rules: super::remediation::RulesSection,
    pub remediation: super::remediation::RemediationSection,
    pub mig: super::mig::MigSection,
    pub reclaim: super::reclaim::ReclaimSection,
    pub accounting: super::reclaim::AccountingSection,
    pub sharing: crate::config::sharing::section::SharingSection,
    pub slurm: super::slurm::SlurmConfig,
    pub nvsentinel: super::nvsentinel::NvsentinelConfig,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    #[serde(deserialize_with = "listen")]
    pub listen: Option<SocketAddr>,
    /// Requests served at once (`/livez` and `/readyz` aside); more are answered 503.
    #[serde(deserialize_with = "max_connections")]
    pub max_connections: Option<usize>,
    /// How long a client may take to send its request head, or stay idle between requests.
    #[serde(deserialize_with = "header_timeout")]
    pub header_timeout: Option<Duration>,
    /// TLS and basic auth, in the format of the Prometheus exporter-toolkit's web config.
    pub web_config_file: Option<PathBuf>,
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
    /// Cadence of the slow tier: reads of ~0.16 ms, or of values that move slowly.
    #[serde(deserialize_with = "slow_interval")]
    pub slow_interval: Option<Duration>,
    /// Cadence of the expensive tier: reads of milliseconds.
    #[serde(deserialize_with = "expensive_interval")]
    pub expensive_interval: Option<Duration>,
    /// The GPM window: profiling metrics are computed between two samples this far apart.
    /// Spanned: whether it is shorter than the poll interval is known only once the command
    /// line is merged, and that error must still point here.
    #[serde(deserialize_with = "profiling_interval")]
    pub profiling_interval: Option<toml::Spanned<Duration>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    pub dcgm: bool,
    pub native: bool,
    /// Per-link NVLink series (state and errors of each link): off by default.
    pub nvlink_links: bool,
    #[serde(deserialize_with = "super::labels::optional_label_value")]
    pub hostname: Option<String>,
    #[serde(deserialize_with = "super::labels::optional_label")]
    pub hostname_label: toml::Spanned<String>,
    pub profile: Profile,
    pub dcgm_names: DcgmNames,
}

/// `[metrics] profile`: how much of what the agent knows goes on the page.
///
/// A family that costs series per GPU asks [`Profile::is_full`] before rendering what the lean
/// page leaves out (docs/metrics.md, "Profiles", says what each costs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// dcgm-exporter's default fields, health, XIDs seen, processes, idle time and GPM where
    /// present, each value once: at most 32 series per GPU on the 8×H100 demo node.
    #[default]
    Lean,
    /// Everything the agent knows, in both families (the page before profiles existed).
    Full,
}

impl Profile {
    pub fn is_full(self) -> bool {
        self == Profile::Full
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Lean => "lean",
            Profile::Full => "full",
        }
    }
}

/// `[metrics] dcgm_names`: which of dcgm-exporter's name sets the compatible family uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum DcgmNames {
    /// dcgm-exporter up to 4.8: `DCGM_FI_DEV_GPU_UTIL` in %, MiB, MHz, mJ; label
    /// `DCGM_FI_DRIVER_VERSION`.
    #[default]
    #[serde(rename = "4.8")]
    V48,
    /// dcgm-exporter 4.9 (DCGM 4.7's naming standard): base units in the names, ratios 0-1, bytes,
    /// hertz, joules; labels `hostname` and `DCGM_FI_SYSTEM_DRIVER_VERSION`.
    #[serde(rename = "4.9")]
    V49,
    /// Both sets side by side, for a fleet migrating its dashboards.
    #[serde(rename = "both")]
    Both,
}

impl DcgmNames {
    pub fn v48(self) -> bool {
        self != DcgmNames::V49
    }

    pub fn v49(self) -> bool {
        self != DcgmNames::V48
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DcgmNames::V48 => "4.8",
            DcgmNames::V49 => "4.9",
            DcgmNames::Both => "both",
        }
    }
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection {
            dcgm: true,
            native: true,
            nvlink_links: false,
            hostname: None,
            hostname_label: toml::Spanned::new(0..0, "Hostname".into()),
            profile: Profile::default(),
            dcgm_names: DcgmNames::default(),
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
    /// Also serve the HTTP API on this Unix socket; root and the agent's own user need no token
    /// there (the kernel vouches for them), anyone else who can connect still needs it.
    pub socket: Option<PathBuf>,
    /// Permissions of the socket, octal.
    #[serde(deserialize_with = "socket_mode")]
    pub socket_mode: u32,
    /// false: the mutating API answers only on the socket, never over TCP.
    pub tcp: bool,
}

impl Default for ApiSection {
    fn default() -> Self {
        ApiSection {
            enabled: false,
            token_file: PathBuf::from("/etc/gpu-steward/api-token"),
            socket: None,
            socket_mode: 0o660,
            tcp: true,
        }
    }
}

fn socket_mode<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let s = String::deserialize(d)?;
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 && m & 0o007 == 0 => Ok(m),
        Ok(m) if m <= 0o777 => Err(de::Error::custom(format!(
            "socket_mode {s} lets every user on the node connect; use \"0660\" or \"0600\""
        ))),
        _ => Err(de::Error::custom(format!(
            "socket_mode '{s}' is not an octal mode like \"0660\""
        ))),
    }
}

/// `[audit]`: where decisions that change the node are recorded.
/// The default place of the audit log (`[audit] file`).
pub const DEFAULT_AUDIT_FILE: &str = "/var/lib/gpu-steward/audit.jsonl";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditSection {
    pub file: PathBuf,
}

impl Default for AuditSection {
    fn default() -> Self {
        AuditSection {
            file: PathBuf::from(DEFAULT_AUDIT_FILE),
        }
    }
}

/// `[health]`: every key optional; absent keys keep `HealthConfig::default()`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthSection {
    #[serde(deserialize_with = "positive_duration")]
    pub xid_window: Option<Duration>,
    pub xid_escalate_after: Option<u32>,
    #[serde(deserialize_with = "positive_duration")]
    pub xid_count_window: Option<Duration>,
    pub temperature_margin_c: Option<u32>,
    #[serde(deserialize_with = "positive_duration")]
    pub pcie_replay_window: Option<Duration>,
    pub pcie_replay_per_minute: PcieRates,
    pub failing_calls_polls: Option<u32>,
    #[serde(deserialize_with = "at_least_one")]
    pub retired_pages_max: Option<u64>,
    pub remapped_rows_uncorrectable_max: Option<u32>,
    #[serde(deserialize_with = "xid_overrides")]
    pub xid_overrides: BTreeMap<u64, XidOverride>,
    #[serde(deserialize_with = "error_rate")]
    pub nvlink_errors_per_minute: Option<f64>,
    #[serde(deserialize_with = "positive_duration")]
    pub nvlink_error_window: Option<Duration>,
    #[serde(deserialize_with = "sbe_rate")]
    pub ecc_correctable_per_minute: Option<f64>,
    #[serde(deserialize_with = "positive_duration")]
    pub ecc_correctable_window: Option<Duration>,
    #[serde(deserialize_with = "positive_duration")]
    pub pcie_busy_for: Option<Duration>,
}

/// `[health.pcie_replay_per_minute]`: expected replays per minute per lane, by generation.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PcieRates {
    #[serde(deserialize_with = "rate")]
    pub gen1: Option<f64>,
    #[serde(deserialize_with = "rate")]
    pub gen2: Option<f64>,
    #[serde(deserialize_with = "rate")]
    pub gen3: Option<f64>,
    #[serde(deserialize_with = "rate")]
    pub gen4: Option<f64>,
    #[serde(deserialize_with = "rate")]
    pub gen5: Option<f64>,
    #[serde(deserialize_with = "rate")]
    pub gen6: Option<f64>,
}

impl HealthSection {
    pub fn into_config(self) -> HealthConfig {
        let d = HealthConfig::default();
        let p = self.pcie_replay_per_minute;
        let mut rates = d.pcie_replay_per_minute;
        for (slot, v) in rates
            .iter_mut()
            .zip([p.gen1, p.gen2, p.gen3, p.gen4, p.gen5, p.gen6])
        {
            if let Some(v) = v {
                *slot = v;
            }
        }
        HealthConfig {
            xid_window: self.xid_window.unwrap_or(d.xid_window),
            xid_escalate_after: self.xid_escalate_after.unwrap_or(d.xid_escalate_after),
            xid_count_window: self.xid_count_window.unwrap_or(d.xid_count_window),
            temperature_margin_c: self.temperature_margin_c.unwrap_or(d.temperature_margin_c),
            pcie_replay_per_minute: rates,
            pcie_replay_window: self.pcie_replay_window.unwrap_or(d.pcie_replay_window),
            failing_calls_polls: self.failing_calls_polls.unwrap_or(d.failing_calls_polls),
            retired_pages_max: self.retired_pages_max.unwrap_or(d.retired_pages_max),
            remapped_rows_uncorrectable_max: self
                .remapped_rows_uncorrectable_max
                .unwrap_or(d.remapped_rows_uncorrectable_max),
            xid_overrides: self.xid_overrides,
            nvlink_errors_per_minute: self
                .nvlink_errors_per_minute
                .unwrap_or(d.nvlink_errors_per_minute),
            nvlink_error_window: self.nvlink_error_window.unwrap_or(d.nvlink_error_window),
            ecc_correctable_per_minute: self
                .ecc_correctable_per_minute
                .unwrap_or(d.ecc_correctable_per_minute),
            ecc_correctable_window: self
                .ecc_correctable_window
                .unwrap_or(d.ecc_correctable_window),
            pcie_busy_for: self.pcie_busy_for.unwrap_or(d.pcie_busy_for),
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
    // `:PORT`, dcgm-exporter's and Go's habit: every IPv4 address, as the default listen.
    if let Some(port) = s.strip_prefix(':').and_then(|p| p.parse::<u16>().ok()) {
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    s.parse().map_err(|_| {
        format!(
            "invalid listen address '{s}'; write IP:PORT, e.g. '0.0.0.0:9400' or '[::]:9400', or \
             ':9400' for every IPv4 address"
        )
    })
}

/// The words a log level may be, alone or after `target=`.
const LOG_LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];

fn is_log_level(word: &str) -> bool {
    LOG_LEVELS
        .iter()
        .any(|l| l.eq_ignore_ascii_case(word.trim()))
}

/// Checks a log level or `tracing` filter directive (`info`, `gpu_steward=debug,warn`).
///
/// Stricter than `EnvFilter`, which takes any bare word as a target name: `inof` or
/// `verbose` would be read as "trace for target `inof`" and silence every other line,
/// errors included. So each comma-separated part must be a level word, or
/// `target=level` (a span filter `target[span]=level` is allowed as `EnvFilter` reads it).
pub fn parse_log_level(s: &str) -> Result<String, String> {
    let allowed = "use one of error, warn, info, debug, trace, off, or target=level directives \
                   like 'gpu_steward=debug,warn'";
    let parts: Vec<&str> = s
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if parts.is_empty() {
        return Err(format!("invalid log level '{s}': it is empty; {allowed}"));
    }
    for part in parts {
        match part.rsplit_once('=') {
            None if part.contains('[') => {}
            None if is_log_level(part) => {}
            None => {
                return Err(format!(
                    "invalid log level '{s}': '{part}' is not a level; {allowed}"
                ))
            }
            Some((target, level)) => {
                if target.trim().is_empty() || !is_log_level(level) {
                    return Err(format!(
                        "invalid log level '{s}': '{part}' is not a target=level directive; {allowed}"
                    ));
                }
            }
        }
    }
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("invalid log level '{s}': {e}; {allowed}"))
}

fn interval<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    parse_interval(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn slow_interval<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    tier_interval(d, "slow_interval")
}

fn expensive_interval<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    tier_interval(d, "expensive_interval")
}

fn profiling_interval<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<toml::Spanned<Duration>>, D::Error> {
    let s = toml::Spanned::<String>::deserialize(d)?;
    let span = s.span();
    parse_interval(s.get_ref())
        .map(|d| Some(toml::Spanned::new(span, d)))
        .map_err(|e| {
            let e = match e.strip_prefix("interval ") {
                Some(rest) => format!("profiling_interval {rest}"),
                None => format!("profiling_interval: {e}"),
            };
            serde::de::Error::custom(e)
        })
}

fn tier_interval<'de, D: Deserializer<'de>>(d: D, key: &str) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    parse_interval(&s)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(e.replacen("interval", key, 1)))
}

fn max_connections<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let n = i64::deserialize(d)?;
    if (1..=65536).contains(&n) {
        Ok(Some(n as usize))
    } else {
        Err(serde::de::Error::custom(format!(
            "max_connections {n} is out of range; use 1 to 65536 (default 64)"
        )))
    }
}

fn header_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    let t = humantime::parse_duration(&s).map_err(|e| {
        serde::de::Error::custom(format!(
            "invalid duration '{s}': {e}; write it like '500ms', '5s' or '1m'"
        ))
    })?;
    if t < Duration::from_millis(100) || t > Duration::from_secs(300) {
        return Err(serde::de::Error::custom(format!(
            "header_timeout '{s}' is out of range; use 100ms to 5m (default 10s)"
        )));
    }
    Ok(Some(t))
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

fn positive_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    match humantime::parse_duration(&s) {
        Ok(v) if !v.is_zero() => Ok(Some(v)),
        Ok(_) => Err(de::Error::custom(format!(
            "duration '{s}' must be longer than zero; write it like '5m' or '1h'"
        ))),
        Err(e) => Err(de::Error::custom(format!(
            "invalid duration '{s}': {e}; write it like '30s', '5m' or '1h'"
        ))),
    }
}

fn at_least_one<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match u64::deserialize(d)? {
        0 => Err(de::Error::custom("must be 1 or more")),
        n => Ok(Some(n)),
    }
}

fn rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let v = f64::deserialize(d)?;
    if v.is_finite() && v > 0.0 {
        Ok(Some(v))
    } else {
        Err(de::Error::custom(format!(
            "invalid replay rate {v}; give replays per minute per lane as a positive number, \
             e.g. 0.96 for Gen4"
        )))
    }
}

/// `nvlink_errors_per_minute`: a rate of zero or more (0 = any error warns).
fn error_rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let v = f64::deserialize(d)?;
    if v.is_finite() && v >= 0.0 {
        Ok(Some(v))
    } else {
        Err(de::Error::custom(format!(
            "invalid error rate {v}; give NVLink replay and recovery errors per minute as a \
             number of 0 or more, e.g. 1.0"
        )))
    }
}

/// `ecc_correctable_per_minute`: a rate of 0 or more (0 = any correctable error warns).
fn sbe_rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let v = f64::deserialize(d)?;
    if v.is_finite() && v >= 0.0 {
        Ok(Some(v))
    } else {
        Err(de::Error::custom(format!(
            "invalid ECC error rate {v}; give correctable ECC errors per minute as a number of 0 \
             or more, e.g. 10.0 (DCGM's limit)"
        )))
    }
}

/// `[health.xid_overrides]`: `"13" = "ignore"` or `"13" = { severity = "fail", action = "reset_gpu" }`.
fn xid_overrides<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<u64, XidOverride>, D::Error> {
    let raw = BTreeMap::<String, OverrideSpec>::deserialize(d)?;
    raw.into_iter()
        .map(|(key, spec)| match key.trim().parse::<u64>() {
            Ok(xid) if xid > 0 => Ok((xid, spec.0)),
            _ => Err(de::Error::custom(format!(
                "invalid XID '{key}' in [health.xid_overrides]; keys are XID numbers, e.g. \"13\""
            ))),
        })
        .collect()
}

struct OverrideSpec(XidOverride);

impl<'de> Deserialize<'de> for OverrideSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OverrideVisitor)
    }
}

struct OverrideVisitor;

const OVERRIDE_HINT: &str =
    "use \"ignore\" or { severity = \"warn\" or \"fail\", action = \"none\", \
     \"restart_app\", \"reset_gpu\", \"reboot_node\", \"drain_and_reset\" or \"contact_support\" }";

impl<'de> Visitor<'de> for OverrideVisitor {
    type Value = OverrideSpec;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "\"ignore\" or a table with severity and action")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<OverrideSpec, E> {
        if v == "ignore" {
            Ok(OverrideSpec(XidOverride::Ignore))
        } else {
            Err(E::custom(format!(
                "invalid XID override '{v}'; {OVERRIDE_HINT}"
            )))
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OverrideSpec, A::Error> {
        let (mut severity, mut action) = (None, None);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "severity" => severity = Some(map.next_value::<SeverityName>()?.0),
                "action" => action = Some(map.next_value::<ActionName>()?.0),
                other => {
                    return Err(de::Error::custom(format!(
                        "unknown key '{other}' in an XID override; {OVERRIDE_HINT}"
                    )))
                }
            }
        }
        match (severity, action) {
            (Some(severity), Some(action)) => {
                Ok(OverrideSpec(XidOverride::Classify { severity, action }))
            }
            _ => Err(de::Error::custom(format!(
                "an XID override needs both severity and action; {OVERRIDE_HINT}"
            ))),
        }
    }
}

struct SeverityName(Status);

impl<'de> Deserialize<'de> for SeverityName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match Status::parse(&s) {
            Some(Status::Pass) => Err(de::Error::custom(
                "severity 'pass' would hide the XID; write \"ignore\" instead of a table",
            )),
            Some(v) => Ok(SeverityName(v)),
            None => Err(de::Error::custom(format!(
                "unknown severity '{s}'; use \"warn\" or \"fail\""
            ))),
        }
    }
}

struct ActionName(Action);

impl<'de> Deserialize<'de> for ActionName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Action::parse(&s).map(ActionName).ok_or_else(|| {
            de::Error::custom(format!(
                "unknown action '{s}'; use none, restart_app, reset_gpu, reboot_node, \
                 drain_and_reset or contact_support"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::parse_log_level;

    #[test]
    fn log_levels_and_directives_are_accepted() {
        for ok in [
            "info",
            "WARN",
            "off",
            "error",
            "gpu_steward=debug",
            "gpu_steward=debug,warn",
            "gpu_steward::http=trace, info",
            "gpu_steward[poll]=debug",
        ] {
            assert_eq!(parse_log_level(ok).as_deref(), Ok(ok), "{ok}");
        }
    }

    #[test]
    fn a_bare_word_that_is_not_a_level_is_rejected() {
        for bad in [
            "inof",
            "verbose",
            "warn,inof",
            "gpu_steward=verbose",
            "=debug",
            "",
            " , ",
        ] {
            let e = parse_log_level(bad).expect_err(bad);
            assert!(
                e.contains("error, warn, info, debug, trace, off"),
                "{bad}: {e}"
            );
        }
    }
}
