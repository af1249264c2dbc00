//! A small blocking HTTP/1.1 GET for the commands that ask the local agent (`status`): over
//! TCP (`http://HOST:PORT`) or the API's Unix socket. One request per connection
//! (`Connection: close`), a timeout on every read and write, bodies by `Content-Length`,
//! chunked or until the connection closes. No TLS: the agent's TLS port is for Prometheus;
//! a local tool uses the plain port on loopback or the socket.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// Where the agent is.
#[derive(Debug, Clone)]
pub enum Target {
    /// `host:port` of an `http://` URL.
    Tcp(String),
    Socket(PathBuf),
}

impl Target {
    /// From `--url` (`http://host:port`, a trailing `/` allowed) or `--socket`.
    pub fn new(url: Option<&str>, socket: Option<PathBuf>) -> Result<Target, String> {
        if let Some(s) = socket {
            return Ok(Target::Socket(s));
        }
        let url = url.unwrap_or("http://127.0.0.1:9400");
        if url.starts_with("https://") {
            return Err(format!(
                "'{url}': https is not supported here; ask the agent's plain port on loopback \
                 or its API socket (--socket)"
            ));
        }
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            format!("'{url}' is not an http:// URL; write it like http://127.0.0.1:9400")
        })?;
        let host = rest.trim_end_matches('/');
        if host.is_empty() || host.contains('/') {
            return Err(format!(
                "'{url}': give the agent's address only, like http://127.0.0.1:9400"
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
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

const TIMEOUT: Duration = Duration::from_secs(5);
/// More than any page the agent serves (a 16-GPU /metrics page is a few MB).
const MAX_BODY: usize = 64 << 20;

/// `GET path`; an error in words when the agent cannot be asked.
pub fn get(target: &Target, path: &str) -> Result<Answer, String> {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: gpu-steward-status\r\nConnection: close\r\n\r\n"
    );
    let raw = match target {
        Target::Tcp(host) => {
            let addr = host
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve '{host}': {e}"))?
                .next()
                .ok_or_else(|| format!("'{host}' has no address"))?;
            let s = TcpStream::connect_timeout(&addr, TIMEOUT)
                .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
            s.set_read_timeout(Some(TIMEOUT)).ok();
            s.set_write_timeout(Some(TIMEOUT)).ok();
            exchange(s, &request)
        }
        Target::Socket(p) => {
            let s = UnixStream::connect(p)
                .map_err(|e| format!("cannot connect to {}: {e}", p.display()))?;
            s.set_read_timeout(Some(TIMEOUT)).ok();
            s.set_write_timeout(Some(TIMEOUT)).ok();
            exchange(s, &request)
        }
    }
    .map_err(|e| format!("{}{path}: {e}", target.describe()))?;
    parse(&raw).map_err(|e| format!("{}{path}: {e}", target.describe()))
}

fn exchange<S: Read + Write>(mut s: S, request: &str) -> Result<Vec<u8>, String> {
    s.write_all(request.as_bytes())
        .map_err(|e| format!("cannot send the request: {e}"))?;
    let mut raw = Vec::new();
    s.take(MAX_BODY as u64)
        .read_to_end(&mut raw)
        .map_err(|e| format!("no complete answer: {e}"))?;
    Ok(raw)
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
        assert!(
            matches!(Target::new(Some("http://127.0.0.1:9400/"), None), Ok(Target::Tcp(h)) if h == "127.0.0.1:9400")
        );
        assert!(Target::new(Some("https://x:1"), None)
            .is_err_and(|e| e.contains("https is not supported")));
        assert!(Target::new(Some("127.0.0.1:9400"), None).is_err_and(|e| e.contains("http://")));
        let a = parse(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\nokEXTRA")
            .expect("parse");
        assert_eq!((a.status, a.body.as_slice()), (503, &b"ok"[..]));
        let a = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
            .expect("parse");
        assert_eq!(a.body, b"abcde");
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nabc").is_err());
    }
}
