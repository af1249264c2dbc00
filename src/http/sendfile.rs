//! `/metrics` pages handed to the kernel by `sendfile(2)` instead of copied from our memory.
//!
//! A scrape's body is the page rendered once per poll, shared by reference (`Bytes`). Writing it
//! with `writev` makes the kernel copy it from our memory into the socket buffer on every
//! scrape: most of the agent's time under load went there, a copy nginx avoids by serving files
//! with `sendfile`. So the page is also kept in a sealed memfd, and a plain-TCP connection's
//! socket (`SendfileStream`) recognises the page among the slices hyper hands it and sends those
//! bytes from the file instead; the kernel then passes page-cache pages to the socket by
//! reference.
//!
//! How a slice is recognised: the `/metrics` handler offers the page to its connection
//! (`Hints::offer`), which keeps the page's `Bytes` (so its memory stays allocated and cannot be
//! reused while the offer stands) with its file. A slice that lies inside an offered page's
//! memory is that page's bytes at that offset, and the file holds the same bytes, since both
//! were written from the same buffer and the file is sealed against any change. Whatever is not
//! recognised (response heads, the per-scrape tail, every other route, TLS connections) goes
//! through `writev` as before; a kernel or sandbox without memfd or sendfile leaves everything
//! on that path.
//!
//! The memfd is shared memory charged to the agent's cgroup, not to its RSS: the footprint
//! figures add it (see BENCHMARKS.md).

use std::collections::VecDeque;
use std::ffi::CStr;
use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// A read-only, sealed in-memory file holding one page.
#[derive(Debug)]
pub struct PageFile {
    file: File,
    len: usize,
}

impl PageFile {
    /// A sealed memfd holding `bytes`.
    pub fn new(name: &CStr, bytes: &[u8]) -> io::Result<PageFile> {
        let fd: OwnedFd = memfd_create(
            name,
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )?;
        let mut file = File::from(fd);
        file.write_all(bytes)?;
        // No write, resize or further sealing: the file holds these bytes until it is closed.
        fcntl(
            file.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_WRITE
                    | SealFlag::F_SEAL_SHRINK
                    | SealFlag::F_SEAL_GROW
                    | SealFlag::F_SEAL_SEAL,
            ),
        )?;
        Ok(PageFile {
            file,
            len: bytes.len(),
        })
    }

    /// Bytes in the file.
    pub fn size(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub(super) fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        (&self.file).write(bytes)
    }
}

/// A body part whose bytes are also in a file.
#[derive(Debug, Clone)]
pub struct FileBacked {
    pub bytes: Bytes,
    pub file: Arc<PageFile>,
}

impl FileBacked {
    /// Pairs `bytes` with `file`; `None` unless the file holds as many bytes (a caller's mistake
    /// must cost the optimisation, never the response).
    pub fn new(bytes: Bytes, file: Arc<PageFile>) -> Option<FileBacked> {
        (bytes.len() == file.size()).then_some(FileBacked { bytes, file })
    }

    /// Where `slice` starts in the file, when it lies wholly inside these bytes.
    fn offset_of(&self, slice: &[u8]) -> Option<usize> {
        let base = self.bytes.as_ptr() as usize;
        let start = slice.as_ptr() as usize;
        let offset = start.checked_sub(base)?;
        (offset + slice.len() <= self.bytes.len()).then_some(offset)
    }
}

/// Pages offered to one connection, newest last. An offer lasts until its page has been sent
/// as often as it was offered (once per response), the connection closes, or newer offers
/// push it out: an idle keep-alive connection holds no old page.
#[derive(Debug, Clone, Default)]
pub struct Hints(Arc<Mutex<VecDeque<Offer>>>);

#[derive(Debug)]
struct Offer {
    part: FileBacked,
    /// Responses that will still send this page.
    pending: usize,
}

/// Offers kept per connection: one per response in flight. Pipelining clients rarely have more
/// than a few; an offer pushed out only sends its page by `writev`.
const MAX_OFFERS: usize = 4;

impl Hints {
    /// Lets the connection send `part` from its file, for one response.
    pub fn offer(&self, part: FileBacked) {
        let mut offers = self.lock();
        if let Some(o) = offers
            .iter_mut()
            .find(|o| Arc::ptr_eq(&o.part.file, &part.file))
        {
            o.pending += 1;
            return;
        }
        if offers.len() == MAX_OFFERS {
            offers.pop_front();
        }
        offers.push_back(Offer { part, pending: 1 });
    }

    /// The file and offset holding `slice`, when an offered page contains it.
    fn find(&self, slice: &[u8]) -> Option<(Arc<PageFile>, usize)> {
        if slice.is_empty() {
            return None;
        }
        self.lock().iter().rev().find_map(|o| {
            o.part
                .offset_of(slice)
                .map(|off| (o.part.file.clone(), off))
        })
    }

