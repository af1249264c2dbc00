//! Any `:authority` on the plugin sockets. The h2 server under tonic refuses a request whose
//! `:authority` is not a valid URI authority (`RST_STREAM PROTOCOL_ERROR`: hyperium/h2#442,
//! tonic#243), and gRPC clients over a Unix socket send exactly that: a socket path
//! (`/var/lib/kubelet/device-plugins/x.sock`: older kubelets, grpc-java), its %-encoding
//! (grpc-go and grpc-core releases that encode it), or nothing. The kubelet has sent `localhost`
//! since it set `grpc.WithAuthority("localhost")`; a Go gRPC server accepts every one of these.
//!
//! [`Relaxed`] sits between the socket and h2 and rewrites, in the client-to-server direction
//! only, each header block: it decodes it (HPACK, RFC 7541, with the client's dynamic table)
//! and re-encodes it as plain literals that use no table, with an unusable `:authority`
//! replaced by `localhost`. Every other frame, and the whole server-to-client direction, pass
//! through untouched. Re-encoding every block (not only the bad ones) keeps h2's decoder table
//! empty, so it can never disagree with the client's encoder. The plugin never reads the
//! authority; nothing else is changed.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What an unusable `:authority` becomes.
const REPLACEMENT: &[u8] = b"localhost";
/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The largest frame written to h2: the protocol's default SETTINGS_MAX_FRAME_SIZE, which
/// tonic's server keeps.
const MAX_FRAME: usize = 16_384;
/// The largest frame accepted from the client (h2 refuses larger ones anyway).
const MAX_INPUT_FRAME: usize = 1 << 24;
/// The largest dynamic table the client may ask for (h2 advertises 4096).
const MAX_TABLE: usize = 65_536;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// A stream whose incoming header blocks are re-encoded with a usable `:authority`.
pub struct Relaxed<S> {
    inner: S,
    /// Raw bytes from the client not yet made into frames.
    input: BytesMut,
    /// Bytes ready for h2.
    output: BytesMut,
    preface_done: bool,
    /// A header block waiting for its CONTINUATION frames: stream, HEADERS flags, priority
    /// fields, the fragments so far.
    pending: Option<(u32, u8, Option<[u8; 5]>, BytesMut)>,
    decoder: Decoder,
    eof: bool,
}

impl<S> Relaxed<S> {
    pub fn new(inner: S) -> Self {
        Relaxed {
            inner,
            input: BytesMut::new(),
            output: BytesMut::new(),
            preface_done: false,
            pending: None,
            decoder: Decoder::default(),
            eof: false,
        }
    }

    /// Moves every complete frame of `input` to `output`, rewriting header blocks.
    fn process(&mut self) -> io::Result<()> {
        if !self.preface_done {
            let n = PREFACE.len().min(self.input.len());
            if self.input[..n] != PREFACE[..n] {
                // Not HTTP/2: pass it on and let h2 say so.
                self.preface_done = true;
            } else if n < PREFACE.len() {
                return Ok(());
            } else {
                self.output.extend_from_slice(&self.input.split_to(n));
                self.preface_done = true;
            }
        }
        while self.input.len() >= 9 {
            let len = (usize::from(self.input[0]) << 16)
                | (usize::from(self.input[1]) << 8)
                | usize::from(self.input[2]);
            if len > MAX_INPUT_FRAME {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "frame too large",
                ));
            }
            if self.input.len() < 9 + len {
                return Ok(());
            }
            let header = self.input.split_to(9);
            let mut payload = self.input.split_to(len);
            let (kind, flags) = (header[3], header[4]);
            let stream =
                u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
            match kind {
                HEADERS => {
                    if flags & PADDED != 0 {
                        let pad = usize::from(*payload.first().ok_or_else(bad_frame)?);
                        payload.advance(1);
                        if pad > payload.len() {
                            return Err(bad_frame());
                        }
                        payload.truncate(payload.len() - pad);
                    }
                    let priority = if flags & PRIORITY != 0 {
                        if payload.len() < 5 {
                            return Err(bad_frame());
                        }
                        let mut p = [0u8; 5];
                        p.copy_from_slice(&payload.split_to(5));
                        Some(p)
                    } else {
                        None
                    };
                    self.pending = Some((stream, flags, priority, payload));
                }
                CONTINUATION => match self.pending.as_mut() {
                    Some((s, _, _, block)) if *s == stream => block.extend_from_slice(&payload),
                    // Out of place: h2 answers it with a connection error.
                    _ => {
                        self.output.extend_from_slice(&header);
                        self.output.extend_from_slice(&payload);
                        continue;
                    }
                },
                _ => {
                    self.output.extend_from_slice(&header);
                    self.output.extend_from_slice(&payload);
                    continue;
                }
            }
            if flags & END_HEADERS != 0 {
                if let Some((stream, first_flags, priority, block)) = self.pending.take() {
                    let fields = self.decoder.decode(&block)?;
                    write_block(&mut self.output, stream, first_flags, priority, &fields);
                }
            }
        }
        Ok(())
    }
}

