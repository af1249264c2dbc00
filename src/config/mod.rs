//! One validated `Config` from the TOML file, the environment and the command line.
//!
//! Precedence: flag > `GPU_STEWARD_*` environment variable > config file > default. Flags and
//! environment variables are resolved by clap into `Overrides`; this module merges them over the
//! file. Every error names the file, line and column and says how to fix it.
//!
//! The files the configuration names are read and checked here too: [`web`] (the web config,
//! TLS and basic auth) and [`token`] (the API token); the HTTP layer serves what they yield.

mod describe;
pub mod dropins;
mod file;
pub mod health;
pub mod hooks;
pub(crate) mod labels;
pub mod mig;
pub mod mig_layout;
pub mod nvsentinel;
pub mod otlp;
#[cfg(test)]
mod profiling_tests;
pub mod reclaim;
pub mod remediation;
mod sections;
pub mod sharing;
pub mod slurm;
pub mod token;
pub mod web;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use file::{
    parse_interval, parse_listen, parse_log_level, DcgmNames, LogFormat, Profile,
    DEFAULT_AUDIT_FILE,
};

use file::FileConfig;

use health::HealthConfig;
use remediation::RemediationConfig;
pub use sections::{KubernetesConfig, ProcessesConfig};
use sharing::SharingConfig;

pub const DEFAULT_CONFIG: &str = "/etc/gpu-steward/config.toml";
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9400";
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// The slow tier: every 10 s BAR1, power limit, ECC, PCIe counters and MIG mode (0.16 ms each
/// on an H100, or slow-moving) are read.
pub const DEFAULT_SLOW_INTERVAL: Duration = Duration::from_secs(10);
/// The expensive tier: every 30 s the energy counter (3.0 ms of CPU on an H100) and
/// per-process utilization (2.8 ms): as often as dcgm-exporter samples anything.
pub const DEFAULT_EXPENSIVE_INTERVAL: Duration = Duration::from_secs(30);
/// The GPM window: `nvmlGpmMetricsGet` costs 1.0-1.45 ms of CPU per call on a real H200
/// (`shared/reference/real-h200/README.md`) whatever the window, and its ratios are averages
/// over the window, so a window of 5 s costs a twentieth of one at a 100 ms poll and answers
/// the same average (docs/performance.md, "Profiling cadence"). Never shorter than the poll.
pub const DEFAULT_PROFILING_INTERVAL: Duration = Duration::from_secs(5);
/// Prometheus, a probe or two and an operator's curl: 64 is plenty, and bounds what a
/// misbehaving client can hold.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Values given on the command line or in the environment.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub nvml_lib: Option<String>,
    pub interval: Option<Duration>,
    pub log_level: Option<String>,
    pub log_format: Option<LogFormat>,
    pub web_config_file: Option<PathBuf>,
    /// The listen address when neither the flag, the environment nor the config file gives one
    /// (`demo`'s `127.0.0.1:9400`); `None`: [`DEFAULT_LISTEN`].
    pub default_listen: Option<SocketAddr>,
    /// The `nvidia-smi` that `[sharing]` runs, over the file's (`demo`: the simulated node's
    /// stand-in).
    pub nvidia_smi: Option<PathBuf>,
    /// The audit log when the config file sets no `[audit] file` (`demo`'s throwaway one);
    /// `None`: [`DEFAULT_AUDIT_FILE`].
    pub default_audit_file: Option<PathBuf>,
}

