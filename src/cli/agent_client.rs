//! A small blocking HTTP/1.1 GET for the commands that ask the local agent (`status`,
//! `check-health`): over TCP (`http://HOST[:PORT]`) or the API's Unix socket. One request per
//! connection (`Connection: close`), the whole exchange bounded by one deadline (a hanging agent
//! costs the caller its timeout, no more), bodies by `Content-Length`, chunked or until the
//! connection closes. No TLS: the agent's TLS port is for Prometheus; a local tool uses the
//! plain port on loopback or the socket.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

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
}

/// An answer: status code and body.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// More than any page the agent serves (a 16-GPU /metrics page is a few MB).
const MAX_BODY: usize = 64 << 20;

/// `GET path`, all of it within `timeout`; an error in words when the agent cannot be asked.
pub fn get(target: &Target, path: &str, timeout: Duration) -> Result<Answer, String> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("no answer within {}", humantime::format_duration(timeout)))
    };
    let host = match target {
        Target::Tcp(h) => h.as_str(),
        Target::Socket(_) => "localhost",
    };
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: gpu-steward\r\nConnection: close\r\n\r\n"
    );
    let raw = match target {
        Target::Tcp(host) => {
            let with_port = if host
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            {
                host.clone()
            } else {
                format!("{host}:80")
            };
            let addr = with_port
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve '{host}': {e}"))?
                .next()
                .ok_or_else(|| format!("'{host}' has no address"))?;
            TcpStream::connect_timeout(&addr, left()?)
                .map_err(|e| format!("cannot connect to {addr}: {e}"))
                .and_then(|s| {
                    exchange(s, &request, &left, |s, t| {
                        s.set_read_timeout(Some(t))?;
                        s.set_write_timeout(Some(t))
                    })
                })
        }
        Target::Socket(p) => UnixStream::connect(p)
            .map_err(|e| format!("cannot connect: {e}"))
            .and_then(|s| {
                exchange(s, &request, &left, |s, t| {
                    s.set_read_timeout(Some(t))?;
                    s.set_write_timeout(Some(t))
                })
            }),
    }
    .map_err(|e| format!("{}{path}: {e}", target.describe()))?;
    parse(&raw).map_err(|e| format!("{}{path}: {e}", target.describe()))
}

/// Writes the request and reads to EOF, each step within what is left of the deadline.
fn exchange<S: Read + Write>(
    mut s: S,
    request: &str,
    left: &dyn Fn() -> Result<Duration, String>,
    set_timeout: impl Fn(&S, Duration) -> std::io::Result<()>,
) -> Result<Vec<u8>, String> {
    set_timeout(&s, left()?).map_err(|e| e.to_string())?;
    s.write_all(request.as_bytes())
        .map_err(|e| format!("cannot send the request: {e}"))?;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        set_timeout(&s, left()?).map_err(|e| e.to_string())?;
        match s.read(&mut chunk) {
            Ok(0) => return Ok(raw),
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                left()?;
            }
            Err(e) => return Err(format!("no complete answer: {e}")),
        }
        if raw.len() > MAX_BODY {
            return Err(format!("the answer is over {} MiB", MAX_BODY >> 20));
        }
    }
}

fn parse(raw: &[u8]) -> Result<Answer, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut res = httparse::Response::new(&mut headers);
    let head = match res.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Err("the answer ended in its headers".into()),
        Err(e) => return Err(format!("not an HTTP answer: {e}")),
    };
    let status = res.code.unwrap_or(0);
    let header = |name: &str| {
        res.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
    };
    let rest = &raw[head..];
    let body = if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        dechunk(rest)?
    } else if let Some(n) = header("content-length").and_then(|v| v.trim().parse::<usize>().ok()) {
        if rest.len() < n {
            return Err(format!("the body ended after {} of {n} bytes", rest.len()));
        }
        rest[..n].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Answer { status, body })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk size line has no end")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).map_err(|e| e.to_string())?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("bad chunk size '{size_text}'"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size + 2 {
            return Err("a chunk ended early".into());
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_bodies_read_every_way() {
        assert_eq!(
            Target::new(Some("http://127.0.0.1:9400/ignored"), None),
            Ok(Target::Tcp("127.0.0.1:9400".into()))
        );
        assert!(Target::new(Some("https://x:1"), None)
            .is_err_and(|e| e.contains("https is not supported")));
        assert!(Target::new(Some("127.0.0.1:9400"), None).is_err_and(|e| e.contains("http://")));
        assert!(Target::new(Some("http://"), None).is_err());
        // Nothing but a host reaches the request's head.
        assert!(Target::new(Some("http://a\r\nX-Evil: 1"), None).is_err());
        assert!(parse(b"SSH-2.0-OpenSSH\r\n").is_err());
        let a = parse(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\nokEXTRA")
            .expect("parse");
        assert_eq!((a.status, a.body.as_slice()), (503, &b"ok"[..]));
        let a = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
            .expect("parse");
        assert_eq!(a.body, b"abcde");
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nabc").is_err());
    }
}
