//! The web configuration: TLS and basic authentication from a file in the format of the
//! Prometheus exporter-toolkit's web configuration (`--web.config.file` of node_exporter and
//! friends), so that one file and one set of bcrypt hashes serve every exporter on the node:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: /etc/gpu-steward/tls.crt
//!   key_file: /etc/gpu-steward/tls.key
//!   client_auth_type: RequireAndVerifyClientCert   # or NoClientCert, VerifyClientCertIfGiven
//!   client_ca_file: /etc/gpu-steward/clients-ca.crt
//!   min_version: TLS12                               # TLS12 or TLS13
//! http_server_config:
//!   headers:
//!     Strict-Transport-Security: max-age=31536000
//! basic_auth_users:
//!   prometheus: $2y$10$...                           # bcrypt, e.g. `htpasswd -nBC 10 prometheus`
//! ```
//!
//! What gpu-steward cannot do as exporter-toolkit does is refused with the reason rather than
//! ignored: TLS 1.0 and 1.1, Go cipher-suite and curve names (rustls offers only modern
//! suites), client certificates accepted without verification, and HTTP/2.
//!
//! Reading and checking only: the file becomes [`WebSettings`] (a built rustls configuration,
//! the checked bcrypt hashes, the allowed headers), so that `check-config` and the daemon's
//! start refuse the same files with the same words. Serving them (the authentication
//! middleware) is `http/web_config.rs`'s; this module must not import `http/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::{HeaderName, HeaderValue};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

