//! `sendfile` over a real loopback socket. A handler offers a page whose file holds *different*
//! bytes of the same length than its memory, so what the client receives says which path sent
//! each byte: the file's bytes came by `sendfile`, the memory's by `writev`.

use std::ffi::CStr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

use super::sendfile::{FileBacked, Hints, PageFile};
use super::server::{roomy, serve_with};

const NAME: &CStr = c"gpu-steward-test";

/// A page of `len` bytes that differ from position to position (a shifted slice would show).
fn page(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| b'a' + ((i / 7 + i % 13 + usize::from(salt)) % 26) as u8)
        .collect()
}

struct Served {
    port: u16,
    file_bytes: Vec<u8>,
    memory_bytes: Vec<u8>,
    /// The last connection's offers, as its handler saw them.
    hints: Arc<std::sync::Mutex<Option<Hints>>>,
    _stop: watch::Sender<bool>,
}

impl Served {
    /// Waits until the connection holds no offer: the server withdraws it right after its
    /// last `sendfile` returns, which may be a moment after the client has read the bytes.
    async fn until_nothing_offered(&self) {
        let hints = self.hints.lock().expect("lock").clone();
        let hints = hints.expect("a request reached the handler");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while hints.offered() > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} offers left",
                hints.offered()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// A server whose `/page` offers a page held as `memory_bytes` in memory and `file_bytes` in
/// its file, and answers it after `prefix`.
async fn serve(len: usize, prefix: &'static str) -> Served {
    let file_bytes = page(len, 0);
    let memory_bytes = page(len, 1);
    assert_ne!(file_bytes, memory_bytes);
    let file = Arc::new(PageFile::new(NAME, &file_bytes).expect("memfd"));
    let memory = Bytes::from(memory_bytes.clone());
    let seen = Arc::new(std::sync::Mutex::new(None));
    let hints_slot = seen.clone();
    let app = Router::new().route(
        "/page",
        get(move |request: Request| {
            let memory = memory.clone();
            let file = file.clone();
            let seen = seen.clone();
            async move {
                let origin = request.extensions().get::<super::Origin>();
                if let Some(hints) = origin.and_then(|o| o.hints.as_ref()) {
                    hints.offer(FileBacked::new(memory.clone(), file).expect("same length"));
                    *seen.lock().expect("lock") = Some(hints.clone());
                }
                let parts = [Bytes::from_static(prefix.as_bytes()), memory];
                axum::response::Response::new(Body::new(super::Parts::new(parts)))
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (stop, stop_rx) = watch::channel(false);
    let (limits, derived) = roomy();
    tokio::spawn(serve_with(
        listener, app, None, limits, derived, None, stop_rx,
    ));
    Served {
        port,
        file_bytes,
        memory_bytes,
        hints: hints_slot,
        _stop: stop,
    }
}

/// Reads one response with a `content-length` body off `s`.
async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>, pause: Option<Duration>) -> Vec<u8> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .expect("content-length")
                .trim()
                .parse()
                .expect("a length");
            while buf.len() < end + 4 + len {
                read_some(s, buf, pause).await;
            }
            let body = buf[end + 4..end + 4 + len].to_vec();
            buf.drain(..end + 4 + len);
            return body;
        }
        read_some(s, buf, pause).await;
    }
}

async fn read_some(s: &mut TcpStream, buf: &mut Vec<u8>, pause: Option<Duration>) {
    let mut chunk = [0u8; 4096];
    if let Some(pause) = pause {
        tokio::time::sleep(pause).await;
    }
    let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut chunk))
        .await
        .expect("the response in time")
        .expect("read");
    assert!(n > 0, "closed mid-response after {} bytes", buf.len());
    buf.extend_from_slice(&chunk[..n]);
}

fn expected(prefix: &str, bytes: &[u8]) -> Vec<u8> {
    [prefix.as_bytes(), bytes].concat()
}

