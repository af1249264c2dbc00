//! `/metrics`: two families rendered from a snapshot, once per poll.
//!
//! - `dcgm`: names, units and labels of NVIDIA's dcgm-exporter 4.x, so existing dashboards, alert
//!   rules and autoscaler queries keep working;
//! - `native`: `gpu_steward_*` series following the Prometheus naming rules (base units, ratios,
//!   `_total` counters, identity in `gpu_steward_gpu_info`);
//! - `agent`: the agent's own health (always on); `kubelet`: the pod-resources client's.
//! - `gpm` (profiling, both families) and `processes` (per-process, native) have their own files.
//!
//! Rendering happens on the poller thread right after a poll; a scrape copies the bytes and
//! appends one line computed at scrape time (the snapshot's age). Nothing here calls NVML.

mod agent;
mod dcgm;
mod dcgm_xid;
mod family;
mod gpm;
mod gzip;
mod health;
mod kubelet;
mod mig;
mod native;
mod processes;
mod sharing;

use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use bytes::Bytes;

use crate::health::NodeHealth;
use crate::http::sendfile::{FileBacked, PageFile};
use crate::snapshot::Snapshot;
use crate::AgentCounters;

pub use family::{Families, Family};

/// `Content-Type` of the Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the renderer needs from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderConfig {
    pub dcgm: bool,
    pub native: bool,
    /// Value of dcgm-exporter's hostname label (`NODE_NAME`, else the host name).
    pub hostname: String,
    /// Name of that label: `Hostname` as dcgm-exporter 4.x, `hostname` as its newer releases;
    /// empty to leave it out (dcgm-exporter's `--no-hostname`).
    pub hostname_label: String,
}

/// One snapshot's exposition, ready to serve.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// Shared by reference with every scrape of this publication: serving copies no body.
    pub text: Bytes,
    /// Compressed when a scraper first asks for gzip, then shared by every gzip scrape of this
    /// publication. Polls outnumber scrapes (a 1 s poll against a 15-30 s scrape), so
    /// compressing every poll spent a third of the agent's own CPU on pages nobody fetched.
    gzip: OnceLock<gzip::GzipPrefix>,
    /// `text` in a sealed memfd, made when a plain-TCP scraper first asks for this publication,
    /// so that scrapes send it with `sendfile` (see `http::sendfile`); `None` inside when the
    /// kernel refused a memfd.
    file: OnceLock<Option<Arc<PageFile>>>,
    taken_at: SystemTime,
}

impl Rendered {
    /// The plain body for a scrape at `now`.
    pub fn plain(&self, now: SystemTime) -> Vec<u8> {
        self.plain_parts(now).concat()
    }

    /// The plain body as its two parts: the shared page and this scrape's tail.
    pub fn plain_parts(&self, now: SystemTime) -> [Bytes; 2] {
        self.plain_parts_with(now, b"")
    }

    /// The plain parts with `extra` (series rendered at scrape time, e.g. alert states) added
    /// to the tail.
    pub fn plain_parts_with(&self, now: SystemTime, extra: &[u8]) -> [Bytes; 2] {
        let mut tail = self.tail(now);
        tail.extend_from_slice(extra);
        [self.text.clone(), Bytes::from(tail)]
    }

    /// The shared page with its memfd copy, made on first use; `None` when memfds are refused.
    pub fn plain_file(&self) -> Option<FileBacked> {
        let file =
            self.file
                .get_or_init(|| match PageFile::new(c"gpu-steward-metrics", &self.text) {
                    Ok(file) => Some(Arc::new(file)),
                    Err(e) => {
                        tracing::debug!(error = %e, "no memfd for the page; scrapes copy it");
                        None
                    }
                });
        FileBacked::new(self.text.clone(), file.clone()?)
    }

    /// Whether the gzip body is compressed already (a gzip scrape then only copies).
    pub fn gzip_ready(&self) -> bool {
        self.gzip.get().is_some()
    }

    /// Compresses the page unless it is already; true when this call did.
    pub fn compress(&self) -> bool {
        let mut did = false;
        self.gzip.get_or_init(|| {
            did = true;
            gzip::GzipPrefix::new(&self.text)
        });
        did
    }

    /// The gzip body for a scrape at `now`.
    pub fn gzip(&self, now: SystemTime) -> Vec<u8> {
        self.gzip_parts(now).concat()
    }

    /// The gzip body as its two parts: the shared compressed page and this scrape's tail with
    /// the trailer.
    pub fn gzip_parts(&self, now: SystemTime) -> [Bytes; 2] {
        self.gzip_parts_with(now, b"")
    }

    /// The gzip parts with `extra` added to the tail (compressed after the shared prefix).
    pub fn gzip_parts_with(&self, now: SystemTime, extra: &[u8]) -> [Bytes; 2] {
        let mut tail = self.tail(now);
        tail.extend_from_slice(extra);
        self.gzip
            .get_or_init(|| gzip::GzipPrefix::new(&self.text))
            .finish_parts(&tail)
    }

    fn tail(&self, now: SystemTime) -> Vec<u8> {
        use std::io::Write;
        // Every scrape runs this: the constant text is copied, and the age, rounded to the
        // millisecond, is formatted as integers (float formatting cost more than the rest).
        const HEAD: &str = "# HELP gpu_steward_snapshot_age_seconds Seconds since the snapshot \
             served by this scrape was taken, computed at scrape time.\n\
             # TYPE gpu_steward_snapshot_age_seconds gauge\n\
             gpu_steward_snapshot_age_seconds ";
        let age = now.duration_since(self.taken_at).unwrap_or_default();
        let ms = (age.as_nanos() + 500_000) / 1_000_000;
        let mut tail = Vec::with_capacity(HEAD.len() + 32);
        tail.extend_from_slice(HEAD.as_bytes());
        let _ = writeln!(tail, "{}.{:03}", ms / 1000, ms % 1000);
        tail
    }
}

/// Renders every enabled family of `snapshot`.
pub fn render(
    snapshot: &Snapshot,
    health: &NodeHealth,
    config: &RenderConfig,
    counters: &AgentCounters,
) -> Rendered {
    let mut families = Families::default();
    if config.dcgm {
        dcgm::render(snapshot, health, config, &mut families);
    }
    if config.native {
        native::render(snapshot, &mut families);
        gpm::render_native(snapshot, &mut families);
        processes::render(snapshot, &mut families);
        health::render(snapshot, health, &mut families);
        mig::render(snapshot, &mut families);
        sharing::render(snapshot, &mut families);
    }
    agent::render(snapshot, counters, &mut families);
    kubelet::render(snapshot, &mut families);
    let text = Bytes::from(families.encode().into_bytes());
    Rendered {
        gzip: OnceLock::new(),
        file: OnceLock::new(),
        text,
        taken_at: snapshot.taken_at,
    }
}

/// 1 for true, 0 for false: the value of a boolean series.
pub(crate) fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Seconds since the Unix epoch, for `_timestamp_seconds` series.
pub(crate) fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}
