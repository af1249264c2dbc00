//! The accept loop over a real loopback socket with a test router whose `/slow` answers only
//! when released, so that requests can be held in flight: the request cap, the probes' exemption,
//! the open budget, shutdown and the HTTP/2 answer, without the binary or NVML.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::prior_knowledge;
use super::server::{serve_with, Derived, Limits};

struct Server {
    port: u16,
    stop: watch::Sender<bool>,
    release: watch::Sender<bool>,
    entered: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

async fn start(max_connections: usize, open_budget: usize, drain: Duration) -> Server {
    let (release, released) = watch::channel(false);
    let entered = Arc::new(AtomicUsize::new(0));
    let inside = entered.clone();
    let app = Router::new()
        .route(
            "/slow",
            get(move || {
                let mut released = released.clone();
                let inside = inside.clone();
                async move {
                    inside.fetch_add(1, Ordering::SeqCst);
                    let _ = released.wait_for(|r| *r).await;
                    "slow\n"
                }
            }),
        )
        .route("/fast", get(|| async { "fast\n" }))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(|| async { "ready\n" }));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (stop, stop_rx) = watch::channel(false);
    let limits = Limits {
        max_connections,
        header_timeout: Duration::from_secs(60),
        drain,
    };
    let derived = Derived {
        open_budget,
        head_budget: 1 << 20,
        first_byte: Duration::from_secs(60),
    };
    let task = tokio::spawn(serve_with(listener, app, limits, derived, None, stop_rx));
    Server {
        port,
        stop,
        release,
        entered,
        task,
    }
}

async fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect")
}

/// Reads until the server closes; `None` if it did not within `within`.
async fn until_closed(s: &mut TcpStream, within: Duration) -> Option<String> {
    let mut buf = Vec::new();
    match tokio::time::timeout(within, s.read_to_end(&mut buf)).await {
        Ok(_) => Some(String::from_utf8_lossy(&buf).into_owned()),
        Err(_) => None,
    }
}

async fn get_on(s: &mut TcpStream, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    until_closed(s, Duration::from_secs(10))
        .await
        .expect("an answer")
}

async fn fetch(port: u16, path: &str) -> String {
    get_on(&mut connect(port).await, path).await
}

