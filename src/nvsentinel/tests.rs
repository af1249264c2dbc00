use std::time::{Duration, SystemTime};

use super::*;
use crate::health::{GpuHealth, GpuVerdict};

fn condition(name: &str, severity: Status, action: Action, reason: &str) -> Condition {
    Condition {
        name: name.into(),
        severity,
        reason: reason.into(),
        action,
        since: SystemTime::UNIX_EPOCH,
    }
}

fn seen(conditions: Vec<Condition>) -> Seen {
    let mut s = Seen::default();
    let map = conditions
        .into_iter()
        .map(|c| (c.name.clone(), c))
        .collect();
    s.0.insert((2, "GPU-2".into()), ("00000000:3B:00.0".into(), map));
    s
}

fn stamp() -> Stamp<'static> {
    Stamp {
        node: "node-a",
        at: SystemTime::UNIX_EPOCH + Duration::new(1_767_322_245, 5),
        strategy: proto::ProcessingStrategy::Unspecified,
    }
}

#[test]
fn an_xid_79_becomes_a_fatal_event_with_nvsentinels_fields() {
    let xid = condition(
        "xid_79",
        Status::Fail,
        Action::RebootNode,
        "XID 79: GPU has fallen off the bus",
    );
    let events = changes(&Seen::default(), &seen(vec![xid]), &stamp());
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(
        (e.agent.as_str(), e.component_class.as_str()),
        ("gpu-steward", "GPU")
    );
    assert_eq!(e.check_name, "xid_79");
    assert!(e.is_fatal && !e.is_healthy);
    assert_eq!(e.message, "XID 79: GPU has fallen off the bus");
    assert_eq!(e.recommended_action, 24, "RESTART_BM in health_event.proto");
    assert_eq!(e.error_code, ["79"]);
    let entities: Vec<(&str, &str)> = e
        .entities_impacted
        .iter()
        .map(|x| (x.entity_type.as_str(), x.entity_value.as_str()))
        .collect();
    assert_eq!(
        entities,
        [
            ("GPU", "2"),
            ("PCI", "00000000:3B:00.0"),
            ("GPU_UUID", "GPU-2")
        ]
    );
    assert_eq!(e.node_name, "node-a");
    let t = e.generated_timestamp.as_ref().expect("timestamp");
    assert_eq!((t.seconds, t.nanos), (1_767_322_245, 5));
}

#[test]
fn a_change_of_severity_is_sent_a_change_of_numbers_is_not_and_a_clear_is_healthy() {
    let warm = condition("temperature", Status::Warn, Action::None, "83 C");
    let warmer = condition("temperature", Status::Warn, Action::None, "84 C");
    let hot = condition("temperature", Status::Fail, Action::ResetGpu, "95 C");
    assert!(changes(&seen(vec![warm.clone()]), &seen(vec![warmer]), &stamp()).is_empty());
    let up = changes(&seen(vec![warm]), &seen(vec![hot.clone()]), &stamp());
    assert_eq!(up.len(), 1);
    assert!(up[0].is_fatal);
    assert_eq!(up[0].recommended_action, 2, "COMPONENT_RESET");
    let cleared = changes(&seen(vec![hot]), &seen(vec![]), &stamp());
    assert_eq!(cleared.len(), 1);
    assert!(cleared[0].is_healthy && !cleared[0].is_fatal);
    assert_eq!(cleared[0].check_name, "temperature");
    assert_eq!(cleared[0].recommended_action, 0);
    assert!(cleared[0].error_code.is_empty());
}

#[test]
fn the_current_state_is_every_active_condition() {
    let a = condition("xid_48", Status::Fail, Action::ResetGpu, "dbe");
    let b = condition("temperature", Status::Warn, Action::None, "83 C");
    let names: Vec<String> = current(&seen(vec![a, b]), &stamp())
        .into_iter()
        .map(|e| e.check_name)
        .collect();
    assert_eq!(names, ["temperature", "xid_48"]);
}

#[test]
fn an_application_fault_is_none_and_not_fatal_even_when_it_fails() {
    // XID 13 is RESTART_APP in the catalog (warn); an override can make it fail.
    for severity in [Status::Warn, Status::Fail] {
        let xid = condition("xid_13", severity, Action::RestartApp, "XID 13");
        let e = &changes(&Seen::default(), &seen(vec![xid]), &stamp())[0];
        assert_eq!(e.recommended_action, 0, "NONE");
        assert!(!e.is_fatal && !e.is_healthy, "{severity:?}");
        assert_eq!(e.error_code, ["13"]);
    }
}

#[test]
fn the_processing_strategy_is_sent_as_configured_and_unspecified_by_default() {
    let xid = condition("xid_79", Status::Fail, Action::RebootNode, "XID 79");
    let e = &changes(&Seen::default(), &seen(vec![xid.clone()]), &stamp())[0];
    assert_eq!(e.processing_strategy, 0, "UNSPECIFIED");
    assert!(e.id.is_empty() && e.custom_recommended_action.is_empty());
    let store_only = Stamp {
        strategy: proto::ProcessingStrategy::StoreOnly,
        ..stamp()
    };
    let e = &changes(&Seen::default(), &seen(vec![xid]), &store_only)[0];
    assert_eq!(e.processing_strategy, 2, "STORE_ONLY");
    let section: NvsentinelConfig =
        toml::from_str("socket = \"/s\"\nprocessing_strategy = \"store_only\"").expect("toml");
    assert_eq!(
        strategy(section.processing_strategy),
        proto::ProcessingStrategy::StoreOnly
    );
    assert_eq!(strategy(None), proto::ProcessingStrategy::Unspecified);
    let err = toml::from_str::<NvsentinelConfig>("processing_strategy = \"dry_run\"")
        .expect_err("unknown strategy")
        .to_string();
    assert!(
        err.contains("execute_remediation") && err.contains("store_only"),
        "{err}"
    );
}

#[test]
fn every_action_maps_to_a_recommended_action_of_the_proto() {
    let table: Vec<(&str, i32)> = crate::health::ACTIONS
        .iter()
        .map(|a| (a.as_str(), recommended(*a) as i32))
        .collect();
    assert_eq!(
        table,
        [
            ("none", 0),
            ("restart_app", 0),
            ("reset_gpu", 2),
            ("reboot_node", 24),
            ("drain_and_reset", 2),
            ("contact_support", 5),
        ]
    );
    for a in crate::health::ACTIONS {
        let n = recommended(a) as i32;
        assert!(
            proto::RECOMMENDED_ACTIONS
                .iter()
                .any(|(_, v)| *v as i32 == n),
            "{n} is defined on the main line"
        );
    }
    let _ = GpuHealth {
        index: 0,
        uuid: String::new(),
        verdict: GpuVerdict::new(Vec::new()),
        xid_window_counts: Default::default(),
    };
}
