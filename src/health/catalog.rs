//! NVIDIA's XID catalog as data, and what each resolution bucket means for a GPU's verdict.
//!
//! `xid-catalog.csv` is NVIDIA's `Xid-Catalog.xlsx` (sheet "Xids", 172 codes) exported as CSV,
//! with two columns added from DCGM and the k8s device plugin; provenance in
//! `docs/health.md`. It is compiled in and parsed once. The bucket → (severity, action) table
//! below is ours; each line says why, citing the catalog's bucket meanings and DCGM's health
//! watch (`NVIDIA/DCGM:modules/health/DcgmHealthWatch.cpp`).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use super::XidOverride;
use super::{Action, Status};

const CSV: &str = include_str!("xid-catalog.csv");

/// One row of the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEntry {
    pub xid: u64,
    pub mnemonic: String,
    pub description: String,
    /// NVIDIA's "Resolution Bucket (Immediate Action)"; empty where the catalog gives none.
    pub bucket: String,
    /// DCGM's verdict for XIDs it checks whatever watches are enabled (`FAIL`, `WARN` or empty).
    pub dcgm_health: String,
}

/// How an XID affects its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Informational: journalled, never a condition.
    Ignore,
    Raise {
        severity: Status,
        action: Action,
    },
}

fn raise(severity: Status, action: Action) -> Verdict {
    Verdict::Raise { severity, action }
}

/// The parsed catalog, keyed by XID.
pub fn catalog() -> &'static BTreeMap<u64, XidEntry> {
    static CATALOG: OnceLock<BTreeMap<u64, XidEntry>> = OnceLock::new();
    CATALOG.get_or_init(|| {
        parse(CSV)
            .into_iter()
            .filter_map(|row| match row {
                Ok(e) => Some((e.xid, e)),
                Err(e) => {
                    // Unreachable for the bundled file: a unit test parses every row.
                    tracing::error!(error = %e, "bad row in the bundled XID catalog");
                    None
                }
            })
            .collect()
    })
}

/// Parses the CSV (RFC 4180: quoted fields may hold commas and doubled quotes), header skipped.
fn parse(text: &str) -> Vec<Result<XidEntry, String>> {
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f = split(line);
            if f.len() != 7 {
                return Err(format!("expected 7 fields, got {}: '{line}'", f.len()));
            }
            let xid = f[0]
                .parse()
                .map_err(|_| format!("bad XID '{}' in '{line}'", f[0]))?;
            Ok(XidEntry {
                xid,
                mnemonic: f[1].clone(),
                description: f[2].clone(),
                bucket: f[3].clone(),
                dcgm_health: f[6].clone(),
            })
        })
        .collect()
}

fn split(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                current.push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut current)),
            (c, _) => current.push(c),
        }
    }
    fields.push(current);
    fields
}

/// The catalog's verdict for an XID, before config overrides.
pub fn default_verdict(xid: u64) -> Verdict {
    let Some(e) = catalog().get(&xid) else {
        // Newer than the catalog: say so and let a human look.
        return raise(Status::Warn, Action::ContactSupport);
    };
    let v = match e.bucket.as_str() {
        // "Application fault; restart the app, GPU is fine".
        "RESTART_APP" => raise(Status::Warn, Action::RestartApp),
        // "Informational" (43, 63, 92, ...): journalled only.
        "IGNORE" => Verdict::Ignore,
        // "Kill GPU processes, nvidia-smi -r; if it persists reboot": the GPU is unusable until reset.
        "RESET_GPU" => raise(Status::Fail, Action::ResetGpu),
        // 79, fallen off the bus: only a power cycle brings it back.
        "RESTART_BM" | "RESTART_VM" => raise(Status::Fail, Action::RebootNode),
        // 48 (DBE): the immediate step is a GPU reset, then check the SRAM threshold flag (field
        // diag / RMA if set). NVSentinel maps it to COMPONENT_RESET; a reset needs the GPU drained
        // anyway, and the driver's recovery action says drain_and_reset when P2P peers are involved.
        "WORKFLOW_XID_48" => raise(Status::Fail, Action::ResetGpu),
        // 74: "reset GPU or reboot; inspect nvlink; recurrence → replace" (DCGM: always FAIL).
        "WORKFLOW_NVLINK_ERR" => raise(Status::Fail, Action::ResetGpu),
        // 144-150: the verdict needs the intrinfo decode we do not get from NVML events; gpud
        // reports them as warnings suggesting a reboot, a reset is the smaller first step.
        "WORKFLOW_NVLINK5_ERR" => raise(Status::Warn, Action::ResetGpu),
        // 45: cleanup after another error; that other XID carries the verdict.
        "WORKFLOW_XID_45" => Verdict::Ignore,
        // 54: auxiliary power not connected: hands on the hardware.
        "CHECK_MECHANICALS" => raise(Status::Warn, Action::ContactSupport),
        // 78 (vGPU start error): update driver/firmware; nothing to do on the GPU itself.
        "UPDATE_SWFW" => raise(Status::Warn, Action::None),
        // 154: the driver's recovery action (read as a field value) carries the verdict.
        "XID_154" => raise(Status::Warn, Action::None),
        // 159 (CHI non-data error): the catalog points at UVM, i.e. the application side.
        "CHECK_UVM" => raise(Status::Warn, Action::RestartApp),
        // 62 codes, almost all "Unused" on current GPUs: seeing one is odd but says little, so
        // warn; a real one (142, NVENC3 error) has no automated recovery.
        "CONTACT_SUPPORT" if e.description == "Unused" => {
            raise(Status::Warn, Action::ContactSupport)
        }
        "CONTACT_SUPPORT" => raise(Status::Fail, Action::ContactSupport),
        // 162-172: the catalog gives no resolution yet.
        _ => raise(Status::Warn, Action::None),
    };
    // DCGM's "devastating" XIDs {48,74,79,95,119,120,140} fail whatever the bucket says; 94 warns.
    match (v, e.dcgm_health.as_str()) {
        (Verdict::Raise { action, .. }, "FAIL") => raise(Status::Fail, action),
        (Verdict::Ignore, "FAIL") => raise(Status::Fail, Action::ResetGpu),
        (Verdict::Ignore, "WARN") => raise(Status::Warn, Action::None),
        _ => v,
    }
}

