//! Observe → diff: what the node looks like, what the configuration asks, and the steps
//! between them. Pure: no NVML, no commands, so it is tested without a GPU. A node that already
//! matches gets an empty plan; what cannot be observed is not changed (and is reported).

use serde::Serialize;

use crate::config::sharing::{SharingConfig, Timeslice};
use crate::gpu::ComputeMode;

/// One GPU as observed before a change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObservedGpu {
    pub index: u32,
    pub uuid: String,
    pub mig_enabled: bool,
    /// The error in words when it could not be read.
    #[serde(serialize_with = "named_result::serialize")]
    pub compute_mode: Result<ComputeMode, String>,
    /// `Err` also when nobody asked (the listing is only run when a time-slice is configured).
    #[serde(serialize_with = "named_result::serialize")]
    pub timeslice: Result<Timeslice, String>,
}

/// A read that may have failed, as JSON with the outcome named: `{"result":"ok","value":…}` or
/// `{"result":"error","error":"…"}`. Serde's default, `{"Ok":…}` / `{"Err":…}`, is the Rust
/// type leaking into the CLI's `--json` and `/api/v1/sharing`.
mod named_result {
    use serde::ser::{SerializeStruct, Serializer};
    use serde::Serialize;

    pub fn serialize<T: Serialize, S: Serializer>(
        r: &Result<T, String>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut out = s.serialize_struct("Read", 2)?;
        match r {
            Ok(value) => {
                out.serialize_field("result", "ok")?;
                out.serialize_field("value", value)?;
            }
            Err(error) => {
                out.serialize_field("result", "error")?;
                out.serialize_field("error", error)?;
            }
        }
        out.end()
    }
}

/// One setting to change on one GPU, with the value it had (to go back to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "setting", rename_all = "snake_case")]
pub enum Change {
    ComputeMode { from: ComputeMode, to: ComputeMode },
    Timeslice { from: Timeslice, to: Timeslice },
}

impl Change {
    /// The change that undoes this one.
    pub fn inverse(self) -> Change {
        match self {
            Change::ComputeMode { from, to } => Change::ComputeMode { from: to, to: from },
            Change::Timeslice { from, to } => Change::Timeslice { from: to, to: from },
        }
    }

    pub fn setting(&self) -> &'static str {
        match self {
            Change::ComputeMode { .. } => "compute_mode",
            Change::Timeslice { .. } => "timeslice",
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Change::ComputeMode { from, to } => {
                format!("compute mode {} -> {}", from.as_str(), to.as_str())
            }
            Change::Timeslice { from, to } => {
                format!("time-slice {} -> {}", from.as_str(), to.as_str())
            }
        }
    }
}

/// A change on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub gpu: u32,
    pub uuid: String,
    #[serde(flatten)]
    pub change: Change,
}

/// A setting the configuration asks for that will not be changed, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// `None` for an override that matches no GPU.
    pub gpu: Option<u32>,
    pub uuid: String,
    pub setting: &'static str,
    pub reason: String,
    /// Whether this keeps the node from matching the configuration (an observation failed),
    /// rather than being a known limitation.
    pub error: bool,
}

/// What an apply will do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub skipped: Vec<Skipped>,
    /// Settings that already match.
    pub unchanged: usize,
}

