//! Alertmanager's webhook payload (`POST /api/v1/alertmanager`) on arbitrary bytes: parsing must
//! never panic, a rejection must carry a reason (the 400's body), and every alert accepted must
//! have what the remediation routes rely on: a non-empty `alertname` and a fingerprint.
#![no_main]

use gpu_steward::remediation::alert::WebhookPayload;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match WebhookPayload::parse(data) {
        Ok(alerts) => {
            for a in &alerts {
                assert!(a.labels.get("alertname").is_some_and(|n| !n.is_empty()));
                assert!(!a.fingerprint.is_empty());
            }
        }
        Err(reason) => assert!(!reason.trim().is_empty()),
    }
});
