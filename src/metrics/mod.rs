//! `/metrics`: the page, rendered once per poll from a snapshot and its health.
//!
//! - `dcgm`: names, units and labels of NVIDIA's dcgm-exporter 4.x, so existing dashboards, alert
//!   rules and autoscaler queries keep working;
//! - `native`: `gpu_steward_*` series following the Prometheus naming rules (base units, ratios,
//!   `_total` counters, identity in `gpu_steward_gpu_info`);
//! - `agent`: the agent's own health (always on); `kubelet`: the pod-resources client's.
//! - `gpm` (profiling, both families), `nvlink` (NVLink and fabric, both families) and
//!   `processes` (per-process, native) have their own files.
//! - the actors' own series (rules, remediation, reclaim) through [`Collector`]s they hand to
//!   the poller, collected into the same page.
//!
//! Rendering happens on the poller thread right after a poll, once; every scrape of the
//! publication serves the same bytes (`publication::Page`). Nothing here calls NVML or knows
//! how the page is served.

mod agent;
mod dcgm;
mod dcgm_sets;
mod dcgm_xid;
mod family;
mod gpm;
mod health;
mod kubelet;
mod mig;
mod native;
mod nvlink;
mod processes;
mod served;
mod sharing;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::SystemTime;

use crate::health::NodeHealth;
use crate::publication::Page;
use crate::snapshot::Snapshot;
use crate::AgentCounters;

pub use crate::config::{DcgmNames, Profile};
pub use family::{Families, Family};
pub use served::left_out;

/// What a native collector may put on the page, from the profile and the families on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View {
    /// The full profile: everything.
    pub full: bool,
    /// Values the dcgm family also carries: on the full page, or when that family is off.
    pub duplicates: bool,
}

impl RenderConfig {
    pub(crate) fn view(&self) -> View {
        let full = self.profile.is_full();
        View {
            full,
            duplicates: full || !self.dcgm,
        }
    }
}

/// `Content-Type` of the Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the renderer needs from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderConfig {
    pub dcgm: bool,
    pub native: bool,
    /// `[metrics] profile`: lean (a series budget per GPU) or full (everything).
    pub profile: Profile,
    /// `[metrics] dcgm_names`: which of dcgm-exporter's name sets the dcgm family uses.
    pub names: DcgmNames,
    /// Value of dcgm-exporter's hostname label (`NODE_NAME`, else the host name).
    pub hostname: String,
    /// Name of that label: `Hostname` as dcgm-exporter 4.x, `hostname` as its newer releases;
    /// empty to leave it out (dcgm-exporter's `--no-hostname`).
    pub hostname_label: String,
    /// The fuller NVLink profile: per-link state and errors (`[metrics] nvlink_links`).
    pub nvlink_links: bool,
    /// Metric names whose series keep their label pairs on the page, unescaped: the names the
    /// rules select, which they read from there (the rule set is fixed at start).
    pub labelled: Arc<HashSet<String>>,
}

/// A source of series outside the snapshot: an actor's own state (alert counts, hook runs, the
/// reclaim view), collected into the page each time it is rendered. Implementors copy out what
/// they hold under a short lock; they must not block or do I/O.
pub trait Collector: Send + Sync {
    /// Pushes its families.
    fn collect(&self, out: &mut Families);
}

/// Series an actor rendered itself and posted for the next page (the reclaim actor's, which it
/// renders from its own view after each of its runs).
#[derive(Default)]
pub struct Posted(std::sync::Mutex<Vec<Family>>);

impl Posted {
    /// Replaces what was posted before.
    pub fn post(&self, families: Vec<Family>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = families;
    }
}

impl Collector for Posted {
    fn collect(&self, out: &mut Families) {
        for f in self.0.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            out.push(f.clone());
        }
    }
}

/// Renders every enabled family of `snapshot`, and the collectors' series, into one page.
pub fn render(
    snapshot: &Snapshot,
    health: &NodeHealth,
    config: &RenderConfig,
    counters: &AgentCounters,
    collectors: &[Arc<dyn Collector>],
) -> Page {
    // The page keeps the label pairs of the names the rules select, and no others.
    let mut families = Families::labelled(config.labelled.clone());
    if config.dcgm {
        dcgm::render(snapshot, health, config, &mut families);
    }
    if config.native {
        let view = config.view();
        native::render(snapshot, view, &mut families);
        if view.duplicates {
            gpm::render_native(snapshot, &mut families);
        }
        nvlink::render_native(snapshot, config.nvlink_links, &mut families);
        nvlink::render_topology(snapshot, &mut families);
        processes::render(snapshot, view, &mut families);
        health::render(snapshot, health, view, &mut families);
        mig::render(snapshot, view, &mut families);
        sharing::render(snapshot, view, &mut families);
    }
    agent::render(snapshot, counters, config.profile.is_full(), &mut families);
    kubelet::render(snapshot, &mut families);
    // The actors' series are native ones (`gpu_steward_*`): off with the native family.
    if config.native {
        for c in collectors {
            c.collect(&mut families);
        }
    }
    let mut f = Family::gauge(
        "gpu_steward_page_series",
        "Series on this page, this one included: what each scrape of this agent adds to Prometheus.",
    );
    // Last, so that it counts itself.
    f.add::<&str>(&[], (families.series() + 1) as f64);
    families.push(f);
    families.into_page()
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
