//! An immutable view of the node at one instant, published by the poller.
//!
//! Everything downstream (metrics rendering, health, HTTP) reads a `Snapshot`; nothing downstream
//! talks to NVML. Every telemetry value is an `Option`: `None` means NVML could not give it (not
//! supported, failed, GPU lost), and renderers must leave such a series out rather than invent a 0.

pub mod mig;
mod nvlink;
mod nvml;
mod process;
mod sharing;
mod topology;

pub use nvlink::{
    Fabric, FabricFault, FabricState, LinkErrors, NvLinkErrors, NvLinks, ThroughputWindow,
};
pub use nvml::NvmlCode;
pub use process::{
    Attribution, GpuProcess, KubeletStatus, LabelNames, PodMapping, PodRef, ProcessInfo,
    ProcessKind,
};
pub use sharing::{
    CdiReport, ComputeMode, OverLimit, PluginNotes, PluginResource, ReplicaCount, SharingStatus,
};
pub use topology::{Link, Pair, Topology, TopologyGpu};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The latest value of a source that runs beside the poller (the sharing status): a `watch`
/// receiver that compares by channel, so that a configuration holding one can be compared.
#[derive(Debug)]
pub struct Feed<T>(pub tokio::sync::watch::Receiver<Arc<T>>);

impl<T> Clone for Feed<T> {
    fn clone(&self) -> Self {
        Feed(self.0.clone())
    }
}

impl<T> PartialEq for Feed<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.same_channel(&other.0)
    }
}

impl<T> Feed<T> {
    pub fn latest(&self) -> Arc<T> {
        self.0.borrow().clone()
    }
}

/// The state of the NVML library as the poller last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlStatus {
    /// Not tried yet (the agent just started).
    Starting,
    /// Initialised; the snapshot's GPU data is live.
    Up,
    /// Loading or initialising failed; the poller retries with backoff.
    Down {
        /// Why, in words an operator can act on.
        reason: String,
        /// The NVML return code or loader failure, for metrics (`driver_not_loaded`, ...).
        error: NvmlCode,
        /// When the failure began.
        since: SystemTime,
        /// Consecutive failed attempts.
        attempts: u32,
    },
}

/// Driver and library versions, read once per NVML session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverInfo {
    pub driver_version: String,
    pub nvml_version: Option<String>,
    /// CUDA driver version as NVML encodes it (`13000` = 13.0).
    pub cuda_version: Option<i32>,
}

/// How many consecutive polls with NVML up a GPU (a UUID) may be missing from the enumeration
/// before the agent forgets what it accumulated about it: XID counts, processes dropped, health
/// history. An hour at the default 5 s interval: a board unbound for maintenance, or gone
/// during a reset, keeps its counters when it returns; one that returns later starts again
/// from 0, which Prometheus reads as a counter reset. The poller and the health evaluator
/// apply the same rule to the same snapshots, so they forget a GPU at the same poll.
pub const FORGET_ABSENT_GPU_AFTER_POLLS: u32 = 720;

/// What a GPU is, read when the device is first seen (and re-read while a field fails).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuIdentity {
    pub index: u32,
    pub uuid: String,
    /// `""` until NVML answered (see [`GpuIdentity::labels_known`]).
    pub name: String,
    pub serial: Option<String>,
    /// NVML's 8-digit-domain form, e.g. `00000000:18:00.0`; `""` until NVML answered.
    pub pci_bus_id: String,
    /// `(device << 16) | vendor`, e.g. `0x233010DE`.
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    pub minor_number: Option<u32>,
    pub architecture: Option<String>,
    pub compute_capability: Option<(i32, i32)>,
    pub power_default_limit_mw: Option<u32>,
    pub power_min_limit_mw: Option<u32>,
    pub power_max_limit_mw: Option<u32>,
    pub max_clocks_mhz: Clocks,
    pub thresholds: TemperatureThresholds,
    pub max_pcie_generation: Option<u32>,
    pub max_pcie_width: Option<u32>,
}

