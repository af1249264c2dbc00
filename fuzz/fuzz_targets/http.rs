//! HTTP request handling on arbitrary bytes: whatever a client sends on a connection, hyper (with
//! the agent's head limits) and the agent's router must answer with well-formed HTTP/1.x or
//! close, never panic, and never take more than the head limit into memory for a request.
#![no_main]

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::state;
use gpu_steward::http::{router, server::MAX_HEAD_BYTES, AppState};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    static STATE: OnceLock<AppState> = OnceLock::new();
    let state = STATE.get_or_init(state).clone();
    runtime().block_on(async move {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .max_buf_size(MAX_HEAD_BYTES)
            .max_header_size(MAX_HEAD_BYTES);
        let service = TowerToHyperService::new(router(state));
        let conn = tokio::spawn(async move {
            let _ = builder
                .serve_connection(TokioIo::new(server), service)
                .await;
        });
        let _ = client.write_all(data).await;
        let _ = client.shutdown().await;
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "the server neither answered nor closed");
        if !out.is_empty() {
            assert!(
                out.starts_with(b"HTTP/1.1 ") || out.starts_with(b"HTTP/1.0 "),
                "not an HTTP answer: {:?}",
                String::from_utf8_lossy(&out[..out.len().min(80)])
            );
        }
        let _ = conn.await;
    });
});
