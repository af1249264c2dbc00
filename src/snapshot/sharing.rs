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