fn bad_frame() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "malformed HEADERS frame")
}

/// Whether h2 takes `value` as an `:authority`.
fn usable(value: &[u8]) -> bool {
    tonic::codegen::http::uri::Authority::try_from(value).is_ok()
}

/// Writes `fields` as one header block (HEADERS, then CONTINUATION frames past `MAX_FRAME`),
/// every field a literal without indexing with a new name, no Huffman.
fn write_block(
    out: &mut BytesMut,
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    fields: &[(Vec<u8>, Vec<u8>)],
) {
    let mut block = BytesMut::new();
    for (name, value) in fields {
        let value: &[u8] = if name == b":authority" && !usable(value) {
            REPLACEMENT
        } else {
            value
        };
        block.put_u8(0);
        encode_int(&mut block, name.len(), 7, 0);
        block.extend_from_slice(name);
        encode_int(&mut block, value.len(), 7, 0);
        block.extend_from_slice(value);
    }
    let mut first = true;
    let mut rest = &block[..];
    loop {
        let room = if first && priority.is_some() {
            MAX_FRAME - 5
        } else {
            MAX_FRAME
        };
        let take = rest.len().min(room);
        let (chunk, tail) = rest.split_at(take);
        rest = tail;
        let last = rest.is_empty();
        let (kind, mut f) = if first {
            let mut f = flags & END_STREAM;
            if priority.is_some() {
                f |= PRIORITY;
            }
            (HEADERS, f)
        } else {
            (CONTINUATION, 0)
        };
        if last {
            f |= END_HEADERS;
        }
        let prio = if first { priority } else { None };
        let len = chunk.len() + prio.map_or(0, |_| 5);
        out.put_uint(len as u64, 3);
        out.put_u8(kind);
        out.put_u8(f);
        out.put_u32(stream);
        if let Some(p) = prio {
            out.extend_from_slice(&p);
        }
        out.extend_from_slice(chunk);
        first = false;
        if last {
            return;
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Relaxed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.output.is_empty() {
                let n = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // What could not be made into frames goes to h2 as it is.
                let rest = this.input.split();
                this.output.extend_from_slice(&rest);
                if this.output.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let mut chunk = [0u8; 8192];
            let mut rb = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                this.eof = true;
                continue;
            }
            this.input.extend_from_slice(rb.filled());
            this.process()?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Relaxed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Relaxed<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

fn encode_int(out: &mut BytesMut, mut value: usize, prefix_bits: u8, first: u8) {
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        out.put_u8(first | value as u8);
        return;
    }
    out.put_u8(first | max as u8);
    value -= max;
    while value >= 128 {
        out.put_u8((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.put_u8(value as u8);
}

/// The HPACK decoder (RFC 7541 §6), mirroring the client's encoder.
#[derive(Debug)]
struct Decoder {
    /// Newest first.
    table: std::collections::VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            table: Default::default(),
            size: 0,
            max: 4096,
        }
    }
}

fn hpack_error(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("HPACK: {what}"))
}

impl Decoder {
    fn decode(&mut self, mut src: &[u8]) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        while let Some(&b) = src.first() {
            if b & 0x80 != 0 {
                let i = decode_int(&mut src, 7)?;
                out.push(self.entry(i)?);
            } else if b & 0x40 != 0 {
                let (name, value) = self.literal(&mut src, 6)?;
                self.insert(name.clone(), value.clone());
                out.push((name, value));
            } else if b & 0x20 != 0 {
                let size = decode_int(&mut src, 5)?;
                if size > MAX_TABLE {
                    return Err(hpack_error("table size update too large"));
                }
                self.max = size;
                self.evict();
            } else {
                out.push(self.literal(&mut src, 4)?);
            }
        }
        Ok(out)
    }

    fn literal(&self, src: &mut &[u8], prefix: u8) -> io::Result<(Vec<u8>, Vec<u8>)> {
        let i = decode_int(src, prefix)?;
        let name = if i == 0 {
            decode_string(src)?
        } else {
            self.entry(i)?.0
        };
        Ok((name, decode_string(src)?))
    }

    fn entry(&self, i: usize) -> io::Result<(Vec<u8>, Vec<u8>)> {
        if i == 0 {
            return Err(hpack_error("index 0"));
        }
        if let Some((n, v)) = STATIC.get(i - 1) {
            return Ok((n.as_bytes().to_vec(), v.as_bytes().to_vec()));
        }
        self.table
            .get(i - STATIC.len() - 1)
            .cloned()
            .ok_or_else(|| hpack_error("index out of the table"))
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = name.len() + value.len() + 32;
        self.table.push_front((name, value));
        self.size += size;
        self.evict();
    }

    fn evict(&mut self) {
        while self.size > self.max {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + 32,
                None => break,
            }
        }
    }
}

