//! NVSentinel's `datamodels.PlatformConnector` messages (`health_event.proto` beside this
//! file, vendored from NVIDIA/NVSentinel `data-models/protobufs/health_event.proto` at commit
//! d87e98588030e23f81a64d3f747bd46dd3efd7a2, NVSentinel's main line, Apache-2.0, its licence
//! header kept), written by hand as the kubelet's messages are (`kubernetes/proto.rs`): no
//! `protoc` on build machines.
//!
//! Field numbers and types follow the vendored file; [`FIELDS`] lists them and a test reads
//! the `.proto` to hold the two together. Must not: add fields the proto does not have.

use std::collections::HashMap;

/// The method's path: `/<package>.<Service>/<Method>`.
pub const METHOD: &str = "/datamodels.PlatformConnector/HealthEventOccurredV1";

#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthEvents {
    #[prost(uint32, tag = "1")]
    pub version: u32,
    #[prost(message, repeated, tag = "2")]
    pub events: Vec<HealthEvent>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum RecommendedAction {
    None = 0,
    ComponentReset = 2,
    ContactSupport = 5,
    RunFielddiag = 6,
    RestartVm = 15,
    RestartBm = 24,
    ReplaceVm = 25,
    RunDcgmeud = 26,
    Custom = 27,
    Remediate = 28,
    Unknown = 99,
}

