//! GPUs that answer "healthy" while they degrade: a storm of correctable ECC errors
//! (`ecc_sbe_rate`) and a PCIe link that trained below its maximum (`pcie_link_degraded`).
//! Neither fails a call or sets an XID, so the history-free checks never see them; this keeps
//! what they need across polls.
//!
//! No NVML call of its own: the correctable counter comes from the `ecc` read (slow tier), the
//! link width from `pcie_counters` (slow tier), the link generation and the utilization from
//! the fast tier, the maxima from the identity.
//!
//! Must not: raise anything on an idle GPU whose link generation is low (GPUs lower it to save
//! power), or before a whole window of samples.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use super::conditions::{finding, Finding};
use super::{Action, HealthConfig, Status};
use crate::snapshot::{GpuSnapshot, GpuStatus};

pub const ECC_SBE_RATE: &str = "ecc_sbe_rate";
pub const PCIE_LINK_DEGRADED: &str = "pcie_link_degraded";

/// A GPU at or above this utilization (`nvmlDeviceGetUtilizationRates` gpu, %) is busy: its link
/// should run at its maximum generation.
/// CHOSEN: half the time a kernel runs. Neither DCGM's health watches nor gpud define "busy"
/// for the link generation; an idle or lightly used GPU may lower its generation to save power
/// (NVIDIA's driver does so in low performance states), and a GPU busy half the time is in P0,
/// where the driver trains the link to its maximum.
pub const PCIE_BUSY_UTIL_PERCENT: u32 = 50;

/// What one GPU's degradation checks remember.
#[derive(Debug, Default)]
pub struct DegradedHistory {
    /// (time, volatile correctable ECC count) samples covering the window.
    sbe: VecDeque<(SystemTime, u64)>,
    /// Since when the GPU has been busy with its link generation below the maximum.
    slow_busy_since: Option<SystemTime>,
}

impl DegradedHistory {
    /// The findings of `gpu` at `now`.
    pub fn findings(
        &mut self,
        gpu: &GpuSnapshot,
        config: &HealthConfig,
        now: SystemTime,
    ) -> Vec<Finding> {
        if gpu.status != GpuStatus::Up {
            self.slow_busy_since = None;
            return Vec::new();
        }
        let mut out = Vec::new();
        out.extend(self.sbe_rate(gpu, config, now));
        out.extend(self.pcie_link(gpu, config, now));
        out
    }

    /// Correctable (single-bit) ECC errors per minute over `ecc_correctable_window`, against
    /// `ecc_correctable_per_minute`, as DCGM's MEM health watch: the volatile count's growth
    /// over the window, a warning at or above the limit. No verdict until the window is covered.
    fn sbe_rate(
        &mut self,
        gpu: &GpuSnapshot,
        config: &HealthConfig,
        now: SystemTime,
    ) -> Option<Finding> {
        let count = gpu.reading.ecc.corrected_volatile?;
        if self.sbe.back().is_some_and(|(_, c)| *c > count) {
            self.sbe.clear(); // the volatile counter restarted (driver reload or GPU reset)
        }
        self.sbe.push_back((now, count));
        let window = config.ecc_correctable_window;
        let old = |t: &SystemTime| now.duration_since(*t).unwrap_or_default() >= window;
        while self.sbe.len() > 2 && self.sbe.get(1).is_some_and(|(t, _)| old(t)) {
            self.sbe.pop_front();
        }
        let (start, base) = *self.sbe.front()?;
        let span = now.duration_since(start).unwrap_or_default();
        if !old(&start) || span.is_zero() {
            return None;
        }
        let errors = count - base;
        let per_minute = errors as f64 * 60.0 / span.as_secs_f64();
        let limit = config.ecc_correctable_per_minute;
        (errors > 0 && per_minute >= limit).then(|| {
            finding(
                ECC_SBE_RATE,
                Status::Warn,
                Action::None,
                format!(
                    "{per_minute:.0} correctable (single-bit) ECC errors per minute over the last \
                     {} ({errors} in all, {:.1}/s), at or above the limit of {limit}/min: the memory \
                     is degrading while the GPU still answers; watch row remapping and \
                     uncorrectable errors, and drain it for a field diagnostic if it persists",
                    crate::human::duration(span),
                    per_minute / 60.0,
                ),
            )
        })
    }

    /// The link narrower than its maximum (at once), or slower than its maximum generation
    /// while the GPU has been busy for `pcie_busy_for`.
    fn pcie_link(
        &mut self,
        gpu: &GpuSnapshot,
        config: &HealthConfig,
        now: SystemTime,
    ) -> Option<Finding> {
        let r = &gpu.reading;
        let id = gpu.identity.as_ref();
        let (max_gen, max_width) = (
            id.and_then(|i| i.max_pcie_generation),
            id.and_then(|i| i.max_pcie_width),
        );
        let narrow = match (r.pcie_width, max_width) {
            (Some(w), Some(max)) if w < max => Some((w, max)),
            _ => None,
        };
        let util = r.gpu_util_percent.unwrap_or(0);
        let busy = util >= PCIE_BUSY_UTIL_PERCENT;
        let slow = match (r.pcie_generation, max_gen) {
            (Some(g), Some(max)) if g < max && busy => Some((g, max)),
            _ => None,
        };
        if slow.is_some() {
            self.slow_busy_since.get_or_insert(now);
        } else {
            self.slow_busy_since = None;
        }
        let busy_for = self.slow_busy_since.map_or(Duration::ZERO, |t| {
            now.duration_since(t).unwrap_or_default()
        });
        let slow = slow.filter(|_| busy_for >= config.pcie_busy_for);
        if narrow.is_none() && slow.is_none() {
            return None;
        }
        let link = format!(
            "Gen{} x{}",
            r.pcie_generation.unwrap_or(0),
            r.pcie_width.unwrap_or(0)
        );
        let max = format!("Gen{} x{}", max_gen.unwrap_or(0), max_width.unwrap_or(0));
        let mut why = Vec::new();
        if let Some((w, m)) = narrow {
            why.push(format!(
                "trained to x{w} of x{m} lanes ({:.0}% of the host bandwidth)",
                f64::from(w) * 100.0 / f64::from(m)
            ));
        }
        if let Some((g, m)) = slow {
            why.push(format!(
                "at Gen{g} below Gen{m} while {util}% busy (at or above {PCIE_BUSY_UTIL_PERCENT}%) \
                 for {}",
                crate::human::duration(busy_for)
            ));
        }
        Some(finding(
            PCIE_LINK_DEGRADED,
            Status::Warn,
            Action::None,
            format!(
                "PCIe link {link}, maximum {max}: {}; check the slot, riser and cabling (a GPU \
                 reset or node reboot retrains the link)",
                why.join(" and ")
            ),
        ))
    }
}

#[cfg(test)]
#[path = "degraded_tests.rs"]
mod tests;
