//! Differential: arbitrary bytes as one client connection over loopback TCP to two real servers
//! (`gpu_steward::http::server::serve`) on the same snapshot, one whose connections answer
//! `GET /metrics` themselves (the fast path, handing everything else to hyper) and one that
//! leaves every request to hyper. Both must answer the same sequence of statuses with the same
//! heads (but `date` and `content-length`, which vary with the live age line), or close alike;
//! neither may panic or hang.
#![no_main]

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::state;
use gpu_steward::http::router;
use gpu_steward::http::server::{serve, Limits};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    })
}

/// The two servers' ports: with the fast path, and hyper only.
fn ports() -> (u16, u16) {
    static PORTS: OnceLock<(u16, u16)> = OnceLock::new();
    *PORTS.get_or_init(|| {
        runtime().block_on(async {
            let state = state();
            let mut ports = Vec::new();
            for fast in [true, false] {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
                ports.push(listener.local_addr().expect("addr").port());
                let (stop, stop_rx) = tokio::sync::watch::channel(false);
                std::mem::forget(stop);
                let limits = Limits {
                    max_connections: 64,
                    header_timeout: Duration::from_secs(10),
                    drain: Duration::from_millis(500),
                };
                tokio::spawn(serve(
                    listener,
                    router(state.clone()),
                    fast.then(|| state.clone()),
                    limits,
                    None,
                    stop_rx,
                ));
            }
            (ports[0], ports[1])
        })
    })
}

/// What a connection answered to `data`: each response's head without `date` and
/// `content-length`, in order (bodies skipped by their length), and whatever was left over.
async fn answers(port: u16, data: &[u8]) -> (Vec<String>, usize) {
    let mut client = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let _ = client.write_all(data).await;
    let _ = client.shutdown().await;
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the server neither answered nor closed");
    let mut heads = Vec::new();
    let mut rest = &out[..];
    while let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&rest[..end]).to_ascii_lowercase();
        assert!(
            head.starts_with("http/1.1 ") || head.starts_with("http/1.0 "),
            "not an HTTP answer: {head:?}"
        );
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(0);
        heads.push(
            head.lines()
                .filter(|l| !l.starts_with("date: ") && !l.starts_with("content-length: "))
                .collect::<Vec<_>>()
                .join("\n"),
        );
        rest = &rest[(end + 4 + len).min(rest.len())..];
    }
    (heads, rest.len())
}

fuzz_target!(|data: &[u8]| {
    let (fast, hyper_only) = ports();
    runtime().block_on(async move {
        let (a, b) = tokio::join!(answers(fast, data), answers(hyper_only, data));
        assert_eq!(a, b, "the fast path and hyper answered differently");
    });
});
