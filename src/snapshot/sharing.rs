//! Plain data about GPU sharing that the poller reads and the sharing subsystem changes.

use serde::Serialize;

/// `nvmlComputeMode_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeMode {
    /// Several contexts per GPU, time-sliced by the driver.
    Default,
    /// Removed from NVML; only ever observed, never set.
    ExclusiveThread,
    /// No contexts at all.
    Prohibited,
    /// One context per GPU, usable from several threads (what MPS wants).
    ExclusiveProcess,
}

impl ComputeMode {
    /// The modes a configuration may ask for.
    pub const SETTABLE: [ComputeMode; 3] = [
        ComputeMode::Default,
        ComputeMode::ExclusiveProcess,
        ComputeMode::Prohibited,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ComputeMode::Default => "default",
            ComputeMode::ExclusiveThread => "exclusive_thread",
            ComputeMode::Prohibited => "prohibited",
            ComputeMode::ExclusiveProcess => "exclusive_process",
        }
    }

    /// A mode a configuration may ask for, by name.
    pub fn parse(s: &str) -> Option<ComputeMode> {
        ComputeMode::SETTABLE.into_iter().find(|m| m.as_str() == s)
    }
}

/// One GPU's replicas of one advertised resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaCount {
    pub gpu: u32,
    pub uuid: String,
    /// The name advertised to the kubelet (`nvidia.com/gpu.shared`, ...).
    pub resource: String,
    pub replicas: u32,
}

/// The device plugin's state for one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginResource {
    pub resource: String,
    /// Registered with the kubelet now.
    pub registered: bool,
    pub registrations_total: u64,
    pub registration_failures_total: u64,
    /// Allocate answers, by result (`success`, `rejected`).
    pub allocations_total: u64,
    pub allocations_rejected_total: u64,
    pub healthy_devices: u64,
    pub unhealthy_devices: u64,
}

/// A process over its replica's memory share (the memory guard's finding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverLimit {
    pub gpu: u32,
    pub uuid: String,
    pub pid: u32,
    pub used_bytes: u64,
    pub limit_bytes: u64,
}

/// What the sharing subsystem reports to metrics, published through the poller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharingStatus {
    pub replicas: Vec<ReplicaCount>,
    pub plugin: Vec<PluginResource>,
    /// Applies by trigger and result (`ok`, `failed`).
    pub applies: std::collections::BTreeMap<(String, &'static str), u64>,
    pub over_limit: Vec<OverLimit>,
    pub guard_signals_total: std::collections::BTreeMap<&'static str, u64>,
    pub plugin_notes: PluginNotes,
}

/// What the device plugin found about the CDI spec its Allocate answers name devices in.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CdiReport {
    /// The CDI kind looked for (`nvidia.com/gpu`).
    pub kind: String,
    /// The spec files of that kind found.
    pub spec_files: Vec<String>,
    /// CDI names (`nvidia.com/gpu=GPU-…`) advertised but in no spec: their allocation fails in
    /// the runtime.
    pub missing_devices: Vec<String>,
    /// Files that could not be read as a CDI spec, and why.
    pub unreadable: Vec<String>,
}

/// What the device plugin says about itself beyond its resources.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginNotes {
    /// Why `mig_strategy = "single"` advertises no device now.
    pub mig_problem: Option<String>,
    /// The CDI check, when a CDI device list strategy is configured.
    pub cdi: Option<CdiReport>,
}
