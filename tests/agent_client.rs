//! `check-health` and `status` against servers that are not a healthy agent: real TCP and Unix
//! listeners in the test that answer a hostile chunk size, a body over the limit, accept and
//! never answer, or never accept with their queue full. Each must end with exit 2 and words
//! naming the problem, within its timeout: not a panic (exit 101) and not a hang.

mod common;

use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;
use std::process::{Command, Output};
use std::time::Duration;

/// Serves `answer` to every connection (after reading the request head) until the test ends.
fn serve(answer: Vec<u8>) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && s.read(&mut b).is_ok_and(|n| n == 1) {
                    head.push(b[0]);
                }
                let _ = s.write_all(&answer);
            });
        }
    });
    url
}

/// Runs the binary with `args`, killed if it outlives `limit` (a hang fails the test, it does
/// not stall it).
fn run(args: &[&str], limit: Duration) -> Output {
    let child = Command::new(common::bin())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("output"),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("gpu-steward {args:?} still running after {limit:?}");
        }
    }
}

/// Exit 2 and the words, from stdout (check-health: one line for node-problem-detector) or
/// stderr (status).
fn refused(out: &Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(2), "{text}");
    text
}

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn a_chunk_size_of_u64_max_is_exit_2_with_words_not_a_panic() {
    let url = serve(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nabc".to_vec(),
    );
    let text = refused(&run(&["check-health", "--url", &url], LIMIT));
    assert!(
        text.contains("cannot ask the agent at") && text.contains("no complete answer"),
        "{text}"
    );
    let text = refused(&run(
        &["status", "--config", "/dev/null", "--url", &url],
        LIMIT,
    ));
    assert!(text.contains("no complete answer"), "{text}");
}

#[test]
fn a_body_over_64_mib_is_refused_at_the_limit() {
    let mut answer =
        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", 65 << 20).into_bytes();
    answer.resize(answer.len() + (65 << 20), b'x');
    let url = serve(answer);
    let text = refused(&run(&["check-health", "--url", &url], LIMIT));
    assert!(text.contains("over the limit of 64 MiB"), "{text}");
    let text = refused(&run(
        &["status", "--config", "/dev/null", "--url", &url],
        LIMIT,
    ));
    assert!(text.contains("over the limit of 64 MiB"), "{text}");
}

#[test]
fn a_server_that_never_answers_costs_the_timeout_over_tcp() {
    let hang = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", hang.local_addr().expect("addr"));
    let text = refused(&run(
        &["check-health", "--url", &url, "--timeout", "1s"],
        LIMIT,
    ));
    assert!(text.contains("no answer within 1s"), "{text}");
    // `status` has no --timeout: its own 5 s per question.
    let text = refused(&run(
        &["status", "--config", "/dev/null", "--url", &url],
        LIMIT,
    ));
    assert!(text.contains("no answer within 5s"), "{text}");
    drop(hang);
}

/// A Unix listener with a backlog of one that never accepts, its queue filled by non-blocking
/// connects until the kernel says EAGAIN: a blocking connect to it would wait forever.
fn full_unix_listener(path: &std::path::Path) -> Vec<std::os::fd::OwnedFd> {
    use nix::sys::socket::{
        bind, connect, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
    };
    let addr = UnixAddr::new(path).expect("addr");
    let new = |flags| socket(AddressFamily::Unix, SockType::Stream, flags, None).expect("socket");
    let l = new(SockFlag::SOCK_CLOEXEC);
    bind(l.as_raw_fd(), &addr).expect("bind");
    listen(&l, Backlog::new(0).expect("backlog")).expect("listen");
    let mut fds = vec![l];
    loop {
        let c = new(SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC);
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
    let sock = path.display().to_string();
    let text = refused(&run(
        &["check-health", "--socket", &sock, "--timeout", "1s"],
        LIMIT,
    ));
    assert!(
        text.contains(&format!("unix:{sock}/health/gpus: no answer within 1s")),
        "{text}"
    );
    let text = refused(&run(
        &["status", "--config", "/dev/null", "--socket", &sock],
        LIMIT,
    ));
    assert!(text.contains("no answer within 5s"), "{text}");
}

/// Deliver 5: what the agent (or whatever answers in its place) says reaches the terminal with
/// no control character and on one line.
#[test]
fn check_health_prints_a_hostile_answer_without_control_characters() {
    let body = "\u{1b}]0;owned\u{7}\u{1b}[31mno GPU\u{9b}\nFORGED";
    let url = serve(
        format!(
            "HTTP/1.1 404 Not Found\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    );
    let out = run(&["check-health", "--url", &url, "--gpu", "0"], LIMIT);
    let text = refused(&out);
    let line = text.strip_suffix('\n').unwrap_or(&text);
    assert!(!line.chars().any(|c| c.is_control()), "{line:?}");
    assert!(
        line.contains("]0;owned") && line.contains("FORGED"),
        "{line}"
    );
}
