//! The checks of one GPU at one poll that need no history: reachability, memory errors, the
//! driver's recovery action, thermal and power slowdowns.
//!
//! Each check returns `Finding`s (a condition without its `since`); the evaluator adds the
//! history-based ones (XIDs, PCIe replay rate, failing calls) and the timestamps. Thresholds
//! follow DCGM's health watches (`NVIDIA/DCGM:modules/health/DcgmHealthWatch.cpp`), summarised
//! in `docs/health.md`.

use super::{Action, HealthConfig, Status};
use crate::snapshot::{GpuSnapshot, GpuStatus};

pub const GPU_LOST: &str = "gpu_lost";
pub const GPU_UNREADABLE: &str = "gpu_unreadable";
pub const ECC_DBE: &str = "ecc_dbe";
pub const RETIRED_PAGES_PENDING: &str = "retired_pages_pending";
pub const RETIRED_PAGES_LIMIT: &str = "retired_pages_limit";
pub const ROW_REMAP_PENDING: &str = "row_remap_pending";
pub const ROW_REMAP_FAILED: &str = "row_remap_failed";
pub const ROW_REMAP_UNCORRECTABLE: &str = "row_remap_uncorrectable";
pub const RECOVERY_ACTION: &str = "driver_recovery_action";
pub const THERMAL_SLOWDOWN: &str = "thermal_slowdown";
pub const TEMPERATURE_MARGIN: &str = "temperature_margin";
pub const POWER_BRAKE: &str = "power_brake_slowdown";
pub const PCIE_REPLAY_RATE: &str = "pcie_replay_rate";
pub const NVML_CALLS_FAILING: &str = "nvml_calls_failing";
pub const MIG_MODE_PENDING: &str = "mig_mode_pending";
pub const MIG_INCOMPLETE: &str = "mig_incomplete";

/// `nvmlClocksEventReasonHwThermalSlowdown`.
const HW_THERMAL_SLOWDOWN: u64 = 0x40;
/// `nvmlClocksEventReasonHwPowerBrakeSlowdown`.
const HW_POWER_BRAKE_SLOWDOWN: u64 = 0x80;

/// A condition found at one poll, before the evaluator stamps its `since`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub name: String,
    pub severity: Status,
    pub reason: String,
    pub action: Action,
}

pub fn finding(name: &str, severity: Status, action: Action, reason: String) -> Finding {
    Finding {
        name: name.to_string(),
        severity,
        reason,
        action,
    }
}

/// Every history-free check of `gpu`.
pub fn check(gpu: &GpuSnapshot, config: &HealthConfig) -> Vec<Finding> {
    let mut out = Vec::new();
    match &gpu.status {
        GpuStatus::Up => {}
        GpuStatus::Lost => {
            out.push(finding(
                GPU_LOST,
                Status::Fail,
                // NVIDIA's XID catalog buckets XID 79 (fallen off the bus) as RESTART_BM.
                Action::RebootNode,
                "NVML reports the GPU as lost (GPU_IS_LOST: fallen off the bus or inaccessible); \
                 only a node reboot (power cycle) brings it back"
                    .into(),
            ));
            return out;
        }
        GpuStatus::Unreadable(why) => {
            out.push(finding(
                GPU_UNREADABLE,
                Status::Fail,
                Action::ResetGpu,
                why.clone(),
            ));
            return out;
        }
    }
    memory(gpu, config, &mut out);
    recovery_action(gpu, &mut out);
    thermal(gpu, config, &mut out);
    mig_pending(gpu, &mut out);
    mig_incomplete(gpu, &mut out);
    out
}

