//! The socket as hyper sees it, with every read counted against the budget for unfinished
//! request heads (see `admission`): hyper's read buffer grows with what a client sends, up to
//! the 64 KiB head limit, and only counting reads bounds it over all connections. Over TLS the
//! reads counted are the decrypted ones, which are what hyper buffers.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::admission::{Registry, Slot};

pub struct Metered<S> {
    stream: S,
    registry: Arc<Registry>,
    slot: Arc<Slot>,
    /// How long a write may wait for the client to take bytes (hyper has no write timeout): a
    /// client that asks and never reads would otherwise hold its request permit forever.
    write_timeout: Duration,
    /// Armed while a write waits; reset whenever the client takes bytes.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> Metered<S> {
    pub fn new(
        stream: S,
        registry: Arc<Registry>,
        slot: Arc<Slot>,
        write_timeout: Duration,
    ) -> Metered<S> {
        Metered {
            stream,
            registry,
            slot,
            write_timeout,
            stalled: None,
        }
    }

    /// After a write returned `Pending`: arms the deadline (once per stall) and fails the
    /// connection when it passes.
    fn check_stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let timeout = self.write_timeout;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client stopped reading its response",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
        let n = buf.filled().len() - before;
        if n > 0 {
            if let Some(largest) = this.registry.read(&this.slot, n) {
                tracing::warn!(
                    largest = %largest,
                    "unfinished request heads hold more than their budget: closing the largest; \
                     see docs/http.md"
                );
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_write(cx, buf) {
            Poll::Pending => this.check_stall(cx),
            done => {
                this.stalled = None;
                done
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_write_vectored(cx, bufs) {
            Poll::Pending => this.check_stall(cx),
            done => {
                this.stalled = None;
                done
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
