//! `[sharing]`, validated: plain data, built from the file's section ([`section`]) or from the
//! time-slicing part of NVIDIA's device plugin YAML ([`yaml`]).

pub mod section;
pub mod spec;
pub mod yaml;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::snapshot::ComputeMode;

/// The CUDA time-slice length, as `nvidia-smi compute-policy --set-timeslice` numbers it
/// (0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG: the help text of the real H100's nvidia-smi, in
/// driver 580.159.04; also quoted in NVIDIA/k8s-device-plugin#354).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Timeslice {
    Default,
    Short,
    Medium,
    Long,
}

impl Timeslice {
    pub const ALL: [Timeslice; 4] = [
        Timeslice::Default,
        Timeslice::Short,
        Timeslice::Medium,
        Timeslice::Long,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Timeslice::Default => "default",
            Timeslice::Short => "short",
            Timeslice::Medium => "medium",
            Timeslice::Long => "long",
        }
    }

    /// The number `--set-timeslice` takes.
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn parse(s: &str) -> Option<Timeslice> {
        Timeslice::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// What the node should look like, for all GPUs or one: `None` leaves the GPU as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NodeSettings {
    pub compute_mode: Option<ComputeMode>,
    pub timeslice: Option<Timeslice>,
}

impl NodeSettings {
    /// `self` with the values `over` sets replacing its own.
    pub fn overlaid(self, over: NodeSettings) -> NodeSettings {
        NodeSettings {
            compute_mode: over.compute_mode.or(self.compute_mode),
            timeslice: over.timeslice.or(self.timeslice),
        }
    }
}

/// A GPU named in the configuration: its index or its UUID (`GPU-...`, or `MIG-...` for a
/// MIG device in a resource's `devices`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum GpuSelector {
    Index(u32),
    Uuid(String),
}

impl GpuSelector {
    pub fn matches(&self, index: u32, uuid: &str) -> bool {
        match self {
            GpuSelector::Index(i) => *i == index,
            GpuSelector::Uuid(u) => u.eq_ignore_ascii_case(uuid),
        }
    }

    /// Parses `"3"`, `"GPU-..."` or `"MIG-..."`; the error says what is accepted.
    pub fn parse(s: &str) -> Result<GpuSelector, String> {
        if let Ok(i) = s.trim().parse::<u32>() {
            return Ok(GpuSelector::Index(i));
        }
        if (s.starts_with("GPU-") || s.starts_with("MIG-")) && s.len() > 4 {
            return Ok(GpuSelector::Uuid(s.to_string()));
        }
        Err(format!(
            "invalid GPU '{s}'; give a GPU index (0, 1, ...) or a UUID ('GPU-...' or 'MIG-...')"
        ))
    }
}

impl std::fmt::Display for GpuSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuSelector::Index(i) => write!(f, "{i}"),
            GpuSelector::Uuid(u) => f.write_str(u),
        }
    }
}

/// Settings for the GPUs a selector matches, over the node-wide ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuOverride {
    pub gpu: GpuSelector,
    #[serde(flatten)]
    pub settings: NodeSettings,
}

/// Which GPUs a shared resource covers (k8s-device-plugin's `devices`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Devices {
    All,
    /// The first N GPUs by index.
    Count(u32),
    List(Vec<GpuSelector>),
}

impl Devices {
    /// Whether the GPU at `position` in index order (with `index` and `uuid`) is covered.
    pub fn covers(&self, position: usize, index: u32, uuid: &str) -> bool {
        match self {
            Devices::All => true,
            Devices::Count(n) => position < *n as usize,
            Devices::List(l) => l.iter().any(|s| s.matches(index, uuid)),
        }
    }
}

/// One shared resource: `name` advertised with `replicas` per GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SharedResource {
    /// `nvidia.com/gpu` or `nvidia.com/mig-<profile>`.
    pub name: String,
    pub replicas: u32,
    pub devices: Devices,
    /// The memory each replica should stay under, in bytes (observed, not enforced).
    pub memory_per_replica: Option<u64>,
}

/// `sharing.timeSlicing` of k8s-device-plugin, with the same meaning.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TimeSlicing {
    pub rename_by_default: bool,
    pub fail_requests_greater_than_one: bool,
    pub resources: Vec<SharedResource>,
}

