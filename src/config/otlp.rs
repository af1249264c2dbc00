//! `[otlp]`: metrics pushed to an OpenTelemetry collector (OTLP over http/protobuf or gRPC).
//! Plain data; the mapping and the sender are [`crate::otlp`]'s.
//!
//! Two sources: the config file's `[otlp]` and the OpenTelemetry SDK's environment variables
//! (`OTEL_EXPORTER_OTLP_*`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`, as the
//! specification's `protocol/exporter.md` and `configuration/sdk-environment-variables.md`
//! define them). Precedence, per key: the config file (the operator's explicit configuration),
//! then the signal-specific variable (`OTEL_EXPORTER_OTLP_METRICS_*`), then the generic one
//! (`OTEL_EXPORTER_OTLP_*`), then the specification's default. The exporter is on when an
//! endpoint is given by either source, unless `[otlp] enabled = false`; off when neither gives
//! one.
//!
//! Must not: log header values (tokens), or read anything but the files named here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

/// `[otlp] interval`'s default: OpenTelemetry's `OTEL_METRIC_EXPORT_INTERVAL` default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// `[otlp] timeout`'s default: the specification's `OTEL_EXPORTER_OTLP_TIMEOUT` (10 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Exports kept while the collector is down; the oldest go first (their points counted).
pub const QUEUE_CAPACITY: usize = 16;
/// Consecutive failed exports after which `/health` carries an agent warning.
pub const WARN_AFTER_FAILURES: u32 = 3;
/// The CA bundle used for `https` when no `certificate` is given (Debian's, from
/// `ca-certificates`).
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The largest header-value file, certificate or key read.
const MAX_FILE: u64 = 1 << 20;

/// The wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Protocol {
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    #[serde(rename = "grpc")]
    Grpc,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::Grpc => "grpc",
        }
    }

    fn parse(s: &str) -> Result<Protocol, String> {
        match s.trim() {
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            "grpc" => Ok(Protocol::Grpc),
            "http/json" => Err(
                "protocol 'http/json' is not supported; use 'http/protobuf' or \
                                'grpc'"
                    .into(),
            ),
            other => Err(format!(
                "unknown protocol '{other}'; use 'http/protobuf' or 'grpc'"
            )),
        }
    }
}

/// A header value as written: inline, or read from a file (a token).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum HeaderValue {
    Inline(String),
    File { file: PathBuf },
}

/// `[otlp]` as written (every key optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpSection {
    pub enabled: Option<bool>,
    pub endpoint: Option<Spanned<String>>,
    pub protocol: Option<Spanned<String>>,
    pub interval: Option<Spanned<String>>,
    pub timeout: Option<Spanned<String>>,
    pub headers: BTreeMap<String, Spanned<HeaderValue>>,
    pub certificate: Option<Spanned<PathBuf>>,
    pub client_certificate: Option<Spanned<PathBuf>>,
    pub client_key: Option<Spanned<PathBuf>>,
    pub resource_attributes: BTreeMap<String, String>,
}

/// TLS material, read and checked when the configuration is loaded.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA bundle (PEM) and where it came from.
    pub ca: Option<(PathBuf, Vec<u8>)>,
    /// Client certificate chain and key (PEM), for mutual TLS.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca.as_ref().map(|c| &c.0))
            .field("client", &self.client.is_some())
            .finish()
    }
}

/// `[otlp]` with the environment applied, validated: present only when the exporter is on.
#[derive(Clone, PartialEq)]
pub struct OtlpConfig {
    pub protocol: Protocol,
    /// The full URL requests go to (`…/v1/metrics` for http/protobuf; scheme, host and port
    /// for gRPC).
    pub endpoint: String,
    pub interval: Duration,
    pub timeout: Duration,
    /// Request headers (gRPC metadata), names lowercase. Values may be secrets: never logged.
    pub headers: Vec<(String, String)>,
    pub tls: TlsFiles,
    /// Resource attributes beside the agent's own (`OTEL_RESOURCE_ATTRIBUTES`, then the file's),
    /// `service.name` included when given.
    pub resource: Vec<(String, String)>,
}

impl std::fmt::Debug for OtlpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpConfig")
            .field("protocol", &self.protocol)
            .field("endpoint", &self.endpoint)
            .field("interval", &self.interval)
            .field("timeout", &self.timeout)
            .field(
                "headers",
                &self.headers.iter().map(|h| &h.0).collect::<Vec<_>>(),
            )
            .field("tls", &self.tls)
            .field("resource", &self.resource)
            .finish()
    }
}