/// The steps from `observed` to what `config` asks.
pub fn plan(config: &SharingConfig, observed: &[ObservedGpu]) -> Plan {
    let mut p = Plan::default();
    for o in &config.gpus {
        if !observed.iter().any(|g| o.gpu.matches(g.index, &g.uuid)) {
            p.skipped.push(Skipped {
                gpu: None,
                uuid: o.gpu.to_string(),
                setting: "override",
                reason: format!("no GPU on this node is '{}'", o.gpu),
                error: false,
            });
        }
    }
    for g in observed {
        let want = config.desired(g.index, &g.uuid);
        let mut skip = |setting: &'static str, reason: String, error: bool| {
            p.skipped.push(Skipped {
                gpu: Some(g.index),
                uuid: g.uuid.clone(),
                setting,
                reason,
                error,
            })
        };
        if let Some(to) = want.compute_mode {
            match (&g.compute_mode, g.mig_enabled) {
                (_, true) => skip(
                    "compute_mode",
                    "MIG is enabled: the compute mode is set per MIG device, which this version \
                     does not do"
                        .into(),
                    false,
                ),
                (Err(e), _) => skip(
                    "compute_mode",
                    format!("cannot read its compute mode ({e}); left as it is"),
                    true,
                ),
                (Ok(from), _) if *from == to => p.unchanged += 1,
                (Ok(from), _) => p.steps.push(Step {
                    gpu: g.index,
                    uuid: g.uuid.clone(),
                    change: Change::ComputeMode { from: *from, to },
                }),
            }
        }
        if let Some(to) = want.timeslice {
            match (&g.timeslice, g.mig_enabled) {
                (_, true) => skip(
                    "timeslice",
                    "MIG is enabled: the time-slice applies to full GPUs only".into(),
                    false,
                ),
                (Err(e), _) => skip(
                    "timeslice",
                    format!("cannot read its time-slice ({e}); left as it is"),
                    true,
                ),
                (Ok(from), _) if *from == to => p.unchanged += 1,
                (Ok(from), _) => p.steps.push(Step {
                    gpu: g.index,
                    uuid: g.uuid.clone(),
                    change: Change::Timeslice { from: *from, to },
                }),
            }
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::sharing::{GpuOverride, GpuSelector, NodeSettings};

    fn gpu(index: u32, mode: ComputeMode, t: Timeslice) -> ObservedGpu {
        ObservedGpu {
            index,
            uuid: format!("GPU-{index}"),
            mig_enabled: false,
            compute_mode: Ok(mode),
            timeslice: Ok(t),
        }
    }

    fn config() -> SharingConfig {
        SharingConfig {
            node: NodeSettings {
                compute_mode: Some(ComputeMode::Default),
                timeslice: Some(Timeslice::Long),
            },
            gpus: vec![GpuOverride {
                gpu: GpuSelector::Index(1),
                settings: NodeSettings {
                    compute_mode: Some(ComputeMode::ExclusiveProcess),
                    timeslice: None,
                },
            }],
            ..SharingConfig::default()
        }
    }

    #[test]
    fn observed_reads_name_their_outcome_in_json() {
        let mut g = gpu(0, ComputeMode::Prohibited, Timeslice::Long);
        g.timeslice = Err("nvidia-smi not found".into());
        let v = serde_json::to_value(&g).expect("json");
        assert_eq!(
            v["compute_mode"],
            serde_json::json!({"result": "ok", "value": "prohibited"})
        );
        assert_eq!(
            v["timeslice"],
            serde_json::json!({"result": "error", "error": "nvidia-smi not found"})
        );
    }

    #[test]
    fn a_node_that_matches_gets_an_empty_plan() {
        let observed = [
            gpu(0, ComputeMode::Default, Timeslice::Long),
            gpu(1, ComputeMode::ExclusiveProcess, Timeslice::Long),
        ];
        let p = plan(&config(), &observed);
        assert!(p.steps.is_empty() && p.skipped.is_empty(), "{p:?}");
        assert_eq!(p.unchanged, 4);
    }

    #[test]
    fn differences_become_steps_with_the_old_value() {
        let observed = [
            gpu(0, ComputeMode::Prohibited, Timeslice::Default),
            gpu(1, ComputeMode::Default, Timeslice::Long),
        ];
        let p = plan(&config(), &observed);
        assert_eq!(p.steps.len(), 3);
        assert_eq!(
            p.steps[0].change,
            Change::ComputeMode {
                from: ComputeMode::Prohibited,
                to: ComputeMode::Default
            }
        );
        assert_eq!(
            p.steps[1].change,
            Change::Timeslice {
                from: Timeslice::Default,
                to: Timeslice::Long
            }
        );
        assert_eq!(p.steps[2].gpu, 1);
        assert_eq!(
            p.steps[2].change.inverse().describe(),
            "compute mode exclusive_process -> default"
        );
    }

    #[test]
    fn what_cannot_be_observed_or_is_mig_is_skipped_and_said() {
        let mut a = gpu(0, ComputeMode::Default, Timeslice::Long);
        a.timeslice = Err("nvidia-smi missing".into());
        let mut b = gpu(1, ComputeMode::Default, Timeslice::Default);
        b.mig_enabled = true;
        let mut c = config();
        c.gpus.push(GpuOverride {
            gpu: GpuSelector::Uuid("GPU-gone".into()),
            settings: NodeSettings {
                compute_mode: None,
                timeslice: Some(Timeslice::Short),
            },
        });
        let p = plan(&c, &[a, b]);
        assert!(p.steps.is_empty(), "{p:?}");
        assert_eq!(p.skipped.len(), 4, "{p:?}");
        assert!(p.skipped[0]
            .reason
            .contains("no GPU on this node is 'GPU-gone'"));
        assert!(p.skipped[1].error && p.skipped[1].reason.contains("nvidia-smi missing"));
        assert!(!p.skipped[2].error && p.skipped[2].reason.contains("MIG is enabled"));
    }
}
