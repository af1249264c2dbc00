//! `[nvsentinel]`: health events to NVSentinel's platform connector. Plain data; the
//! translation and the sender are [`crate::nvsentinel`]'s.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// The `agent` of every event.
pub const AGENT: &str = "gpu-steward";
/// The longest a connect and call together may take; a connector that hangs is given up on.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Events kept while the connector is down; the oldest go first (counted).
pub const QUEUE_CAPACITY: usize = 1024;
/// Events per call at most.
pub const MAX_BATCH: usize = 256;

/// `[nvsentinel]`, as written and as used: off without a socket (an empty `socket` is none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvsentinelConfig {
    #[serde(deserialize_with = "socket")]
    pub socket: Option<PathBuf>,
    /// NVSentinel's observe-only rollout switch (`processingStrategy` of every event); unset:
    /// left `UNSPECIFIED`, which the platform connector normalises to `EXECUTE_REMEDIATION`.
    pub processing_strategy: Option<Strategy>,
}

/// `[nvsentinel] processing_strategy`: NVSentinel's `ProcessingStrategy`, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    ExecuteRemediation,
    StoreOnly,
}

fn socket<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    let s = String::deserialize(d)?;
    Ok((!s.is_empty()).then(|| PathBuf::from(s)))
}

impl NvsentinelConfig {
    /// What `check-config` says.
    pub fn describe(&self) -> String {
        match &self.socket {
            None => "nvsentinel: off\n".to_string(),
            Some(s) => format!(
                "nvsentinel: every change of a GPU's verdict or condition as a HealthEvent to \
                 '{}' (PlatformConnector/HealthEventOccurredV1), processingStrategy {}, at most \
                 {} queued while it is down, each call at most {}\n",
                s.display(),
                match self.processing_strategy {
                    None => "UNSPECIFIED (the connector's default, EXECUTE_REMEDIATION)",
                    Some(Strategy::ExecuteRemediation) => "EXECUTE_REMEDIATION",
                    Some(Strategy::StoreOnly) => "STORE_ONLY (observe only)",
                },
                QUEUE_CAPACITY,
                humantime::format_duration(CALL_TIMEOUT)
            ),
        }
    }
}
