//! `[nvsentinel]`: every change of a GPU's verdict or condition as a `HealthEvent` to
//! NVSentinel's platform connector (gRPC on a Unix socket, `datamodels.PlatformConnector`
//! `HealthEventOccurredV1`).
//!
//! - [`proto`]: the vendored messages;
//! - this file: the configuration and the pure translation of verdicts into events (what
//!   changed between two polls, and the current state to send again after a reconnect);
//! - [`task`]: the actor that queues (bounded), batches per poll, sends and retries.
//!
//! Must not: block the poller, or wait on the connector longer than [`CALL_TIMEOUT`].

pub mod proto;
pub mod task;

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::health::{Action, Condition, NodeHealth, Status};
use crate::snapshot::Snapshot;
use proto::{Entity, ProcessingStrategy, RecommendedAction, Timestamp};

pub use crate::config::nvsentinel::{
    NvsentinelConfig, AGENT, CALL_TIMEOUT, MAX_BATCH, QUEUE_CAPACITY,
};

/// `[nvsentinel] processing_strategy` as the event's `processingStrategy`: unset stays
/// `UNSPECIFIED`, which the platform connector normalises to `EXECUTE_REMEDIATION`.
pub fn strategy(configured: Option<crate::config::nvsentinel::Strategy>) -> ProcessingStrategy {
    use crate::config::nvsentinel::Strategy;
    match configured {
        None => ProcessingStrategy::Unspecified,
        Some(Strategy::ExecuteRemediation) => ProcessingStrategy::ExecuteRemediation,
        Some(Strategy::StoreOnly) => ProcessingStrategy::StoreOnly,
    }
}

/// Our action as NVSentinel's recommended action (docs/health.md has the table). Every value is
/// one of the main line's enum; an application fault (`restart_app`) is `NONE`: NVSentinel
/// remediates infrastructure, and its maintainers declined an app-restart action.
pub fn recommended(action: Action) -> RecommendedAction {
    match action {
        Action::None | Action::RestartApp => RecommendedAction::None,
        Action::ResetGpu | Action::DrainAndReset => RecommendedAction::ComponentReset,
        Action::RebootNode => RecommendedAction::RestartBm,
        Action::ContactSupport => RecommendedAction::ContactSupport,
    }
}

/// What each GPU's conditions were at one poll: (index, UUID, PCI bus id) → conditions by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen(BTreeMap<(u32, String), (String, BTreeMap<String, Condition>)>);

impl Seen {
    /// The conditions of every GPU of `health`, with the PCI bus ids of `snapshot`.
    pub fn of(health: &NodeHealth, snapshot: &Snapshot) -> Seen {
        let mut seen = BTreeMap::new();
        for g in &health.gpus {
            let pci = snapshot
                .gpus
                .iter()
                .find(|s| s.index == g.index)
                .and_then(|s| s.identity.as_ref())
                .map(|i| i.pci_bus_id.clone())
                .unwrap_or_default();
            let conditions = g
                .verdict
                .conditions
                .iter()
                .map(|c| (c.name.clone(), c.clone()))
                .collect();
            seen.insert((g.index, g.uuid.clone()), (pci, conditions));
        }
        Seen(seen)
    }
}

/// Where the events go and when they were made.
pub struct Stamp<'a> {
    pub node: &'a str,
    pub at: SystemTime,
    pub strategy: ProcessingStrategy,
}

/// Whether NVSentinel is to treat a raised condition as fatal: a fail, unless it is the
/// application's fault (`restart_app`), which is not the node's.
fn fatal(c: &Condition) -> bool {
    c.severity == Status::Fail && c.action != Action::RestartApp
}

/// The events from `before` to `now`: a condition raised or changed in severity or action, and
/// one healthy event per condition cleared. In GPU order, then condition name.
pub fn changes(before: &Seen, now: &Seen, stamp: &Stamp) -> Vec<proto::HealthEvent> {
    let mut out = Vec::new();
    let empty = BTreeMap::new();
    for (key, (pci, conditions)) in &now.0 {
        let old = before.0.get(key).map_or(&empty, |(_, c)| c);
        for (name, c) in conditions {
            let same = old
                .get(name)
                .is_some_and(|o| (o.severity, o.action) == (c.severity, c.action));
            if !same {
                out.push(event(key, pci, c, false, stamp));
            }
        }
        for (name, c) in old {
            if !conditions.contains_key(name) {
                out.push(event(key, pci, c, true, stamp));
            }
        }
    }
    // A GPU gone from the node: its conditions are not "cleared" (nobody judged it healthy).
    out
}

/// Every active condition now: what is sent again after a reconnect or a restart.
pub fn current(now: &Seen, stamp: &Stamp) -> Vec<proto::HealthEvent> {
    changes(&Seen::default(), now, stamp)
}

fn event(
    (index, uuid): &(u32, String),
    pci: &str,
    c: &Condition,
    cleared: bool,
    stamp: &Stamp,
) -> proto::HealthEvent {
    let at = stamp
        .at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let xid = c
        .name
        .strip_prefix("xid_")
        .filter(|n| n.parse::<u64>().is_ok());
    let mut entities = vec![entity("GPU", &index.to_string()), entity("GPU_UUID", uuid)];
    if !pci.is_empty() {
        entities.insert(1, entity("PCI", pci));
    }
    proto::HealthEvent {
        version: 1,
        agent: AGENT.into(),
        component_class: "GPU".into(),
        check_name: c.name.clone(),
        is_fatal: !cleared && fatal(c),
        is_healthy: cleared,
        message: if cleared {
            format!("cleared: {}", c.reason)
        } else {
            c.reason.clone()
        },
        recommended_action: if cleared {
            RecommendedAction::None as i32
        } else {
            recommended(c.action) as i32
        },
        error_code: xid.map(|x| vec![x.to_string()]).unwrap_or_default(),
        entities_impacted: entities,
        generated_timestamp: Some(Timestamp {
            seconds: i64::try_from(at.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(at.subsec_nanos()).unwrap_or(0),
        }),
        node_name: stamp.node.into(),
        processing_strategy: stamp.strategy as i32,
        ..Default::default()
    }
}

fn entity(t: &str, v: &str) -> Entity {
    Entity {
        entity_type: t.into(),
        entity_value: v.into(),
    }
}

#[cfg(test)]
mod tests;
