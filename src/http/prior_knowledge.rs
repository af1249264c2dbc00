//! HTTP/2 with prior knowledge (RFC 9113 §3.3): a client that opens with the HTTP/2 preface
//! reads HTTP/2 frames, not an HTTP/1.1 status line, so it is answered in its own protocol with
//! the error code made for exactly this, HTTP_1_1_REQUIRED (0xd, §7): the server preface (an
//! empty SETTINGS frame, §3.4), a RST_STREAM of the client's first request with that code, and a
//! GOAWAY with it whose debug data says what to do. curl then retries the request over HTTP/1.1
//! by itself; Go's and nghttp2's clients report the code by name.
//!
//! Why not serve HTTP/2: Prometheus and kubelet probes speak HTTP/1.1 over cleartext, and h2c
//! would bring the h2 crate (HPACK, flow control, and the rapid-reset and CONTINUATION floods to
//! defend against) and its memory into the agent for no client it has.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Bytes to peek at to recognise the preface.
pub const PEEK: usize = PREFACE.len();

/// True when a connection's first bytes are the HTTP/2 preface, or its start: no HTTP/1 request
/// begins with "PRI " (the method is reserved for the preface, RFC 9113 §3.4).
pub fn is_preface(first: &[u8]) -> bool {
    let n = first.len().min(PREFACE.len());
    n >= 4 && first[..n] == PREFACE[..n]
}

const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const HTTP_1_1_REQUIRED: u32 = 0xd;
const FRAME_HEADER: usize = 9;
/// What is read of the client's frames while looking for its first request.
const READ_LIMIT: usize = 16 * 1024;
const REASON: &[u8] = b"gpu-steward serves HTTP/1.1 only: retry without HTTP/2 prior knowledge";

/// One frame: 9-byte header (24-bit length, type, no flags, stream) and the payload.
fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    // Payloads here are a few dozen bytes: the length always fits in 24 bits.
    let len = payload.len() as u32;
    let mut f = Vec::with_capacity(FRAME_HEADER + payload.len());
    f.extend_from_slice(&len.to_be_bytes()[1..]);
    f.extend_from_slice(&[kind, 0]);
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The answer: SETTINGS, a RST_STREAM of `request` (the client's first stream, if it sent one)
/// and a GOAWAY, both saying HTTP/1.1 is required.
pub fn answer(request: Option<u32>) -> Vec<u8> {
    let code = HTTP_1_1_REQUIRED.to_be_bytes();
    let mut out = frame(SETTINGS, 0, &[]);
    if let Some(id) = request {
        out.extend(frame(RST_STREAM, id, &code));
    }
    let mut goaway = Vec::with_capacity(8 + REASON.len());
    // The last stream acted on: the reset one, or none.
    goaway.extend_from_slice(&request.unwrap_or(0).to_be_bytes());
    goaway.extend_from_slice(&code);
    goaway.extend_from_slice(REASON);
    out.extend(frame(GOAWAY, 0, &goaway));
    out
}

/// The stream of the first HEADERS frame in `bytes` (the preface, then frames), if complete.
fn first_request(bytes: &[u8]) -> Option<u32> {
    let mut at = PREFACE.len();
    while let Some(head) = bytes.get(at..at + FRAME_HEADER) {
        if head[3] == HEADERS {
            let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            return Some(id);
        }
        at += FRAME_HEADER + u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    }
    None
}

/// Answers an HTTP/2 client and closes. Bounded: `limit` to see its first request (clients send
/// it with the preface, without waiting for the server's), as long to write, and as long to
/// drain what else it sends, so that the close is a FIN, not a reset that could discard the
/// answer before the client reads it.
pub async fn refuse(mut stream: TcpStream, limit: Duration) {
    let mut seen = Vec::with_capacity(1024);
    let look = async {
        let mut chunk = [0u8; 1024];
        while seen.len() < READ_LIMIT {
            if let Some(id) = first_request(&seen) {
                return Some(id);
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&chunk[..n]),
            }
        }
        first_request(&seen)
    };
    let request = tokio::time::timeout(limit, look).await.ok().flatten();
    let written = tokio::time::timeout(limit, stream.write_all(&answer(request))).await;
    if !matches!(written, Ok(Ok(()))) {
        return;
    }
    let _ = stream.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 1024];
        let mut left = 64 * 1024usize;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(limit, drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preface_and_only_it_is_recognised() {
        assert!(is_preface(PREFACE));
        assert!(is_preface(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04"));
        assert!(is_preface(b"PRI *"));
        assert!(!is_preface(b"PRI"), "too short to tell");
        assert!(!is_preface(b"POST / HTTP/1.1\r\n"));
        assert!(!is_preface(b"GET / HTTP/1.1\r\n\r\n"));
    }

    #[test]
    fn the_first_request_is_found_after_settings_and_window_update() {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(SETTINGS, 0, &[0, 3, 0, 0, 0, 100]));
        bytes.extend(frame(0x8, 0, &[0, 0, 1, 0]));
        assert_eq!(first_request(&bytes), None, "no HEADERS yet");
        bytes.extend(frame(HEADERS, 1, &[0x82, 0x86]));
        assert_eq!(first_request(&bytes), Some(1));
        assert_eq!(
            first_request(&bytes[..bytes.len() - 2]),
            Some(1),
            "its header is enough"
        );
        assert_eq!(first_request(&bytes[..30]), None, "a cut frame header");
    }

    #[test]
    fn the_answer_is_settings_rst_stream_and_goaway_all_http_1_1_required() {
        let a = answer(Some(1));
        assert_eq!(&a[..9], &[0, 0, 0, SETTINGS, 0, 0, 0, 0, 0]);
        assert_eq!(&a[9..18], &[0, 0, 4, RST_STREAM, 0, 0, 0, 0, 1]);
        assert_eq!(&a[18..22], &HTTP_1_1_REQUIRED.to_be_bytes());
        let g = &a[22..];
        let len = u32::from_be_bytes([0, g[0], g[1], g[2]]) as usize;
        assert_eq!(len, g.len() - 9);
        assert_eq!(&g[3..9], &[GOAWAY, 0, 0, 0, 0, 0], "on stream 0");
        assert_eq!(&g[9..13], &[0, 0, 0, 1], "the last stream acted on");
        assert_eq!(&g[13..17], &HTTP_1_1_REQUIRED.to_be_bytes());
        assert!(String::from_utf8_lossy(&g[17..]).contains("HTTP/1.1 only"));
        let no_request = answer(None);
        assert_eq!(no_request[12], GOAWAY, "no RST_STREAM without a stream");
        assert_eq!(&no_request[18..22], &[0, 0, 0, 0]);
    }
}