async fn wait_entered(server: &Server, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.entered.load(Ordering::SeqCst) < n {
        assert!(Instant::now() < deadline, "{n} requests never got in");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn requests_over_the_cap_get_a_503_with_the_reason_and_probes_still_pass() {
    let server = start(2, 64, Duration::from_secs(1)).await;
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(fetch(server.port, "/slow")))
        .collect();
    wait_entered(&server, 2).await;

    let refused = fetch(server.port, "/fast").await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.contains("too many requests being served (max_connections = 2)"),
        "{refused}"
    );
    assert!(refused.contains("retry-after: 1"), "{refused}");
    for probe in ["/livez", "/readyz"] {
        let r = fetch(server.port, probe).await;
        assert!(r.starts_with("HTTP/1.1 200"), "{probe} over the cap: {r}");
    }

    server.release.send_replace(true);
    for h in held {
        assert!(h.await.expect("join").starts_with("HTTP/1.1 200"));
    }
    assert!(fetch(server.port, "/fast")
        .await
        .starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn silent_and_trickling_connections_hold_no_permit() {
    let server = start(1, 64, Duration::from_secs(1)).await;
    let mut idle = Vec::new();
    for i in 0..20 {
        let mut s = connect(server.port).await;
        if i % 2 == 1 {
            s.write_all(b"GET /fast HTTP/1.1\r\nX-Slow: ")
                .await
                .expect("partial head");
        }
        idle.push(s);
    }
    for path in ["/fast", "/livez", "/fast"] {
        let r = fetch(server.port, path).await;
        assert!(r.starts_with("HTTP/1.1 200"), "{path}: {r}");
    }
}

#[tokio::test]
async fn a_spent_budget_makes_room_by_closing_the_oldest_idle_connection() {
    let server = start(64, 4, Duration::from_secs(1)).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(connect(server.port).await);
    }
    // Accepted in order, so the fifth connection pushes out the first.
    let r = fetch(server.port, "/livez").await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(
        until_closed(&mut idle[0], Duration::from_secs(10))
            .await
            .is_some(),
        "the oldest idle connection was kept"
    );
    // Once more, with the budget full again: the next oldest gives way.
    idle.push(connect(server.port).await);
    let r = fetch(server.port, "/fast").await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(
        until_closed(&mut idle[1], Duration::from_secs(10))
            .await
            .is_some(),
        "the next oldest idle connection was kept"
    );
}

#[tokio::test]
async fn a_budget_of_busy_connections_refuses_newcomers_with_a_503() {
    let server = start(64, 1, Duration::from_secs(1)).await;
    let held = tokio::spawn(fetch(server.port, "/slow"));
    wait_entered(&server, 1).await;
    let refused = fetch(server.port, "/livez").await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.contains("too many connections (1 open, all busy)"),
        "{refused}"
    );
    server.release.send_replace(true);
    assert!(held.await.expect("join").starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn shutdown_closes_idle_connections_at_once_and_lets_a_response_in_flight_finish() {
    let server = start(64, 64, Duration::from_secs(5)).await;
    let mut silent = connect(server.port).await;
    let mut trickling = connect(server.port).await;
    trickling
        .write_all(b"GET /fast HTTP/1.1\r\n")
        .await
        .expect("partial head");
    let mut kept_alive = connect(server.port).await;
    kept_alive
        .write_all(b"GET /fast HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("request");
    let mut first = [0u8; 15];
    kept_alive.read_exact(&mut first).await.expect("answer");
    assert_eq!(&first, b"HTTP/1.1 200 OK");
    let held = tokio::spawn(fetch(server.port, "/slow"));
    wait_entered(&server, 1).await;

    server.stop.send_replace(true);
    // Well before the 5 s drain: none of them has a request in flight.
    let soon = Duration::from_secs(2);
    assert!(until_closed(&mut silent, soon).await.is_some(), "silent");
    assert!(
        until_closed(&mut trickling, soon).await.is_some(),
        "trickling"
    );
    assert!(
        until_closed(&mut kept_alive, soon).await.is_some(),
        "kept alive"
    );
    assert!(!server.task.is_finished(), "a response is still in flight");

    server.release.send_replace(true);
    let answer = held.await.expect("join");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    tokio::time::timeout(Duration::from_secs(2), server.task)
        .await
        .expect("the server stops once the response is out")
        .expect("join");
}

#[tokio::test]
async fn http2_prior_knowledge_is_told_http_1_1_is_required() {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let server = start(64, 64, Duration::from_secs(1)).await;
    // As curl sends it: preface, SETTINGS, then the request's HEADERS on stream 1.
    let mut s = connect(server.port).await;
    let mut hello = PREFACE.to_vec();
    hello.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    hello.extend_from_slice(&[0, 0, 2, 0x1, 0x5, 0, 0, 0, 1, 0x82, 0x86]);
    s.write_all(&hello).await.expect("preface");
    let answer = until_closed(&mut s, Duration::from_secs(10))
        .await
        .expect("closed after the answer");
    assert_eq!(
        answer.as_bytes(),
        prior_knowledge::answer(Some(1)).as_slice()
    );

    // A client that sends only the preface and stops: no stream to reset.
    let mut s = connect(server.port).await;
    s.write_all(PREFACE).await.expect("preface");
    s.shutdown().await.expect("shutdown");
    let answer = until_closed(&mut s, Duration::from_secs(10))
        .await
        .expect("closed after the answer");
    assert_eq!(answer.as_bytes(), prior_knowledge::answer(None).as_slice());
    assert!(fetch(server.port, "/fast")
        .await
        .starts_with("HTTP/1.1 200"));
}

/// A client that sends its request and shuts down its side (`shutdown(SHUT_WR)`, as `nc -N`
/// and some HTTP/1.0 tools do) gets its answer. Found by fuzzing (the input is kept as
/// `fuzz/regressions/http/half-close-http10`): hyper without `half_close` dropped such a
/// request unanswered when it read the EOF before writing the response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_its_request_gets_the_answer() {
    let server = start(8, 16, Duration::from_secs(1)).await;
    let requests: [&[u8]; 4] = [
        b"PH ;* HTTP/1.0\r\n\r\n",
        b"GET /nowhere HTTP/1.0\r\n\r\n",
        b"GET /livez HTTP/1.1\r\n\r\n",
        b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n",
    ];
    for request in requests {
        for _ in 0..25 {
            let mut s = connect(server.port).await;
            s.write_all(request).await.expect("write");
            s.shutdown().await.expect("shutdown");
            let mut answer = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
                .await
                .expect("closed within 10 s")
                .expect("read");
            assert!(
                answer.starts_with(b"HTTP/1."),
                "{:?}: {:?}",
                String::from_utf8_lossy(request),
                String::from_utf8_lossy(&answer)
            );
        }
    }
}