/// The file as exporter-toolkit defines it (unknown keys are errors there too).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    tls_server_config: Option<TlsSection>,
    #[serde(default)]
    http_server_config: Option<HttpSection>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsSection {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    /// Inline PEM, as exporter-toolkit also accepts.
    cert: Option<String>,
    key: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<PathBuf>,
    client_allowed_sans: Option<Vec<String>>,
    min_version: Option<String>,
    max_version: Option<String>,
    cipher_suites: Option<Vec<String>>,
    curve_preferences: Option<Vec<String>>,
    prefer_server_cipher_suites: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpSection {
    http2: Option<bool>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// Response headers exporter-toolkit lets a web config set.
const ALLOWED_HEADERS: [&str; 5] = [
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
    "Content-Security-Policy",
];

/// A checked web configuration file.
pub struct WebSettings {
    pub path: PathBuf,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// User name → bcrypt hash (each parsed, of cost 8 or more).
    pub users: BTreeMap<String, String>,
    /// Response headers, each one exporter-toolkit allows, with a valid value.
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// Names the users but not their hashes.
impl std::fmt::Debug for WebSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSettings")
            .field("path", &self.path)
            .field("tls", &self.tls.is_some())
            .field("basic_auth_users", &self.users.keys().collect::<Vec<_>>())
            .field("headers", &self.headers)
            .finish()
    }
}

impl WebSettings {
    /// A one-line summary for `check-config` and the start log.
    pub fn describe(&self) -> String {
        describe(self.tls.is_some(), self.users.len())
    }
}

/// `TLS on|off, basic auth off|on (N users)`.
pub fn describe(tls: bool, users: usize) -> String {
    format!(
        "TLS {}, basic auth {}",
        if tls { "on" } else { "off" },
        match users {
            0 => "off".to_string(),
            n => format!("on ({n} user{})", if n == 1 { "" } else { "s" }),
        }
    )
}

/// Reads and checks the file: every error names the file, and YAML errors the line and column.
pub fn load(path: &Path) -> Result<WebSettings, String> {
    let text =
        crate::bounded::read_to_string(path, crate::bounded::Limits::provided(MAX_WEB_CONFIG))
            .map_err(|e| format!("web config {e}"))?;
    parse(path, &text)
}

/// The largest web config read (docs/configuration.md): a few users and paths, not a document.
pub const MAX_WEB_CONFIG: u64 = 1 << 20;

/// [`load`] on text already read (`path` names it in errors and anchors relative paths).
pub fn parse(path: &Path, text: &str) -> Result<WebSettings, String> {
    let at = |msg: String| format!("{}: {msg}", path.display());
    let file: File = if text.trim().is_empty() {
        File::default()
    } else {
        serde_yaml::from_str(text).map_err(|e| match e.location() {
            Some(l) => format!("{}:{}:{}: {e}", path.display(), l.line(), l.column()),
            None => at(e.to_string()),
        })?
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let tls = match file.tls_server_config {
        Some(t) => Some(Arc::new(tls_config(base, t).map_err(at)?)),
        None => None,
    };
    let mut headers = Vec::new();
    if let Some(http) = file.http_server_config {
        if http.http2 == Some(true) {
            return Err(at(
                "http_server_config.http2: true is not supported; gpu-steward serves HTTP/1.1 \
                 only (Prometheus scrapes over HTTP/1.1); remove the key or set it to false"
                    .into(),
            ));
        }
        for (name, value) in http.headers {
            let Some(allowed) = ALLOWED_HEADERS
                .iter()
                .find(|a| a.eq_ignore_ascii_case(&name))
            else {
                return Err(at(format!(
                    "http_server_config.headers: '{name}' cannot be set; allowed are {}",
                    ALLOWED_HEADERS.join(", ")
                )));
            };
            let value = HeaderValue::from_str(&value).map_err(|_| {
                at(format!(
                    "http_server_config.headers.{name}: the value is not a valid header value"
                ))
            })?;
            headers.push((HeaderName::from_static(lower(allowed)), value));
        }
    }
    let mut users = BTreeMap::new();
    for (user, hash) in file.basic_auth_users {
        if user.contains(':') {
            return Err(at(format!(
                "basic_auth_users: user name '{user}' contains ':', which basic auth cannot carry"
            )));
        }
        let parsed: bcrypt::HashParts = hash.parse().map_err(|e| {
            at(format!(
                "basic_auth_users.{user}: not a bcrypt hash ({e}); make one with \
                 `htpasswd -nBC 10 {user}` and keep the part after ':'"
            ))
        })?;
        if parsed.get_cost() < 8 {
            return Err(at(format!(
                "basic_auth_users.{user}: bcrypt cost {} is too cheap to guess against; use 10",
                parsed.get_cost()
            )));
        }
        users.insert(user, hash);
    }
    Ok(WebSettings {
        path: path.to_path_buf(),
        tls,
        users,
        headers,
    })
}

fn lower(h: &'static str) -> &'static str {
    match h {
        "Strict-Transport-Security" => "strict-transport-security",
        "X-Content-Type-Options" => "x-content-type-options",
        "X-Frame-Options" => "x-frame-options",
        "X-XSS-Protection" => "x-xss-protection",
        _ => "content-security-policy",
    }
}

fn tls_config(base: &Path, t: TlsSection) -> Result<rustls::ServerConfig, String> {
    // Settings first, files after: a wrong setting is reported without touching the disk.
    let (min, max) = tls_versions(&t)?;
    let resolve = |p: &PathBuf| {
        if p.is_absolute() {
            p.clone()
        } else {
            base.join(p)
        }
    };
    let (certs, key) = certificate_and_key(&t, &resolve)?;
    let versions: Vec<&'static rustls::SupportedProtocolVersion> =
        [(12, &rustls::version::TLS12), (13, &rustls::version::TLS13)]
            .into_iter()
            .filter(|(v, _)| (min..=max).contains(v))
            .map(|(_, p)| p)
            .collect();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| format!("tls_server_config: {e}"))?;
    let builder = match client_verifier(&t, &resolve, provider)? {
        None => builder.with_no_client_auth(),
        Some(verifier) => builder.with_client_cert_verifier(verifier),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls_server_config: the key does not fit the certificate: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The settings rustls cannot honour refused, and the protocol versions offered (12, 13).
fn tls_versions(t: &TlsSection) -> Result<(u8, u8), String> {
    if t.cipher_suites.is_some() || t.curve_preferences.is_some() {
        return Err(
            "tls_server_config: cipher_suites and curve_preferences name Go's suites; \
             gpu-steward (rustls) offers only TLS 1.2 ECDHE-AEAD and TLS 1.3 suites and \
             X25519/P-256/P-384; remove the keys"
                .into(),
        );
    }
    if t.client_allowed_sans.is_some() {
        return Err(
            "tls_server_config.client_allowed_sans is not supported; limit clients with \
             client_ca_file instead"
                .into(),
        );
    }
    let _ = t.prefer_server_cipher_suites; // rustls always follows the server's order.
    let version = |v: &Option<String>, key: &str| -> Result<Option<u8>, String> {
        match v.as_deref() {
            None => Ok(None),
            Some("TLS12") => Ok(Some(12)),
            Some("TLS13") => Ok(Some(13)),
            Some(other @ ("TLS10" | "TLS11")) => Err(format!(
                "tls_server_config.{key}: {other} is not offered (broken protocol versions); \
                 use TLS12 or TLS13"
            )),
            Some(other) => Err(format!(
                "tls_server_config.{key}: unknown version '{other}'; use TLS12 or TLS13"
            )),
        }
    };
    let min = version(&t.min_version, "min_version")?.unwrap_or(12);
    let max = version(&t.max_version, "max_version")?.unwrap_or(13);
    if min > max {
        return Err("tls_server_config: min_version is above max_version".into());
    }
    Ok((min, max))
}

/// The largest certificate, key or CA bundle read: a chain of a few certificates is a few KiB,
/// a system CA bundle about 200 KiB.
const MAX_PEM_FILE: u64 = 1 << 20;

/// A PEM file the web config names, read through the bounded reader (a regular file within
/// [`MAX_PEM_FILE`] and its deadline: a FIFO or a device there is refused, never waited on).
/// Errors name the file as the web config wrote it (`written`), then why.
fn pem_file(path: &Path, written: &Path, key: &str) -> Result<Vec<u8>, String> {
    crate::bounded::read(path, crate::bounded::Limits::provided(MAX_PEM_FILE)).map_err(|e| {
        format!(
            "tls_server_config.{key} {}: {}",
            written.display(),
            e.problem
        )
    })
}

/// The server's certificate chain and key, from files (relative to the web config) or inline.
fn certificate_and_key(
    t: &TlsSection,
    resolve: &dyn Fn(&PathBuf) -> PathBuf,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let certs: Vec<CertificateDer<'static>> = match (&t.cert_file, &t.cert) {
        (Some(f), None) => CertificateDer::pem_slice_iter(&pem_file(&resolve(f), f, "cert_file")?)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("tls_server_config.cert_file {}: {e}", f.display()))?,
        (None, Some(pem)) => CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("tls_server_config.cert: {e}"))?,
        _ => {
            return Err(
                "tls_server_config needs exactly one of cert_file and cert (and of key_file \
                 and key)"
                    .into(),
            )
        }
    };
    if certs.is_empty() {
        return Err("tls_server_config: the certificate file holds no certificate".into());
    }
    let key = match (&t.key_file, &t.key) {
        (Some(f), None) => PrivateKeyDer::from_pem_slice(&pem_file(&resolve(f), f, "key_file")?)
            .map_err(|e| format!("tls_server_config.key_file {}: {e}", f.display()))?,
        (None, Some(pem)) => PrivateKeyDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| format!("tls_server_config.key: {e}"))?,
        _ => {
            return Err(
                "tls_server_config needs exactly one of key_file and key (and of cert_file \
                 and cert)"
                    .into(),
            )
        }
    };
    Ok((certs, key))
}