impl TimeSlicing {
    /// The name advertised to the kubelet for `resource`: `<name>.shared` when
    /// `rename_by_default` (as k8s-device-plugin's `DisableResourceNamingInConfig` does).
    pub fn advertised_name(&self, resource: &SharedResource) -> String {
        if self.rename_by_default {
            format!("{}.shared", resource.name)
        } else {
            resource.name.clone()
        }
    }

    /// The resource that shares GPUs named `name` (`nvidia.com/gpu`), if any.
    pub fn resource(&self, name: &str) -> Option<&SharedResource> {
        self.resources.iter().find(|r| r.name == name)
    }
}

/// How MIG devices are advertised (k8s-device-plugin's `MIG_STRATEGY`, same meaning).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MigStrategy {
    /// MIG devices only under the `nvidia.com/mig-<profile>` resources time-slicing names.
    #[default]
    None,
    /// Every MIG device as `nvidia.com/gpu`, when every GPU has MIG on with one profile.
    Single,
    /// Every MIG device under `nvidia.com/mig-<profile>`.
    Mixed,
}

impl MigStrategy {
    pub const ALL: [MigStrategy; 3] = [MigStrategy::None, MigStrategy::Single, MigStrategy::Mixed];

    pub fn as_str(self) -> &'static str {
        match self {
            MigStrategy::None => "none",
            MigStrategy::Single => "single",
            MigStrategy::Mixed => "mixed",
        }
    }

    pub fn parse(s: &str) -> Option<MigStrategy> {
        MigStrategy::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

/// How Allocate hands devices to the runtime (k8s-device-plugin's `DEVICE_LIST_STRATEGY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceListStrategy {
    /// `NVIDIA_VISIBLE_DEVICES`, read by NVIDIA's container runtime.
    Envvar,
    /// `ContainerAllocateResponse.cdi_devices`, injected by containerd / CRI-O themselves.
    CdiCri,
    /// The `cdi.k8s.io/<key>` annotation, for runtimes that read CDI from annotations.
    CdiAnnotations,
}

impl DeviceListStrategy {
    pub const ALL: [DeviceListStrategy; 3] = [
        DeviceListStrategy::Envvar,
        DeviceListStrategy::CdiCri,
        DeviceListStrategy::CdiAnnotations,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceListStrategy::Envvar => "envvar",
            DeviceListStrategy::CdiCri => "cdi-cri",
            DeviceListStrategy::CdiAnnotations => "cdi-annotations",
        }
    }

    pub fn parse(s: &str) -> Option<DeviceListStrategy> {
        DeviceListStrategy::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

/// How devices are named to the runtime (k8s-device-plugin's `DEVICE_ID_STRATEGY`): the
/// `GPU-…`/`MIG-…` UUID, or the index (`0`, and `<gpu>:<mig device>` for a MIG device).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceIdStrategy {
    #[default]
    Uuid,
    Index,
}

impl DeviceIdStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceIdStrategy::Uuid => "uuid",
            DeviceIdStrategy::Index => "index",
        }
    }
}

/// The Kubernetes device plugin (off by default): `[sharing.device_plugin]` as written and as
/// used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DevicePluginConfig {
    pub enabled: bool,
    /// The kubelet's device-plugin directory: `kubelet.sock` is there, and the plugin's own
    /// sockets go there.
    #[serde(deserialize_with = "section::absolute_dir")]
    pub directory: PathBuf,
    #[serde(deserialize_with = "section::mig_strategy")]
    pub mig_strategy: MigStrategy,
    /// Never empty, each strategy once.
    #[serde(deserialize_with = "section::device_list_strategy")]
    pub device_list_strategy: Vec<DeviceListStrategy>,
    #[serde(deserialize_with = "section::device_id_strategy")]
    pub device_id_strategy: DeviceIdStrategy,
    /// `vendor/class` of the CDI devices (`nvidia.com/gpu`, as `nvidia-ctk cdi generate`
    /// writes): a device is named `<cdi_kind>=<id>`.
    #[serde(deserialize_with = "section::cdi_kind")]
    pub cdi_kind: String,
    /// Where CDI specs are looked for at start (the CDI spec's default directories).
    #[serde(deserialize_with = "section::absolute_dirs")]
    pub cdi_spec_dirs: Vec<PathBuf>,
}

