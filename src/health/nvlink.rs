//! NVLink and fabric conditions of one GPU: `nvlink_down` and `nvlink_errors` need history
//! (which links were seen active, the error counts over a window), `fabric_not_ready`,
//! `fabric_degraded` and `fabric_unhealthy` read the latest fabric info. XIDs 74 and 144-150
//! (NVLink errors in NVIDIA's catalog) also raise `nvlink_errors`.
//!
//! Pure: time comes in as an argument. Severities and actions follow DCGM's NVLINK health
//! watch (link down fails; replay/recovery errors fail there, warn here above a rate, like the
//! PCIe replay rate) and NVIDIA's fabric health mask (nvml.h); `docs/health.md` has the table.

use std::collections::{BTreeSet, VecDeque};
use std::time::SystemTime;

use super::conditions::{finding, Finding};
use super::{Action, HealthConfig, Status};
use crate::snapshot::{FabricFault, FabricState, GpuSnapshot, GpuStatus};

pub const NVLINK_DOWN: &str = "nvlink_down";
pub const NVLINK_ERRORS: &str = "nvlink_errors";
pub const FABRIC_NOT_READY: &str = "fabric_not_ready";
pub const FABRIC_DEGRADED: &str = "fabric_degraded";
pub const FABRIC_UNHEALTHY: &str = "fabric_unhealthy";

/// XIDs that are NVLink errors (`xid-catalog.csv`: 74 NVLINK_ERROR, 144-150 NVLink5).
pub fn is_nvlink_xid(xid: u64) -> bool {
    xid == 74 || (144..=150).contains(&xid)
}

/// What is remembered about one GPU's links.
#[derive(Debug, Default)]
pub struct LinkHistory {
    /// Links seen active since the agent started (or the board last changed).
    seen_active: BTreeSet<usize>,
    /// (time, replay + recovery count) samples covering the error window.
    errors: VecDeque<(SystemTime, u64)>,
}

impl LinkHistory {
    /// The NVLink findings of `gpu` at `now`; `xid_findings` are this evaluation's XID
    /// findings (`xid_<n>`), of which the NVLink ones also raise `nvlink_errors`.
    pub fn findings(
        &mut self,
        gpu: &GpuSnapshot,
        config: &HealthConfig,
        now: SystemTime,
        xid_findings: &[Finding],
    ) -> Vec<Finding> {
        let mut out = Vec::new();
        if gpu.status != GpuStatus::Up {
            return out;
        }
        let links = gpu.reading.nvlink.as_ref();
        if let Some(n) = links {
            out.extend(self.down(&n.active, gpu.reading.fabric.is_some()));
        }
        let count = links.and_then(|n| Some(n.errors.replay? + n.errors.recovery?));
        let mut errors: Vec<Finding> = self.rate(count, config, now).into_iter().collect();
        errors.extend(xid_findings.iter().filter_map(nvlink_xid));
        // One condition: the most severe of its sources.
        errors.sort_by(|a, b| b.severity.cmp(&a.severity).then(b.action.cmp(&a.action)));
        out.extend(errors.into_iter().next());
        out.extend(fabric(gpu));
        out
    }

    /// Links inactive that were seen active; on a GPU with fabric info (an NVSwitch baseboard,
    /// Hopper and newer, where every link is wired to a switch) also links inactive while
    /// another link of the GPU is active, so that a link down before the agent started counts
    /// too (CHOSEN). A board with NVLink bridges may leave links unconnected: there only a link
    /// seen active counts.
    fn down(&mut self, active: &[bool], all_wired: bool) -> Option<Finding> {
        self.seen_active.extend(
            active
                .iter()
                .enumerate()
                .filter(|(_, a)| **a)
                .map(|(i, _)| i),
        );
        let any_up = active.iter().any(|a| *a);
        let down: Vec<String> = active
            .iter()
            .enumerate()
            .filter(|(i, a)| !**a && ((all_wired && any_up) || self.seen_active.contains(i)))
            .map(|(i, _)| i.to_string())
            .collect();
        if down.is_empty() {
            return None;
        }
        Some(finding(
            NVLINK_DOWN,
            Status::Fail,
            Action::ResetGpu,
            format!(
                "NVLink {} down ({} of {}): peer-to-peer traffic runs slower or not at all; \
                 drain the GPU and reset it to retrain the links (nvidia-smi nvlink -s shows \
                 them); if a link stays down after a reset, the board or NVSwitch needs service",
                links(&down),
                down.len(),
                active.len()
            ),
        ))
    }

