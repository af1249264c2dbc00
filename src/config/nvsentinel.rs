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
                 '{}' (PlatformConnector/HealthEventOccurredV1), at most {} queued while it is \
                 down, each call at most {}\n",
                s.display(),
                QUEUE_CAPACITY,
                humantime::format_duration(CALL_TIMEOUT)
            ),
        }
    }
}
