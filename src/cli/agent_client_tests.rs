//! The agent client against real listeners in the test (TCP and Unix) that answer with canned
//! bytes, hang, or never accept: every answer is known before the client asks.

use super::*;
use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;

/// A TCP listener that answers one connection with `answer` after reading the request head.
fn serve_once(answer: Vec<u8>) -> (Target, std::thread::JoinHandle<()>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let target = Target::Tcp(l.local_addr().expect("addr").to_string());
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut b).is_ok_and(|n| n == 1) {
            head.push(b[0]);
        }
        // The peer may close early (a refused body): a failed write is its business.
        let _ = s.write_all(&answer);
    });
    (target, server)
}

fn ask(answer: &[u8]) -> Result<Answer, String> {
    let (target, server) = serve_once(answer.to_vec());
    let a = get(&target, "/health/gpus", Duration::from_secs(10));
    server.join().expect("server");
    a
}

#[test]
fn urls_are_checked_and_bodies_read_every_way() {
    assert_eq!(
        Target::new(Some("http://127.0.0.1:9400/ignored"), None),
        Ok(Target::Tcp("127.0.0.1:9400".into()))
    );
    assert!(
        Target::new(Some("https://x:1"), None).is_err_and(|e| e.contains("https is not supported"))
    );
    assert!(Target::new(Some("127.0.0.1:9400"), None).is_err_and(|e| e.contains("http://")));
    assert!(Target::new(Some("http://"), None).is_err());
    // Nothing but a host reaches the request's head.
    assert!(Target::new(Some("http://a\r\nX-Evil: 1"), None).is_err());
    assert!(ask(b"SSH-2.0-OpenSSH\r\n").is_err());
    let a =
        ask(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\nok").expect("length");
    assert_eq!((a.status, a.body.as_slice()), (503, &b"ok"[..]));
    let a = ask(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    )
    .expect("chunked");
    assert_eq!(a.body, b"abcde");
    let a = ask(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end").expect("close");
    assert_eq!(a.body, b"to the end");
    let e = ask(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nabc").expect_err("short");
    assert!(e.contains("no complete answer"), "{e}");
}

#[test]
fn a_chunk_size_of_u64_max_is_an_error_not_a_panic() {
    let e = ask(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nabc")
        .expect_err("refused");
    assert!(e.contains("no complete answer"), "{e}");
    let e = ask(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\nabc")
        .expect_err("refused");
    assert!(e.contains("chunk size"), "{e}");
}

#[test]
fn a_body_over_the_limit_is_refused_at_the_limit() {
    let mut answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
        MAX_BODY + 1
    )
    .into_bytes();
    answer.resize(answer.len() + MAX_BODY + 1, b'x');
    let e = ask(&answer).expect_err("too big");
    assert!(e.contains("over the limit of 64 MiB"), "{e}");
}

#[test]
fn a_server_that_accepts_and_never_answers_costs_the_timeout() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let target = Target::Tcp(l.local_addr().expect("addr").to_string());
    let e = get(&target, "/health/gpus", Duration::from_millis(300)).expect_err("hangs");
    assert!(e.contains("/health/gpus: no answer within 300ms"), "{e}");
    drop(l);
}

/// A Unix listener with a backlog of one that never accepts, its queue filled: a connect to it
/// would block forever.
fn full_unix_listener(path: &std::path::Path) -> Vec<std::os::fd::OwnedFd> {
    use nix::sys::socket::{
        bind, connect, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
    };
    let addr = UnixAddr::new(path).expect("addr");
    let l = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    bind(l.as_raw_fd(), &addr).expect("bind");
    listen(&l, Backlog::new(0).expect("backlog")).expect("listen");
    let mut fds = vec![l];
    loop {
        let c = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )
        .expect("socket");
        match connect(c.as_raw_fd(), &addr) {
            Ok(()) => fds.push(c),
            Err(nix::errno::Errno::EAGAIN) => return fds,
            Err(e) => panic!("filling the queue: {e}"),
        }
        assert!(fds.len() < 1000, "the queue never filled");
    }
}

#[test]
fn a_unix_socket_whose_accept_queue_is_full_costs_the_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("api.sock");
    let _held = full_unix_listener(&path);
    let target = Target::Socket(path);
    let e = get(&target, "/readyz", Duration::from_millis(300)).expect_err("full");
    assert!(e.contains("/readyz: no answer within 300ms"), "{e}");
}

#[test]
fn only_the_socket_and_loopback_addresses_are_this_machine() {
    let at = |url: &str| Target::new(Some(url), None).expect(url).on_this_machine();
    assert!(at("http://127.0.0.1:9400"));
    assert!(at("http://127.0.0.2:9400"));
    assert!(at("http://localhost:9400"));
    assert!(at("http://LOCALHOST"));
    assert!(at("http://[::1]:9400"));
    assert!(!at("http://10.0.0.7:9400"));
    assert!(!at("http://node-1:9400"));
    assert!(!at("http://[fe80::1]:9400"));
    assert!(!at("http://localhost.example.com:9400"));
    assert!(Target::new(None, Some("/run/gpu-steward/api.sock".into()))
        .expect("socket")
        .on_this_machine());
}