#[tokio::test]
async fn an_offered_page_goes_out_from_its_file_after_the_unoffered_prefix() {
    let served = serve(300_000, "prefix written from memory\n").await;
    let mut s = TcpStream::connect(("127.0.0.1", served.port))
        .await
        .expect("connect");
    s.write_all(b"GET /page HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("write");
    let body = read_response(&mut s, &mut Vec::new(), None).await;
    assert!(body == expected("prefix written from memory\n", &served.file_bytes));
    assert!(body != expected("prefix written from memory\n", &served.memory_bytes));
    // The connection stays open and holds no page once the response is out.
    served.until_nothing_offered().await;
}

#[tokio::test]
async fn a_slow_reader_gets_the_rest_of_the_page_from_the_file_at_the_right_offset() {
    let served = serve(2_000_000, "p\n").await;
    // A small receive window: the server's sends stop short and wait many times.
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(8 * 1024).expect("rcvbuf");
    let mut s = socket
        .connect(([127, 0, 0, 1], served.port).into())
        .await
        .expect("connect");
    s.write_all(b"GET /page HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("write");
    let body = read_response(&mut s, &mut Vec::new(), Some(Duration::from_micros(200))).await;
    assert_eq!(body.len(), 2_000_002);
    assert!(
        body == expected("p\n", &served.file_bytes),
        "bytes out of place"
    );
}

#[tokio::test]
async fn pipelined_requests_each_get_the_whole_page_from_the_file() {
    let served = serve(200_000, "").await;
    let mut s = TcpStream::connect(("127.0.0.1", served.port))
        .await
        .expect("connect");
    s.write_all(&b"GET /page HTTP/1.1\r\nHost: t\r\n\r\n".repeat(5))
        .await
        .expect("write");
    let mut buf = Vec::new();
    for i in 0..5 {
        let body = read_response(&mut s, &mut buf, None).await;
        assert!(body == served.file_bytes, "response {i}");
    }
    served.until_nothing_offered().await;
}

#[test]
fn the_file_is_sealed_against_change() {
    let file = PageFile::new(NAME, b"page").expect("memfd");
    assert_eq!(file.size(), 4);
    let err = file
        .try_write(b"x")
        .expect_err("a sealed file takes no write");
    assert_eq!(err.raw_os_error(), Some(nix::libc::EPERM), "{err}");
}

#[test]
fn only_slices_inside_the_offered_bytes_are_found_and_at_their_offset() {
    let bytes = Bytes::from(page(100, 0));
    let file = Arc::new(PageFile::new(NAME, &bytes).expect("memfd"));
    assert!(FileBacked::new(Bytes::from_static(b"short"), file.clone()).is_none());
    let hints = Hints::default();
    hints.offer(FileBacked::new(bytes.clone(), file).expect("same length"));
    assert_eq!(hints.find_offset(&bytes[10..20]), Some(10));
    assert_eq!(hints.find_offset(&bytes[..]), Some(0));
    assert_eq!(hints.find_offset(&bytes[..0]), None);
    let copy = bytes.to_vec();
    assert_eq!(
        hints.find_offset(&copy[10..20]),
        None,
        "equal bytes elsewhere in memory"
    );
    let longer = [&bytes[..], b"!"].concat();
    assert_eq!(hints.find_offset(&longer), None);
}

#[test]
fn offers_are_bounded_per_connection() {
    let hints = Hints::default();
    let pages: Vec<_> = (0..6)
        .map(|i| {
            let bytes = Bytes::from(page(50, i));
            let file = Arc::new(PageFile::new(NAME, &bytes).expect("memfd"));
            FileBacked::new(bytes, file).expect("same length")
        })
        .collect();
    for p in &pages {
        hints.offer(p.clone());
        hints.offer(p.clone());
    }
    assert_eq!(hints.offered(), 4);
    assert_eq!(
        hints.find_offset(&pages[0].bytes[..]),
        None,
        "the oldest went first"
    );
    assert_eq!(hints.find_offset(&pages[5].bytes[..]), Some(0));
}
