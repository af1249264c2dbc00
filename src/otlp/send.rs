//! One OTLP export: http/protobuf (a `POST` of the encoded request with hyper's HTTP/1.1
//! client) or gRPC (`MetricsService/Export` with the generated tonic client), over TCP or TLS
//! (rustls, the CA bundle and client certificate of `[otlp]`). A fresh connection per export:
//! at one export a minute, keeping one open buys nothing and a broken one costs a retry.
//!
//! What the answer means is the specification's (protocol/exporter.md, "Retryable Response
//! Codes" and OTLP's "Failures"): HTTP 429, 502, 503, 504 and gRPC `UNAVAILABLE`,
//! `RESOURCE_EXHAUSTED`, `CANCELLED`, `DEADLINE_EXCEEDED`, `ABORTED`, `OUT_OF_RANGE`,
//! `DATA_LOSS` are retried (an HTTP `Retry-After` honoured); anything else is final.
//!
//! Must not: log (the task words failures), or wait longer than the timeout it is given.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use prost::Message;
use tokio::net::TcpStream;

use super::{OtlpConfig, Protocol};

/// The largest response body read (a partial success's message is short).
const MAX_RESPONSE: usize = 64 * 1024;
/// The longest `Retry-After` honoured; a collector asking for more is asked again sooner.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// How an export ended, short of success.
#[derive(Debug)]
pub enum Failure {
    /// Worth trying again (after `retry_after` when the collector said so).
    Retryable {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// The collector refused the data for good (a bad request, a wrong path): dropped.
    Final(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Retryable { reason, .. } | Failure::Final(reason) => f.write_str(reason),
        }
    }
}

/// What an accepted export said: the points it rejected and why (a partial success).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Accepted {
    pub rejected: i64,
    pub message: String,
}

/// Where exports go, with the TLS settings read once.
#[derive(Clone)]
pub struct Target {
    pub protocol: Protocol,
    pub uri: hyper::Uri,
    pub timeout: Duration,
    pub headers: Vec<(String, String)>,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Target {
    /// The target of a configuration; an unusable TLS setting is an error to report.
    pub fn new(c: &OtlpConfig) -> Result<Target, String> {
        let uri: hyper::Uri = c
            .endpoint
            .parse()
            .map_err(|e| format!("endpoint '{}': {e}", c.endpoint))?;
        let tls = match uri.scheme_str() {
            Some("https") => Some(Arc::new(tls_config(c)?)),
            _ => None,
        };
        Ok(Target {
            protocol: c.protocol,
            uri,
            timeout: c.timeout,
            headers: c.headers.clone(),
            tls,
        })
    }

    fn host_port(&self) -> (String, u16) {
        let host = self
            .uri
            .host()
            .unwrap_or("localhost")
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let default = match (self.protocol, self.tls.is_some()) {
            (_, true) => 443,
            (Protocol::HttpProtobuf, false) => 4318,
            (Protocol::Grpc, false) => 4317,
        };
        (host, self.uri.port_u16().unwrap_or(default))
    }
}

fn tls_config(c: &OtlpConfig) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let ca = match &c.tls.ca {
        Some((_, pem)) => pem.clone(),
        None => {
            let path = std::path::Path::new(crate::config::otlp::SYSTEM_CA_BUNDLE);
            crate::bounded::read(path, crate::bounded::Limits::provided(1 << 20)).map_err(|e| {
                format!(
                    "an https endpoint without [otlp] certificate uses {}: {}; set certificate \
                     to the collector's CA",
                    path.display(),
                    e.problem
                )
            })?
        }
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ca) {
        let cert = cert.map_err(|e| format!("CA bundle: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("CA bundle: a certificate is unusable: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    let mut config = match &c.tls.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("client certificate: {e}"))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("client key: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("client certificate and key: {e}"))?
        }
    };
    config.alpn_protocols = match c.protocol {
        Protocol::Grpc => vec![b"h2".to_vec()],
        Protocol::HttpProtobuf => vec![b"http/1.1".to_vec()],
    };
    Ok(config)
}

/// A connection to the target: TCP, with TLS when the endpoint is `https`.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

async fn connect(t: &Target) -> std::io::Result<Box<dyn Io>> {
    let (host, port) = t.host_port();
    let tcp = TcpStream::connect((host.as_str(), port)).await?;
    let _ = tcp.set_nodelay(true);
    match &t.tls {
        None => Ok(Box::new(tcp)),
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|e| std::io::Error::other(format!("server name '{host}': {e}")))?;
            let tls = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name, tcp)
                .await?;
            Ok(Box::new(tls))
        }
    }
}

/// One export within the target's timeout.
pub async fn export(
    t: &Target,
    request: &ExportMetricsServiceRequest,
) -> Result<Accepted, Failure> {
    let call = async {
        match t.protocol {
            Protocol::HttpProtobuf => http(t, request).await,
            Protocol::Grpc => grpc(t, request.clone()).await,
        }
    };
    match tokio::time::timeout(t.timeout, call).await {
        Ok(r) => r,
        Err(_) => Err(Failure::Retryable {
            reason: format!(
                "no answer within {} (timeout)",
                humantime::format_duration(t.timeout)
            ),
            retry_after: None,
        }),
    }
}