/// How NVSentinel's modules treat an event (`[nvsentinel] processing_strategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ProcessingStrategy {
    /// The platform connector normalises it to `EXECUTE_REMEDIATION`.
    Unspecified = 0,
    ExecuteRemediation = 1,
    StoreOnly = 2,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Entity {
    #[prost(string, tag = "1")]
    pub entity_type: String,
    #[prost(string, tag = "2")]
    pub entity_value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthEvent {
    #[prost(uint32, tag = "1")]
    pub version: u32,
    #[prost(string, tag = "2")]
    pub agent: String,
    #[prost(string, tag = "3")]
    pub component_class: String,
    #[prost(string, tag = "4")]
    pub check_name: String,
    #[prost(bool, tag = "5")]
    pub is_fatal: bool,
    #[prost(bool, tag = "6")]
    pub is_healthy: bool,
    #[prost(string, tag = "7")]
    pub message: String,
    #[prost(enumeration = "RecommendedAction", tag = "8")]
    pub recommended_action: i32,
    #[prost(string, repeated, tag = "9")]
    pub error_code: Vec<String>,
    #[prost(message, repeated, tag = "10")]
    pub entities_impacted: Vec<Entity>,
    #[prost(map = "string, string", tag = "11")]
    pub metadata: HashMap<String, String>,
    #[prost(message, optional, tag = "12")]
    pub generated_timestamp: Option<Timestamp>,
    #[prost(string, tag = "13")]
    pub node_name: String,
    #[prost(message, optional, tag = "14")]
    pub quarantine_overrides: Option<BehaviourOverrides>,
    #[prost(message, optional, tag = "15")]
    pub drain_overrides: Option<BehaviourOverrides>,
    #[prost(enumeration = "ProcessingStrategy", tag = "16")]
    pub processing_strategy: i32,
    /// Left empty: the platform connector assigns it.
    #[prost(string, tag = "17")]
    pub id: String,
    /// Only with `CUSTOM`, which the agent does not send.
    #[prost(string, tag = "18")]
    pub custom_recommended_action: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BehaviourOverrides {
    #[prost(bool, tag = "1")]
    pub force: bool,
    #[prost(bool, tag = "2")]
    pub skip: bool,
}

/// `google.protobuf.Timestamp`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `google.protobuf.Empty`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

/// `message HealthEvent` of the vendored proto as (type, name, number), for the test that
/// holds the structs above to it.
pub const FIELDS: &[(&str, &str, u32)] = &[
    ("uint32", "version", 1),
    ("string", "agent", 2),
    ("string", "componentClass", 3),
    ("string", "checkName", 4),
    ("bool", "isFatal", 5),
    ("bool", "isHealthy", 6),
    ("string", "message", 7),
    ("RecommendedAction", "recommendedAction", 8),
    ("repeated string", "errorCode", 9),
    ("repeated Entity", "entitiesImpacted", 10),
    ("map<string, string>", "metadata", 11),
    ("google.protobuf.Timestamp", "generatedTimestamp", 12),
    ("string", "nodeName", 13),
    ("BehaviourOverrides", "quarantineOverrides", 14),
    ("BehaviourOverrides", "drainOverrides", 15),
    ("ProcessingStrategy", "processingStrategy", 16),
    ("string", "id", 17),
    ("string", "customRecommendedAction", 18),
];

/// `enum RecommendedAction` of the vendored proto as (name, number).
pub const RECOMMENDED_ACTIONS: &[(&str, RecommendedAction)] = &[
    ("NONE", RecommendedAction::None),
    ("COMPONENT_RESET", RecommendedAction::ComponentReset),
    ("CONTACT_SUPPORT", RecommendedAction::ContactSupport),
    ("RUN_FIELDDIAG", RecommendedAction::RunFielddiag),
    ("RESTART_VM", RecommendedAction::RestartVm),
    ("RESTART_BM", RecommendedAction::RestartBm),
    ("REPLACE_VM", RecommendedAction::ReplaceVm),
    ("RUN_DCGMEUD", RecommendedAction::RunDcgmeud),
    ("CUSTOM", RecommendedAction::Custom),
    ("REMEDIATE", RecommendedAction::Remediate),
    ("UNKNOWN", RecommendedAction::Unknown),
];

/// `enum ProcessingStrategy` of the vendored proto as (name, number).
pub const PROCESSING_STRATEGIES: &[(&str, ProcessingStrategy)] = &[
    ("UNSPECIFIED", ProcessingStrategy::Unspecified),
    (
        "EXECUTE_REMEDIATION",
        ProcessingStrategy::ExecuteRemediation,
    ),
    ("STORE_ONLY", ProcessingStrategy::StoreOnly),
];

#[cfg(test)]
mod tests {
    use super::*;

    const PROTO: &str = include_str!("health_event.proto");

    /// The fields of `message <name>` in the vendored file as (type, name, number).
    fn fields(message: &str) -> Vec<(String, String, u32)> {
        let start = PROTO
            .find(&format!("message {message} {{"))
            .expect("message in proto");
        let body = &PROTO[start..];
        let body = &body[body.find('{').expect("{") + 1..body.find('}').expect("}")];
        body.lines()
            .map(str::trim)
            .filter(|l| l.ends_with(';'))
            .map(|l| {
                let (decl, number) = l.trim_end_matches(';').split_once(" = ").expect("=");
                let (ty, name) = decl.rsplit_once(' ').expect("type name");
                (ty.to_string(), name.to_string(), number.parse().expect("n"))
            })
            .collect()
    }

    /// The values of `enum <name>` in the vendored file as (name, number).
    fn enum_values(name: &str) -> Vec<(String, i32)> {
        let start = PROTO
            .find(&format!("enum {name} {{"))
            .expect("enum in proto");
        let body = &PROTO[start..];
        let body = &body[body.find('{').expect("{") + 1..body.find('}').expect("}")];
        body.lines()
            .map(str::trim)
            .filter(|l| l.ends_with(';'))
            .map(|l| {
                let (n, v) = l.trim_end_matches(';').split_once(" = ").expect("=");
                (n.to_string(), v.parse().expect("number"))
            })
            .collect()
    }

    fn names<T: Copy + Into<i32>>(table: &[(&str, T)]) -> Vec<(String, i32)> {
        table
            .iter()
            .map(|(n, v)| (n.to_string(), (*v).into()))
            .collect()
    }

    #[test]
    fn the_hand_written_event_follows_the_vendored_proto() {
        let want: Vec<(String, String, u32)> = FIELDS
            .iter()
            .map(|(t, n, i)| (t.to_string(), n.to_string(), *i))
            .collect();
        assert_eq!(fields("HealthEvent"), want);
        assert!(PROTO.starts_with("// Copyright (c) 2025, NVIDIA CORPORATION."));
        assert!(PROTO.contains("package datamodels;"));
        assert!(PROTO.contains(
            "rpc HealthEventOccurredV1(HealthEvents) returns (google.protobuf.Empty) {}"
        ));
        assert_eq!(enum_values("RecommendedAction"), names(RECOMMENDED_ACTIONS));
        assert_eq!(
            enum_values("ProcessingStrategy"),
            names(PROCESSING_STRATEGIES)
        );
        assert!(
            !PROTO.contains("RESTART_APP"),
            "the closed pull request's 39 is not on the main line"
        );
    }
}
