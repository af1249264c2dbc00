//! The connection's own `GET /metrics` path: what it takes and what it hands to hyper, its
//! answers against hyper's for the same request, and its timeouts, over real loopback sockets.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

use super::{parse, response_head, serve, Conn, End, Head, Rewind};
use crate::http::admission::{Admit, Registry, Ticket};
use crate::http::sendfile::{Hints, SendfileStream};
use crate::http::server::{roomy, serve_with, MAX_HEAD_BYTES};
use crate::http::tests::healthy;
use crate::http::AppState;

const SCRAPE: &[u8] =
    b"GET /metrics HTTP/1.1\r\nHost: node-1:9400\r\nUser-Agent: Prometheus/3.0\r\n\r\n";

#[test]
fn only_a_plain_get_of_metrics_over_http_1_1_is_taken() {
    assert_eq!(
        parse(SCRAPE),
        Head::Scrape {
            len: SCRAPE.len(),
            gzip: false
        }
    );
    let gzip = b"GET /metrics HTTP/1.1\r\naccept-encoding: identity\r\nAccept-Encoding: gzip;q=0.5\r\n\r\nGET";
    assert_eq!(
        parse(gzip),
        Head::Scrape {
            len: gzip.len() - 3,
            gzip: true
        }
    );
    for i in 0..SCRAPE.len() {
        assert_eq!(parse(&SCRAPE[..i]), Head::Partial, "{i} bytes");
    }
    let others: &[&[u8]] = &[
        b"HEAD /metrics HTTP/1.1\r\n\r\n",
        b"POST /metrics HTTP/1.1\r\n\r\n",
        b"GET /metrics?x=1 HTTP/1.1\r\n\r\n",
        b"GET /metrics/ HTTP/1.1\r\n\r\n",
        b"GET http://node-1/metrics HTTP/1.1\r\n\r\n",
        b"GET /livez HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.0\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nconnection: keep-alive\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nUpgrade: h2c\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nBad Header: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01",
    ];
    for other in others {
        assert_eq!(
            parse(other),
            Head::Other,
            "{}",
            String::from_utf8_lossy(other)
        );
    }
    // Over 32 headers: hyper's (it takes 100).
    let mut many = b"GET /metrics HTTP/1.1\r\n".to_vec();
    for i in 0..33 {
        many.extend_from_slice(format!("x-{i}: y\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert_eq!(parse(&many), Head::Other);
}

#[test]
fn the_response_head_names_length_encoding_and_date() {
    let mut head = Vec::new();
    response_head(&mut head, 150_749, false);
    let text = String::from_utf8(head.clone()).expect("ascii");
    let date = httpdate::fmt_http_date(std::time::SystemTime::now());
    let expected = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n\
         vary: Accept-Encoding\r\ncontent-length: 150749\r\ndate: {date}\r\n\r\n"
    );
    // The second may turn between the two clocks read.
    assert_eq!(text.len(), expected.len(), "{text}");
    assert!(text.starts_with(&expected[..expected.find("date: ").expect("date")]));
    response_head(&mut head, 11_321, true);
    let text = String::from_utf8(head).expect("ascii");
    assert!(
        text.contains("\r\nvary: Accept-Encoding\r\ncontent-encoding: gzip\r\ncontent-length: 11321\r\ndate: "),
        "{text}"
    );
}

/// What `serve` needs around one connection accepted by a test's own loop.
struct Around {
    hints: Hints,
    registry: Arc<Registry>,
    ticket: Ticket,
    requests: Arc<Semaphore>,
    state: AppState,
}

/// A connection: the client's end, the server's end as the server wraps it, and its context.
async fn accepted(permits: usize) -> (TcpStream, SendfileStream, Around) {
    accepted_by(Registry::new(16, 1 << 20), permits).await
}

/// The same, admitted by `registry`.
async fn accepted_by(
    registry: Arc<Registry>,
    permits: usize,
) -> (TcpStream, SendfileStream, Around) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let client = TcpStream::connect(listener.local_addr().expect("addr"))
        .await
        .expect("connect");
    let (server, peer) = listener.accept().await.expect("accept");
    let Admit::Open { ticket, .. } = registry.admit(peer.ip()) else {
        panic!("admitted");
    };
    let hints = Hints::default();
    let around = Around {
        hints: hints.clone(),
        registry,
        ticket,
        requests: Arc::new(Semaphore::new(permits)),
        state: healthy(),
    };
    (client, SendfileStream::new(server, hints), around)
}

impl Around {
    fn conn(&self, header_timeout: Duration) -> Conn<'_> {
        Conn {
            state: &self.state,
            hints: &self.hints,
            requests: &self.requests,
            registry: &self.registry,
            slot: self.ticket.slot(),
            id: self.ticket.id(),
            header_timeout,
            peer: None,
        }
    }
}