impl DevicePluginConfig {
    /// Whether Allocate names CDI devices (so the CDI spec must have them).
    pub fn uses_cdi(&self) -> bool {
        self.device_list_strategy
            .iter()
            .any(|s| *s != DeviceListStrategy::Envvar)
    }
}

impl Default for DevicePluginConfig {
    fn default() -> Self {
        DevicePluginConfig {
            enabled: false,
            directory: PathBuf::from("/var/lib/kubelet/device-plugins"),
            mig_strategy: MigStrategy::None,
            device_list_strategy: vec![DeviceListStrategy::Envvar],
            device_id_strategy: DeviceIdStrategy::Uuid,
            cdi_kind: "nvidia.com/gpu".into(),
            cdi_spec_dirs: vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")],
        }
    }
}

/// What the replica memory guard does about a process over its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardAction {
    /// Report only (condition and metric).
    None,
    /// Signal the offender after the grace period.
    Signal,
}

/// The replica memory guard: observed usage against `memory_per_replica`
/// (`[sharing.memory_guard]` as written and as used).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryGuardConfig {
    #[serde(deserialize_with = "section::guard_action")]
    pub action: GuardAction,
    /// The signal sent by `action = "signal"` (`SIGTERM` by default).
    #[serde(deserialize_with = "section::signal_name")]
    pub signal: String,
    /// How long a process must stay over its share before it is signalled.
    #[serde(
        serialize_with = "humantime_serde_compat::serialize",
        deserialize_with = "section::grace"
    )]
    pub grace: Duration,
    /// Log and audit what would be signalled, signal nothing (the default).
    pub dry_run: bool,
    /// Process names (`comm`) never signalled.
    pub exempt_processes: Vec<String>,
}

impl Default for MemoryGuardConfig {
    fn default() -> Self {
        MemoryGuardConfig {
            action: GuardAction::None,
            signal: "SIGTERM".into(),
            grace: Duration::from_secs(60),
            dry_run: true,
            exempt_processes: Vec::new(),
        }
    }
}

mod humantime_serde_compat {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }
}

/// `[sharing]`, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SharingConfig {
    /// Node-wide settings.
    pub node: NodeSettings,
    /// Per-GPU settings, applied over `node` in order (the last match wins).
    pub gpus: Vec<GpuOverride>,
    pub nvidia_smi: PathBuf,
    #[serde(with = "humantime_serde_compat")]
    pub nvidia_smi_timeout: Duration,
    /// Shared resources for the device plugin (and the memory guard); `None` = no sharing.
    pub time_slicing: Option<TimeSlicing>,
    /// Where `time_slicing` came from when it was read from NVIDIA's YAML.
    pub time_slicing_file: Option<PathBuf>,
    pub device_plugin: DevicePluginConfig,
    pub memory_guard: MemoryGuardConfig,
}

impl Default for SharingConfig {
    fn default() -> Self {
        SharingConfig {
            node: NodeSettings::default(),
            gpus: Vec::new(),
            nvidia_smi: PathBuf::from("/usr/bin/nvidia-smi"),
            nvidia_smi_timeout: Duration::from_secs(30),
            time_slicing: None,
            time_slicing_file: None,
            device_plugin: DevicePluginConfig::default(),
            memory_guard: MemoryGuardConfig::default(),
        }
    }
}

impl SharingConfig {
    /// What GPU `index`/`uuid` should look like.
    pub fn desired(&self, index: u32, uuid: &str) -> NodeSettings {
        self.gpus
            .iter()
            .filter(|o| o.gpu.matches(index, uuid))
            .fold(self.node, |acc, o| acc.overlaid(o.settings))
    }

    /// Whether anything on the node is managed (compute mode or time-slice of any GPU).
    pub fn manages_node(&self) -> bool {
        let some = |s: &NodeSettings| s.compute_mode.is_some() || s.timeslice.is_some();
        some(&self.node) || self.gpus.iter().any(|o| some(&o.settings))
    }