/// How clients are verified: `None` asks for no certificate. A mode that would accept a
/// certificate nobody verified is refused.
fn client_verifier(
    t: &TlsSection,
    resolve: &dyn Fn(&PathBuf) -> PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>, String> {
    let client_roots = || -> Result<Arc<rustls::RootCertStore>, String> {
        let Some(f) = &t.client_ca_file else {
            return Err(format!(
                "tls_server_config.client_auth_type {} needs client_ca_file",
                t.client_auth_type.as_deref().unwrap_or("")
            ));
        };
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_slice_iter(&pem_file(&resolve(f), f, "client_ca_file")?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("tls_server_config.client_ca_file {}: {e}", f.display()))?;
        for c in certs {
            roots
                .add(c)
                .map_err(|e| format!("tls_server_config.client_ca_file {}: {e}", f.display()))?;
        }
        Ok(Arc::new(roots))
    };
    match t.client_auth_type.as_deref().unwrap_or("NoClientCert") {
        "NoClientCert" => Ok(None),
        mode @ ("RequireAndVerifyClientCert" | "VerifyClientCertIfGiven") => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                client_roots()?,
                provider,
            );
            let verifier = if mode == "VerifyClientCertIfGiven" {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            verifier
                .build()
                .map(Some)
                .map_err(|e| format!("tls_server_config.client_ca_file: {e}"))
        }
        other @ ("RequestClientCert" | "RequireAnyClientCert") => Err(format!(
            "tls_server_config.client_auth_type {other} accepts certificates nobody \
             verified; gpu-steward verifies what it asks for: use \
             RequireAndVerifyClientCert with client_ca_file"
        )),
        other => Err(format!(
            "tls_server_config.client_auth_type '{other}' is unknown; use NoClientCert, \
             VerifyClientCertIfGiven or RequireAndVerifyClientCert"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(Path::new("/etc/gpu-steward/web.yml"), text).expect_err("should be refused")
    }

    #[test]
    fn errors_name_the_file_the_place_and_the_fix() {
        let e = err("basic_auth_users:\n  prometheus: plain-text\n");
        assert!(
            e.starts_with(
                "/etc/gpu-steward/web.yml: basic_auth_users.prometheus: not a bcrypt hash"
            ),
            "{e}"
        );
        assert!(e.contains("htpasswd -nBC 10 prometheus"), "{e}");
        let e = err("tls_server_config:\n  cert_file: a\n  kye_file: b\n");
        assert!(e.starts_with("/etc/gpu-steward/web.yml:3:3:"), "{e}");
        assert!(e.contains("kye_file"), "{e}");
        let e = err("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS10\n");
        assert!(e.contains("use TLS12 or TLS13"), "{e}");
        let e = err("http_server_config:\n  headers:\n    Set-Cookie: x\n");
        assert!(e.contains("'Set-Cookie' cannot be set"), "{e}");
        let e = err("http_server_config:\n  http2: true\n");
        assert!(e.contains("HTTP/1.1 only"), "{e}");
        let e = err(
            "tls_server_config:\n  cert_file: /nonexistent/c.pem\n  key_file: /nonexistent/k.pem\n",
        );
        assert!(e.contains("cert_file /nonexistent/c.pem"), "{e}");
        let e = err("basic_auth_users:\n  p: \"$2y$04$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DSmpppmD4G6J8Khr8k2XS\"\n");
        assert!(e.contains("too cheap"), "{e}");
    }

    #[test]
    fn an_empty_file_turns_nothing_on() {
        let c = parse(Path::new("w.yml"), "\n").expect("empty is valid");
        assert!(c.tls.is_none() && c.users.is_empty() && c.headers.is_empty());
        assert_eq!(c.describe(), "TLS off, basic auth off");
    }

    /// Issue [25/28]: the TLS files are read through the bounded reader: a FIFO at `cert_file`
    /// is refused at once, naming the key, not waited on.
    #[test]
    fn a_fifo_as_the_certificate_is_refused_not_waited_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("tls.crt");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let text = format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            fifo.display(),
            fifo.display()
        );
        let t = std::time::Instant::now();
        let e = parse(&dir.path().join("web.yml"), &text).expect_err("a FIFO is no certificate");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            t.elapsed()
        );
        assert!(
            e.contains("tls_server_config.cert_file") && e.contains("FIFO"),
            "{e}"
        );
    }
}
