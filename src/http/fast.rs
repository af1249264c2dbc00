//! `GET /metrics` over plain TCP, answered by the connection itself rather than by hyper.
//!
//! Under scrape load, half of the agent's own CPU went to the layers between the socket and
//! the page: hyper's dispatcher, its header maps and response encoder, axum's router and the
//! boxed futures and timer entries each request makes. nginx, serving the same bytes, parses a
//! line and calls `sendfile`. This path does the same for the one request that comes by the
//! thousand: it reads the request head into a small buffer, and when the head is a plain
//! `GET /metrics` over HTTP/1.1 it writes the response head, the scrape's own lines and the page
//! (from its memfd, see `sendfile`) itself.
//!
//! Anything else goes to hyper, with the bytes read so far, and hyper serves the rest of the
//! connection as before: every other path, `HEAD`, a query string, HTTP/1.0, a request with a
//! body or an `Expect`, `Connection` or `Upgrade` header, a head httparse refuses or with more
//! than 32 headers, a head over the 64 KiB limit (hyper answers 431), and a request over the
//! `max_connections` cap (hyper answers 503 and closes). The web config's basic auth and
//! headers, and TLS, turn this path off: those connections are all hyper's.
//!
//! The connection's limits hold here as they do under hyper: reads go through `Metered` (the
//! head budget and the write timeout), the header timeout runs from the start of each request
//! head (the first one, and each one after a keep-alive response), a response holds a request
//! permit and marks the connection serving, an evicted or shut-down connection that waits for
//! a request closes, and one that is answering finishes first.
//!
//! Must not: answer anything but `GET /metrics`, or hold a partial head past the header timeout.

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::admission::{Registry, Slot};
use super::sendfile::Hints;
use super::server::MAX_HEAD_BYTES;
use super::AppState;
use crate::metrics::CONTENT_TYPE;

/// Headers a request on this path may have; more go to hyper (which takes 100).
const MAX_HEADERS: usize = 32;

/// Bytes read at a time; a scrape's head is a few hundred.
const READ_CHUNK: usize = 4096;

/// What a connection's fast path works with.
pub(super) struct Conn<'a> {
    pub state: &'a AppState,
    pub hints: &'a Hints,
    pub requests: &'a Arc<Semaphore>,
    pub registry: &'a Arc<Registry>,
    pub slot: &'a Arc<Slot>,
    pub id: u64,
    pub header_timeout: Duration,
    pub peer: super::ahead::Peer,
}

/// How the fast path left a connection.
#[derive(Debug)]
pub(super) enum End {
    /// Closed, timed out, failed, evicted or shut down: nothing more to do.
    Closed,
    /// A request for hyper: these bytes were read and not answered.
    HandOff(BytesMut),
}

/// What the bytes read so far hold.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// A whole `GET /metrics` head of `len` bytes.
    Scrape { len: usize, gzip: bool },
    /// The start of a head.
    Partial,
    /// Another request, or one this path does not answer.
    Other,
}

/// Serves `GET /metrics` requests on `io` until another request comes (handed back) or the
/// connection ends.
pub(super) async fn serve<S>(io: &mut S, c: &Conn<'_>) -> End
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut head = Vec::with_capacity(256);
    // One timer per connection rather than one per request: it is moved on only when it fires
    // before the current head's deadline.
    let mut deadline = Instant::now() + c.header_timeout;
    let timer = tokio::time::sleep_until(deadline);
    tokio::pin!(timer);
    loop {
        match parse(&buf) {
            Head::Scrape { len, gzip } => {
                // A pipelined request met after shutdown began is not started.
                if c.registry.closing() {
                    return End::Closed;
                }
                let serving = c.registry.serving(c.id);
                let Ok(permit) = c.requests.clone().try_acquire_owned() else {
                    // Hyper answers the cap's 503, with its reason, and closes.
                    drop(serving);
                    return End::HandOff(buf);
                };
                buf.advance(len);
                let (parts, gzip) = super::scrape(c.state, gzip, Some(c.hints), c.peer).await;
                response_head(&mut head, parts[0].len() + parts[1].len(), gzip);
                let sent = write_all(io, [&head, &parts[0], &parts[1]]).await;
                drop(permit);
                drop(serving);
                if sent.is_err() {
                    return End::Closed;
                }
                deadline = Instant::now() + c.header_timeout;
                continue;
            }
            Head::Other => return End::HandOff(buf),
            // Hyper refuses it with 431, as it would have.
            Head::Partial if buf.len() > MAX_HEAD_BYTES => return End::HandOff(buf),
            Head::Partial => {}
        }
        if buf.capacity() - buf.len() < READ_CHUNK / 2 {
            buf.reserve(READ_CHUNK);
        }
        tokio::select! {
            biased;
            // Waiting for a request: whether evicted or shutting down, closing loses no answer.
            _ = c.slot.woken(c.registry) => return End::Closed,
            () = &mut timer => {
                if Instant::now() >= deadline {
                    return End::Closed;
                }
                timer.as_mut().reset(deadline);
            }
            read = io.read_buf(&mut buf) => match read {
                Ok(0) | Err(_) => return End::Closed,
                Ok(_) => {}
            },
        }
    }
}

