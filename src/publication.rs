//! What the poller publishes each interval, and everything downstream reads: the snapshot, its
//! health, the health journal and the page rendered from them.
//!
//! Plain data at the bottom of the house: the poller produces it, and the actors (HTTP, rules,
//! remediation, reclaim, the sharing guard and the device plugin) receive it through a
//! `tokio::sync::watch` channel without importing the poller. Must not: import anything that
//! acts, or change after it is published (only the page's gzip copy is made once, on demand).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;

use crate::health::{Journal, NodeHealth};
use crate::snapshot::Snapshot;

/// One poll's publication. Immutable once sent.
#[derive(Debug)]
pub struct Published {
    pub snapshot: Arc<Snapshot>,
    /// Per-GPU verdicts computed from `snapshot` (and the ones before it).
    pub health: Arc<NodeHealth>,
    /// The health event journal: the same `Arc` in every publication. The poller appends once
    /// per poll; readers hold the lock only to copy entries out, so they never stall a poll.
    pub journal: Arc<Mutex<Journal>>,
    /// The exposition of this publication, every family in it (see `metrics::render`).
    pub page: Page,
    /// The poll interval in force when this was published (readiness uses it).
    pub interval: Duration,
}

/// One rendered exposition, served as it is: the page is rendered once per poll, and every
/// scrape of this publication gets the same bytes.
#[derive(Debug)]
pub struct Page {
    /// Prometheus text format 0.0.4. Shared by reference with every scrape: serving copies no
    /// body.
    pub text: Bytes,
    /// Series (sample lines) on the page, counted while it was rendered.
    pub series: usize,
    /// `text` gzipped, made by the first scrape that asks for gzip and shared by the others.
    /// Polls outnumber scrapes (a 1-5 s poll against a 15-30 s scrape), so compressing every
    /// publication up front would mostly compress pages nobody fetches.
    gzip: OnceLock<Bytes>,
}

impl Page {
    pub fn new(text: Bytes) -> Page {
        Page::counted(text, 0)
    }

    /// A page whose renderer counted its `series`.
    pub fn counted(text: Bytes, series: usize) -> Page {
        Page {
            text,
            series,
            gzip: OnceLock::new(),
        }
    }

    /// Whether the gzip copy exists already (a gzip scrape then only clones a pointer).
    pub fn gzip_ready(&self) -> bool {
        self.gzip.get().is_some()
    }

    /// The gzip copy of the page, compressed on first use (about 0.4 ms for the 8-GPU page).
    pub fn gzip(&self) -> Bytes {
        self.gzip.get_or_init(|| compress(&self.text)).clone()
    }
}

/// gzip at flate2's fastest level: the page is text of repeated label sets, which level 1
/// already shrinks about tenfold, and its cost is paid by a waiting scraper.
fn compress(text: &[u8]) -> Bytes {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(text.len() / 8 + 64),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(text);
    Bytes::from(gz.finish().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn the_gzip_copy_is_made_once_and_gives_back_the_page() {
        let text: Vec<u8> = (0..20_000u32)
            .flat_map(|i| format!("metric{{gpu=\"{}\"}} {}\n", i % 8, i).into_bytes())
            .collect();
        let page = Page::new(Bytes::from(text.clone()));
        assert!(!page.gzip_ready());
        let first = page.gzip();
        assert!(page.gzip_ready());
        assert_eq!(
            first.as_ptr(),
            page.gzip().as_ptr(),
            "shared, not recompressed"
        );
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&first[..])
            .read_to_end(&mut out)
            .expect("valid gzip");
        assert_eq!(out, text);
        assert!(first.len() < text.len() / 4, "really compressed");
    }

    #[test]
    fn an_empty_page_compresses_to_a_valid_stream() {
        let page = Page::new(Bytes::new());
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&page.gzip()[..])
            .read_to_end(&mut out)
            .expect("valid gzip");
        assert!(out.is_empty());
    }
}