impl GpuIdentity {
    /// Whether the name and bus id, which label every series of the dcgm family and
    /// `gpu_steward_gpu_info`, have been read. NVML never answers them empty.
    pub fn labels_known(&self) -> bool {
        !self.name.is_empty() && !self.pci_bus_id.is_empty()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clocks {
    pub graphics: Option<u32>,
    pub sm: Option<u32>,
    pub memory: Option<u32>,
    pub video: Option<u32>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TemperatureThresholds {
    pub shutdown_c: Option<u32>,
    pub slowdown_c: Option<u32>,
    pub gpu_max_c: Option<u32>,
    pub memory_max_c: Option<u32>,
}

/// Framebuffer memory in bytes, as `nvmlMemory_v2_t` reports it (`used` excludes `reserved`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub total: u64,
    pub reserved: u64,
    pub used: u64,
    pub free: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EccCounts {
    pub corrected_volatile: Option<u64>,
    pub uncorrected_volatile: Option<u64>,
    pub corrected_aggregate: Option<u64>,
    pub uncorrected_aggregate: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetiredPages {
    pub single_bit: Option<u64>,
    pub double_bit: Option<u64>,
    pub pending: Option<bool>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

/// Telemetry of one GPU, each field as its read last left it (reads run at the cadence of their
/// tier). Every field is optional; see the module docs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReading {
    pub gpu_util_percent: Option<u32>,
    pub mem_util_percent: Option<u32>,
    pub enc_util_percent: Option<u32>,
    pub dec_util_percent: Option<u32>,
    pub memory: Option<Memory>,
    pub bar1_total_bytes: Option<u64>,
    pub bar1_used_bytes: Option<u64>,
    pub temperature_c: Option<u32>,
    pub memory_temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    pub enforced_power_limit_mw: Option<u32>,
    pub energy_mj: Option<u64>,
    pub clocks_mhz: Clocks,
    pub fan_percent: Option<u32>,
    /// PCIe throughput: from GPM between two polls where the GPU has it (Hopper and newer),
    /// else from `nvmlDeviceGetPcieThroughput` (a 20 ms sample in KB/s, x 1024).
    pub pcie_tx_bytes_per_second: Option<f64>,
    pub pcie_rx_bytes_per_second: Option<f64>,
    pub pcie_replay_count: Option<u32>,
    pub pcie_generation: Option<u32>,
    pub pcie_width: Option<u32>,
    pub ecc_enabled: Option<bool>,
    pub ecc: EccCounts,
    pub retired_pages: RetiredPages,
    pub remapped_rows: Option<RemappedRows>,
    /// `nvmlClocksEventReasons` bitmask.
    pub clock_event_reasons: Option<u64>,
    pub mig_mode_current: Option<bool>,
    pub mig_mode_pending: Option<bool>,
    /// GPU instances (with compute instances and MIG UUIDs) while MIG is enabled.
    pub mig_instances: Option<Vec<mig::GpuInstance>>,
    /// GPM metrics per GPU instance id while MIG is enabled (Hopper and newer).
    pub mig_gpm: Vec<(u32, GpmMetrics)>,
    /// Containers the kubelet allocated this GPU's MIG devices to.
    pub mig_pods: Vec<mig::MigPod>,
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: 0 none, 1 gpu reset, 2 node reboot, 3 drain P2P,
    /// 4 drain and reset, 5 recover the IMEX domain.
    pub recovery_action: Option<u32>,
    /// The processes exported, at most `[processes] max_per_gpu` (largest memory first).
    pub processes: Option<Vec<GpuProcess>>,
    /// How many processes NVML listed, before the cap.
    pub process_count: Option<u32>,
    /// Processes left out by the cap, summed over polls since the agent started.
    pub processes_dropped_total: u64,
    /// GPM profiling metrics between this poll and the previous one (Hopper and newer).
    pub gpm: Option<GpmMetrics>,
    /// Kubernetes containers the kubelet allocated this GPU (or a replica of it) to.
    pub pods: Vec<PodRef>,
    /// `nvmlDeviceGetComputeMode` (slow tier, with the MIG mode).
    pub compute_mode: Option<ComputeMode>,
    /// NVLinks (slow tier for link state, every poll for counters); `None` without NVLink.
    pub nvlink: Option<NvLinks>,
    /// The GPU fabric (Hopper and newer with NVLink; slow tier).
    pub fabric: Option<Fabric>,
}

/// GPM metrics (`nvmlGpmMetricsGet` between two samples), ratios 0-1 and bytes per second.
/// Each is `None` when NVML answered that metric with an error.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpmMetrics {
    pub graphics_active: Option<f64>,
    pub sm_active: Option<f64>,
    pub sm_occupancy: Option<f64>,
    pub tensor_active: Option<f64>,
    pub dram_active: Option<f64>,
    pub fp64_active: Option<f64>,
    pub fp32_active: Option<f64>,
    pub fp16_active: Option<f64>,
    pub pcie_tx_bytes_per_second: Option<f64>,
    pub pcie_rx_bytes_per_second: Option<f64>,
}

/// Whether the GPU could be read this poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuStatus {
    Up,
    /// NVML answered `GPU_IS_LOST`: fallen off the bus or otherwise inaccessible.
    Lost,
    /// Its handle or identity could not be read, for the reason given.
    Unreadable(String),
}

/// Counts of one XID on one GPU since the agent started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidStat {
    pub count: u64,
    pub last_seen: SystemTime,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GpuSnapshot {
    pub index: u32,
    /// `None` when the GPU has never been readable since the agent started.
    pub identity: Option<Arc<GpuIdentity>>,
    pub status: GpuStatus,
    pub reading: GpuReading,
    /// NVML calls on this GPU that failed in the last run of each read (not counting "not
    /// supported"); slow-tier reads count until they run again.
    pub failed_calls: u32,
    /// The most consecutive runs of any one read of this GPU that failed, up to its last.
    pub failing_runs: u32,
    /// Per-XID counts, keyed by XID.
    pub xids: BTreeMap<u64, XidStat>,
    /// The most recent XID on this GPU, as dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS` reports it.
    pub last_xid: Option<u64>,
}

impl GpuSnapshot {
    pub fn uuid(&self) -> &str {
        self.identity.as_ref().map_or("", |i| i.uuid.as_str())
    }
}

/// The poll result of one source (a group of related NVML calls), as node_exporter reports its
/// collectors: one failing source never blanks the others.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourceStatus {
    pub duration: Duration,
    pub success: bool,
}

/// What one NVML function has cost so far: calls and the wall time spent in them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CallStat {
    pub calls: u64,
    pub seconds: f64,
}

