//! The HTTP/1.1 GET of the commands that ask the local agent (`status`, `check-health`): over
//! TCP (`http://HOST[:PORT]`) or the API's Unix socket, with hyper's client on a one-thread
//! runtime of its own.
//!
//! The agent may be hung, busy or not the agent at all, so everything is bounded: one deadline
//! over the whole exchange (resolve, connect, send, head and body: a full accept queue, a
//! server that accepts and never answers or one that trickles costs the caller its `--timeout`,
//! no more), a response head of at most [`MAX_HEAD`] bytes and a body of at most [`MAX_BODY`].
//! No TLS: the agent's TLS port is for Prometheus; a local tool uses the plain port on loopback
//! or the socket.
//!
//! This module must not be called from inside a tokio runtime (it starts its own), and must not
//! parse HTTP itself: hyper does, with the limits above.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;

/// Where the agent is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The `host[:port]` of an `http://` URL.
    Tcp(String),
    Socket(PathBuf),
}

/// The agent's default address.
pub const DEFAULT_URL: &str = "http://127.0.0.1:9400";

impl Target {
    /// From `--url` (`http://host[:port]`; a path after it is ignored) or `--socket`.
    pub fn new(url: Option<&str>, socket: Option<PathBuf>) -> Result<Target, String> {
        if let Some(s) = socket {
            return Ok(Target::Socket(s));
        }
        let url = url.unwrap_or(DEFAULT_URL);
        if url.starts_with("https://") {
            return Err(format!(
                "'{url}': https is not supported here; ask the agent's plain port on loopback \
                 or its API socket (--socket)"
            ));
        }
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("'{url}' is not an http:// URL; write it like {DEFAULT_URL}"))?;
        let host = rest.split('/').next().unwrap_or_default();
        if host.is_empty() {
            return Err(format!(
                "'{url}' names no host; write it like {DEFAULT_URL}"
            ));
        }
        if host
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '@')
        {
            return Err(format!(
                "'{}' has an unusable host; write it like {DEFAULT_URL}",
                url.escape_debug()
            ));
        }
        Ok(Target::Tcp(host.to_string()))
    }

    pub fn describe(&self) -> String {
        match self {
            Target::Tcp(h) => format!("http://{h}"),
            Target::Socket(p) => format!("unix:{}", p.display()),
        }
    }

    /// Whether the agent runs on this machine: its API socket, or a loopback address. Only such
    /// an agent's file paths mean the same files here.
    pub fn on_this_machine(&self) -> bool {
        let host = match self {
            Target::Socket(_) => return true,
            Target::Tcp(h) => h,
        };
        // `host[:port]`, `[v6]:port`.
        let name = match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or_default(),
            None => host.rsplit_once(':').map_or(host.as_str(), |(h, _)| h),
        };
        name.eq_ignore_ascii_case("localhost")
            || name
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

/// An answer: status code and body.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// More than any page the agent serves (a 16-GPU /metrics page is a few MB).
pub const MAX_BODY: usize = 64 << 20;

/// The most bytes hyper buffers for the status line and headers (the agent sends a few hundred).
pub const MAX_HEAD: usize = 64 << 10;

/// How often a connect to a Unix socket whose accept queue is full is tried again.
const FULL_QUEUE_RETRY: Duration = Duration::from_millis(20);

/// `GET path`, all of it within `timeout`; an error in words when the agent cannot be asked.
/// The error starts with the agent's address and the path.
pub fn get(target: &Target, path: &str, timeout: Duration) -> Result<Answer, String> {
    let whence = || format!("{}{path}", target.describe());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("{}: cannot start the HTTP client: {e}", whence()))?;
    let answer = runtime.block_on(async {
        tokio::time::timeout(timeout, exchange(target, path))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no answer within {}; is the agent busy or hung? give it more with --timeout",
                    humantime::format_duration(timeout)
                ))
            })
    });
    // A name lookup still running on the blocking pool must not hold the command past its
    // deadline: leave it behind.
    runtime.shutdown_background();
    answer.map_err(|e| format!("{}: {e}", whence()))
}

/// Connect, send and read the whole answer; bounded in time by the caller.
async fn exchange(target: &Target, path: &str) -> Result<Answer, String> {
    match target {
        Target::Tcp(host) => {
            let with_port = if host
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            {
                host.clone()
            } else {
                format!("{host}:80")
            };
            let addr = tokio::net::lookup_host(&with_port)
                .await
                .map_err(|e| format!("cannot resolve '{host}': {e}"))?
                .next()
                .ok_or_else(|| format!("'{host}' has no address"))?;
            let stream = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
            request(TokioIo::new(stream), host, path).await
        }
        Target::Socket(p) => {
            let stream = connect_unix(p).await?;
            request(TokioIo::new(stream), "localhost", path).await
        }
    }
}

/// Connects to a Unix socket. A non-blocking connect to a socket whose accept queue is full
/// fails at once with `EAGAIN` (a blocking one would wait without limit): tried again until the
/// caller's deadline, as a busy agent may accept soon.
async fn connect_unix(p: &std::path::Path) -> Result<tokio::net::UnixStream, String> {
    loop {
        match tokio::net::UnixStream::connect(p).await {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tokio::time::sleep(FULL_QUEUE_RETRY).await;
            }
            Err(e) => return Err(format!("cannot connect: {e}")),
        }
    }
}

/// One request on a fresh connection, the answer's body read up to [`MAX_BODY`].
async fn request<I>(io: I, host: &str, path: &str) -> Result<Answer, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD.max(8192))
        .handshake::<_, Empty<Bytes>>(io)
        .await
        .map_err(|e| format!("cannot start HTTP: {}", chain(&e)))?;
    // The connection is driven beside the request; its errors reach the request's future.
    let driver = tokio::spawn(connection);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::USER_AGENT, "gpu-steward")
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::new())
        .map_err(|e| format!("cannot build the request: {e}"))?;
    let response = sender
        .send_request(req)
        .await
        .map_err(|e| format!("no complete answer: {}", chain(&e)))?;
    let status = response.status().as_u16();
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                format!(
                    "the answer's body is over the limit of {} MiB; is this the agent?",
                    MAX_BODY >> 20
                )
            } else {
                format!("no complete answer: {}", chain(e.as_ref()))
            }
        })?
        .to_bytes()
        .to_vec();
    driver.abort();
    Ok(Answer { status, body })
}

/// An error with its causes, as hyper's own words are short ("error reading a body").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    crate::terminal::escape(&out).into_owned()
}

#[cfg(test)]
#[path = "agent_client_tests.rs"]
mod tests;
