//! Conformance with real drivers: every question the captures of a real H100 and a real H200
//! (driver 580.159.04, `tests/data/real-h*/`, provenance in `tests/data/README.md`) asked is
//! replayed against the simulator, loaded as a dynamic library and configured as that board by
//! `tests/scenarios/real-h*.toml`. The test fails on any difference in return code, and on any
//! difference in value except the ones in [`VARYING`] (readings that change from run to run or
//! depend on the host: only their JSON type must match). Differences kept on purpose are listed
//! per board with their reason; the test fails when one of them stops differing or leaves the
//! capture, so the lists stay honest. A captured key the replay cannot map fails too.
//!
//! Replayed: `nvml-capture-idle.json` (system and device questions), `nvml-mig-and-more-probe.json`
//! and the `mig_profiles` table of `nvml-call-cost.json` (its other keys are cost measurements
//! of calls the idle capture already asks).

mod common;
mod replay;

use std::collections::BTreeSet;
use std::path::PathBuf;

use replay::{recorded, Answer, Replay};
use serde_json::Value;

/// Values that vary between readings or hosts: `section/key` and the JSON pointers of the
/// varying parts ("" = the whole value). Everything else must be equal.
const VARYING: &[(&str, &[&str])] = &[
    ("device/GetTemperature_GPU", &[""]),
    ("device/GetPowerUsage", &[""]),
    ("device/GetTotalEnergyConsumption", &[""]),
    ("device/GetUtilizationRates", &["/gpu", "/memory"]),
    ("device/GetPcieThroughput_TX", &[""]),
    ("device/GetPcieThroughput_RX", &[""]),
    ("device/GetClockInfo_0", &[""]),
    ("device/GetClockInfo_1", &[""]),
    ("device/GetClockInfo_2", &[""]),
    ("device/GetClockInfo_3", &[""]),
    ("device/GetClock_0_0", &[""]),
    ("device/GetClock_1_0", &[""]),
    ("device/GetClock_2_0", &[""]),
    ("device/GetClock_3_0", &[""]),
    ("device/GetEncoderUtilization", &["/0"]),
    ("device/GetDecoderUtilization", &["/0"]),
    // field 82, the memory temperature
    ("device/GetFieldValues", &["/0/ui", "/0/ull"]),
    ("probe/GetMarginTemperature", &[""]),
    ("probe/GetJpgUtilization", &["/0"]),
    ("probe/GetOfaUtilization", &["/0"]),
    // the calling process's name and the host's CPUs
    ("probe/SystemGetProcessName_self", &[""]),
    ("probe/GetCpuAffinity", &[""]),
    // the probe kept only a Python object's repr: only SUCCESS can be compared
    ("probe/SystemGetConfComputeState", &[""]),
];

/// Differences from the real H100 kept on purpose: `section/key` and why.
const KEPT_H100: &[(&str, &str)] = &[];

/// Differences from the real H200 kept on purpose: `section/key` and why.
const KEPT_H200: &[(&str, &str)] = &[];

fn data(board: &str, file: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(board)
        .join(file);
    let text = std::fs::read_to_string(&path).expect("capture file");
    serde_json::from_str(&text).expect("capture JSON")
}

fn scenario(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/scenarios")
        .join(file);
    std::fs::read_to_string(path).expect("scenario file")
}

fn type_of(v: &Value) -> Value {
    Value::String(
        match v {
            Value::Null => "<null>",
            Value::Bool(_) => "<bool>",
            Value::Number(n) if n.is_f64() => "<float>",
            Value::Number(_) => "<integer>",
            Value::String(_) => "<string>",
            Value::Array(_) => "<array>",
            Value::Object(_) => "<object>",
        }
        .to_owned(),
    )
}

/// Replaces the varying parts of `answer` by their type.
fn masked(id: &str, answer: Answer) -> Answer {
    let mut v = answer?;
    for (_, pointers) in VARYING.iter().filter(|(k, _)| *k == id) {
        for p in *pointers {
            if let Some(x) = v.pointer_mut(p) {
                *x = type_of(x);
            }
        }
    }
    Ok(v)
}

fn show(a: &Answer) -> String {
    match a {
        Ok(v) => v.to_string(),
        Err(code) => format!("error {code}"),
    }
}

/// Every captured question of `board`: `(section, key, entry)`.
fn questions(board: &str) -> Vec<(&'static str, String, Value)> {
    let idle = data(board, "nvml-capture-idle.json");
    let probe = data(board, "nvml-mig-and-more-probe.json");
    let cost = data(board, "nvml-call-cost.json");
    let devices = idle["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 1, "one GPU per capture");
    let sections: [(&str, &Value); 4] = [
        ("system", &idle["system"]),
        ("device", &devices[0]),
        ("probe", &probe),
        ("mig_profiles", &cost["mig_profiles"]),
    ];
    let mut out = Vec::new();
    for (section, map) in sections {
        let map = map.as_object().expect("a JSON object per section");
        for (key, entry) in map {
            out.push((section, key.clone(), entry.clone()));
        }
    }
    out
}

fn conform(board: &str, scenario_file: &str, kept: &[(&str, &str)]) {
    let sim = common::Sim::new(&scenario(scenario_file));
    let replay = Replay::open(&sim.lib);
    let mut failures = Vec::new();
    let mut seen = BTreeSet::new();
    let questions = questions(board);
    assert!(questions.len() > 190, "{} questions only", questions.len());
    for (section, key, entry) in questions {
        let id = format!("{section}/{key}");
        seen.insert(id.clone());
        let Some(expected) = recorded(&entry) else {
            failures.push(format!("{id}: cannot read the captured answer {entry}"));
            continue;
        };
        let Some(actual) = replay.answer(section, &key) else {
            failures.push(format!("{id}: no replay for this captured question"));
            continue;
        };
        let (expected, actual) = (masked(&id, expected), masked(&id, actual));
        let differs = expected != actual;
        let kept_on_purpose = kept.iter().any(|(k, _)| *k == id);
        if differs && !kept_on_purpose {
            failures.push(format!(
                "{id}: real {} vs simulated {}",
                show(&expected),
                show(&actual)
            ));
        } else if !differs && kept_on_purpose {
            failures.push(format!(
                "{id}: listed as a kept difference but now equal; remove it from the list"
            ));
        }
    }
    for (k, _) in kept {
        if !seen.contains(*k) {
            failures.push(format!(
                "{k}: listed as a kept difference but not in the capture"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{board}: {} difference(s) from the real driver:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_simulated_h100_answers_like_the_real_one() {
    conform("real-h100", "real-h100.toml", KEPT_H100);
}

#[test]
fn the_simulated_h200_answers_like_the_real_one() {
    conform("real-h200", "real-h200.toml", KEPT_H200);
}

#[test]
fn keys_split_into_names_and_arguments() {
    assert_eq!(replay::split_key("GetClock_0_1"), ("GetClock", vec![0, 1]));
    assert_eq!(
        replay::split_key("GetFanSpeed_v2_0"),
        ("GetFanSpeed_v2", vec![0])
    );
    assert_eq!(
        replay::split_key("GetMemoryInfo_v2"),
        ("GetMemoryInfo_v2", vec![])
    );
    assert_eq!(
        replay::split_key("GpmMigSampleGet_gi1"),
        ("GpmMigSampleGet_gi1", vec![])
    );
}