fn unreachable(e: impl std::fmt::Display) -> Failure {
    Failure::Retryable {
        reason: format!("cannot reach the collector: {e}"),
        retry_after: None,
    }
}

async fn http(t: &Target, request: &ExportMetricsServiceRequest) -> Result<Accepted, Failure> {
    let io = connect(t).await.map_err(unreachable)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(unreachable)?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let authority = t
        .uri
        .authority()
        .map_or_else(String::new, |a| a.as_str().to_string());
    let path = t.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = hyper::Request::post(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::CONTENT_TYPE, "application/x-protobuf")
        .header(
            hyper::header::USER_AGENT,
            concat!("gpu-steward/", env!("CARGO_PKG_VERSION")),
        );
    for (k, v) in &t.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .body(Full::new(Bytes::from(request.encode_to_vec())))
        .map_err(|e| Failure::Final(format!("cannot build the request: {e}")))?;
    let resp = sender.send_request(req).await.map_err(unreachable)?;
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get(hyper::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(retry_after);
    let body = Limited::new(resp.into_body(), MAX_RESPONSE)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    driver.abort();
    if status.is_success() {
        let r = ExportMetricsServiceResponse::decode(body).unwrap_or_default();
        return Ok(accepted(r));
    }
    // The collector's reason: a google.rpc.Status, whose message is field 2; shown as text
    // when it is not protobuf.
    let why = String::from_utf8_lossy(&body[..body.len().min(200)])
        .chars()
        .filter(|c| !c.is_control())
        .collect::<String>();
    let reason = format!("the collector answered HTTP {status}: {why}");
    match status.as_u16() {
        429 | 502 | 503 | 504 => Err(Failure::Retryable {
            reason,
            retry_after,
        }),
        _ => Err(Failure::Final(reason)),
    }
}

fn accepted(r: ExportMetricsServiceResponse) -> Accepted {
    r.partial_success
        .map(|p| Accepted {
            rejected: p.rejected_data_points,
            message: p.error_message,
        })
        .unwrap_or_default()
}

/// `Retry-After`: seconds, or an HTTP date (RFC 9110 10.2.3); at most [`MAX_RETRY_AFTER`].
pub fn retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    let d = match v.parse::<u64>() {
        Ok(s) => Duration::from_secs(s),
        Err(_) => httpdate::parse_http_date(v)
            .ok()?
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    };
    Some(d.min(MAX_RETRY_AFTER))
}

async fn grpc(t: &Target, request: ExportMetricsServiceRequest) -> Result<Accepted, Failure> {
    use tonic::transport::Endpoint;
    // tonic is built without its own TLS: the connector below makes the TLS connection, and
    // tonic is given the `http` form of the address.
    let (host, port) = t.host_port();
    let plain = if host.contains(':') {
        format!("http://[{host}]:{port}")
    } else {
        format!("http://{host}:{port}")
    };
    let endpoint = Endpoint::from_shared(plain).map_err(|e| Failure::Final(e.to_string()))?;
    let target = t.clone();
    let channel = endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let target = target.clone();
            async move { connect(&target).await.map(TokioIo::new) }
        }))
        .await
        .map_err(unreachable)?;
    let mut req = tonic::Request::new(request);
    for (k, v) in &t.headers {
        let key = tonic::metadata::MetadataKey::from_bytes(k.as_bytes())
            .map_err(|e| Failure::Final(format!("header '{k}': {e}")))?;
        let value = v
            .parse()
            .map_err(|_| Failure::Final(format!("the value of header '{k}' is not valid")))?;
        req.metadata_mut().insert(key, value);
    }
    let mut client = MetricsServiceClient::new(channel);
    match client.export(req).await {
        Ok(r) => Ok(accepted(r.into_inner())),
        Err(s) => {
            use tonic::Code;
            let reason = format!(
                "the collector answered gRPC {:?}: {}",
                s.code(),
                s.message()
            );
            match s.code() {
                Code::Unavailable
                | Code::ResourceExhausted
                | Code::Cancelled
                | Code::DeadlineExceeded
                | Code::Aborted
                | Code::OutOfRange
                | Code::DataLoss => Err(Failure::Retryable {
                    reason,
                    retry_after: None,
                }),
                _ => Err(Failure::Final(reason)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_or_a_date_and_is_capped() {
        assert_eq!(retry_after("7"), Some(Duration::from_secs(7)));
        assert_eq!(retry_after("86400"), Some(MAX_RETRY_AFTER));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO),
            "a date in the past: now"
        );
        let soon = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        let d = retry_after(&soon).expect("a date");
        assert!(
            d > Duration::from_secs(100) && d <= Duration::from_secs(120),
            "{d:?}"
        );
        assert_eq!(retry_after("soon"), None);
    }
}
