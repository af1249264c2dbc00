//! One device's NVML state for one session, and the table of what can be read from it.
//!
//! Each [`Read`] is a small group of calls with one outcome, filed under a *source* (the unit
//! operators see in `gpu_steward_poll_source_*`) and a [`Tier`] chosen from what the calls cost
//! on a real H100 (driver 580, `nvml-sim/costs/`) and how fast their values move. The
//! poller decides when each tier is due; the reader only runs reads and keeps what must persist
//! between them (the process-utilization cursor, GPM samples, the fan count, what the device
//! lacks).

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvml_wrapper::{Device, Nvml};

use super::gpm::GpmSampler;
use super::identity::{self, IdentityRead};
use super::nvlink;
use super::processes::{self, ProcessCursor};
use super::telemetry;
use super::CallLog;
use crate::snapshot::{GpuReading, NvmlCode};

/// How often a read is worth its cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Cheap (2-60 µs) and fast-moving: every poll.
    Fast,
    /// 0.16 ms of CPU each (BAR1, power limit, ECC mode, PCIe replays, MIG mode) or
    /// slow-moving (error counters, link width): every `[poller] slow_interval` (10 s).
    Slow,
    /// Milliseconds each: the energy counter (3.0 ms of CPU on an H100) and per-process
    /// utilization (2.8 ms): every `[poller] expensive_interval` (30 s).
    Expensive,
    /// GPM (Hopper and newer): one sample per GPU (and per MIG instance) at each edge of the
    /// profiling window, every `[poller] profiling_interval` (5 s); `nvmlGpmMetricsGet` between
    /// two samples costs 1.0-1.45 ms of CPU on a real H200 whatever the window.
    Profiling,
    /// Expensive cadence, and so slow in wall time (`nvmlDeviceGetPcieThroughput` samples for
    /// 20 ms per direction) that it runs after the poll's results are handed over, never on
    /// its critical path.
    Background,
}

/// One entry of [`READS`].
pub struct Read {
    /// Short name, for logs and tests (`energy`, `process_utilization`, ...).
    pub name: &'static str,
    /// The source it reports under (`power`, `processes`, ...).
    pub source: &'static str,
    pub tier: Tier,
    run: fn(&mut GpuReader, &Device, &mut GpuReading),
}

impl std::fmt::Debug for Read {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({:?})", self.source, self.name, self.tier)
    }
}

const fn read(
    source: &'static str,
    name: &'static str,
    tier: Tier,
    run: fn(&mut GpuReader, &Device, &mut GpuReading),
) -> Read {
    Read {
        name,
        source,
        tier,
        run,
    }
}

/// Everything read per GPU, in the order it is read (a source's reads may depend on earlier
/// ones of the same poll: processes on the MIG mode, PCIe throughput on GPM).
pub static READS: &[Read] = &[
    read(
        "utilization",
        "utilization",
        Tier::Fast,
        telemetry::utilization,
    ),
    read("memory", "memory", Tier::Fast, telemetry::memory),
    read("memory", "bar1", Tier::Slow, telemetry::bar1),
    read("thermal", "temperature", Tier::Fast, telemetry::thermal),
    read("power", "power", Tier::Fast, telemetry::power),
    read("power", "energy", Tier::Expensive, telemetry::energy),
    read("power", "power_limit", Tier::Slow, telemetry::power_limit),
    read("clocks", "clocks", Tier::Fast, telemetry::clocks),
    read("pcie", "pcie_link", Tier::Fast, telemetry::pcie_link),
    read(
        "pcie",
        "pcie_counters",
        Tier::Slow,
        telemetry::pcie_counters,
    ),
    read("ecc", "ecc", Tier::Slow, telemetry::ecc),
    read("mig", "mig_mode", Tier::Slow, telemetry::mig_mode),
    read("mig", "mig_layout", Tier::Slow, GpuReader::mig_layout),
    read("processes", "process_list", Tier::Fast, processes::list),
    read(
        "processes",
        "process_utilization",
        Tier::Expensive,
        processes::utilization,
    ),
    read("gpm", "gpm", Tier::Profiling, GpuReader::gpm),
    read("nvlink", "nvlink_links", Tier::Slow, nvlink::links),
    read("nvlink", "nvlink_counters", Tier::Fast, nvlink::counters),
    read("nvlink", "fabric", Tier::Slow, nvlink::fabric),
    read(
        "pcie",
        "pcie_throughput",
        Tier::Background,
        telemetry::pcie_throughput,
    ),
];

