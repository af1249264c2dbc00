//! The alert as Alertmanager's webhook (payload version 4) carries it: the one shape that local
//! rules and central Alertmanagers both hand to the routes, and that a hook reads on stdin.
//! Plain data; imports nothing of the agent.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// Alertmanager's zero time, written as `endsAt` of a firing alert.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Firing,
    Resolved,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Firing => "firing",
            Status::Resolved => "resolved",
        }
    }
}

/// One alert (Alertmanager's `alerts[]` element). Read from the webhook with unknown fields
/// tolerated (newer Alertmanagers may add some).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    pub status: Status,
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    pub starts_at: String,
    #[serde(default = "zero_time")]
    pub ends_at: String,
    #[serde(rename = "generatorURL", default)]
    pub generator_url: String,
    /// Alertmanager's fingerprint of the labels; computed when a sender leaves it out.
    #[serde(default)]
    pub fingerprint: String,
}

fn zero_time() -> String {
    ZERO_TIME.to_string()
}

impl Alert {
    pub fn name(&self) -> &str {
        self.labels.get("alertname").map_or("", String::as_str)
    }

    /// The GPU the alert is about: its `gpu` label (the agent's and dcgm-exporter's index).
    pub fn gpu(&self) -> Option<&str> {
        self.labels.get("gpu").map(String::as_str)
    }

    /// Its `uuid` (native family) or `UUID` (dcgm-exporter family) label.
    pub fn gpu_uuid(&self) -> Option<&str> {
        self.labels
            .get("uuid")
            .or_else(|| self.labels.get("UUID"))
            .map(String::as_str)
    }
}

/// Alertmanager's fingerprint of a label set (`model.LabelSet.Fingerprint`): FNV-1a 64 over the
/// sorted names and values, each followed by the byte 0xff, as 16 hex digits.
pub fn fingerprint(labels: &BTreeMap<String, String>) -> String {
    const OFFSET: u64 = 14_695_981_039_346_656_037;
    const PRIME: u64 = 1_099_511_628_211;
    let mut h = OFFSET;
    let mut add = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
    };
    for (k, v) in labels {
        add(k.as_bytes());
        add(&[0xff]);
        add(v.as_bytes());
        add(&[0xff]);
    }
    format!("{h:016x}")
}

/// RFC 3339 in UTC with milliseconds, as the agent writes every timestamp.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Alertmanager's webhook body, version 4.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookPayload {
    pub version: String,
    #[serde(default)]
    pub group_key: String,
    #[serde(default)]
    pub truncated_alerts: u64,
    pub status: Status,
    #[serde(default)]
    pub receiver: String,
    #[serde(default)]
    pub group_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub common_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub common_annotations: BTreeMap<String, String>,
    #[serde(rename = "externalURL", default)]
    pub external_url: String,
    pub alerts: Vec<Alert>,
}

impl WebhookPayload {
    /// Parses and validates a webhook body; `Err` is the reason for the 400.
    pub fn parse(body: &[u8]) -> Result<Vec<Alert>, String> {
        let p: WebhookPayload =
            serde_json::from_slice(body).map_err(|e| format!("invalid webhook payload: {e}"))?;
        if p.version != "4" {
            return Err(format!(
                "unsupported webhook payload version '{}'; this endpoint takes Alertmanager's version 4",
                p.version
            ));
        }
        p.alerts
            .into_iter()
            .enumerate()
            .map(|(i, mut a)| {
                if a.labels.get("alertname").is_none_or(|n| n.is_empty()) {
                    return Err(format!("alerts[{i}] has no 'alertname' label"));
                }
                if humantime::parse_rfc3339_weak(&a.starts_at).is_err() {
                    return Err(format!(
                        "alerts[{i}].startsAt '{}' is not an RFC 3339 time",
                        a.starts_at
                    ));
                }
                if a.fingerprint.is_empty() {
                    a.fingerprint = fingerprint(&a.labels);
                }
                Ok(a)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_alertmanagers() {
        // Values from prometheus/common model (labelset_test / fingerprinting_test):
        // the empty set hashes to the FNV offset basis.
        assert_eq!(fingerprint(&BTreeMap::new()), "cbf29ce484222325");
        let mut l = BTreeMap::new();
        l.insert("alertname".to_string(), "A".to_string());
        let a = fingerprint(&l);
        l.insert("gpu".to_string(), "0".to_string());
        assert_ne!(a, fingerprint(&l));
        assert_eq!(a.len(), 16);
    }

    #[test]
    fn parses_version_4_and_says_what_is_wrong() {
        let ok = br#"{"version":"4","groupKey":"{}:{}","truncatedAlerts":0,"status":"firing",
            "receiver":"r","groupLabels":{},"commonLabels":{},"commonAnnotations":{},
            "externalURL":"http://am","alerts":[{"status":"firing","labels":{"alertname":"X","gpu":"1"},
            "annotations":{},"startsAt":"2026-11-22T22:00:00.000Z","endsAt":"0001-01-01T00:00:00Z",
            "generatorURL":"","fingerprint":"abc"}]}"#;
        let alerts = WebhookPayload::parse(ok).expect("valid");
        assert_eq!(alerts[0].gpu(), Some("1"));
        assert_eq!(alerts[0].fingerprint, "abc");
        let e = WebhookPayload::parse(br#"{"version":"3","status":"firing","alerts":[]}"#)
            .expect_err("bad");
        assert!(e.contains("version '3'"), "{e}");
        let e = WebhookPayload::parse(b"{").expect_err("bad");
        assert!(e.starts_with("invalid webhook payload"), "{e}");
        let e = WebhookPayload::parse(
            br#"{"version":"4","status":"firing","alerts":[{"status":"firing","labels":{},"startsAt":"x"}]}"#,
        )
        .expect_err("bad");
        assert!(e.contains("alerts[0] has no 'alertname'"), "{e}");
        // Fields a newer Alertmanager adds are tolerated; a missing fingerprint is computed.
        let newer = br#"{"version":"4","status":"firing","alerts":[{"status":"firing",
            "labels":{"alertname":"X"},"startsAt":"2026-11-22T22:00:00Z","silencedBy":[]}]}"#;
        let alerts = WebhookPayload::parse(newer).expect("unknown alert fields are tolerated");
        assert_eq!(alerts[0].fingerprint.len(), 16);
    }
}