    /// One response has sent `file` to its end: its offer is withdrawn when no other will.
    fn sent(&self, file: &Arc<PageFile>) {
        let mut offers = self.lock();
        if let Some(i) = offers.iter().position(|o| Arc::ptr_eq(&o.part.file, file)) {
            offers[i].pending -= 1;
            if offers[i].pending == 0 {
                offers.remove(i);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Offer>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
impl Hints {
    pub(super) fn find_offset(&self, slice: &[u8]) -> Option<usize> {
        self.find(slice).map(|(_, offset)| offset)
    }

    /// Pages still offered.
    pub(super) fn offered(&self) -> usize {
        self.lock().len()
    }
}

/// A plain TCP socket that sends offered pages with `sendfile`.
pub struct SendfileStream {
    stream: TcpStream,
    hints: Hints,
    /// Off for good after the kernel refused `sendfile` on this socket.
    enabled: bool,
}

impl SendfileStream {
    pub fn new(stream: TcpStream, hints: Hints) -> SendfileStream {
        SendfileStream {
            stream,
            hints,
            enabled: true,
        }
    }

    /// Writes `bufs` telling the kernel more follows at once (`MSG_MORE`): the response head
    /// then leaves in the same segment as the start of the page sent after it, as nginx's
    /// `tcp_nopush` does, instead of in a packet and a wakeup of its own.
    fn poll_send_more(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        use nix::sys::socket::{sendmsg, MsgFlags};
        loop {
            std::task::ready!(self.stream.poll_write_ready(cx))?;
            let sent = self.stream.try_io(Interest::WRITABLE, || {
                sendmsg::<()>(
                    self.stream.as_raw_fd(),
                    bufs,
                    &[],
                    // nix 0.29 has no name for MSG_MORE.
                    MsgFlags::from_bits_retain(nix::libc::MSG_MORE) | MsgFlags::MSG_NOSIGNAL,
                    None,
                )
                .map_err(io::Error::from)
            });
            match sent {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    /// Sends up to `len` bytes of `file` from `offset`; `None` when the kernel does not support
    /// it here (the caller writes the bytes instead).
    fn poll_sendfile(
        &mut self,
        cx: &mut Context<'_>,
        file: &Arc<PageFile>,
        offset: usize,
        len: usize,
    ) -> Option<Poll<io::Result<usize>>> {
        let Ok(mut off) = nix::libc::off_t::try_from(offset) else {
            return None;
        };
        loop {
            match self.stream.poll_write_ready(cx) {
                Poll::Pending => return Some(Poll::Pending),
                Poll::Ready(Err(e)) => return Some(Poll::Ready(Err(e))),
                Poll::Ready(Ok(())) => {}
            }
            let sent = self.stream.try_io(Interest::WRITABLE, || {
                nix::sys::sendfile::sendfile(
                    self.stream.as_fd(),
                    file.file.as_fd(),
                    Some(&mut off),
                    len,
                )
                .map_err(io::Error::from)
            });
            match sent {
                Ok(n) => {
                    if offset + n == file.size() {
                        self.hints.sent(file);
                    }
                    return Some(Poll::Ready(Ok(n)));
                }
                // Readiness was stale: `try_io` cleared it, so the next poll waits.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if unsupported(&e) => {
                    tracing::debug!(error = %e, "sendfile refused; writing pages instead");
                    self.enabled = false;
                    return None;
                }
                Err(e) => return Some(Poll::Ready(Err(e))),
            }
        }
    }
}

/// Errors that say `sendfile` cannot work here at all, as opposed to a failed socket.
fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error().map(Errno::from_raw),
        Some(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP | Errno::EPERM)
    )
}

impl AsyncRead for SendfileStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for SendfileStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.enabled {
            if let Some((file, offset)) = this.hints.find(buf) {
                if let Some(done) = this.poll_sendfile(cx, &file, offset, buf.len()) {
                    return done;
                }
            }
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    /// Writes the slices before the first offered page with `writev`, or, when the first slice
    /// is one, sends it from its file. Either way a short count, which hyper continues from.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if !this.enabled {
            return Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        }
        let mut plain = bufs.len();
        for (i, slice) in bufs.iter().enumerate() {
            let Some((file, offset)) = this.hints.find(slice) else {
                continue;
            };
            if i > 0 {
                plain = i;
                break;
            }
            if let Some(done) = this.poll_sendfile(cx, &file, offset, slice.len()) {
                return done;
            }
            break;
        }
        if plain < bufs.len() {
            return this.poll_send_more(cx, &bufs[..plain]);
        }
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
