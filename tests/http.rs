//! The HTTP surface over a real socket: endpoints, status codes, bad requests.

mod common;

use common::{scenario, Agent};

#[test]
fn endpoints_answer_with_the_contract_types() {
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml")).start();
    let live = agent.get("/livez");
    assert_eq!((live.status, live.text().trim()), (200, "ok"));
    assert_eq!(agent.get("/readyz").status, 200);
    let landing = agent.get("/");
    assert_eq!(landing.status, 200);
    for link in ["/metrics", "/health", "/health/gpus", "/readyz", "/livez"] {
        assert!(
            landing.text().contains(&format!("href=\"{link}\"")),
            "{link}"
        );
    }
    let health = agent.get("/health");
    assert_eq!(health.status, 200);
    assert_eq!(
        health.header("content-type"),
        Some("application/health+json")
    );
    let h = health.json();
    assert_eq!(h["status"], "pass");
    assert_eq!(h["agent"]["nvml"]["status"], "up");
    assert_eq!(h["agent"]["driverVersion"], "580.95.05");
    let checks = h["checks"].as_object().expect("checks map");
    let mut keys: Vec<&String> = checks.keys().collect();
    keys.sort();
    assert_eq!(
        keys,
        (0..8)
            .map(|i| format!("gpu:{i}"))
            .collect::<Vec<_>>()
            .iter()
            .collect::<Vec<_>>()
    );
    let g0 = &checks["gpu:0"][0];
    assert_eq!(g0["status"], "pass");
    assert_eq!(g0["componentType"], "gpu");
    assert_eq!(g0["action"], "none");
    assert!(g0["componentId"]
        .as_str()
        .is_some_and(|u| u.starts_with("GPU-")));

    let gpus = agent.get("/health/gpus");
    assert_eq!(gpus.status, 200);
    assert_eq!(gpus.json()["status"], "pass");
    let one = agent.get("/health/gpus/3");
    assert_eq!(one.status, 200);
    assert_eq!(one.json()["status"], "pass");
    let by_uuid = agent.get(&format!(
        "/health/gpus/{}",
        g0["componentId"].as_str().unwrap_or("")
    ));
    assert_eq!(by_uuid.json()["componentId"], g0["componentId"]);
    let missing = agent.get("/health/gpus/42");
    assert_eq!(missing.status, 404);
    assert!(missing.text().contains("no GPU '42'"), "{}", missing.text());
}

#[test]
fn bad_requests_get_a_4xx_with_a_reason_and_the_server_keeps_serving() {
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml")).start();
    let nf = agent.get("/nope");
    assert_eq!(nf.status, 404);
    assert!(nf.text().contains("'/nope'"), "{}", nf.text());

    let post = agent.request(
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    );
    assert_eq!(post.status, 405);
    assert!(post.text().contains("read-only"), "{}", post.text());
    assert!(post.header("allow").is_some_and(|a| a.contains("GET")));

    let garbage = agent.request_bytes(b"\x16\x03\x01 this is not http\r\n\r\n");
    assert!(
        garbage.status == 400 || garbage.status == 0,
        "malformed request answered {}",
        garbage.status
    );

    let huge = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let r = agent.request(&huge);
    assert!(
        r.status == 431 || r.status == 400 || r.status == 0,
        "oversized: {}",
        r.status
    );

    // Still serving after all that.
    assert_eq!(agent.get("/metrics").status, 200);
    assert_eq!(agent.get("/readyz").status, 200);
}

/// Reads until the server closes the connection; `Some(bytes)` if it did within `within`.
fn closed_within(mut s: std::net::TcpStream, within: std::time::Duration) -> Option<Vec<u8>> {
    use std::io::Read;
    s.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = Vec::new();
    match s.read_to_end(&mut buf) {
        Ok(_) => Some(buf),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(buf),
        Err(_) => None,
    }
}

#[test]
fn silent_and_slow_clients_are_dropped_after_the_header_timeout() {
    use std::io::Write;
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .config("[server]\nheader_timeout = \"300ms\"\n")
        .start();
    let silent = std::net::TcpStream::connect(("127.0.0.1", agent.port)).expect("connect");
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", agent.port)).expect("connect");
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .expect("partial head");
    // Generous bound: the point is that they are closed at all, not how fast.
    let deadline = std::time::Duration::from_secs(10);
    assert!(
        closed_within(silent, deadline).is_some(),
        "silent client kept open"
    );
    assert!(
        closed_within(slow, deadline).is_some(),
        "slow client kept open"
    );
    assert_eq!(agent.get("/metrics").status, 200);
}
