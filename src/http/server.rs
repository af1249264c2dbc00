//! The accept loop: HTTP/1.1 connections served by hyper with the limits a daemon on an open
//! port needs, which `axum::serve` does not set (it configures no timer, so hyper's header-read
//! timeout never fires and an idle client holds its connection forever):
//!
//! - a header-read timeout, so slow or silent clients are dropped;
//! - a cap on headers (64 KiB; larger requests get 431 from hyper);
//! - a cap on concurrent connections: beyond it a client gets a 503 with the reason and the
//!   connection is closed, so one misbehaving client cannot starve Prometheus or the probes;
//! - graceful shutdown: stop accepting, let in-flight requests finish, close idle keep-alives.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// Largest request head accepted (hyper's minimum is 8 KiB).
const MAX_HEADER_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    /// How long in-flight requests get to finish at shutdown.
    pub drain: Duration,
}

/// Serves `app` on `listener` until `stop` turns true, then drains.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    tokio::spawn(refuse(stream, limits.max_connections));
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(limits.header_timeout)
                    .max_buf_size(MAX_HEADER_BYTES);
                let conn = builder.serve_connection(
                    TokioIo::new(stream),
                    TowerToHyperService::new(app.clone()),
                );
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    drop(permit);
                });
            }
            // The guard `wait_for` returns must not live across an await: drop it at once.
            _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(limits.drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "connections still open after {:?}; closing them",
            limits.drain
        );
    }
}

/// Answers a connection over the limit with a 503 and closes it.
async fn refuse(mut stream: tokio::net::TcpStream, limit: usize) {
    let body = format!("too many connections (limit {limit}); retry later\n");
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        stream.write_all(response.as_bytes()),
    )
    .await;
    let _ = stream.shutdown().await;
}
