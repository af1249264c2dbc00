//! One change of one GPU's health, as the journal keeps it, `/api/v1/events` serves it and the
//! journal file stores it (one JSON object per line).

use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serialize};

use super::{rfc3339, Action, Status};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A condition became active.
    Raised,
    /// An active condition got worse (severity or action).
    Escalated,
    /// An active condition got milder or changed its reason's numbers.
    Changed,
    /// A condition is no longer active.
    Cleared,
    /// An XID arrived (journalled even when it raises nothing, e.g. catalog bucket IGNORE).
    Observed,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Raised => "raised",
            EventKind::Escalated => "escalated",
            EventKind::Changed => "changed",
            EventKind::Cleared => "cleared",
            EventKind::Observed => "observed",
        }
    }
}

/// One change of one GPU's health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthEvent {
    #[serde(serialize_with = "rfc3339", deserialize_with = "from_rfc3339")]
    pub time: SystemTime,
    pub gpu: u32,
    pub uuid: String,
    pub kind: EventKind,
    pub condition: String,
    /// The condition's severity after the change (`pass` for cleared).
    pub severity: Status,
    pub action: Action,
    pub reason: String,
    /// Read back from the journal file at start: it happened before this process started.
    /// Absent (false) on the events of this run, and never written to the file.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub before_restart: bool,
}

fn from_rfc3339<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_rfc3339_weak(&s).map_err(serde::de::Error::custom)
}