fn decode_int(src: &mut &[u8], prefix: u8) -> io::Result<usize> {
    let max = (1usize << prefix) - 1;
    let first = *src
        .first()
        .ok_or_else(|| hpack_error("truncated integer"))?;
    *src = &src[1..];
    let mut value = usize::from(first) & max;
    if value < max {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let b = *src
            .first()
            .ok_or_else(|| hpack_error("truncated integer"))?;
        *src = &src[1..];
        if shift > 28 {
            return Err(hpack_error("integer too large"));
        }
        value += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
}

fn decode_string(src: &mut &[u8]) -> io::Result<Vec<u8>> {
    let huffman = src.first().is_some_and(|b| b & 0x80 != 0);
    let len = decode_int(src, 7)?;
    if len > src.len() {
        return Err(hpack_error("truncated string"));
    }
    let (raw, rest) = src.split_at(len);
    *src = rest;
    if huffman {
        huffman_decode(raw)
    } else {
        Ok(raw.to_vec())
    }
}

/// The code length of each symbol (0-255, then EOS) of the HPACK Huffman code (RFC 7541
/// Appendix B). The code is canonical, so the codes follow from the lengths.
const HUFFMAN_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];

/// (length, code) → symbol.
fn huffman_codes() -> &'static HashMap<(u8, u32), u16> {
    static CODES: OnceLock<HashMap<(u8, u32), u16>> = OnceLock::new();
    CODES.get_or_init(|| {
        let mut order: Vec<u16> = (0..257).collect();
        order.sort_by_key(|&s| (HUFFMAN_LENGTHS[usize::from(s)], s));
        let mut map = HashMap::new();
        let mut code: u32 = 0;
        let mut prev = HUFFMAN_LENGTHS[usize::from(order[0])];
        for (i, &s) in order.iter().enumerate() {
            let len = HUFFMAN_LENGTHS[usize::from(s)];
            if i > 0 {
                code = (code + 1) << (len - prev);
            }
            prev = len;
            map.insert((len, code), s);
        }
        map
    })
}

fn huffman_decode(src: &[u8]) -> io::Result<Vec<u8>> {
    let codes = huffman_codes();
    let mut out = Vec::with_capacity(src.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0u8);
    for byte in src {
        for bit in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> bit) & 1);
            len += 1;
            if let Some(&s) = codes.get(&(len, code)) {
                if s == 256 {
                    return Err(hpack_error("EOS in a string"));
                }
                out.push(s as u8);
                code = 0;
                len = 0;
            } else if len >= 30 {
                return Err(hpack_error("invalid Huffman code"));
            }
        }
    }
    // Padding: fewer than 8 bits, all ones (a prefix of EOS).
    if len >= 8 || code != (1u32 << len) - 1 {
        return Err(hpack_error("invalid Huffman padding"));
    }
    Ok(out)
}