/// Reads the head at the start of `buf`.
fn parse(buf: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let len = match request.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Head::Partial,
        Err(_) => return Head::Other,
    };
    if request.method != Some("GET")
        || request.path != Some("/metrics")
        || request.version != Some(1)
    {
        return Head::Other;
    }
    let refused = [
        "content-length",
        "transfer-encoding",
        "connection",
        "expect",
        "upgrade",
    ];
    if request
        .headers
        .iter()
        .any(|h| refused.iter().any(|n| h.name.eq_ignore_ascii_case(n)))
    {
        return Head::Other;
    }
    let accept = request
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("accept-encoding"))
        .map(|h| h.value);
    Head::Scrape {
        len,
        gzip: super::accepts_gzip(accept),
    }
}

/// The head hyper writes for the router's `/metrics` answer, byte for byte.
fn response_head(out: &mut Vec<u8>, len: usize, gzip: bool) {
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-type: ");
    out.extend_from_slice(CONTENT_TYPE.as_bytes());
    out.extend_from_slice(b"\r\nvary: Accept-Encoding\r\n");
    if gzip {
        out.extend_from_slice(b"content-encoding: gzip\r\n");
    }
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
    out.extend_from_slice(b"\r\ndate: ");
    DATE.with(|cached| {
        let mut cached = cached.borrow_mut();
        let now = SystemTime::now();
        let second = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if cached.0 != second || cached.1.is_empty() {
            *cached = (second, httpdate::fmt_http_date(now));
        }
        out.extend_from_slice(cached.1.as_bytes());
    });
    out.extend_from_slice(b"\r\n\r\n");
}

thread_local! {
    /// The `date` header's value and the second it names, as hyper caches it.
    static DATE: std::cell::RefCell<(u64, String)> = const {
        std::cell::RefCell::new((0, String::new()))
    };
}

/// Writes the three parts with vectored writes, so that the socket sees the page's own memory
/// (and sends it from its file) and the head leaves with the page's start.
async fn write_all<S: AsyncWrite + Unpin>(io: &mut S, parts: [&[u8]; 3]) -> io::Result<()> {
    let mut slices = parts.map(IoSlice::new);
    let mut bufs: &mut [IoSlice<'_>] = &mut slices;
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let n = io.write_vectored(bufs).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// A stream that yields `unread` before what comes from `inner`: the connection as hyper gets
/// it after the fast path read part of it.
pub(super) struct Rewind<S> {
    unread: BytesMut,
    inner: S,
}

impl<S> Rewind<S> {
    pub fn new(unread: BytesMut, inner: S) -> Rewind<S> {
        Rewind { unread, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.unread.is_empty() {
            return std::pin::Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let n = this.unread.len().min(buf.remaining());
        buf.put_slice(&this.unread[..n]);
        this.unread.advance(n);
        if this.unread.is_empty() {
            // Its buffer is not needed any more.
            this.unread = BytesMut::new();
        }
        std::task::Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[path = "fast_tests.rs"]
mod tests;