impl OtlpConfig {
    /// What `check-config` says.
    pub fn describe(this: Option<&OtlpConfig>) -> String {
        let Some(c) = this else {
            return "otlp: off\n".to_string();
        };
        let names: Vec<&str> = c.headers.iter().map(|h| h.0.as_str()).collect();
        format!(
            "otlp: metrics ({}) to '{}' every {}, each export within {}, headers [{}], TLS {}, \
             at most {} exports queued while the collector is down\n",
            c.protocol.as_str(),
            c.endpoint,
            humantime::format_duration(c.interval),
            humantime::format_duration(c.timeout),
            names.join(", "),
            match (&c.tls.ca, &c.tls.client) {
                (None, _) if !c.endpoint.starts_with("https") => "off".to_string(),
                (ca, client) => format!(
                    "with CA {}{}",
                    ca.as_ref()
                        .map_or(format!("{SYSTEM_CA_BUNDLE} (the system's)"), |c| c
                            .0
                            .display()
                            .to_string()),
                    if client.is_some() {
                        " and a client certificate"
                    } else {
                        ""
                    }
                ),
            },
            QUEUE_CAPACITY
        )
    }
}

/// Where a problem is: at a byte offset of the config file, or in an environment variable.
#[derive(Debug, PartialEq, Eq)]
pub enum Problem {
    At(usize, String),
    Env(&'static str, String),
}

/// The file's `[otlp]` checked (what needs no environment): values with the offsets of their
/// keys, header files read.
#[derive(Debug, Default, Clone)]
pub struct Checked {
    pub enabled: Option<bool>,
    pub endpoint: Option<String>,
    pub protocol: Option<Protocol>,
    /// The interval and the offset of its value, for the check against the poll interval.
    pub interval: Option<(Duration, usize)>,
    pub timeout: Option<Duration>,
    pub headers: Vec<(String, String)>,
    pub certificate: Option<(PathBuf, Vec<u8>)>,
    pub client: Option<(Vec<u8>, Vec<u8>)>,
    pub resource: Vec<(String, String)>,
}

fn duration(s: &str, key: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d >= Duration::from_millis(100) && d <= Duration::from_secs(3600) => Ok(d),
        Ok(_) => Err(format!(
            "{key} '{s}' is out of range; use between 100ms and 1h"
        )),
        Err(e) => Err(format!(
            "invalid duration '{s}': {e}; write it like '10s' or '1m'"
        )),
    }
}

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    crate::bounded::read(path, crate::bounded::Limits::provided(MAX_FILE))
        .map_err(|e| format!("{what} {}: {}", path.display(), e.problem))
}

/// A header name as HTTP/2 and gRPC metadata want it: a token, lowercase.
fn header_name(name: &str) -> Result<String, String> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.!#$%&'*+^`|~".contains(&b));
    if ok {
        Ok(name.to_ascii_lowercase())
    } else {
        Err(format!(
            "invalid header name '{name}'; use letters, digits and '-' (e.g. 'authorization')"
        ))
    }
}

fn header_value(name: &str, v: &str) -> Result<String, String> {
    if v.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)) {
        Ok(v.to_string())
    } else {
        Err(format!(
            "the value of header '{name}' holds a control or non-ASCII character"
        ))
    }
}

fn pem_check(pem: &[u8], what: &str, path: &Path, key: bool) -> Result<(), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    if key {
        PrivateKeyDer::from_pem_slice(pem)
            .map(drop)
            .map_err(|e| format!("{what} {}: no usable private key ({e})", path.display()))
    } else {
        let n = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{what} {}: {e}", path.display()))?
            .len();
        if n == 0 {
            return Err(format!("{what} {}: holds no certificate", path.display()));
        }
        Ok(())
    }
}

/// A path from the config file, relative to the file's directory.
fn beside(config: Option<&Path>, p: &Path) -> PathBuf {
    match config.and_then(Path::parent) {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p.to_path_buf(),
    }
}

