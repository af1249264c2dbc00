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

use std::sync::OnceLock;
use std::time::SystemTime;

use bytes::Bytes;

use crate::health::NodeHealth;
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

    /// Whether the gzip body is compressed already (a gzip scrape then only copies).
    pub fn gzip_ready(&self) -> bool {
        self.gzip.get().is_some()
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
        let age = now
            .duration_since(self.taken_at)
            .unwrap_or_default()
            .as_secs_f64();
        format!(
            "# HELP gpu_steward_snapshot_age_seconds Seconds since the snapshot served by this \
             scrape was taken, computed at scrape time.\n\
             # TYPE gpu_steward_snapshot_age_seconds gauge\n\
             gpu_steward_snapshot_age_seconds {age:.3}\n"
        )
        .into_bytes()
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
