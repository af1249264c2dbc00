//! The MIG plan as the planner makes it and the audit log records it (`mig` `apply.start`,
//! `step`, `mode.pending`, `apply.done`): plain data, defined with the records that carry it so
//! that the ledger stands below the subsystems that write it. The planner ([`crate::mig::plan`])
//! and the apply ([`crate::mig::apply`]) use these types under their own names.

use serde::{Deserialize, Serialize};

/// A MIG apply's intent record (`mig-apply.intent`, [`crate::mig::intent`]): written before its
/// first change, so that one found later means that apply was killed half-way.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct IntentRecord {
    pub layout: String,
    pub pid: u32,
    /// Seconds since the Unix epoch.
    pub started: u64,
    /// The records of interrupted applies that were still there when this apply started
    /// (oldest first, at most 8): the node had not reached a known layout since.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier: Vec<IntentRecord>,
}

/// One change, in the order it must be made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Step {
    SetMigMode {
        enable: bool,
    },
    DestroyComputeInstance {
        gpu_instance_id: u32,
        compute_instance_id: u32,
        /// What to re-create to undo it.
        profile_id: u32,
        start: u32,
        size: u32,
    },
    DestroyGpuInstance {
        gpu_instance_id: u32,
        profile: String,
        profile_id: u32,
        start: u32,
        size: u32,
    },
    /// A full-size compute instance in a kept GPU instance that has none.
    CreateComputeInstance {
        gpu_instance_id: u32,
        profile_id: u32,
        start: u32,
        size: u32,
    },
    /// A GPU instance at this placement and its full-size compute instance.
    CreateInstance {
        profile: String,
        profile_id: u32,
        start: u32,
        size: u32,
        ci_profile_id: u32,
        ci_size: u32,
    },
}

/// The plan for one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPlan {
    pub index: u32,
    pub uuid: String,
    /// `false`: no entry of the layout selects this GPU; it is left alone.
    pub selected: bool,
    /// GPU instance ids kept as they are.
    pub kept: Vec<u32>,
    pub steps: Vec<Step>,
    /// Processes running in instances the plan destroys (or on a GPU whose mode changes).
    pub blocking_pids: Vec<u32>,
}

/// The plan for the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub gpus: Vec<GpuPlan>,
}

/// A GPU whose MIG mode change waits for a reset.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct PendingReset {
    pub index: u32,
    pub uuid: String,
    pub enable: bool,
    /// The driver's activation status (`in_use`, `reset_required`).
    pub status: String,
    pub blocking_pids: Vec<u32>,
}