/// The NVML library of a session, opaque outside the NVML boundary.
pub struct Library(Arc<Nvml>);

/// A device handle for one poll, opaque outside the NVML boundary.
pub struct Handle<'l>(Device<'l>);

/// What one run of a read did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadOutcome {
    pub duration: Duration,
    /// Calls that failed, other than as unsupported or with the GPU lost (0 = success).
    pub failures: u32,
}

/// One device's NVML state for one session: what it lacks, what its calls cost, and what
/// reads carry from one poll to the next.
pub struct GpuReader {
    nvml: Arc<Nvml>,
    index: u32,
    pub log: CallLog,
    pub(super) cursor: ProcessCursor,
    gpm: GpmSampler,
    /// `nvmlDeviceGetNumFans`, asked once (1 when the driver cannot say: fan 0 is probed).
    pub(super) fans: Option<u32>,
    /// The MIG mode last read: what the GPU supports changes with it.
    pub(super) mig: Option<bool>,
    /// The board's GPU-instance profiles, read once while MIG is enabled.
    mig_profiles: Option<Vec<crate::snapshot::mig::GiProfile>>,
    /// The published PCIe rates came from GPM.
    pcie_from_gpm: bool,
}

impl GpuReader {
    pub(super) fn new(nvml: Arc<Nvml>, index: u32) -> Self {
        GpuReader {
            nvml,
            index,
            log: CallLog::default(),
            cursor: ProcessCursor::default(),
            gpm: GpmSampler::default(),
            fans: None,
            mig: None,
            mig_profiles: None,
            pcie_from_gpm: false,
        }
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    /// Where the NVML call this reader is in is told (see [`super::InCall`]).
    pub fn in_call(&self) -> super::InCall {
        self.log.in_call()
    }

    /// Forgets per-board state (utilization cursor, GPM samples, capabilities): the index
    /// now names another board. Errors and costs not handed over yet are kept, and so is
    /// where the call being made is told.
    pub fn forget_board(&mut self) {
        let (errors, costs) = self.log.take();
        let in_call = self.log.in_call();
        *self = GpuReader::new(self.nvml.clone(), self.index);
        self.log = CallLog::watched(in_call);
        self.log.errors = errors;
        self.log.costs = costs;
    }

    /// The session's library, to take a device [`Handle`] from.
    pub fn library(&self) -> Library {
        Library(self.nvml.clone())
    }

    /// The device handle for this poll; `Err` when it cannot be had (`GpuIsLost` when the GPU
    /// fell off the bus).
    pub fn handle<'l>(&mut self, library: &'l Library) -> Result<Handle<'l>, NvmlCode> {
        let index = self.index;
        self.log
            .call("nvmlDeviceGetHandleByIndex_v2", || {
                library.0.device_by_index(index)
            })
            .map(Handle)
    }

    /// The board's UUID: what tells one board from another at the same index.
    pub fn uuid(&mut self, device: &Handle) -> Result<String, NvmlCode> {
        self.log.call("nvmlDeviceGetUUID", || device.0.uuid())
    }

    /// Reads what the GPU is (see [`IdentityRead`]).
    pub fn identity(&mut self, device: &Handle) -> Result<IdentityRead, NvmlCode> {
        identity::read(&device.0, self.index, &mut self.log)
    }

    /// The MIG layout (GPU and compute instances, MIG UUIDs) while MIG is enabled.
    fn mig_layout(&mut self, d: &Device, out: &mut GpuReading) {
        let enabled = out.mig_mode_current == Some(true);
        out.mig_instances = super::mig::poll_layout(
            &self.nvml,
            &mut self.mig_profiles,
            d,
            enabled,
            &mut self.log.errors,
        );
    }

    /// Runs one read into `out`.
    pub fn run(&mut self, read: &Read, device: &Handle, out: &mut GpuReading) -> ReadOutcome {
        let started = Instant::now();
        self.log.begin_read();
        (read.run)(self, &device.0, out);
        ReadOutcome {
            duration: started.elapsed(),
            failures: self.log.read_failures(),
        }
    }

    /// The MIG mode read this poll: when it changed, what the GPU answers changes too, so
    /// what it was found to lack is asked again.
    pub(super) fn observe_mig(&mut self, enabled: Option<bool>) {
        if let Some(now) = enabled {
            if self.mig.is_some_and(|was| was != now) {
                self.log.forget_capabilities();
            }
            self.mig = Some(now);
        }
    }

    fn gpm(&mut self, device: &Device, out: &mut GpuReading) {
        let mig = self.mig == Some(true);
        out.gpm = self.gpm.poll(&self.nvml, device, mig, &mut self.log);
        let instances: Vec<u32> = out
            .mig_instances
            .iter()
            .flatten()
            .map(|gi| gi.gpu_instance_id)
            .collect();
        out.mig_gpm = if mig {
            self.gpm
                .poll_mig(&self.nvml, device, &instances, &mut self.log)
        } else {
            Vec::new()
        };
        let rates = out
            .gpm
            .as_ref()
            .map(|m| (m.pcie_tx_bytes_per_second, m.pcie_rx_bytes_per_second))
            .filter(|(tx, rx)| tx.is_some() || rx.is_some());
        match rates {
            Some((tx, rx)) => {
                out.pcie_tx_bytes_per_second = tx;
                out.pcie_rx_bytes_per_second = rx;
                self.pcie_from_gpm = true;
            }
            // GPM stopped giving them (MIG enabled, a failed sample): its last rates are not
            // current; `nvmlDeviceGetPcieThroughput` gives them again at its next read.
            None if self.pcie_from_gpm => {
                out.pcie_tx_bytes_per_second = None;
                out.pcie_rx_bytes_per_second = None;
                self.pcie_from_gpm = false;
            }
            None => {}
        }
    }

    /// Whether GPM gives this GPU's PCIe rates (then `nvmlDeviceGetPcieThroughput`, 20 ms of
    /// wall time per direction, is not needed).
    pub(super) fn pcie_from_gpm(&self, out: &GpuReading) -> bool {
        out.gpm
            .as_ref()
            .is_some_and(|m| m.pcie_tx_bytes_per_second.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_read_has_a_unique_name_and_a_known_source() {
        let sources = [
            "utilization",
            "memory",
            "thermal",
            "power",
            "clocks",
            "pcie",
            "ecc",
            "mig",
            "processes",
            "gpm",
            "nvlink",
        ];
        let mut names = std::collections::HashSet::new();
        for r in READS {
            assert!(names.insert(r.name), "{} twice", r.name);
            assert!(sources.contains(&r.source), "{r:?}");
        }
    }

    #[test]
    fn the_calls_that_cost_milliseconds_are_not_on_every_poll() {
        // Measured on an H100 (driver 580): energy 3.0 ms CPU, process utilization 2.8 ms CPU,
        // PCIe throughput 21 ms wall.
        let tier = |n: &str| READS.iter().find(|r| r.name == n).map(|r| r.tier);
        assert_eq!(tier("energy"), Some(Tier::Expensive));
        assert_eq!(tier("process_utilization"), Some(Tier::Expensive));
        assert_eq!(tier("pcie_throughput"), Some(Tier::Background));
        // nvmlGpmMetricsGet: 1.0-1.45 ms CPU on an H200, driver 580 (reference/real-h200).
        assert_eq!(tier("gpm"), Some(Tier::Profiling));
    }
}
