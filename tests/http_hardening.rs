//! The HTTP server under hostile clients, against the real binary over loopback: hundreds of
//! silent and trickling connections re-opened as soon as they are cut, while the probes and a
//! scrape must keep answering within a second; the 64 KiB head limit; HTTP/2 with prior
//! knowledge; SIGTERM with stalled connections.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{scenario, wait_for, Agent};

/// Tests that measure time run one at a time, so that one's load is not another's latency.
static TIMED: Mutex<()> = Mutex::new(());

fn timed() -> std::sync::MutexGuard<'static, ()> {
    TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How many hostile connections this process can hold: 500, or fewer when the descriptor
/// limit cannot be raised that far (the agent, our child, inherits the raised limit).
fn hostile_connections() -> usize {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let want = 2048.min(hard);
    if soft < want {
        setrlimit(Resource::RLIMIT_NOFILE, want, hard).expect("raise RLIMIT_NOFILE");
    }
    let usable = usize::try_from(soft.max(want)).unwrap_or(usize::MAX);
    500.min(usable.saturating_sub(256))
}

/// One request on a fresh connection: status and how long it took, connect to last byte.
fn timed_get(port: u16, path: &str) -> (u16, Duration) {
    let start = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let status = String::from_utf8_lossy(&buf)
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, start.elapsed())
}

/// Counters of the hostile clients.
#[derive(Default)]
struct Flood {
    open: AtomicUsize,
    cut: AtomicUsize,
    stop: AtomicBool,
}

/// `n` connections to `port`, half silent, half sending a head a byte every 100 ms; each is
/// re-opened as soon as the server cuts it, until `flood.stop`.
fn flood(port: u16, n: usize, flood: Arc<Flood>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let tasks: Vec<_> = (0..n)
                .map(|i| tokio::spawn(hostile(port, i % 2 == 1, flood.clone())))
                .collect();
            for t in tasks {
                let _ = t.await;
            }
        });
    })
}

