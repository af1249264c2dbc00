//! The socket as hyper sees it, with every read counted against the budget for unfinished
//! request heads (see `admission`): hyper's read buffer grows with what a client sends, up to
//! the 64 KiB head limit, and only counting reads bounds it over all connections. Over TLS the
//! reads counted are the decrypted ones, which are what hyper buffers.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::admission::{Registry, Slot};

pub struct Metered<S> {
    stream: S,
    registry: Arc<Registry>,
    slot: Arc<Slot>,
}

impl<S> Metered<S> {
    pub fn new(stream: S, registry: Arc<Registry>, slot: Arc<Slot>) -> Metered<S> {
        Metered {
            stream,
            registry,
            slot,
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
                     see the HTTP section of the README"
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
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
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