/// GPU instances without a compute instance: nothing can run in them and the device plugin
/// offers no MIG device for them. The agent's applier always creates both, so this is an apply
/// (or rollback) killed half-way, or a hand-made change left unfinished.
fn mig_incomplete(gpu: &GpuSnapshot, out: &mut Vec<Finding>) {
    let Some(instances) = &gpu.reading.mig_instances else {
        return;
    };
    let empty: Vec<String> = instances
        .iter()
        .filter(|gi| gi.compute_instances.is_empty())
        .map(|gi| format!("{} ({})", gi.gpu_instance_id, gi.profile))
        .collect();
    if empty.is_empty() {
        return;
    }
    out.push(finding(
        MIG_INCOMPLETE,
        Status::Warn,
        Action::None,
        format!(
            "GPU instance(s) {} have no compute instance: a MIG change was interrupted; apply the \
             layout again (gpu-steward mig apply --layout NAME, or SIGHUP the agent with [mig] \
             layout set), which completes or replaces them",
            empty.join(", ")
        ),
    ));
}

/// A MIG mode change waiting for a GPU reset (nodes stuck "pending" advertise no GPUs:
/// NVIDIA/mig-parted#18, gpu-operator#118): what blocks the reset and what to do.
fn mig_pending(gpu: &GpuSnapshot, out: &mut Vec<Finding>) {
    let r = &gpu.reading;
    let (Some(current), Some(pending)) = (r.mig_mode_current, r.mig_mode_pending) else {
        return;
    };
    if current == pending {
        return;
    }
    let word = |on: bool| if on { "enabled" } else { "disabled" };
    let holders: Vec<String> = r
        .processes
        .iter()
        .flatten()
        .map(|p| match &p.info {
            Some(i) => format!("{} ({})", p.pid, i.name),
            None => p.pid.to_string(),
        })
        .collect();
    let blocked = if holders.is_empty() {
        "no process holds the GPU now".to_string()
    } else {
        format!("processes hold the GPU: {}", holders.join(", "))
    };
    out.push(finding(
        MIG_MODE_PENDING,
        Status::Warn,
        if holders.is_empty() {
            Action::ResetGpu
        } else {
            Action::DrainAndReset
        },
        format!(
            "MIG mode is {} and {} is pending until the GPU is reset; {blocked}; a reset also \
             needs nvidia-persistenced, dcgm/nv-hostengine and the nvidia_drm module out of the \
             way; stop them, then reset the GPU (nvidia-smi -r -i {}) or apply the layout with \
             [mig] reset_command configured",
            word(current),
            word(pending),
            gpu.index
        ),
    ));
}