/// The static table (RFC 7541 Appendix A).
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    fn text(fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(n).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn decodes_rfc_7541_c4_requests_with_huffman_and_the_dynamic_table() {
        let mut d = Decoder::default();
        let first = d
            .decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .expect("C.4.1");
        assert_eq!(
            text(&first),
            [
                (":method".to_string(), "GET".to_string()),
                (":scheme".into(), "http".into()),
                (":path".into(), "/".into()),
                (":authority".into(), "www.example.com".into())
            ]
        );
        assert_eq!(d.size, 57);
        // C.4.2 names :authority by its dynamic index (62).
        let second = d
            .decode(&hex("8286 84be 5886 a8eb 1064 9cbf"))
            .expect("C.4.2");
        assert_eq!(
            text(&second)[3..],
            [
                (":authority".to_string(), "www.example.com".to_string()),
                ("cache-control".into(), "no-cache".into())
            ]
        );
        assert_eq!(d.size, 110);
        assert!(d.decode(&hex("ff")).is_err(), "a truncated integer");
        assert!(d.decode(&hex("c5")).is_err(), "index 69 is past the table");
    }

    fn frames(mut b: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        while b.len() >= 9 {
            let len = (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]);
            let stream = u32::from_be_bytes([b[5], b[6], b[7], b[8]]);
            out.push((b[3], b[4], stream, b[9..9 + len].to_vec()));
            b = &b[9 + len..];
        }
        out
    }

    #[test]
    fn rewrites_an_unusable_authority_keeps_a_good_one_and_passes_other_frames() {
        let mut r = Relaxed::new(());
        let mut input = PREFACE.to_vec();
        // SETTINGS (empty), then a padded HEADERS split over a CONTINUATION.
        input.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
        block.push(0x41); // :authority, incremental indexing, raw value
        let path = b"/var/lib/kubelet/device-plugins/x.sock";
        block.push(path.len() as u8);
        block.extend_from_slice(path);
        let (a, b) = block.split_at(10);
        let mut headers = vec![2u8];
        headers.extend_from_slice(a);
        headers.extend_from_slice(&[0, 0]);
        input.extend_from_slice(&[
            0,
            0,
            headers.len() as u8,
            HEADERS,
            PADDED | END_STREAM,
            0,
            0,
            0,
            1,
        ]);
        input.extend_from_slice(&headers);
        input.extend_from_slice(&[0, 0, b.len() as u8, CONTINUATION, END_HEADERS, 0, 0, 0, 1]);
        input.extend_from_slice(b);
        // A second request names the (bad) authority by its dynamic index.
        input.extend_from_slice(&[0, 0, 3, HEADERS, END_HEADERS, 0, 0, 0, 3, 0x83, 0x86, 0xbe]);
        // Fed a byte at a time, as a slow socket would.
        for byte in input {
            r.input.put_u8(byte);
            r.process().expect("process");
        }
        assert!(r.output.starts_with(PREFACE));
        let out = frames(&r.output[PREFACE.len()..]);
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!((out[0].0, out[0].3.len()), (0x4, 0));
        for (i, stream) in [(1, 1), (2, 3)] {
            let (kind, flags, s, payload) = &out[i];
            assert_eq!((*kind, *s), (HEADERS, stream));
            assert_eq!(flags & END_HEADERS, END_HEADERS);
            let fields = text(&Decoder::default().decode(payload).expect("plain literals"));
            assert_eq!(
                fields[2],
                (":authority".to_string(), "localhost".to_string())
            );
        }
        assert_eq!(out[1].1 & END_STREAM, END_STREAM);
        // A usable authority goes through as it is.
        let mut buf = BytesMut::new();
        write_block(
            &mut buf,
            5,
            0,
            None,
            &[(b":authority".to_vec(), b"localhost:1234".to_vec())],
        );
        let f = frames(&buf);
        let fields = text(&Decoder::default().decode(&f[0].3).expect("decode"));
        assert_eq!(fields[0].1, "localhost:1234");
        for bad in ["", "/x.sock", "%2Fx.sock", "unix:///x.sock"] {
            assert!(!usable(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn a_large_block_is_split_into_continuation_frames() {
        let mut out = BytesMut::new();
        let big = vec![b'a'; 40_000];
        write_block(
            &mut out,
            7,
            END_STREAM,
            Some([0, 0, 0, 0, 15]),
            &[(b"x-big".to_vec(), big.clone())],
        );
        let f = frames(&out);
        assert_eq!(f.len(), 3);
        assert_eq!((f[0].0, f[0].1), (HEADERS, END_STREAM | PRIORITY));
        assert_eq!((f[1].0, f[1].1), (CONTINUATION, 0));
        assert_eq!((f[2].0, f[2].1), (CONTINUATION, END_HEADERS));
        assert!(f.iter().all(|x| x.3.len() <= MAX_FRAME && x.2 == 7));
        let mut block: Vec<u8> = f[0].3[5..].to_vec();
        block.extend(f[1].3.iter().chain(f[2].3.iter()));
        let fields = Decoder::default().decode(&block).expect("decode");
        assert_eq!(fields[0].1, big);
    }
}
