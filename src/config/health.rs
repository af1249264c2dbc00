//! The health evaluation's tunables: XID window and escalation, per-XID overrides, thresholds.
//!
//! Plain data with defaults, validated by `config::file` (which knows the positions of bad
//! values); this module never reads files. The vocabulary the section is written in (a GPU's
//! [`Status`] and the [`Action`] an operator should take) is defined here, where the file names
//! it, and used by `health` for its verdicts. Defaults follow DCGM's health watches and NVIDIA's
//! XID catalog (see `docs/health.md` for the table of conditions).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Health status as the draft RFC "Health Check Response Format for HTTP APIs" spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Warn,
    Fail,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }

    /// 0 pass, 1 warn, 2 fail (`gpu_steward_gpu_health`).
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn parse(s: &str) -> Option<Status> {
        [Status::Pass, Status::Warn, Status::Fail]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

/// What an operator (or a remediation hook) should do about a GPU, from least to most drastic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    None,
    RestartApp,
    ResetGpu,
    RebootNode,
    DrainAndReset,
    ContactSupport,
}

pub const ACTIONS: [Action; 6] = [
    Action::None,
    Action::RestartApp,
    Action::ResetGpu,
    Action::RebootNode,
    Action::DrainAndReset,
    Action::ContactSupport,
];

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::None => "none",
            Action::RestartApp => "restart_app",
            Action::ResetGpu => "reset_gpu",
            Action::RebootNode => "reboot_node",
            Action::DrainAndReset => "drain_and_reset",
            Action::ContactSupport => "contact_support",
        }
    }

    pub fn parse(s: &str) -> Option<Action> {
        ACTIONS.into_iter().find(|a| a.as_str() == s)
    }

    /// The next step when the same fault keeps coming back: an application restart did not help
    /// → reset the GPU; resets did not help → reboot; reboots did not help → hardware
    /// (gpud escalates to HARDWARE_INSPECTION after repeated reboots the same way).
    pub fn escalate(self) -> Action {
        match self {
            Action::None => Action::None,
            Action::RestartApp => Action::ResetGpu,
            Action::ResetGpu | Action::DrainAndReset => Action::RebootNode,
            Action::RebootNode | Action::ContactSupport => Action::ContactSupport,
        }
    }
}

/// What the config says about one XID, replacing the catalog's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XidOverride {
    /// Journal the XID but never raise a condition for it.
    Ignore,
    Classify {
        severity: Status,
        action: Action,
    },
}

/// Per-lane replay rates (replays per minute per lane) at a bit error rate of 1e-12, as DCGM's
/// PCIe health watch assumes them (`NVIDIA/DCGM:modules/health/DcgmHealthWatch.cpp`), for
/// generations 1 to 6.
pub const DCGM_REPLAYS_PER_MINUTE_PER_LANE: [f64; 6] = [0.15, 0.3, 0.48, 0.96, 1.92, 3.84];

#[derive(Debug, Clone, PartialEq)]
pub struct HealthConfig {
    /// How long an XID keeps its GPU in warn or fail after its last occurrence.
    pub xid_window: Duration,
    /// The same XID seen this many times within `xid_window` escalates its verdict one level.
    pub xid_escalate_after: u32,
    /// Window of `DCGM_EXP_XID_ERRORS_COUNT` (dcgm-exporter's `--xid-count-window-size`).
    pub xid_count_window: Duration,
    /// Warn when the GPU is this close (°C) to its slowdown temperature.
    pub temperature_margin_c: u32,
    /// Expected replays per minute per lane, indexed by PCIe generation - 1.
    pub pcie_replay_per_minute: [f64; 6],
    /// The span over which the replay rate is measured (DCGM: 60 s); no verdict before that.
    pub pcie_replay_window: Duration,
    /// A GPU whose NVML calls fail for this many consecutive polls warns.
    pub failing_calls_polls: u32,
    /// Retired pages (single + double bit) at which the GPU fails (DCGM_LIMIT_MAX_RETIRED_PAGES).
    pub retired_pages_max: u64,
    /// Rows remapped for uncorrectable errors at which the GPU warns (DCGM's MEM watch: 512).
    pub remapped_rows_uncorrectable_max: u32,
    pub xid_overrides: BTreeMap<u64, XidOverride>,
    /// NVLink replay + recovery errors per minute (summed over the GPU's links) above which
    /// the GPU warns (`nvlink_errors`).
    pub nvlink_errors_per_minute: f64,
    /// The span over which that rate is measured; no verdict before that.
    pub nvlink_error_window: Duration,
    /// Correctable (single-bit) ECC errors per minute at or above which the GPU warns
    /// (`ecc_sbe_rate`).
    pub ecc_correctable_per_minute: f64,
    /// The span over which that rate is measured; no verdict before that.
    pub ecc_correctable_window: Duration,
    /// How long a busy GPU's link may run below its maximum generation before it warns
    /// (`pcie_link_degraded`).
    pub pcie_busy_for: Duration,
}