impl OtlpSection {
    /// Checks what the file says; files are read relative to `config` (the config file).
    pub fn check(self, config: Option<&Path>) -> Result<Checked, Problem> {
        let at = |s: &std::ops::Range<usize>| s.start;
        let mut c = Checked {
            enabled: self.enabled,
            ..Checked::default()
        };
        if let Some(e) = &self.endpoint {
            c.endpoint =
                Some(endpoint_url(e.get_ref()).map_err(|m| Problem::At(at(&e.span()), m))?);
        }
        if let Some(p) = &self.protocol {
            c.protocol =
                Some(Protocol::parse(p.get_ref()).map_err(|m| Problem::At(at(&p.span()), m))?);
        }
        if let Some(i) = &self.interval {
            let d = duration(i.get_ref(), "interval").map_err(|m| Problem::At(at(&i.span()), m))?;
            c.interval = Some((d, i.span().start));
        }
        if let Some(t) = &self.timeout {
            c.timeout =
                Some(duration(t.get_ref(), "timeout").map_err(|m| Problem::At(at(&t.span()), m))?);
        }
        for (name, value) in &self.headers {
            let here = |m| Problem::At(at(&value.span()), m);
            let n = header_name(name).map_err(here)?;
            let v = match value.get_ref() {
                HeaderValue::Inline(s) => s.clone(),
                HeaderValue::File { file } => {
                    let bytes = read_file(&beside(config, file), "header file").map_err(here)?;
                    String::from_utf8(bytes)
                        .map_err(|_| here(format!("header file {}: not UTF-8", file.display())))?
                        .trim_end_matches(['\n', '\r'])
                        .to_string()
                }
            };
            c.headers
                .push((n.clone(), header_value(&n, &v).map_err(here)?));
        }
        if let Some(f) = &self.certificate {
            let path = beside(config, f.get_ref());
            let pem = read_file(&path, "certificate").map_err(|m| Problem::At(at(&f.span()), m))?;
            pem_check(&pem, "certificate", &path, false)
                .map_err(|m| Problem::At(at(&f.span()), m))?;
            c.certificate = Some((path, pem));
        }
        match (&self.client_certificate, &self.client_key) {
            (None, None) => {}
            (Some(cert), Some(key)) => {
                let (cp, kp) = (
                    beside(config, cert.get_ref()),
                    beside(config, key.get_ref()),
                );
                let cpem = read_file(&cp, "client_certificate")
                    .map_err(|m| Problem::At(at(&cert.span()), m))?;
                pem_check(&cpem, "client_certificate", &cp, false)
                    .map_err(|m| Problem::At(at(&cert.span()), m))?;
                let kpem =
                    read_file(&kp, "client_key").map_err(|m| Problem::At(at(&key.span()), m))?;
                pem_check(&kpem, "client_key", &kp, true)
                    .map_err(|m| Problem::At(at(&key.span()), m))?;
                c.client = Some((cpem, kpem));
            }
            (Some(one), None) | (None, Some(one)) => {
                return Err(Problem::At(
                    at(&one.span()),
                    "client_certificate and client_key go together; set both or neither".into(),
                ))
            }
        }
        c.resource = self.resource_attributes.into_iter().collect();
        Ok(c)
    }
}

/// An endpoint as given: an absolute `http` or `https` URL.
fn endpoint_url(s: &str) -> Result<String, String> {
    let uri: hyper::Uri = s
        .parse()
        .map_err(|e| format!("invalid endpoint '{s}': {e}; write e.g. 'http://collector:4318'"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(_)) => Ok(s.to_string()),
        _ => Err(format!(
            "endpoint '{s}' is not an http:// or https:// URL with a host; write e.g. \
             'http://collector:4318'"
        )),
    }
}

/// The http/protobuf URL of a base endpoint (the generic variable, the file's key): `v1/metrics`
/// appended to its path, as the specification says.
fn with_metrics_path(base: &str) -> String {
    format!("{}/v1/metrics", base.trim_end_matches('/'))
}

/// `k1=v1,k2=v2` with percent-encoded values (the W3C Baggage form the specification gives
/// for `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_RESOURCE_ATTRIBUTES`).
fn key_values(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("'{item}' is not key=value"))?;
        out.push((k.trim().to_string(), percent_decode(v.trim())?));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-encoding in '{s}'"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("'{s}' is not UTF-8 once decoded"))
}