/// The agent's whole configuration, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file it came from, if one was read.
    pub file: Option<PathBuf>,
    pub listen: SocketAddr,
    /// `[server] web_config_file` / `--web-config-file`: TLS and basic auth (exporter-toolkit).
    pub web_config_file: Option<PathBuf>,
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub nvml_lib: String,
    pub interval: Duration,
    /// Cadence of the slow tier of reads (ECC, limits, PCIe counters, MIG mode, ...).
    pub slow_interval: Duration,
    /// Cadence of the expensive tier (energy counter, per-process utilization).
    pub expensive_interval: Duration,
    /// The GPM window (profiling metrics); never shorter than `interval`.
    pub profiling_interval: Duration,
    pub metrics_dcgm: bool,
    pub metrics_native: bool,
    /// `[metrics] nvlink_links`: per-link NVLink series (the fuller profile).
    pub metrics_nvlink_links: bool,
    /// Overrides the hostname label value; default `NODE_NAME`, else the host name.
    pub hostname: Option<String>,
    pub hostname_label: String,
    /// `[metrics] profile`: lean (the default, a series budget per GPU) or full.
    pub metrics_profile: Profile,
    /// `[metrics] dcgm_names`: dcgm-exporter 4.8's names, 4.9's, or both.
    pub dcgm_names: DcgmNames,
    /// A `tracing` filter; `None` leaves it to `RUST_LOG` or `info`.
    pub log_level: Option<String>,
    pub log_format: LogFormat,
    pub api_enabled: bool,
    pub api_token_file: PathBuf,
    /// `[api] socket`, `socket_mode`, `tcp`: the API on a Unix socket, and whether TCP has it too.
    pub api_socket: Option<PathBuf>,
    pub api_socket_mode: u32,
    pub api_tcp: bool,
    /// `[audit] file`: the JSON-lines log of every change the agent makes to the node.
    pub audit_file: PathBuf,
    /// `[health]`: thresholds, XID window and overrides.
    pub health: HealthConfig,
    /// `[processes]`: per-process series and procfs attribution.
    pub processes: ProcessesConfig,
    /// `[kubernetes]`: pod labels from the kubelet's pod-resources API.
    pub kubernetes: KubernetesConfig,
    /// `[rules] files`: the patterns (the rules are loaded from them beside the configuration:
    /// `rules::served::load`).
    pub rule_files: Vec<String>,
    /// `[remediation]`: hooks, routes and their safety rails.
    pub remediation: RemediationConfig,
    /// `[mig]`: layouts, the layout to converge to, hooks and the reset command.
    pub mig: mig::MigConfig,
    /// `[reclaim]`: idle GPUs and what to do about them (off by default, dry run by default).
    pub reclaim: reclaim::ReclaimConfig,
    /// `[accounting]`: per-owner GPU seconds and energy.
    pub accounting: reclaim::AccountingConfig,
    /// `[sharing]`: compute mode, time-slice, shared resources and the device plugin.
    pub sharing: SharingConfig,
    /// `[slurm]`: drain this node when a GPU fails (docs/slurm.md).
    pub slurm: slurm::SlurmConfig,
    /// `[nvsentinel]`: health events to NVSentinel's platform connector.
    pub nvsentinel: nvsentinel::NvsentinelConfig,
    /// `[otlp]` with the `OTEL_*` environment applied: `None` while the exporter is off.
    pub otlp: Option<otlp::OtlpConfig>,
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}:{line}:{column}: {message}")]
    Invalid {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// An OpenTelemetry environment variable (`OTEL_*`) that cannot be used.
    #[error("environment variable {var}: {message}")]
    Environment { var: &'static str, message: String },
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

/// Loads `path` (if it exists, or fails if `required`) with its `config.d/*.toml` drop-ins,
/// and applies `overrides`.
pub fn load(path: &Path, required: bool, overrides: &Overrides) -> Result<Config, ConfigError> {
    // The file and the drop-ins of `config.d` beside it, merged (dropins.rs).
    let (file, parsed) = match dropins::read(path, required)? {
        Some(source) => {
            // An error of the merged text is placed in the drop-in that causes it, if one does.
            let parsed =
                parse(&source.name, &source.text).map_err(|e| source.own_error().unwrap_or(e))?;
            (Some(path.to_path_buf()), parsed)
        }
        None => (None, Parsed::default()),
    };
    finish(file, parsed, overrides)
}

/// Merges the overrides over the parsed file, then checks what needs both.
fn finish(
    file: Option<PathBuf>,
    parsed: Parsed,
    overrides: &Overrides,
) -> Result<Config, ConfigError> {
    let profiling_at = parsed.profiling_at;
    let otlp = parsed.otlp.clone();
    let name = file.as_ref().map(|f| f.display().to_string());
    let mut config = merge(file, parsed, overrides);
    check_profiling(&config, name.clone(), profiling_at, overrides)?;
    config.otlp = with_otlp_env(otlp, &config, name, &|k| std::env::var(k).ok())?;
    Ok(config)
}

/// `[otlp]` with the OpenTelemetry environment variables applied (`config::otlp` has the
/// precedence), and its interval checked against the poll's: an export between two polls
/// would only send the same publication again.
fn with_otlp_env(
    (checked, interval_at): (otlp::Checked, Option<(usize, usize)>),
    c: &Config,
    file: Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<otlp::OtlpConfig>, ConfigError> {
    let resolved = otlp::resolve(checked, env).map_err(|p| match p {
        otlp::Problem::Env(var, message) => ConfigError::Environment { var, message },
        // `check` reports the file's problems while parsing; `resolve` finds none there.
        otlp::Problem::At(_, message) => ConfigError::Invalid {
            file: file.clone().unwrap_or_default(),
            line: 0,
            column: 0,
            message,
        },
    })?;
    let Some(o) = resolved else {
        return Ok(None);
    };
    if o.interval < c.interval {
        let message = format!(
            "otlp interval '{}' is shorter than the poll interval '{}'; an export between two \
             polls would send the same data again, so use '{}' or more (default 60s)",
            humantime::format_duration(o.interval),
            humantime::format_duration(c.interval),
            humantime::format_duration(c.interval),
        );
        return Err(match (file, interval_at) {
            (Some(file), Some((line, column))) => ConfigError::Invalid {
                file,
                line,
                column,
                message,
            },
            _ => ConfigError::Environment {
                var: "OTEL_METRIC_EXPORT_INTERVAL",
                message,
            },
        });
    }
    Ok(Some(o))
}

/// `[poller] profiling_interval` shorter than the poll interval (from the file or the command
/// line): a window shorter than a poll cannot have a sample at each edge.
fn check_profiling(
    c: &Config,
    file: Option<String>,
    at: Option<(usize, usize)>,
    o: &Overrides,
) -> Result<(), ConfigError> {
    let (Some(file), Some((line, column))) = (file, at) else {
        return Ok(());
    };
    if c.profiling_interval >= c.interval {
        return Ok(());
    }
    let from = if o.interval.is_some() {
        "--interval (or GPU_STEWARD_INTERVAL)"
    } else {
        "[poller] interval"
    };
    Err(ConfigError::Invalid {
        file,
        line,
        column,
        message: format!(
            "profiling_interval '{}' is shorter than the poll interval '{}' ({from}); \
             GPM samples are taken at polls, so use '{}' or more (default 5s)",
            humantime::format_duration(c.profiling_interval),
            humantime::format_duration(c.interval),
            humantime::format_duration(c.interval),
        ),
    })
}

/// A configuration from `text` (as the file `name`) with `overrides` applied: what `load`
/// does once it has read the file. Public so that fuzzing can reach it without a file.
pub fn from_text(name: &str, text: &str, overrides: &Overrides) -> Result<Config, ConfigError> {
    finish(Some(PathBuf::from(name)), parse(name, text)?, overrides)
}

/// The file's sections, and those that needed more than the TOML parser: the files they name,
/// read once here (`[sharing]` may name k8s-device-plugin's YAML, `[mig]` mig-parted's).
#[derive(Debug, Default)]
struct Parsed {
    file: FileConfig,
    sharing: SharingConfig,
    /// `[mig]` with the layouts of its mig-parted file.
    mig: mig::MigConfig,
    /// Line and column of `[poller] profiling_interval`, checked once the command line is known.
    profiling_at: Option<(usize, usize)>,
    /// `[otlp]` checked, and the line and column of its `interval`: the environment and the
    /// poll interval are applied in `finish`.
    otlp: (otlp::Checked, Option<(usize, usize)>),
}

/// Parses config text; `name` is used in error messages.
fn parse(name: &str, text: &str) -> Result<Parsed, ConfigError> {
    let invalid = |offset: usize, message: String| {
        let (line, column) = line_col(text, offset);
        ConfigError::Invalid {
            file: name.to_string(),
            line,
            column,
            message,
        }
    };
    let f: FileConfig = toml::from_str(text).map_err(|e| {
        let at = e.span().map_or(0, |span| span.start);
        invalid(at, toml_message(e.message(), text, at))
    })?;
    let k = &f.kubernetes;
    let chosen = [
        ("[metrics] hostname_label", &f.metrics.hostname_label),
        ("[kubernetes] pod_label", &k.pod_label),
        ("[kubernetes] namespace_label", &k.namespace_label),
        ("[kubernetes] container_label", &k.container_label),
    ];
    if let Some((span, message)) = labels::first_duplicate(&chosen) {
        return Err(invalid(span.start, message));
    }
    if let Some((span, message)) = f.remediation.unknown_hook() {
        return Err(invalid(span.start, message));
    }
    if let Some((span, message)) = f.remediation.bad_action() {
        return Err(invalid(span.start, message));
    }
    if let Some(message) = f.remediation.duplicate_hook() {
        let at = text.find("[[remediation.").unwrap_or(0);
        return Err(invalid(at, message));
    }
    // mig-parted's file, read once here (bounded), never at apply time.
    let parted = match &f.mig.mig_config {
        Some(path) => mig::read_mig_parted(path)?,
        None => mig_layout::Layouts::new(),
    };
    f.mig.check(&parted).map_err(|(at, m)| invalid(at, m))?;
    if let Some((span, message)) = f.reclaim.check() {
        return Err(invalid(span.start, message));
    }
    let mut f = f;
    let otlp = std::mem::take(&mut f.otlp)
        .check(Some(Path::new(name)))
        .map_err(|p| match p {
            otlp::Problem::At(at, m) => invalid(at, m),
            otlp::Problem::Env(var, message) => ConfigError::Environment { var, message },
        })?;
    let otlp_at = otlp.interval.map(|(_, at)| line_col(text, at));
    let mig = std::mem::take(&mut f.mig).into_config(parted);
    let section = std::mem::take(&mut f.sharing);
    let yaml = match &section.device_plugin_config {
        Some(path) => {
            sharing::yaml::read(Path::new(path.get_ref())).map_err(|e| ConfigError::Invalid {
                file: e.file,
                line: e.line,
                column: e.column,
                message: e.message,
            })?
        }
        None => None,
    };
    let sharing = section
        .into_config(yaml)
        .map_err(|m| invalid(m.span.start, m.message))?;
    let profiling_at = f
        .poller
        .profiling_interval
        .as_ref()
        .map(|p| line_col(text, p.span().start));
    Ok(Parsed {
        file: f,
        sharing,
        mig,
        profiling_at,
        otlp: (otlp, otlp_at),
    })
}

/// The TOML parser's message, or, where it has none (a control character in a comment, found by
/// fuzzing), what is at that position and what to do.
fn toml_message(message: &str, text: &str, at: usize) -> String {
    let message = message.trim();
    if !message.is_empty() {
        return message.to_string();
    }
    match text.get(at..).and_then(|rest| rest.chars().next()) {
        Some(c) if c.is_control() => format!(
            "control character U+{:04X} is not allowed in TOML; remove it",
            u32::from(c)
        ),
        Some(c) => format!("invalid TOML at '{c}'; check the syntax of this line"),
        None => "invalid TOML at the end of the file; check the last line".to_string(),
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// A path from the config file, relative to the file's directory (as `[rules] files` are), so
/// that it does not depend on the working directory (`/` under systemd).
fn beside(config_file: Option<&Path>, p: PathBuf) -> PathBuf {
    match config_file.and_then(Path::parent) {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p,
    }
}

fn merge(file: Option<PathBuf>, parsed: Parsed, o: &Overrides) -> Config {
    let Parsed {
        file: f,
        mut sharing,
        mig,
        profiling_at: _,
        otlp: _,
    } = parsed;
    if let Some(n) = &o.nvidia_smi {
        sharing.nvidia_smi = n.clone();
    }
    let web_config_file = o.web_config_file.clone().or_else(|| {
        f.server
            .web_config_file
            .clone()
            .map(|p| beside(file.as_deref(), p))
    });
    let interval = o.interval.or(f.poller.interval).unwrap_or(DEFAULT_INTERVAL);
    let default_listen: SocketAddr = DEFAULT_LISTEN
        .parse()
        .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 9400)));
    Config {
        file,
        listen: o
            .listen
            .or(f.server.listen)
            .or(o.default_listen)
            .unwrap_or(default_listen),
        web_config_file,
        max_connections: f.server.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
        header_timeout: f.server.header_timeout.unwrap_or(DEFAULT_HEADER_TIMEOUT),
        nvml_lib: o
            .nvml_lib
            .clone()
            .or(f.nvml.library)
            .unwrap_or_else(|| DEFAULT_NVML_LIB.to_string()),
        interval,
        profiling_interval: f
            .poller
            .profiling_interval
            .map(toml::Spanned::into_inner)
            .unwrap_or(DEFAULT_PROFILING_INTERVAL.max(interval)),
        slow_interval: f.poller.slow_interval.unwrap_or(DEFAULT_SLOW_INTERVAL),
        expensive_interval: f
            .poller
            .expensive_interval
            .unwrap_or(DEFAULT_EXPENSIVE_INTERVAL),
        metrics_dcgm: f.metrics.dcgm,
        metrics_native: f.metrics.native,
        metrics_nvlink_links: f.metrics.nvlink_links,
        hostname: f.metrics.hostname,
        hostname_label: f.metrics.hostname_label.into_inner(),
        metrics_profile: f.metrics.profile,
        dcgm_names: f.metrics.dcgm_names,
        log_level: o.log_level.clone().or(f.log.level),
        log_format: o.log_format.or(f.log.format).unwrap_or(LogFormat::Text),
        api_enabled: f.api.enabled,
        api_token_file: f.api.token_file,
        api_socket: f.api.socket,
        api_socket_mode: f.api.socket_mode,
        api_tcp: f.api.tcp,
        audit_file: match &o.default_audit_file {
            Some(d) if f.audit.file == Path::new(DEFAULT_AUDIT_FILE) => d.clone(),
            _ => f.audit.file,
        },
        health: f.health.into_config(),
        processes: f.processes,
        kubernetes: f.kubernetes.into_config(),
        rule_files: f.rules.files,
        remediation: f.remediation.into_config(),
        mig,
        reclaim: f.reclaim.into_config(),
        accounting: f.accounting.into_config(),
        sharing,
        slurm: f.slurm,
        nvsentinel: f.nvsentinel,
        otlp: None,
    }
}

impl Config {
    /// The `[rules] files` patterns as loaded: a relative one is taken beside the config file.
    pub fn rule_patterns(&self) -> Vec<String> {
        let base = self
            .file
            .as_ref()
            .and_then(|f| f.parent())
            .map(Path::to_path_buf)
            .unwrap_or_default();
        self.rule_files
            .iter()
            .map(|p| {
                if Path::new(p).is_absolute() {
                    p.clone()
                } else {
                    base.join(p).display().to_string()
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse("c.toml", text)
            .map(|_| ())
            .expect_err("must be rejected")
            .to_string()
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = merge(
            None,
            parse("c.toml", "").expect("valid"),
            &Overrides::default(),
        );
        assert_eq!(c.listen.to_string(), "0.0.0.0:9400");
        assert_eq!(c.interval, Duration::from_secs(5));
        assert_eq!(c.nvml_lib, "libnvidia-ml.so.1");
        assert!(c.metrics_dcgm && c.metrics_native && !c.api_enabled);
        assert_eq!(c.hostname_label, "Hostname");
    }

    #[test]
    fn a_relative_web_config_file_is_beside_the_config_file_a_flag_is_not() {
        let text = "[server]\nweb_config_file = \"web.yml\"\n";
        let file = Some(PathBuf::from("/etc/gpu-steward/config.toml"));
        let c = merge(
            file.clone(),
            parse("c.toml", text).expect("valid"),
            &Overrides::default(),
        );
        assert_eq!(
            c.web_config_file.as_deref(),
            Some(Path::new("/etc/gpu-steward/web.yml"))
        );
        let text = "[server]\nweb_config_file = \"/srv/web.yml\"\n";
        let c = merge(
            file.clone(),
            parse("c.toml", text).expect("valid"),
            &Overrides::default(),
        );
        assert_eq!(
            c.web_config_file.as_deref(),
            Some(Path::new("/srv/web.yml"))
        );
        let flag = Overrides {
            web_config_file: Some(PathBuf::from("web.yml")),
            ..Overrides::default()
        };
        let c = merge(file, parse("c.toml", "").expect("valid"), &flag);
        assert_eq!(c.web_config_file.as_deref(), Some(Path::new("web.yml")));
    }

    #[test]
    fn a_control_character_gets_a_message_not_an_empty_line() {
        // Found by fuzzing (fuzz/corpus/config): the TOML parser reports no message here.
        let e = err("# a comment\n# with a NUL \0 inside\n");
        assert_eq!(
            e,
            "c.toml:2:14: control character U+0000 is not allowed in TOML; remove it"
        );
    }

    #[test]
    fn unknown_key_is_reported_at_its_position() {
        let e = err("[poller]\ninterval = \"5s\"\nintervall = \"1s\"\n");
        assert!(
            e.starts_with("c.toml:3:1: unknown field `intervall`"),
            "{e}"
        );
        assert!(
            e.contains("expected one of `interval`, `slow_interval`"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_point_at_the_value_and_say_what_to_do() {
        let e = err("[poller]\ninterval = \"5x\"\n");
        assert!(e.starts_with("c.toml:2:12: invalid duration '5x'"), "{e}");
        assert!(e.contains("'500ms'"), "{e}");
        let e = err("[poller]\ninterval = \"10ms\"\n");
        assert!(e.contains("shorter than the minimum of 100ms"), "{e}");
        let e = err("[server]\nlisten = \"localhost\"\n");
        assert!(
            e.starts_with("c.toml:2:10: invalid listen address 'localhost'"),
            "{e}"
        );
        let e = err("[log]\nformat = \"xml\"\n");
        assert!(e.starts_with("c.toml:2:10:"), "{e}");
        let e = err("[api]\nsocket_mode = \"0666\"\n");
        assert!(
            e.starts_with("c.toml:2:15: socket_mode 0666 lets every user"),
            "{e}"
        );
        let e = err("[api]\nsocket_mode = \"rw\"\n");
        assert!(e.contains("not an octal mode"), "{e}");
        let e = err("[audit]\nfile = 3\n");
        assert!(e.starts_with("c.toml:2:8:"), "{e}");
        let e = err("[metrics]\nhostname_label = \"gpu\"\n");
        assert!(
            e.starts_with("c.toml:2:18: label name 'gpu' is already used"),
            "{e}"
        );
        let e = err("[kubernetes]\npod_label = \"k8s\"\ncontainer_label = \"k8s\"\n");
        assert!(
            e.starts_with("c.toml:3:19: [kubernetes] container_label 'k8s' is the same as [kubernetes] pod_label"),
            "{e}"
        );
        let e = err("[metrics]\nhostname_label = \"pod\"\n");
        assert!(e.contains("hostname_label 'pod' is the same as"), "{e}");
        let e = err(&format!(
            "[metrics]\nhostname = \"{}\"\n",
            "n".repeat(100_000)
        ));
        assert!(
            e.starts_with("c.toml:2:12: the label value is 100000 bytes, over the limit of 256"),
            "{}",
            &e[..e.len().min(300)]
        );
        assert_eq!(
            labels::truncate_value("é".repeat(200)),
            ("é".repeat(128), true)
        );
        let e = err("[metrics]\nhostname_label = \"host-name\"\n");
        assert!(e.contains("invalid label name 'host-name'"), "{e}");
        let e = err("[server]\nmax_connections = 0\n");
        assert!(
            e.starts_with("c.toml:2:19: max_connections 0 is out of range"),
            "{e}"
        );
        let e = err("[server]\nheader_timeout = \"1h\"\n");
        assert!(e.contains("header_timeout '1h' is out of range"), "{e}");
        let e = err("[metrics]\ndcgm = \"yes\"\n");
        assert!(e.starts_with("c.toml:2:8:"), "{e}");
    }

    #[test]
    fn unknown_name_sets_and_profiles_name_their_position_and_the_allowed_values() {
        let e = err("[metrics]\ndcgm_names = \"4.10\"\n");
        assert!(e.starts_with("c.toml:2:14:"), "{e}");
        assert!(e.contains("'4.10'") || e.contains("`4.10`"), "{e}");
        assert!(
            e.contains("4.8") && e.contains("4.9") && e.contains("both"),
            "{e}"
        );
        let e = err("[poller]\n[metrics]\nprofile = \"tiny\"\n");
        assert!(e.starts_with("c.toml:3:11:"), "{e}");
        assert!(e.contains("lean") && e.contains("full"), "{e}");
        let c = parse(
            "c.toml",
            "[metrics]\ndcgm_names = \"both\"\nprofile = \"full\"\n",
        )
        .expect("valid");
        assert_eq!(c.file.metrics.dcgm_names, DcgmNames::Both);
        assert_eq!(c.file.metrics.profile, Profile::Full);
        let d = parse("c.toml", "").expect("valid");
        assert_eq!(d.file.metrics.dcgm_names, DcgmNames::V48);
        assert_eq!(d.file.metrics.profile, Profile::Lean);
    }

    #[test]
    fn syntax_errors_have_positions() {
        let e = err("[poller\ninterval = 5\n");
        assert!(e.starts_with("c.toml:1:"), "{e}");
    }

    #[test]
    fn flags_and_environment_win_over_the_file() {
        let f = parse(
            "c.toml",
            "[server]\nlisten = \"127.0.0.1:1\"\n[poller]\ninterval = \"2s\"\n",
        )
        .expect("valid");
        let o = Overrides {
            interval: Some(Duration::from_millis(500)),
            ..Overrides::default()
        };
        let c = merge(None, f, &o);
        assert_eq!(c.interval, Duration::from_millis(500));
        assert_eq!(c.listen.to_string(), "127.0.0.1:1");
    }

    #[test]
    fn a_default_listen_yields_to_the_flag_and_the_config_file() {
        let demo = Overrides {
            default_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9400))),
            ..Overrides::default()
        };
        let c = merge(None, parse("c.toml", "").expect("valid"), &demo);
        assert_eq!(c.listen.to_string(), "127.0.0.1:9400");
        let file = "[server]\nlisten = \"127.0.0.1:1\"\n";
        let c = merge(None, parse("c.toml", file).expect("valid"), &demo);
        assert_eq!(c.listen.to_string(), "127.0.0.1:1");
        let flag = Overrides {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 2))),
            ..demo
        };
        let c = merge(None, parse("c.toml", file).expect("valid"), &flag);
        assert_eq!(c.listen.to_string(), "127.0.0.1:2");
    }

    #[test]
    fn health_section_parses_with_defaults_and_overrides() {
        let c = merge(
            None,
            parse("c.toml", "").expect("valid"),
            &Overrides::default(),
        );
        assert_eq!(c.health, HealthConfig::default());
        let text = "[health]\nxid_window = \"2m\"\nxid_escalate_after = 5\n\
                    [health.pcie_replay_per_minute]\ngen4 = 2.0\n\
                    [health.xid_overrides]\n\"13\" = { severity = \"fail\", action = \"reset_gpu\" }\n\
                    \"48\" = \"ignore\"\n";
        let c = merge(
            None,
            parse("c.toml", text).expect("valid"),
            &Overrides::default(),
        );
        assert_eq!(c.health.xid_window, Duration::from_secs(120));
        assert_eq!(c.health.xid_escalate_after, 5);
        assert_eq!(c.health.pcie_replay_per_minute[3], 2.0);
        assert_eq!(c.health.pcie_replay_per_minute[4], 1.92);
        assert_eq!(
            c.health.xid_overrides.get(&13),
            Some(&health::XidOverride::Classify {
                severity: health::Status::Fail,
                action: health::Action::ResetGpu
            })
        );
        assert_eq!(
            c.health.xid_overrides.get(&48),
            Some(&health::XidOverride::Ignore)
        );
        assert!(
            c.describe("").contains("13=fail/reset_gpu, 48=ignore"),
            "{}",
            c.describe("")
        );
    }

    #[test]
    fn nvlink_health_and_metrics_keys_parse_and_bad_values_have_positions() {
        let text = "[health]\nnvlink_errors_per_minute = 0.0\nnvlink_error_window = \"30s\"\n\
                    [metrics]\nnvlink_links = true\n";
        let c = merge(
            None,
            parse("c.toml", text).expect("valid"),
            &Overrides::default(),
        );
        assert_eq!(c.health.nvlink_errors_per_minute, 0.0);
        assert_eq!(c.health.nvlink_error_window, Duration::from_secs(30));
        assert!(c.metrics_nvlink_links);
        assert!(
            c.describe("").contains("per-link NVLink on"),
            "{}",
            c.describe("")
        );
        assert!(
            c.describe("")
                .contains("NVLink errors above 0/min over 30s"),
            "{}",
            c.describe("")
        );
        let e = err("[health]\nnvlink_errors_per_minute = -1.0\n");
        assert!(e.starts_with("c.toml:2:28: invalid error rate -1"), "{e}");
        let e = err("[health]\nnvlink_error_window = \"0s\"\n");
        assert!(e.starts_with("c.toml:2:23:"), "{e}");
    }

    #[test]
    fn bad_health_values_have_positions() {
        let e = err("[health]\nxid_window = \"soon\"\n");
        assert!(e.starts_with("c.toml:2:14: invalid duration 'soon'"), "{e}");
        let e = err("[health]\nxid_windw = \"1m\"\n");
        assert!(
            e.starts_with("c.toml:2:1: unknown field `xid_windw`"),
            "{e}"
        );
        let e =
            err("[health.xid_overrides]\n\"13\" = { severity = \"fail\", action = \"reboot\" }\n");
        assert!(e.starts_with("c.toml:2:"), "{e}");
        assert!(e.contains("unknown action 'reboot'"), "{e}");
        let e = err("[health.xid_overrides]\n\"13\" = \"mute\"\n");
        assert!(
            e.starts_with("c.toml:2:8: invalid XID override 'mute'"),
            "{e}"
        );
        let e = err("[health.xid_overrides]\nabc = \"ignore\"\n");
        assert!(e.contains("invalid XID 'abc'"), "{e}");
        let e = err("[health]\nretired_pages_max = 0\n");
        assert!(e.starts_with("c.toml:2:21: must be 1 or more"), "{e}");
        let e = err("[health.pcie_replay_per_minute]\ngen7 = 1.0\n");
        assert!(e.contains("unknown field `gen7`"), "{e}");
    }

    #[test]
    fn processes_and_kubernetes_sections() {
        let c = merge(
            None,
            parse("c.toml", "").expect("valid"),
            &Overrides::default(),
        );
        assert_eq!(c.processes, ProcessesConfig::default());
        assert!(!c.kubernetes.enabled);
        assert_eq!(c.kubernetes.labels.pod, "pod");
        let text = "[processes]\nprocfs = \"/host/proc\"\nmax_per_gpu = 8\n\
                    [kubernetes]\nenabled = true\nrefresh = \"30s\"\npod_label = \"k8s_pod\"\n";
        let c = merge(
            None,
            parse("c.toml", text).expect("valid"),
            &Overrides::default(),
        );
        assert_eq!(c.processes.procfs, PathBuf::from("/host/proc"));
        assert_eq!(c.processes.max_per_gpu, 8);
        assert!(c.kubernetes.enabled);
        assert_eq!(c.kubernetes.refresh, Duration::from_secs(30));
        assert_eq!(c.kubernetes.labels.pod, "k8s_pod");
        let d = c.describe("");
        assert!(d.contains("/host/proc") && d.contains("k8s_pod"), "{d}");
        let e = err("[processes]\nprocfs = \"proc\"\n");
        assert!(
            e.starts_with("c.toml:2:10: path 'proc' is not absolute"),
            "{e}"
        );
        let e = err("[kubernetes]\npod_label = \"exported-pod\"\n");
        assert!(
            e.starts_with("c.toml:2:13: invalid label name 'exported-pod'"),
            "{e}"
        );
        let e = err("[kubernetes]\nrefresh = \"100ms\"\n");
        assert!(e.contains("shorter than 1s"), "{e}");
        let e = err("[kubernetes]\nsocket = \"/x\"\n");
        assert!(e.starts_with("c.toml:2:1: unknown field `socket`"), "{e}");
    }

    #[test]
    fn the_issues_remediation_toml_parses_as_written() {
        let text = r#"
[rules]
files = ["/etc/gpu-steward/rules/*.yml"]

[remediation]
dry_run = false

[[remediation.hooks]]
name = "cordon"
command = ["/usr/lib/gpu-steward/hooks/cordon.sh"]   # argv, never a shell
timeout = "30s"

[[remediation.routes]]
matchers = ['alertname="GpuFatalXid"', 'severity="critical"']
hooks = ["cordon"]
cooldown = "1h"
on_resolved = false
"#;
        let c = from_text("c.toml", text, &Overrides::default()).expect("valid");
        assert_eq!(c.rule_files, ["/etc/gpu-steward/rules/*.yml"]);
        let r = &c.remediation;
        assert!(!r.dry_run);
        assert_eq!(r.max_actions_per_hour, 6);
        assert_eq!(r.hooks[0].argv, ["/usr/lib/gpu-steward/hooks/cordon.sh"]);
        assert_eq!(r.hooks[0].timeout, Duration::from_secs(30));
        assert_eq!(r.routes[0].hooks, ["cordon"]);
        assert_eq!(r.routes[0].cooldown, Duration::from_secs(3600));
        assert!(!r.routes[0].on_resolved);
        assert!(c
            .describe("")
            .contains("route [alertname=\"GpuFatalXid\", severity=\"critical\"] -> cordon"));
        // Off by default.
        let d = from_text("c.toml", "", &Overrides::default()).expect("valid");
        assert!(d.remediation.routes.is_empty() && d.rule_files.is_empty());
    }

    #[test]
    fn bad_remediation_values_have_positions() {
        let e = err("[[remediation.actions]]\nname = \"x\"\nkind = \"reset\"\n");
        assert!(
            e.starts_with("c.toml:3:8: unknown action kind 'reset'"),
            "{e}"
        );
        let e = err("[[remediation.actions]]\nname = \"x\"\nkind = \"power_limit\"\n");
        assert!(
            e.starts_with("c.toml:2:8: action 'x' of kind 'power_limit' needs watts"),
            "{e}"
        );
        let e = err("[[remediation.actions]]\nname = \"x\"\nkind = \"fence\"\nwatts = 3\n");
        assert!(
            e.starts_with("c.toml:4:9: watts applies to kind 'power_limit'"),
            "{e}"
        );
        let e = err("[[remediation.hooks]]\nname = \"a\"\ncommand = [\"/a b\"]\n");
        assert!(e.starts_with("c.toml:3:"), "{e}");
        let e = err("[[remediation.routes]]\nmatchers = []\nhooks = []\ncooldown = \"soon\"\n");
        assert!(e.starts_with("c.toml:4:12: invalid duration 'soon'"), "{e}");
        let e = err("[rules]\nfiles = [\"/x/[\"]\n");
        assert!(
            e.starts_with("c.toml:2:9: invalid file pattern '/x/['"),
            "{e}"
        );
        let e = err(
            "[[remediation.hooks]]\nname = \"a\"\ncommand = [\"/bin/true\"]\n\
                     [[remediation.actions]]\nname = \"a\"\nkind = \"signal_processes\"\n",
        );
        assert!(e.contains("'a' is defined twice"), "{e}");
        let e = err("[remediation]\nenabled = true\n");
        assert!(e.starts_with("c.toml:2:1: unknown field `enabled`"), "{e}");
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncdé\nx", 0), (1, 1));
        assert_eq!(line_col("ab\ncdé\nx", 3), (2, 1));
        assert_eq!(line_col("ab\ncdé\nx", 8), (3, 1));
        assert_eq!(line_col("ab\ncdé\nx", 6), (2, 3));
    }
}