/// DCGM's limit on correctable (single-bit) ECC errors in its MEM watch's one-minute window
/// (`DCGM_LIMIT_MAX_SBE_RATE`, `NVIDIA/DCGM:dcgmlib/src/dcgm_gpu_hardware_limits.h`; the watch
/// warns at or above it: `modules/health/DcgmHealthWatch.cpp` `MonitorMem`).
pub const DCGM_SBE_PER_MINUTE: f64 = 10.0;

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            xid_window: Duration::from_secs(600),
            xid_escalate_after: 3,
            xid_count_window: Duration::from_millis(300_000),
            temperature_margin_c: 5,
            pcie_replay_per_minute: DCGM_REPLAYS_PER_MINUTE_PER_LANE,
            pcie_replay_window: Duration::from_secs(60),
            failing_calls_polls: 3,
            retired_pages_max: 63,
            remapped_rows_uncorrectable_max: 512,
            xid_overrides: BTreeMap::new(),
            // CHOSEN: DCGM's NVLINK watch fails on any replay or recovery error
            // (DCGM_LIMIT_MAX_NVLINK_ERROR = 1 per check); a healthy link sees none, and one
            // stray error a minute is not yet a storm.
            nvlink_errors_per_minute: 1.0,
            nvlink_error_window: Duration::from_secs(60),
            ecc_correctable_per_minute: DCGM_SBE_PER_MINUTE,
            // DCGM's MEM watch looks at the last minute.
            ecc_correctable_window: Duration::from_secs(60),
            // CHOSEN: a minute, the span of DCGM's rate watches; a link the driver is about to
            // raise is back at its maximum within a poll of the GPU getting busy.
            pcie_busy_for: Duration::from_secs(60),
        }
    }
}

impl HealthConfig {
    /// Replays per minute above which a link of `generation` and `width` lanes warns:
    /// ceil(per-lane rate × lanes), as DCGM computes it (Gen4 x16 → 16/min, Gen5 x16 → 31/min).
    pub fn pcie_replay_limit(&self, generation: u32, width: u32) -> Option<f64> {
        let rate = self
            .pcie_replay_per_minute
            .get((generation as usize).checked_sub(1)?)?;
        Some((rate * f64::from(width)).ceil())
    }

    /// One line per setting, for `check-config`.
    pub fn describe(&self) -> String {
        let overrides: Vec<String> = self
            .xid_overrides
            .iter()
            .map(|(xid, o)| match o {
                XidOverride::Ignore => format!("{xid}=ignore"),
                XidOverride::Classify { severity, action } => {
                    format!("{xid}={}/{}", severity.as_str(), action.as_str())
                }
            })
            .collect();
        let rates: Vec<String> = self
            .pcie_replay_per_minute
            .iter()
            .enumerate()
            .map(|(i, r)| format!("gen{}={r}", i + 1))
            .collect();
        format!(
            "health: XIDs count for {window} (escalate after {esc} in the window), \
             DCGM_EXP_XID_ERRORS_COUNT window {count_window}, warn {margin}°C below slowdown, \
             PCIe replays/min/lane {rates} measured over {replay_window}, warn after {polls} polls of failing calls, \
             fail at {pages} retired pages, warn at {rows} uncorrectable remapped rows, \
             NVLink errors above {nvlink}/min over {nvlink_window}, \
             correctable ECC errors at or above {sbe}/min over {sbe_window}, \
             PCIe link below its maximum generation while busy for {busy_for}, \
             XID overrides: {overrides}\n",
            window = humantime::format_duration(self.xid_window),
            esc = self.xid_escalate_after,
            count_window = humantime::format_duration(self.xid_count_window),
            margin = self.temperature_margin_c,
            rates = rates.join(" "),
            replay_window = humantime::format_duration(self.pcie_replay_window),
            polls = self.failing_calls_polls,
            pages = self.retired_pages_max,
            rows = self.remapped_rows_uncorrectable_max,
            nvlink = self.nvlink_errors_per_minute,
            nvlink_window = humantime::format_duration(self.nvlink_error_window),
            sbe = self.ecc_correctable_per_minute,
            sbe_window = humantime::format_duration(self.ecc_correctable_window),
            busy_for = humantime::format_duration(self.pcie_busy_for),
            overrides = if overrides.is_empty() {
                "none".to_string()
            } else {
                overrides.join(", ")
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcie_limits_follow_dcgm() {
        let c = HealthConfig::default();
        assert_eq!(c.pcie_replay_limit(4, 16), Some(16.0));
        assert_eq!(c.pcie_replay_limit(5, 16), Some(31.0));
        assert_eq!(c.pcie_replay_limit(3, 16), Some(8.0));
        assert_eq!(c.pcie_replay_limit(0, 16), None);
        assert_eq!(c.pcie_replay_limit(7, 16), None);
    }
}
