//! `check-config`'s summary of a configuration: what the agent would do with it, section by
//! section. Reads the files the configuration names (token, web config) to say whether they are
//! usable; must not change anything.

use super::{token, web, Config, LogFormat};

impl Config {
    /// A human summary of what this configuration makes the agent do (for `check-config`), with
    /// `rules`, the summary of the alert rules loaded from `[rules] files` (they are loaded
    /// beside the configuration, not in it: `rules::served::Loaded::describe`).
    pub fn describe(&self, rules: &str) -> String {
        let on = |b: bool| if b { "on" } else { "off" };
        let source = self
            .file
            .as_ref()
            .map_or("built-in defaults".to_string(), |f| f.display().to_string());
        let hostname_label = if self.hostname_label.is_empty() {
            "left out".to_string()
        } else {
            format!("'{}'", self.hostname_label)
        };
        format!(
            "configuration from {source}\n\
             serve HTTP on {listen}: /metrics, /health, /health/gpus, /livez, /readyz \
             (at most {max_connections} requests at once besides the probes, {header_timeout} to send headers)\n\
             load NVML from '{lib}' and poll every {interval}; slow-moving reads every {slow}, \
             expensive ones every {expensive}, profiling (GPM) windows of {profiling}\n\
             metrics: profile {profile}, dcgm-compatible {dcgm} (dcgm-exporter {names} names), native {native}, per-link NVLink {nvlink_links}, hostname label {hostname_label}\n\
             TLS and basic auth: {web}\n\
             mutating API (/api/v1): {api}\n\
             audit log: {audit}\n\
             log: level {level}, format {format}\n\
             {health}\
             {processes}\
             {kubernetes}\
             {rules}\
             {remediation}\
             {reclaim}\
             {accounting}\
             {sharing}\
             {mig}\
             {slurm}\
             {nvsentinel}",
            listen = self.listen,
            max_connections = self.max_connections,
            header_timeout = humantime::format_duration(self.header_timeout),
            lib = self.nvml_lib,
            interval = humantime::format_duration(self.interval),
            slow = humantime::format_duration(self.slow_interval.max(self.interval)),
            expensive = humantime::format_duration(self.expensive_interval.max(self.interval)),
            profiling = humantime::format_duration(self.profiling_interval),
            dcgm = on(self.metrics_dcgm),
            profile = self.metrics_profile.as_str(),
            names = self.dcgm_names.as_str(),
            native = on(self.metrics_native),
            nvlink_links = on(self.metrics_nvlink_links),
            api = self.api_summary(),
            audit = self.audit_file.display(),
            web = self.web_summary(),
            level = self.log_level.as_deref().unwrap_or("info (or RUST_LOG)"),
            format = match self.log_format {
                LogFormat::Text => "text",
                LogFormat::Json => "json",
            },
            health = self.health.describe(),
            processes = self.processes.describe(),
            kubernetes = self.kubernetes.describe(),
            remediation = self.remediation.describe(),
            mig = self.mig.describe(),
            reclaim = self.reclaim.describe(),
            accounting = self.accounting.describe(),
            sharing = self.sharing.describe(),
            slurm = self.slurm.describe(),
            nvsentinel = self.nvsentinel.describe(),
        )
    }

    /// The mutating API: off, or on with its token and socket.
    fn api_summary(&self) -> String {
        if self.api_enabled {
            let socket = match &self.api_socket {
                Some(p) => format!(
                    "; on socket {} (mode {:04o}){}",
                    p.display(),
                    self.api_socket_mode,
                    if self.api_tcp { "" } else { " only" }
                ),
                None => String::new(),
            };
            match token::load_token(&self.api_token_file) {
                Ok(_) => format!("on, token from {}{socket}", self.api_token_file.display()),
                Err(e) => format!("on, but the token is unusable: {e}{socket}"),
            }
        } else {
            "off".to_string()
        }
    }

    /// TLS and basic auth from the web config, or why it is unusable.
    fn web_summary(&self) -> String {
        match &self.web_config_file {
            None => "off (no web_config_file)".to_string(),
            Some(f) => match web::load(f) {
                Ok(w) => format!("{} from {}", w.describe(), f.display()),
                Err(e) => format!("unusable: {e}"),
            },
        }
    }
}