impl CallStat {
    pub fn add(&mut self, calls: u64, time: Duration) {
        self.calls += calls;
        self.seconds += time.as_secs_f64();
    }
}

/// A whole-node snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Wall-clock time of the poll that produced it.
    pub taken_at: SystemTime,
    pub nvml: NvmlStatus,
    pub driver: Option<DriverInfo>,
    pub gpus: Vec<GpuSnapshot>,
    /// GPUs NVML counts (`nvmlDeviceGetCount_v2`), lost ones included; `None` while NVML is down.
    pub gpu_count: Option<u32>,
    /// Keyed by source name (`utilization`, `memory`, ...).
    pub sources: BTreeMap<&'static str, SourceStatus>,
    /// How long the whole poll took.
    pub poll_duration: Duration,
    /// Cumulative NVML call failures by (function, error), since the agent started.
    pub nvml_errors: BTreeMap<(&'static str, NvmlCode), u64>,
    /// Cumulative NVML calls made by the poller, by function, since the agent started (the XID
    /// waiter's blocking waits are not counted: they wait for events, they cost nothing).
    pub nvml_calls: BTreeMap<&'static str, CallStat>,
    /// Cumulative NVML initialisation failures by error, since the agent started.
    pub nvml_init_errors: BTreeMap<NvmlCode, u64>,
    /// Completed polls since the agent started.
    pub polls: u64,
    /// The kubelet pod-resources client, when `[kubernetes] enabled`.
    pub kubernetes: Option<KubeletStatus>,
    /// The sharing subsystem (device plugin, replicas, memory guard), when configured.
    pub sharing: Option<Arc<SharingStatus>>,
    /// How the GPUs connect (read at start and when the set of GPUs changes).
    pub topology: Option<Arc<Topology>>,
}

impl Snapshot {
    /// The snapshot published before the first poll.
    pub fn starting(now: SystemTime) -> Self {
        Snapshot {
            taken_at: now,
            nvml: NvmlStatus::Starting,
            driver: None,
            gpus: Vec::new(),
            gpu_count: None,
            sources: BTreeMap::new(),
            poll_duration: Duration::ZERO,
            nvml_errors: BTreeMap::new(),
            nvml_init_errors: BTreeMap::new(),
            nvml_calls: BTreeMap::new(),
            polls: 0,
            kubernetes: None,
            sharing: None,
            topology: None,
        }
    }

    /// Looks a GPU up by index (`"3"`) or UUID (`"GPU-..."`).
    pub fn gpu(&self, key: &str) -> Option<&GpuSnapshot> {
        match key.parse::<u32>() {
            Ok(index) => self.gpus.iter().find(|g| g.index == index),
            Err(_) => self
                .gpus
                .iter()
                .find(|g| g.uuid().eq_ignore_ascii_case(key)),
        }
    }
}