/// The environment variable of a key: the signal-specific one, else the generic one.
fn var<'a>(
    env: &dyn Fn(&str) -> Option<String>,
    key: &'a str,
) -> Option<(&'static str, String, bool)> {
    let (metrics, generic): (&'static str, &'static str) = match key {
        "ENDPOINT" => (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        "PROTOCOL" => (
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        "HEADERS" => (
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ),
        "TIMEOUT" => (
            "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ),
        "CERTIFICATE" => (
            "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        ),
        "CLIENT_CERTIFICATE" => (
            "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        ),
        "CLIENT_KEY" => (
            "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        ),
        _ => return None,
    };
    let get = |n: &str| env(n).filter(|v| !v.trim().is_empty());
    get(metrics)
        .map(|v| (metrics, v, true))
        .or_else(|| get(generic).map(|v| (generic, v, false)))
}

/// The file's `[otlp]` with the environment applied: `None` when the exporter is off.
/// `interval`'s offset comes back with an error about it (the poll check is the caller's).
pub fn resolve(
    file: Checked,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<OtlpConfig>, Problem> {
    let env_endpoint = var(env, "ENDPOINT");
    let no_endpoint = file.endpoint.is_none() && env_endpoint.is_none();
    if file.enabled == Some(false) || (no_endpoint && file.enabled != Some(true)) {
        return Ok(None);
    }
    let protocol = match (file.protocol, var(env, "PROTOCOL")) {
        (Some(p), _) => p,
        (None, Some((name, v, _))) => Protocol::parse(&v).map_err(|m| Problem::Env(name, m))?,
        (None, None) => Protocol::HttpProtobuf,
    };
    let endpoint = match (&file.endpoint, env_endpoint) {
        (Some(e), _) => match protocol {
            Protocol::HttpProtobuf => with_metrics_path(e),
            Protocol::Grpc => e.clone(),
        },
        (None, Some((name, v, signal))) => {
            let v = endpoint_url(v.trim()).map_err(|m| Problem::Env(name, m))?;
            match (protocol, signal) {
                // The signal-specific variable is used as it is.
                (Protocol::HttpProtobuf, false) => with_metrics_path(&v),
                _ => v,
            }
        }
        (None, None) => match protocol {
            Protocol::HttpProtobuf => "http://localhost:4318/v1/metrics".to_string(),
            Protocol::Grpc => "http://localhost:4317".to_string(),
        },
    };
    let timeout = match (file.timeout, var(env, "TIMEOUT")) {
        (Some(t), _) => t,
        (None, Some((name, v, _))) => {
            let ms: u64 = v.trim().parse().map_err(|_| {
                Problem::Env(
                    name,
                    format!("'{v}' is not a whole number of milliseconds (e.g. 10000)"),
                )
            })?;
            Duration::from_millis(ms.clamp(100, 3_600_000))
        }
        (None, None) => DEFAULT_TIMEOUT,
    };
    let interval = match (file.interval, env("OTEL_METRIC_EXPORT_INTERVAL")) {
        (Some((d, _)), _) => d,
        (None, Some(v)) if !v.trim().is_empty() => {
            let ms: u64 = v.trim().parse().map_err(|_| {
                Problem::Env(
                    "OTEL_METRIC_EXPORT_INTERVAL",
                    format!("'{v}' is not a whole number of milliseconds (e.g. 60000)"),
                )
            })?;
            Duration::from_millis(ms)
        }
        _ => DEFAULT_INTERVAL,
    };
    // Headers: the environment's, then the file's (which win on the same name).
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    if let Some((name, v, _)) = var(env, "HEADERS") {
        for (k, val) in key_values(&v).map_err(|m| Problem::Env(name, m))? {
            let k = header_name(&k).map_err(|m| Problem::Env(name, m))?;
            let val = header_value(&k, &val).map_err(|m| Problem::Env(name, m))?;
            headers.insert(k, val);
        }
    }
    headers.extend(file.headers);
    let ca = match file.certificate {
        Some(c) => Some(c),
        None => match var(env, "CERTIFICATE") {
            Some((name, v, _)) => {
                let p = PathBuf::from(v.trim());
                let pem = read_file(&p, "certificate").map_err(|m| Problem::Env(name, m))?;
                pem_check(&pem, "certificate", &p, false).map_err(|m| Problem::Env(name, m))?;
                Some((p, pem))
            }
            None => None,
        },
    };
    let client = match file.client {
        Some(c) => Some(c),
        None => match (var(env, "CLIENT_CERTIFICATE"), var(env, "CLIENT_KEY")) {
            (None, None) => None,
            (Some((cn, c, _)), Some((kn, k, _))) => {
                let (cp, kp) = (PathBuf::from(c.trim()), PathBuf::from(k.trim()));
                let cpem = read_file(&cp, "client certificate").map_err(|m| Problem::Env(cn, m))?;
                pem_check(&cpem, "client certificate", &cp, false)
                    .map_err(|m| Problem::Env(cn, m))?;
                let kpem = read_file(&kp, "client key").map_err(|m| Problem::Env(kn, m))?;
                pem_check(&kpem, "client key", &kp, true).map_err(|m| Problem::Env(kn, m))?;
                Some((cpem, kpem))
            }
            (Some((n, _, _)), None) | (None, Some((n, _, _))) => {
                return Err(Problem::Env(
                    n,
                    "the client certificate and key go together; set both or neither".into(),
                ))
            }
        },
    };
    // Resource: OTEL_RESOURCE_ATTRIBUTES, the file's, then OTEL_SERVICE_NAME (which the
    // specification says wins over service.name in OTEL_RESOURCE_ATTRIBUTES).
    let mut resource: BTreeMap<String, String> = BTreeMap::new();
    if let Some(v) = env("OTEL_RESOURCE_ATTRIBUTES") {
        resource.extend(key_values(&v).map_err(|m| Problem::Env("OTEL_RESOURCE_ATTRIBUTES", m))?);
    }
    resource.extend(file.resource);
    if let Some(s) = env("OTEL_SERVICE_NAME").filter(|s| !s.trim().is_empty()) {
        resource.insert("service.name".into(), s.trim().to_string());
    }
    Ok(Some(OtlpConfig {
        protocol,
        endpoint,
        interval,
        timeout,
        headers: headers.into_iter().collect(),
        tls: TlsFiles { ca, client },
        resource: resource.into_iter().collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn file(text: &str) -> Checked {
        #[derive(Deserialize)]
        struct F {
            otlp: OtlpSection,
        }
        let f: F = toml::from_str(text).expect("toml");
        f.otlp.check(None).expect("valid")
    }

    #[test]
    fn off_without_an_endpoint_on_with_one_from_either_source() {
        assert_eq!(resolve(Checked::default(), &env(&[])), Ok(None));
        let c = resolve(
            Checked::default(),
            &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")]),
        )
        .expect("valid")
        .expect("on");
        assert_eq!(c.endpoint, "http://c:4318/v1/metrics");
        assert_eq!(c.protocol, Protocol::HttpProtobuf);
        assert_eq!(c.interval, DEFAULT_INTERVAL);
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        let off = file("[otlp]\nenabled = false\n");
        assert_eq!(
            resolve(
                off,
                &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")])
            ),
            Ok(None)
        );
    }

    #[test]
    fn the_signal_variable_is_used_as_is_and_wins_over_the_generic_one() {
        let c = resolve(
            Checked::default(),
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4318"),
                ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:9/custom"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b,X-Team=gpu"),
            ]),
        )
        .expect("valid")
        .expect("on");
        assert_eq!(c.endpoint, "http://m:9/custom");
        assert_eq!(c.protocol, Protocol::HttpProtobuf);
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(
            c.headers,
            [
                ("api-key".to_string(), "a b".to_string()),
                ("x-team".to_string(), "gpu".to_string())
            ]
        );
        let g = resolve(
            Checked::default(),
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ]),
        )
        .expect("valid")
        .expect("on");
        assert_eq!(g.endpoint, "http://generic:4317", "gRPC: nothing appended");
    }

    #[test]
    fn the_config_file_wins_over_the_environment_key_by_key() {
        let f = file(
            "[otlp]\nendpoint = \"https://file:4318\"\ninterval = \"30s\"\n\
             [otlp.headers]\nx-team = \"file\"\n",
        );
        let c = resolve(
            f,
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-team=env,x-other=1"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "service.name=x,deployment.environment=prod",
                ),
                ("OTEL_SERVICE_NAME", "gpu-agent"),
            ]),
        )
        .expect("valid")
        .expect("on");
        assert_eq!(c.endpoint, "https://file:4318/v1/metrics");
        assert_eq!(c.interval, Duration::from_secs(30));
        assert_eq!(c.timeout, Duration::from_secs(2), "unset in the file");
        assert_eq!(
            c.headers,
            [
                ("x-other".to_string(), "1".to_string()),
                ("x-team".to_string(), "file".to_string())
            ]
        );
        assert_eq!(
            c.resource,
            [
                ("deployment.environment".to_string(), "prod".to_string()),
                ("service.name".to_string(), "gpu-agent".to_string())
            ]
        );
    }

    #[test]
    fn bad_environment_values_name_the_variable() {
        let e = resolve(
            Checked::default(),
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ]),
        );
        assert!(
            matches!(&e, Err(Problem::Env("OTEL_EXPORTER_OTLP_PROTOCOL", m)) if m.contains("not supported")),
            "{e:?}"
        );
        let e = resolve(
            Checked::default(),
            &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]),
        );
        assert!(
            matches!(&e, Err(Problem::Env("OTEL_EXPORTER_OTLP_ENDPOINT", _))),
            "{e:?}"
        );
        let e = resolve(
            Checked::default(),
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k.pem"),
            ]),
        );
        assert!(
            matches!(&e, Err(Problem::Env("OTEL_EXPORTER_OTLP_CLIENT_KEY", m)) if m.contains("together")),
            "{e:?}"
        );
    }

    fn config_err(text: &str) -> String {
        super::super::from_text("c.toml", text, &super::super::Overrides::default())
            .map(|_| ())
            .expect_err("must be rejected")
            .to_string()
    }

    #[test]
    fn check_config_names_mistakes_with_positions() {
        let e = config_err(
            "[poller]\ninterval = \"5s\"\n[otlp]\nendpoint = \"http://c\"\ninterval = \"1s\"\n",
        );
        assert!(
            e.starts_with("c.toml:5:12: otlp interval '1s' is shorter than the poll interval '5s'"),
            "{e}"
        );
        let e = config_err("[otlp]\nprotocol = \"http/json\"\n");
        assert!(
            e.starts_with("c.toml:2:12: protocol 'http/json' is not supported"),
            "{e}"
        );
        let e = config_err("[otlp]\nendpoint = \"collector:4317\"\n");
        assert!(e.starts_with("c.toml:2:12:"), "{e}");
        let e = config_err("[otlp]\nendpont = \"http://c\"\n");
        assert!(e.starts_with("c.toml:2:1: unknown field `endpont`"), "{e}");
        let e = config_err("[otlp]\ntimeout = \"soon\"\n");
        assert!(e.starts_with("c.toml:2:11: invalid duration 'soon'"), "{e}");
        let e = config_err("[otlp]\nclient_key = \"/k.pem\"\n");
        assert!(
            e.starts_with("c.toml:2:14: client_certificate and client_key go together"),
            "{e}"
        );
        let e = config_err("[otlp]\ncertificate = \"/nonexistent/ca.pem\"\n");
        assert!(
            e.starts_with("c.toml:2:15: certificate /nonexistent/ca.pem:"),
            "{e}"
        );
        let e = config_err("[otlp.headers]\n\"bad header\" = \"x\"\n");
        assert!(
            e.starts_with("c.toml:2:16: invalid header name 'bad header'"),
            "{e}"
        );
        let e = config_err("[otlp.headers]\nauthorization = { file = \"/nonexistent/token\" }\n");
        assert!(
            e.starts_with("c.toml:2:17: header file /nonexistent/token:"),
            "{e}"
        );
        // Off by default, and the summary says so.
        let c = super::super::from_text("c.toml", "", &super::super::Overrides::default())
            .expect("valid");
        assert!(c.otlp.is_none());
        assert!(c.describe("").contains("otlp: off"), "{}", c.describe(""));
        let c = super::super::from_text(
            "c.toml",
            "[otlp]\nendpoint = \"http://c:4318\"\nprotocol = \"grpc\"\n[otlp.headers]\nx-token = \"s3cret\"\n",
            &super::super::Overrides::default(),
        )
        .expect("valid");
        let d = c.describe("");
        assert!(
            d.contains("otlp: metrics (grpc) to 'http://c:4318' every 1m")
                && d.contains("headers [x-token]"),
            "{d}"
        );
        assert!(!d.contains("s3cret"), "{d}");
    }

    #[test]
    fn a_header_from_a_file_is_read_without_its_newline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        std::fs::write(&token, "Bearer s3cret\n").expect("write");
        let text = format!(
            "[otlp]\nendpoint = \"http://c:4318\"\n[otlp.headers]\nauthorization = {{ file = \"{}\" }}\n",
            token.display()
        );
        let c = resolve(file(&text), &env(&[])).expect("valid").expect("on");
        assert_eq!(
            c.headers,
            [("authorization".to_string(), "Bearer s3cret".to_string())]
        );
        assert!(
            !format!("{c:?}").contains("s3cret"),
            "header values are never printed"
        );
    }
}