async fn hostile(port: u16, trickle: bool, flood: Arc<Flood>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const HEAD: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: t\r\nX-Slow: ";
    while !flood.stop.load(Ordering::Relaxed) {
        let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        flood.open.fetch_add(1, Ordering::Relaxed);
        let mut sent = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut sink = [0u8; 512];
        loop {
            if flood.stop.load(Ordering::Relaxed) {
                break;
            }
            tokio::select! {
                r = s.read(&mut sink) => {
                    if matches!(r, Ok(0) | Err(_)) {
                        flood.cut.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
                _ = tick.tick() => {
                    if trickle {
                        let byte = HEAD.get(sent).copied().unwrap_or(b'a');
                        sent += 1;
                        if s.write_all(&[byte]).await.is_err() {
                            flood.cut.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                    }
                }
            }
        }
        flood.open.fetch_sub(1, Ordering::Relaxed);
    }
}

#[test]
fn probes_and_a_scrape_answer_within_a_second_under_500_idle_and_slow_connections() {
    let _timed = timed();
    let n = hostile_connections();
    // A 1 s header timeout (so also 1 s to the first byte) cuts every hostile connection two or
    // three times during the test: the re-opening churn is part of the load.
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .config("[server]\nheader_timeout = \"1s\"\n")
        .start();
    let hostile = Arc::new(Flood::default());
    let flooder = flood(agent.port, n, hostile.clone());
    wait_for(
        "the hostile connections to open",
        Duration::from_secs(20),
        || (hostile.open.load(Ordering::Relaxed) >= n).then_some(()),
    );

    let mut slowest = [Duration::ZERO; 3];
    let mut asked = 0;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        for (i, path) in ["/livez", "/readyz", "/metrics"].iter().enumerate() {
            let (status, took) = timed_get(agent.port, path);
            assert_eq!(status, 200, "{path} under {n} hostile connections");
            assert!(
                took < Duration::from_secs(1),
                "{path} took {took:?} under {n} hostile connections"
            );
            slowest[i] = slowest[i].max(took);
            asked += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let cut = hostile.cut.load(Ordering::Relaxed);
    hostile.stop.store(true, Ordering::Relaxed);
    flooder.join().expect("flood thread");
    eprintln!(
        "{n} hostile connections, {cut} cut and re-opened; {asked} requests; slowest \
         /livez {:?}, /readyz {:?}, /metrics {:?}",
        slowest[0], slowest[1], slowest[2]
    );
    assert!(
        cut >= n,
        "the server cut only {cut} of {n} hostile connections"
    );
    assert_eq!(agent.get("/livez").status, 200);
}

#[test]
fn idle_connections_do_not_count_against_max_connections() {
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .config("[server]\nmax_connections = 2\nheader_timeout = \"1m\"\n")
        .start();
    let mut held: Vec<TcpStream> = (0..10)
        .map(|_| TcpStream::connect(("127.0.0.1", agent.port)).expect("connect"))
        .collect();
    for s in held.iter_mut().skip(5) {
        s.write_all(b"GET /metrics HTTP/1.1\r\n")
            .expect("partial head");
    }
    for path in ["/metrics", "/health", "/livez"] {
        assert_eq!(agent.get(path).status, 200, "{path}");
    }
}

/// A request whose head (request line and headers) is exactly `size` bytes.
fn head_of(size: usize) -> Vec<u8> {
    let frame = "GET /livez HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Pad: \r\n\r\n";
    let pad = "a".repeat(size - frame.len());
    frame
        .replace("X-Pad: ", &format!("X-Pad: {pad}"))
        .into_bytes()
}

#[test]
fn request_heads_are_limited_to_64_kib_with_a_431() {
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml")).start();
    let limit = 64 * 1024;
    assert_eq!(head_of(limit).len(), limit);
    assert_eq!(
        agent.request_bytes(&head_of(limit)).status,
        200,
        "at the limit"
    );
    let over = agent.request_bytes(&head_of(limit + 1));
    assert_eq!(over.status, 431, "one byte over");
    // As the hostile-input battery sent them: one 114 KB header, a 70 KB request line.
    assert_eq!(agent.request_bytes(&head_of(114_000)).status, 431);
    let line = format!(
        "GET /livez?{} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        "a".repeat(70_000)
    );
    assert_eq!(agent.request(&line).status, 431, "a long request line");
    let many: String = (0..101).map(|i| format!("X-H{i}: v\r\n")).collect();
    let many = format!("GET /livez HTTP/1.1\r\nHost: t\r\n{many}Connection: close\r\n\r\n");
    assert_eq!(agent.request(&many).status, 431, "more than 100 headers");
    assert_eq!(agent.get("/metrics").status, 200);
}

#[test]
fn http2_with_prior_knowledge_is_told_http_1_1_is_required() {
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml")).start();
    let mut s = TcpStream::connect(("127.0.0.1", agent.port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // As curl --http2-prior-knowledge opens: preface, SETTINGS, HEADERS of stream 1.
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    hello.extend_from_slice(&[0, 0, 2, 0x1, 0x5, 0, 0, 0, 1, 0x82, 0x86]);
    s.write_all(&hello).expect("preface");
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("an answer, then a close");
    let frames = h2_frames(&answer);
    let kinds: Vec<u8> = frames.iter().map(|f| f.0).collect();
    assert_eq!(kinds, [0x4, 0x3, 0x7], "SETTINGS, RST_STREAM, GOAWAY");
    assert_eq!(frames[1].1, 1, "the request's stream is reset");
    assert_eq!(frames[1].2, [0, 0, 0, 0xd], "HTTP_1_1_REQUIRED");
    assert_eq!(frames[2].2[4..8], [0, 0, 0, 0xd], "HTTP_1_1_REQUIRED");
    let reason = String::from_utf8_lossy(&frames[2].2[8..]).into_owned();
    assert!(reason.contains("HTTP/1.1 only"), "{reason}");
    assert_eq!(agent.get("/livez").status, 200);
}

/// (type, stream, payload) of each frame.
fn h2_frames(mut bytes: &[u8]) -> Vec<(u8, u32, Vec<u8>)> {
    let mut frames = Vec::new();
    while bytes.len() >= 9 {
        let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
        frames.push((bytes[3], stream, bytes[9..9 + len].to_vec()));
        bytes = &bytes[9 + len..];
    }
    frames
}

#[test]
fn sigterm_with_stalled_connections_exits_0_well_within_a_second() {
    let _timed = timed();
    let mut agent = Agent::with_scenario(&scenario("dgx-h100.toml")).start();
    let mut stalled = Vec::new();
    for i in 0..64 {
        let mut s = TcpStream::connect(("127.0.0.1", agent.port)).expect("connect");
        if i % 2 == 1 {
            s.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
                .expect("partial head");
        }
        stalled.push(s);
    }
    // A keep-alive connection idle after a scrape.
    let mut kept = TcpStream::connect(("127.0.0.1", agent.port)).expect("connect");
    kept.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        .expect("scrape");
    let mut head = [0u8; 12];
    kept.read_exact(&mut head).expect("answer");
    assert_eq!(&head, b"HTTP/1.1 200");
    // Accepted in order: once this answers, the stalled ones are in the server's hands.
    assert_eq!(agent.get("/livez").status, 200);

    let start = Instant::now();
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    let status = loop {
        if let Some(status) = agent.child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "still running 5 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    let took = start.elapsed();
    eprintln!("SIGTERM to exit with 64 stalled connections and one kept alive: {took:?}");
    assert_eq!(status.code(), Some(0), "{}", agent.log());
    assert!(
        took < Duration::from_secs(1),
        "took {took:?}, docs/http.md says within a second"
    );
}

/// A client that asks and never reads its answers: once the socket buffers are full, the write
/// waits at most `header_timeout`, then the connection is closed (hyper alone has no write
/// timeout, so such a client held its connection, and possibly its request permit, forever).
#[test]
fn a_client_that_never_reads_is_cut_off_at_the_write_timeout() {
    let _t = timed();
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .config("[server]\nmax_connections = 1\nheader_timeout = \"1s\"\n")
        .start();
    let mut greedy = TcpStream::connect(("127.0.0.1", agent.port)).expect("connect");
    // ~150 KB per answer: 400 pipelined answers (60 MB) are far beyond both sockets' buffers,
    // however far loopback autotuning grows them (tcp_wmem and tcp_rmem allow ~10 MB together).
    let asks = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(400);
    greedy
        .write_all(asks.as_bytes())
        .expect("pipelined requests");
    let mut first = [0u8; 12];
    greedy.read_exact(&mut first).expect("the first answer");
    assert_eq!(&first, b"HTTP/1.1 200");
    // From here on it reads nothing, for longer than the write timeout.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        agent.get("/metrics").status,
        200,
        "the permit was given back"
    );
    // What the kernel still holds for it arrives, then the close: not 400 answers and then a
    // connection left open (which is what happens without the deadline).
    greedy
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    let end = loop {
        match greedy.read(&mut buf) {
            Ok(0) => break "closed",
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break "reset",
            Err(e) => panic!("the stalled connection was left open ({e}) after {got} bytes"),
        }
    };
    assert!(
        got < 20 << 20,
        "{got} bytes arrived before the connection was {end}: the writes never timed out"
    );
}

/// A 400 from `/api/v1/events` quotes the bad `since` bounded and escaped: a 58 KB value with an
/// ESC and a NUL in it is answered with a short, printable reason (its first 64 characters of
/// 58005).
#[test]
fn a_bad_since_is_quoted_bounded_and_escaped_in_the_400() {
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml")).start();
    let value = format!("%1b[2J%00{}", "x".repeat(58_000));
    let r = agent.get(&format!("/api/v1/events?since={value}"));
    assert_eq!(r.status, 400, "{}", r.text());
    let body = r.text();
    assert!(body.len() < 512, "{} bytes: {}", body.len(), &body[..200]);
    assert!(
        !body.contains('\u{1b}') && !body.contains('\0'),
        "raw control characters: {body:?}"
    );
    assert!(
        body.starts_with("invalid since '\\u{1b}[2J\\u{0}xxx")
            && body.contains("… (57941 more characters)"),
        "{body}"
    );
}