fn memory(gpu: &GpuSnapshot, config: &HealthConfig, out: &mut Vec<Finding>) {
    let r = &gpu.reading;
    // The volatile counter restarts at 0 with the driver or a GPU reset, so any count is a
    // double-bit error since the last reset: DCGM's MEM watch fails on volatile DBE > 0.
    if let Some(dbe) = r.ecc.uncorrected_volatile.filter(|n| *n > 0) {
        out.push(finding(
            ECC_DBE,
            Status::Fail,
            Action::ResetGpu,
            format!(
                "{dbe} uncorrectable (double-bit) ECC error(s) since the last GPU reset; \
                 reset the GPU to retire or remap the affected memory"
            ),
        ));
    }
    let p = r.retired_pages;
    if p.pending == Some(true) {
        out.push(finding(
            RETIRED_PAGES_PENDING,
            Status::Warn,
            Action::ResetGpu,
            "pages are pending retirement; they are retired at the next GPU reset".into(),
        ));
    }
    let retired = p.single_bit.unwrap_or(0) + p.double_bit.unwrap_or(0);
    if (p.single_bit.is_some() || p.double_bit.is_some()) && retired >= config.retired_pages_max {
        out.push(finding(
            RETIRED_PAGES_LIMIT,
            Status::Fail,
            Action::ContactSupport,
            format!(
                "{retired} pages retired, at or over the limit of {}; the board needs \
                 replacing (RMA)",
                config.retired_pages_max
            ),
        ));
    }
    let Some(rows) = r.remapped_rows else { return };
    if rows.failure {
        out.push(finding(
            ROW_REMAP_FAILED,
            Status::Fail,
            Action::ContactSupport,
            "a row remapping failed: the memory cannot be repaired in the field (RMA)".into(),
        ));
    }
    if rows.pending {
        out.push(finding(
            ROW_REMAP_PENDING,
            Status::Warn,
            Action::ResetGpu,
            "a row remapping is pending; it takes effect at the next GPU reset".into(),
        ));
    }
    if rows.uncorrectable >= config.remapped_rows_uncorrectable_max {
        out.push(finding(
            ROW_REMAP_UNCORRECTABLE,
            Status::Warn,
            Action::ContactSupport,
            format!(
                "{} rows remapped for uncorrectable errors, at or over {}; plan a replacement",
                rows.uncorrectable, config.remapped_rows_uncorrectable_max
            ),
        ));
    }
}

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: the driver's own recommendation, which beats ours.
/// Severities as DCGM's DRIVER watch: reset, reboot, drain-and-reset fail; drain P2P warns.
fn recovery_action(gpu: &GpuSnapshot, out: &mut Vec<Finding>) {
    let (severity, action, what) = match gpu.reading.recovery_action {
        None | Some(0) => return,
        Some(1) => (Status::Fail, Action::ResetGpu, "a GPU reset"),
        Some(2) => (Status::Fail, Action::RebootNode, "a node reboot"),
        Some(3) => (
            Status::Warn,
            Action::DrainAndReset,
            "draining peer-to-peer traffic (then a reset)",
        ),
        Some(4) => (Status::Fail, Action::DrainAndReset, "a drain and reset"),
        // NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN (go-nvml's nvml.h; NVML 590-595): the
        // multi-node NVLink (IMEX) domain the GPU belongs to must be recovered. CHOSEN: fail
        // (jobs across the domain cannot run) and drain_and_reset, the drain its jobs need
        // before nvidia-imex is restarted on the domain's nodes.
        Some(5) => (
            Status::Fail,
            Action::DrainAndReset,
            "recovering its IMEX domain: drain the jobs of the multi-node NVLink (IMEX) \
             domain, restart nvidia-imex on the domain's nodes, reset the GPU if it persists",
        ),
        Some(other) => {
            out.push(finding(
                RECOVERY_ACTION,
                Status::Warn,
                Action::ContactSupport,
                format!("the driver recommends an unknown recovery action ({other})"),
            ));
            return;
        }
    };
    out.push(finding(
        RECOVERY_ACTION,
        severity,
        action,
        format!("the driver recommends {what} (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)"),
    ));
}

fn thermal(gpu: &GpuSnapshot, config: &HealthConfig, out: &mut Vec<Finding>) {
    let r = &gpu.reading;
    let reasons = r.clock_event_reasons.unwrap_or(0);
    if reasons & HW_THERMAL_SLOWDOWN != 0 {
        out.push(finding(
            THERMAL_SLOWDOWN,
            Status::Warn,
            Action::None,
            "hardware thermal slowdown is active: clocks are cut to cool the GPU; check \
             airflow, fans and inlet temperature"
                .into(),
        ));
    }
    if reasons & HW_POWER_BRAKE_SLOWDOWN != 0 {
        out.push(finding(
            POWER_BRAKE,
            Status::Warn,
            Action::None,
            "hardware power brake slowdown is active: the power supply or chassis asked the \
             GPU to cut power; check the PSUs"
                .into(),
        ));
    }
    let slowdown = gpu.identity.as_ref().and_then(|i| i.thresholds.slowdown_c);
    if let (Some(t), Some(limit)) = (r.temperature_c, slowdown) {
        // Some GPUs report 0 (gpud skips them): no usable threshold.
        if limit > 0 && t + config.temperature_margin_c >= limit {
            out.push(finding(
                TEMPERATURE_MARGIN,
                Status::Warn,
                Action::None,
                format!(
                    "temperature {t}°C is within {}°C of the slowdown threshold {limit}°C",
                    config.temperature_margin_c
                ),
            ));
        }
    }
}
