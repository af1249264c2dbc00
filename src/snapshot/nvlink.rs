//! NVLink and the GPU fabric of one GPU, as plain data. `None` (on [`super::GpuReading`]) means
//! the board has no NVLink or NVML does not show it (a VM with the GPU passed through, as
//! captured on the real H100, answers NOT_SUPPORTED): renderers leave the series out.

use std::time::{Duration, Instant};

/// The board's NVLinks (`nvmlDeviceGetNvLinkState` per link) and their counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvLinks {
    /// One entry per link the board has, by link number: whether it is active.
    pub active: Vec<bool>,
    /// Error counts summed over the GPU's links (`NVML_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL`).
    pub errors: NvLinkErrors,
    /// Data bytes transmitted and received over all links since the driver loaded
    /// (`NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`/`_RX`, KiB, summed over links).
    pub tx_bytes: Option<u64>,
    pub rx_bytes: Option<u64>,
    /// Per-link error counts by link number (`NVML_FI_DEV_NVLINK_ERROR_DL_*`); empty when the
    /// driver does not give them.
    pub per_link: Vec<LinkErrors>,
    /// When `tx_bytes` and `rx_bytes` were read (both known), for the next poll's window.
    pub sampled_at: Option<Instant>,
    /// The last two reads of the data counters, for DCGM's rate fields; `None` on the first
    /// read, or when either read lacked a direction.
    pub window: Option<ThroughputWindow>,
}

impl NvLinks {
    pub fn active_count(&self) -> usize {
        self.active.iter().filter(|a| **a).count()
    }

    /// Transmitted plus received KiB, NVML's unit, as DCGM sums them for field 449.
    pub fn total_kib(&self) -> Option<u64> {
        Some((self.tx_bytes? + self.rx_bytes?) / 1024)
    }
}

/// Two successive reads of the GPU's NVLink data counters (transmit + receive, KiB): what
/// DCGM's `ReadAndCacheNvLinkBandwidth` divides by the time between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThroughputWindow {
    pub kib_before: u64,
    pub kib_now: u64,
    pub elapsed: Duration,
}

impl ThroughputWindow {
    /// KiB per second over the window; `None` when the counters went back (a driver reload
    /// resets them: no rate can be known) or no time passed.
    pub fn kib_per_second(&self) -> Option<f64> {
        let secs = self.elapsed.as_secs_f64();
        let delta = self.kib_now.checked_sub(self.kib_before)?;
        (secs > 0.0).then(|| delta as f64 / secs)
    }
}

/// The error counters of `nvmlNvLinkErrorCounter_t`, summed over the GPU's links.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvLinkErrors {
    pub replay: Option<u64>,
    pub recovery: Option<u64>,
    pub crc_flit: Option<u64>,
    pub crc_data: Option<u64>,
}

/// One link's data-link-layer error counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkErrors {
    pub replay: Option<u64>,
    pub recovery: Option<u64>,
    pub crc: Option<u64>,
}

/// `nvmlGpuFabricState_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FabricState {
    NotStarted,
    InProgress,
    Completed,
}

impl FabricState {
    pub fn as_str(self) -> &'static str {
        match self {
            FabricState::NotStarted => "not_started",
            FabricState::InProgress => "in_progress",
            FabricState::Completed => "completed",
        }
    }

    /// The value of the `state` gauge: `NVML_GPU_FABRIC_STATE_*` (1 not started, 2 in
    /// progress, 3 completed).
    pub fn code(self) -> u8 {
        match self {
            FabricState::NotStarted => 1,
            FabricState::InProgress => 2,
            FabricState::Completed => 3,
        }
    }
}

/// `nvmlDeviceGetGpuFabricInfoV` (Hopper and newer, with NVLink through NVSwitches).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fabric {
    pub state: FabricState,
    /// The registration status when it is not SUCCESS (`None` = SUCCESS).
    pub error: Option<super::NvmlCode>,
    pub clique_id: u32,
    /// The cluster UUID, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub cluster_uuid: String,
    /// `healthMask`; `None` from a v1 answer.
    pub health_mask: Option<u32>,
    /// `healthSummary` (1 healthy, 2 unhealthy, 3 limited capacity); `None` before struct v3
    /// or when NOT_SUPPORTED (0).
    pub health_summary: Option<u8>,
}

/// A fabric health-mask field that reads "true" (or, for the configuration, not "none").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricFault {
    DegradedBandwidth,
    RouteRecovery,
    RouteUnhealthy,
    AccessTimeoutRecovery,
    IncorrectConfiguration,
}

impl FabricFault {
    pub fn as_str(self) -> &'static str {
        match self {
            FabricFault::DegradedBandwidth => "degraded_bandwidth",
            FabricFault::RouteRecovery => "route_recovery",
            FabricFault::RouteUnhealthy => "route_unhealthy",
            FabricFault::AccessTimeoutRecovery => "access_timeout_recovery",
            FabricFault::IncorrectConfiguration => "incorrect_configuration",
        }
    }
}

impl Fabric {
    /// The health-mask fields that are set, decoded as nvml.h lays them out
    /// (`NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_*` / `_WIDTH_*`: a 2-bit field per fault at shifts
    /// 0, 2, 4, 6 where 1 = true, 2 = false, 0 = not supported; the configuration at shift 8,
    /// 4 bits, where 0 = not supported, 1 = none, anything else a misconfiguration).
    pub fn faults(&self) -> Vec<FabricFault> {
        let Some(mask) = self.health_mask else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (shift, fault) in [
            (0, FabricFault::DegradedBandwidth),
            (2, FabricFault::RouteRecovery),
            (4, FabricFault::RouteUnhealthy),
            (6, FabricFault::AccessTimeoutRecovery),
        ] {
            if (mask >> shift) & 0x3 == 1 {
                out.push(fault);
            }
        }
        if (mask >> 8) & 0xF > 1 {
            out.push(FabricFault::IncorrectConfiguration);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_mask(mask: u32) -> Fabric {
        Fabric {
            state: FabricState::Completed,
            error: None,
            clique_id: 1,
            cluster_uuid: String::new(),
            health_mask: Some(mask),
            health_summary: Some(1),
        }
    }

    #[test]
    fn the_health_mask_decodes_as_nvml_h_lays_it_out() {
        let healthy = 2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8;
        assert!(with_mask(healthy).faults().is_empty());
        assert!(with_mask(0).faults().is_empty(), "all not supported");
        assert_eq!(
            with_mask(healthy & !0x3 | 1).faults(),
            [FabricFault::DegradedBandwidth]
        );
        assert_eq!(
            with_mask(2 | 2 << 2 | 1 << 4 | 1 << 6 | 5 << 8).faults(),
            [
                FabricFault::RouteUnhealthy,
                FabricFault::AccessTimeoutRecovery,
                FabricFault::IncorrectConfiguration
            ]
        );
    }
}