    /// Lines for `check-config`.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        if !self.manages_node() && self.time_slicing.is_none() {
            out.push_str("sharing: off\n");
        } else {
            let mode = self.node.compute_mode.map_or("left as is", |m| m.as_str());
            let slice = self.node.timeslice.map_or("left as is", |t| t.as_str());
            out.push_str(&format!(
                "sharing: compute mode {mode}, time-slice {slice} (through '{}'), {} per-GPU override(s)\n",
                self.nvidia_smi.display(),
                self.gpus.len()
            ));
            if let Some(ts) = &self.time_slicing {
                for r in &ts.resources {
                    out.push_str(&format!(
                        "sharing: resource {} advertised as {} with {} replicas per GPU{}\n",
                        r.name,
                        ts.advertised_name(r),
                        r.replicas,
                        r.memory_per_replica
                            .map(|b| format!(", {} MiB per replica", b >> 20))
                            .unwrap_or_default()
                    ));
                }
            }
        }
        if let Some(ts) = &self.time_slicing {
            if ts.resources.iter().any(|r| r.memory_per_replica.is_some()) {
                let g = &self.memory_guard;
                out.push_str(&match g.action {
                    GuardAction::None => {
                        "memory guard: report processes over memory_per_replica\n".to_string()
                    }
                    GuardAction::Signal => format!(
                        "memory guard: report, and {} {} after {} over memory_per_replica{}\n",
                        if g.dry_run {
                            "log (dry run) instead of sending"
                        } else {
                            "send"
                        },
                        g.signal,
                        humantime::format_duration(g.grace),
                        if g.exempt_processes.is_empty() {
                            String::new()
                        } else {
                            format!(" (exempt: {})", g.exempt_processes.join(", "))
                        }
                    ),
                });
            }
        }
        if self.device_plugin.enabled {
            let dp = &self.device_plugin;
            let lists: Vec<&str> = dp.device_list_strategy.iter().map(|s| s.as_str()).collect();
            out.push_str(&format!(
                "device plugin: on, kubelet at '{}', MIG strategy {}, devices by {} ({} ids){}\n",
                dp.directory.join("kubelet.sock").display(),
                dp.mig_strategy.as_str(),
                lists.join(" + "),
                dp.device_id_strategy.as_str(),
                if dp.uses_cdi() {
                    format!(", CDI kind {}", dp.cdi_kind)
                } else {
                    String::new()
                }
            ));
        } else {
            out.push_str("device plugin: off\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_gpu_overrides_win_over_node_settings_in_order() {
        let c = SharingConfig {
            node: NodeSettings {
                compute_mode: Some(ComputeMode::Default),
                timeslice: Some(Timeslice::Long),
            },
            gpus: vec![
                GpuOverride {
                    gpu: GpuSelector::Index(1),
                    settings: NodeSettings {
                        compute_mode: Some(ComputeMode::ExclusiveProcess),
                        timeslice: None,
                    },
                },
                GpuOverride {
                    gpu: GpuSelector::Uuid("GPU-b".into()),
                    settings: NodeSettings {
                        compute_mode: None,
                        timeslice: Some(Timeslice::Short),
                    },
                },
            ],
            ..SharingConfig::default()
        };
        assert_eq!(c.desired(0, "GPU-a"), c.node);
        let d = c.desired(1, "GPU-B");
        assert_eq!(d.compute_mode, Some(ComputeMode::ExclusiveProcess));
        assert_eq!(d.timeslice, Some(Timeslice::Short));
        assert!(c.manages_node());
        assert!(!SharingConfig::default().manages_node());
    }

    #[test]
    fn devices_cover_all_a_count_or_a_list() {
        assert!(Devices::All.covers(7, 7, "GPU-x"));
        assert!(Devices::Count(2).covers(1, 5, "GPU-x"));
        assert!(!Devices::Count(2).covers(2, 6, "GPU-x"));
        let l = Devices::List(vec![
            GpuSelector::Index(3),
            GpuSelector::Uuid("GPU-y".into()),
        ]);
        assert!(l.covers(0, 3, "GPU-x") && l.covers(0, 0, "GPU-y") && !l.covers(0, 1, "GPU-z"));
        assert!(GpuSelector::parse("gpu0").is_err());
    }
}