    /// Replay + recovery errors per minute over `nvlink_error_window` against
    /// `nvlink_errors_per_minute`; no verdict until the window is covered.
    fn rate(
        &mut self,
        count: Option<u64>,
        config: &HealthConfig,
        now: SystemTime,
    ) -> Option<Finding> {
        let Some(count) = count else {
            self.errors.clear();
            return None;
        };
        if self.errors.back().is_some_and(|(_, c)| *c > count) {
            self.errors.clear(); // the counters restarted (driver reload or reset)
        }
        self.errors.push_back((now, count));
        let old = |t: &SystemTime| {
            now.duration_since(*t).unwrap_or_default() >= config.nvlink_error_window
        };
        while self.errors.len() > 2 && self.errors.get(1).is_some_and(|(t, _)| old(t)) {
            self.errors.pop_front();
        }
        let (start, base) = *self.errors.front()?;
        let span = now.duration_since(start).unwrap_or_default();
        if !old(&start) || span.is_zero() {
            return None;
        }
        let per_minute = (count - base) as f64 * 60.0 / span.as_secs_f64();
        let limit = config.nvlink_errors_per_minute;
        (per_minute > limit).then(|| {
            finding(
                NVLINK_ERRORS,
                Status::Warn,
                Action::ResetGpu,
                format!(
                    "{per_minute:.1} NVLink replay and recovery errors per minute over the last \
                     {}, above {limit}; a link is retraining: expect slow collectives; drain \
                     and reset the GPU, and replace the board if it recurs",
                    crate::human::duration(span)
                ),
            )
        })
    }
}

/// An NVLink XID finding, as `nvlink_errors` with the XID's verdict.
fn nvlink_xid(f: &Finding) -> Option<Finding> {
    let xid: u64 = f.name.strip_prefix("xid_")?.parse().ok()?;
    is_nvlink_xid(xid).then(|| finding(NVLINK_ERRORS, f.severity, f.action, f.reason.clone()))
}

/// The fabric conditions of the latest fabric info.
fn fabric(gpu: &GpuSnapshot) -> Vec<Finding> {
    let Some(f) = &gpu.reading.fabric else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if f.state != FabricState::Completed || f.error.is_some() {
        out.push(finding(
            FABRIC_NOT_READY,
            Status::Fail,
            Action::None,
            format!(
                "the GPU fabric is {} with status {} (not completed with SUCCESS): CUDA jobs \
                 cannot start on this GPU; check that nvidia-fabricmanager runs and matches the \
                 driver version (systemctl status nvidia-fabricmanager), restart it, and \
                 reboot the node if the fabric still does not complete",
                f.state.as_str(),
                f.error.map_or("success".into(), |c| c.label()),
            ),
        ));
    }
    let faults = f.faults();
    let names = |set: &[FabricFault]| -> Vec<&str> {
        faults
            .iter()
            .filter(|x| set.contains(x))
            .map(|x| x.as_str())
            .collect()
    };
    let mut unhealthy = names(&[
        FabricFault::RouteUnhealthy,
        FabricFault::IncorrectConfiguration,
    ]);
    if unhealthy.is_empty() && f.health_summary == Some(2) {
        unhealthy.push("health summary unhealthy");
    }
    if !unhealthy.is_empty() {
        out.push(finding(
            FABRIC_UNHEALTHY,
            Status::Fail,
            Action::ResetGpu,
            format!(
                "the GPU fabric is unhealthy ({}): traffic to other GPUs over NVLink can fail; \
                 drain the GPU, check nvidia-fabricmanager's log, and reset the GPU (or reboot \
                 the node) so that the fabric manager sets up its routes again",
                unhealthy.join(", ")
            ),
        ));
    }
    let mut degraded = names(&[
        FabricFault::DegradedBandwidth,
        FabricFault::RouteRecovery,
        FabricFault::AccessTimeoutRecovery,
    ]);
    if degraded.is_empty() && unhealthy.is_empty() && f.health_summary == Some(3) {
        degraded.push("health summary limited capacity");
    }
    if !degraded.is_empty() {
        out.push(finding(
            FABRIC_DEGRADED,
            Status::Warn,
            Action::None,
            format!(
                "the GPU fabric is degraded ({}): NVLink bandwidth is reduced or routes are \
                 recovering; jobs run slower; if it persists, drain and reset the GPU",
                degraded.join(", ")
            ),
        ));
    }
    out
}

#[cfg(test)]
#[path = "nvlink_tests.rs"]
mod tests;

/// `link 3`, `links 3 and 7`, `links 3, 7 and 9`: the link numbers read as numbers, not as a
/// count.
fn links(down: &[String]) -> String {
    match down {
        [] => "no link".into(),
        [one] => format!("link {one}"),
        [rest @ .., last] => format!("links {} and {last}", rest.join(", ")),
    }
}
