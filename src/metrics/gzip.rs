//! Precompressed exposition with a live tail.
//!
//! The body is compressed once per snapshot. A scrape appends a few lines computed at scrape
//! time (the snapshot's age) without recompressing: the body is deflated ending with a full flush
//! (byte-aligned, history reset), so the tail can be deflated on its own and concatenated, and the
//! gzip trailer's CRC-32 is combined from the two parts (the technique pigz uses to compress in
//! parallel). One valid single-member gzip stream results, which every client can read.

use std::io::Write;

use bytes::Bytes;
use flate2::{Compress, Compression, FlushCompress};

/// gzip member header: magic, deflate, no flags, no mtime, no extra flags, unknown OS.
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];

#[derive(Debug, Clone)]
pub struct GzipPrefix {
    /// gzip header and the deflated body ending with a full flush (no final block).
    bytes: Bytes,
    crc: crc32fast::Hasher,
    len: u64,
}

impl GzipPrefix {
    pub fn new(body: &[u8]) -> Self {
        let mut bytes = HEADER.to_vec();
        deflate_into(body, FlushCompress::Full, &mut bytes);
        let mut crc = crc32fast::Hasher::new();
        crc.update(body);
        GzipPrefix {
            bytes: Bytes::from(bytes),
            crc,
            len: body.len() as u64,
        }
    }

    /// The complete gzip stream of `body` followed by `tail`.
    #[cfg(test)]
    pub fn finish(&self, tail: &[u8]) -> Vec<u8> {
        self.finish_parts(tail).concat()
    }

    /// The same stream as two parts: the shared prefix, and the tail with the trailer.
    ///
    /// The tail (a line or two) goes in a final *stored* block rather than through deflate:
    /// setting up a deflate stream allocates and clears ~270 KiB of zlib state, which cost more
    /// per scrape than everything else a gzip scrape does, to save a few bytes.
    pub fn finish_parts(&self, tail: &[u8]) -> [Bytes; 2] {
        let mut out = Vec::with_capacity(tail.len() + 32);
        for (i, chunk) in tail.chunks(usize::from(u16::MAX)).enumerate() {
            let last = (i + 1) * usize::from(u16::MAX) >= tail.len();
            stored_block(chunk, last, &mut out);
        }
        if tail.is_empty() {
            stored_block(b"", true, &mut out);
        }
        let mut crc = self.crc.clone();
        crc.update(tail);
        let _ = out.write_all(&crc.finalize().to_le_bytes());
        // ISIZE is the input length modulo 2^32 (RFC 1952).
        let _ = out.write_all(&((self.len + tail.len() as u64) as u32).to_le_bytes());
        [self.bytes.clone(), Bytes::from(out)]
    }

    #[cfg(test)]
    pub fn prefix_len(&self) -> usize {
        self.bytes.len()
    }
}

/// A deflate stored block (RFC 1951 §3.2.4) at a byte boundary, which the full flush that ends
/// the prefix guarantees: BFINAL and BTYPE 00 in the first byte, then LEN and its complement.
fn stored_block(data: &[u8], last: bool, out: &mut Vec<u8>) {
    let len = u16::try_from(data.len()).unwrap_or(u16::MAX);
    out.push(u8::from(last));
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(!len).to_le_bytes());
    out.extend_from_slice(&data[..usize::from(len)]);
}

/// Raw-deflates all of `input` into `out` with the given final flush.
fn deflate_into(input: &[u8], flush: FlushCompress, out: &mut Vec<u8>) {
    let mut c = Compress::new(Compression::fast(), false);
    loop {
        out.reserve(input.len() / 2 + 128);
        let consumed = c.total_in() as usize;
        let status = c.compress_vec(&input[consumed..], out, flush);
        let done = c.total_in() as usize == input.len();
        match status {
            Ok(flate2::Status::StreamEnd) => return,
            Ok(_) if done && out.len() < out.capacity() && flush != FlushCompress::Finish => return,
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "deflate failed");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn gunzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(data)
            .read_to_end(&mut out)
            .expect("valid gzip");
        out
    }

    #[test]
    fn body_and_tail_make_one_valid_stream() {
        let body: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("metric{{gpu=\"{}\"}} {}\n", i % 8, i).into_bytes())
            .collect();
        let prefix = GzipPrefix::new(&body);
        let tail = b"gpu_steward_snapshot_age_seconds 0.25\n";
        let gz = prefix.finish(tail);
        let mut expected = body.clone();
        expected.extend_from_slice(tail);
        assert_eq!(gunzip(&gz), expected);
        // The body was really compressed, not stored.
        assert!(prefix.prefix_len() < body.len() / 4);
    }

    #[test]
    fn a_tail_longer_than_one_stored_block_is_split() {
        let tail: Vec<u8> = (0..150_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let gz = GzipPrefix::new(b"head\n").finish(&tail);
        let mut expected = b"head\n".to_vec();
        expected.extend_from_slice(&tail);
        assert_eq!(gunzip(&gz), expected);
    }

    #[test]
    fn empty_parts_are_valid() {
        assert_eq!(gunzip(&GzipPrefix::new(b"").finish(b"")), b"");
        assert_eq!(gunzip(&GzipPrefix::new(b"").finish(b"x\n")), b"x\n");
    }
}