/// The verdict for an XID with the config's overrides applied.
pub fn verdict(xid: u64, overrides: &BTreeMap<u64, XidOverride>) -> Verdict {
    match overrides.get(&xid) {
        Some(XidOverride::Ignore) => Verdict::Ignore,
        Some(XidOverride::Classify { severity, action }) => raise(*severity, *action),
        None => default_verdict(xid),
    }
}

/// XIDs whose default verdict is fail: their counters are created at 0 for every GPU so that
/// `increase()` alerts fire on the first occurrence.
pub fn critical_xids() -> &'static [u64] {
    static CRITICAL: OnceLock<Vec<u64>> = OnceLock::new();
    CRITICAL.get_or_init(|| {
        catalog()
            .keys()
            .copied()
            .filter(|x| {
                matches!(
                    default_verdict(*x),
                    Verdict::Raise {
                        severity: Status::Fail,
                        ..
                    }
                )
            })
            .collect()
    })
}

/// `(mnemonic, description)` of an XID, for dcgm-exporter's `err_code`/`err_msg` labels.
pub fn describe(xid: u64) -> (&'static str, &'static str) {
    catalog()
        .get(&xid)
        .map_or(("UNKNOWN_XID", "XID not in NVIDIA's catalog"), |e| {
            (e.mnemonic.as_str(), e.description.as_str())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_parses_and_all_172_codes_are_there() {
        let rows = parse(CSV);
        assert_eq!(rows.len(), 172);
        for r in &rows {
            assert!(r.is_ok(), "{r:?}");
        }
        assert_eq!(catalog().len(), 172);
        assert_eq!(
            catalog().keys().copied().collect::<Vec<_>>(),
            (1..=172).collect::<Vec<_>>()
        );
        let e45 = &catalog()[&45];
        assert!(e45.description.contains("errors -- Most likely"), "{e45:?}");
        assert_eq!(e45.bucket, "WORKFLOW_XID_45");
    }

    #[test]
    fn dcgm_devastating_xids_fail() {
        for xid in [48, 74, 79, 95, 119, 120, 140] {
            assert!(
                matches!(
                    default_verdict(xid),
                    Verdict::Raise {
                        severity: Status::Fail,
                        ..
                    }
                ),
                "{xid}"
            );
        }
        assert_eq!(default_verdict(79), raise(Status::Fail, Action::RebootNode));
        assert_eq!(default_verdict(94), raise(Status::Warn, Action::RestartApp));
        assert_eq!(default_verdict(13), raise(Status::Warn, Action::RestartApp));
        assert_eq!(default_verdict(63), Verdict::Ignore);
        assert_eq!(
            default_verdict(1),
            raise(Status::Warn, Action::ContactSupport)
        );
        assert_eq!(
            default_verdict(9999),
            raise(Status::Warn, Action::ContactSupport)
        );
        assert!(critical_xids().contains(&48) && !critical_xids().contains(&13));
    }

    #[test]
    fn overrides_win() {
        let mut o = BTreeMap::new();
        o.insert(
            13,
            XidOverride::Classify {
                severity: Status::Fail,
                action: Action::ResetGpu,
            },
        );
        o.insert(48, XidOverride::Ignore);
        assert_eq!(verdict(13, &o), raise(Status::Fail, Action::ResetGpu));
        assert_eq!(verdict(48, &o), Verdict::Ignore);
        assert_eq!(describe(79).0, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS");
    }
}