/// Reads one response with a `content-length` body: its head (lowercased) and body.
async fn response(s: &mut TcpStream, buf: &mut Vec<u8>) -> (String, Vec<u8>) {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .expect("content-length")
                .parse()
                .expect("length");
            if buf.len() >= end + 4 + len {
                let body = buf[end + 4..end + 4 + len].to_vec();
                buf.drain(..end + 4 + len);
                return (head, body);
            }
        }
        let mut chunk = [0u8; 65536];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("a response within 10 s")
            .expect("read");
        assert!(
            n > 0,
            "closed after {} bytes: {:?}",
            buf.len(),
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn gunzip(body: &[u8]) -> String {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(body), &mut text)
        .expect("gzip");
    text
}

/// The page's lines but the age of the snapshot, which is computed at each scrape.
fn lines_but_age(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with("gpu_steward_snapshot_age_seconds "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn scrapes_are_answered_until_another_request_which_is_handed_back_unread() {
    let (mut client, mut server, around) = accepted(4).await;
    let other = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n";
    let mut pipelined = SCRAPE.to_vec();
    pipelined.extend_from_slice(b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n");
    pipelined.extend_from_slice(other);
    client.write_all(&pipelined).await.expect("send");
    let conn = around.conn(Duration::from_secs(30));
    let (end, (plain_head, plain, gzip_head, gzipped, rest)) =
        tokio::join!(serve(&mut server, &conn), async {
            let mut buf = Vec::new();
            let (h1, b1) = response(&mut client, &mut buf).await;
            let (h2, b2) = response(&mut client, &mut buf).await;
            (h1, b1, h2, b2, buf)
        });
    let End::HandOff(unread) = end else {
        panic!("handed back, not {end:?}");
    };
    assert_eq!(&unread[..], other);
    assert!(
        plain_head.starts_with("http/1.1 200 ok\r\n"),
        "{plain_head}"
    );
    assert!(!plain_head.contains("content-encoding"), "{plain_head}");
    let plain = String::from_utf8(plain).expect("utf-8");
    assert!(plain.contains("DCGM_FI_DEV_GPU_UTIL{gpu=\"1\""), "{plain}");
    assert!(
        plain.contains("\ngpu_steward_snapshot_age_seconds "),
        "{plain}"
    );
    assert!(
        gzip_head.contains("\r\ncontent-encoding: gzip\r\n"),
        "{gzip_head}"
    );
    assert_eq!(lines_but_age(&gunzip(&gzipped)), lines_but_age(&plain));
    assert!(rest.is_empty(), "nothing but the two answers");
    // The page was sent from its file to its end: its offer is withdrawn.
    assert_eq!(around.hints.offered(), 0);
}

#[tokio::test]
async fn over_the_request_cap_the_request_is_handed_to_hyper_whole() {
    let (mut client, mut server, around) = accepted(0).await;
    client.write_all(SCRAPE).await.expect("send");
    let end = serve(&mut server, &around.conn(Duration::from_secs(30))).await;
    let End::HandOff(unread) = end else {
        panic!("handed back, not {end:?}");
    };
    assert_eq!(&unread[..], SCRAPE);
    // Not left marked as serving: shutdown would wait for it otherwise.
    assert_eq!(around.registry.counts(), (1, 1));
}

#[tokio::test]
async fn a_head_over_the_limit_goes_to_hyper_which_refuses_it() {
    let (mut client, mut server, around) = accepted(4).await;
    let mut huge = b"GET /metrics HTTP/1.1\r\nx-big: ".to_vec();
    huge.resize(MAX_HEAD_BYTES + 10, b'a');
    let conn = around.conn(Duration::from_secs(30));
    let (end, ()) = tokio::join!(serve(&mut server, &conn), async {
        client.write_all(&huge).await.expect("send");
    });
    let End::HandOff(unread) = end else {
        panic!("handed back, not {end:?}");
    };
    assert!(unread.len() > MAX_HEAD_BYTES);
    assert!(unread.len() <= huge.len());
}

#[tokio::test]
async fn the_header_timeout_runs_from_the_start_of_each_head() {
    let timeout = Duration::from_millis(300);
    // Silent after one answer: closed once the timeout has passed since that answer.
    let (mut client, mut server, around) = accepted(4).await;
    let conn = around.conn(timeout);
    let started = Instant::now();
    let (end, answered) = tokio::join!(serve(&mut server, &conn), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        client.write_all(SCRAPE).await.expect("send");
        let mut buf = Vec::new();
        response(&mut client, &mut buf).await;
        Instant::now()
    });
    assert!(matches!(end, End::Closed), "{end:?}");
    // 200 ms in, the first head came within its 300 ms; the second never came.
    assert!(answered.duration_since(started) >= Duration::from_millis(200));
    assert!(started.elapsed() >= answered.duration_since(started) + timeout);
    drop(server);
    let mut rest = Vec::new();
    assert_eq!(client.read_to_end(&mut rest).await.expect("read"), 0);

    // A head that trickles in and never ends: closed at the timeout, not at its last byte.
    let (mut client, mut server, around) = accepted(4).await;
    let conn = around.conn(timeout);
    let started = Instant::now();
    let (end, ()) = tokio::join!(serve(&mut server, &conn), async {
        for b in b"GET /metrics HTTP/1.1\r\nHost: " {
            if client.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    assert!(matches!(end, End::Closed), "{end:?}");
    assert!(started.elapsed() >= timeout);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_waiting_connection_closes_at_shutdown_and_eviction() {
    let (_client, mut server, around) = accepted(4).await;
    let conn = around.conn(Duration::from_secs(30));
    let (end, ()) = tokio::join!(serve(&mut server, &conn), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        around.registry.shutdown();
    });
    assert!(matches!(end, End::Closed), "{end:?}");

    // Evicted to make room for a newcomer from the same address (a budget of one).
    let (_client, mut server, around) = accepted_by(Registry::new(1, 1 << 20), 4).await;
    let conn = around.conn(Duration::from_secs(30));
    let (end, _newcomer) = tokio::join!(serve(&mut server, &conn), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        around.registry.admit(std::net::Ipv4Addr::LOCALHOST.into())
    });
    assert!(matches!(end, End::Closed), "{end:?}");
}

#[tokio::test]
async fn rewind_yields_the_unread_bytes_then_the_socket() {
    let (mut client, server, _around) = accepted(4).await;
    let mut stream = Rewind::new(BytesMut::from(&b"GET /he"[..]), server);
    client
        .write_all(b"alth HTTP/1.1\r\n\r\n")
        .await
        .expect("send");
    let mut got = Vec::new();
    let mut small = [0u8; 4];
    while got.len() < 24 {
        let n = stream.read(&mut small).await.expect("read");
        assert!(n > 0);
        got.extend_from_slice(&small[..n]);
    }
    assert_eq!(&got[..], b"GET /health HTTP/1.1\r\n\r\n");
    stream.write_all(b"written through").await.expect("write");
    drop(stream);
    let mut echoed = Vec::new();
    client.read_to_end(&mut echoed).await.expect("read");
    assert_eq!(&echoed[..], b"written through");
}

/// The server on a port, with or without the fast path, over the router of `state`.
async fn server(state: AppState, fast: bool) -> (u16, watch::Sender<bool>) {
    let app = super::super::router(state.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (stop, stop_rx) = watch::channel(false);
    let (limits, derived) = roomy();
    let scrape = fast.then_some(state);
    tokio::spawn(serve_with(
        listener, app, scrape, limits, derived, None, stop_rx,
    ));
    (port, stop)
}

/// Heads without their `date` and `content-length` (the age's digits vary) and bodies without
/// the live age line, for comparison; each body's length was checked against its header when
/// the next response was read after it.
fn comparable(
    (head, body): (String, Vec<u8>),
    gzip: bool,
) -> (String, std::collections::BTreeSet<String>) {
    let head = head
        .lines()
        .filter(|l| !l.starts_with("date: ") && !l.starts_with("content-length: "))
        .collect::<Vec<_>>()
        .join("\n");
    let text = if gzip {
        gunzip(&body)
    } else {
        String::from_utf8(body).expect("utf-8")
    };
    (head, lines_but_age(&text))
}

#[tokio::test]
async fn the_fast_answers_are_hypers_and_mixed_pipelines_are_answered_in_order() {
    let state = healthy();
    let (hyper_port, _stop_hyper) = server(state.clone(), false).await;
    let (fast_port, _stop_fast) = server(state, true).await;
    let requests = [
        (&b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"[..], false),
        (
            b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n",
            true,
        ),
        (b"GET /livez HTTP/1.1\r\n\r\n", false),
        (b"GET /metrics HTTP/1.1\r\n\r\n", false),
        (b"GET /nowhere HTTP/1.1\r\n\r\n", false),
        (
            b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n",
            true,
        ),
    ];
    let mut answers = Vec::new();
    for port in [hyper_port, fast_port] {
        let mut client = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        client
            .write_all(
                &requests
                    .iter()
                    .flat_map(|(r, _)| r.iter().copied())
                    .collect::<Vec<_>>(),
            )
            .await
            .expect("send");
        let mut buf = Vec::new();
        let mut got = Vec::new();
        for (_, gzip) in &requests {
            got.push(comparable(response(&mut client, &mut buf).await, *gzip));
        }
        answers.push(got);
    }
    for (i, (by_hyper, by_fast)) in answers[0].iter().zip(&answers[1]).enumerate() {
        assert_eq!(by_hyper.0, by_fast.0, "head of answer {i}");
        assert!(by_hyper.1 == by_fast.1, "body of answer {i} differs");
    }
    let statuses: Vec<&str> = answers[1]
        .iter()
        .map(|(head, _)| head.lines().next().unwrap_or(""))
        .collect();
    assert_eq!(
        statuses,
        [
            "http/1.1 200 ok",
            "http/1.1 200 ok",
            "http/1.1 200 ok",
            "http/1.1 200 ok",
            "http/1.1 404 not found",
            "http/1.1 200 ok"
        ]
    );
}

/// A client that sends its request and shuts down its side (`shutdown(SHUT_WR)`, as `nc -N`
/// and some HTTP/1.0 tools do) gets its answer on either path. Found by the `http_fast` fuzz
/// target: hyper without `half_close` dropped such a request unanswered when it read the EOF
/// before writing the response, on the fast server or the other by chance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_its_request_gets_the_answer() {
    let state = healthy();
    let (hyper_port, _stop_hyper) = server(state.clone(), false).await;
    let (fast_port, _stop_fast) = server(state, true).await;
    let requests: [&[u8]; 4] = [
        b"PH ;* HTTP/1.0\r\n\r\n",
        b"GET /nowhere HTTP/1.0\r\n\r\n",
        b"GET /livez HTTP/1.1\r\n\r\n",
        SCRAPE,
    ];
    for request in requests {
        for port in [hyper_port, fast_port] {
            for _ in 0..25 {
                let mut s = TcpStream::connect(("127.0.0.1", port))
                    .await
                    .expect("connect");
                s.write_all(request).await.expect("write");
                s.shutdown().await.expect("shutdown");
                let mut answer = Vec::new();
                tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
                    .await
                    .expect("closed within 10 s")
                    .expect("read");
                assert!(
                    answer.starts_with(b"HTTP/1."),
                    "{:?} on {}: {:?}",
                    String::from_utf8_lossy(request),
                    if port == fast_port {
                        "the fast server"
                    } else {
                        "hyper only"
                    },
                    String::from_utf8_lossy(&answer)
                );
            }
        }
    }
}
