//! The TOML shape of `[sharing]`, validated while parsing so that every error carries the
//! position of the offending key or value. The meaning of `[sharing.time_slicing]` is that of
//! k8s-device-plugin's `sharing.timeSlicing` (NVIDIA/k8s-device-plugin `api/config/v1/`), in the
//! agent's snake_case; NVIDIA's own YAML is read by [`super::yaml`] into the same types.

use std::path::PathBuf;
use std::time::Duration;

use serde::de;
use serde::{Deserialize, Deserializer};
use toml::Spanned;

use super::spec::parse_memory_size;
pub use super::spec::{DevicesSpec, SelectorSpec};
use super::{
    DeviceIdStrategy, DeviceListStrategy, DevicePluginConfig, Devices, GpuOverride, GuardAction,
    MemoryGuardConfig, MigStrategy, NodeSettings, SharedResource, SharingConfig, TimeSlicing,
    Timeslice,
};
use crate::snapshot::ComputeMode;

/// `[sharing]`: every key optional; an absent section manages nothing.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SharingSection {
    #[serde(deserialize_with = "compute_mode")]
    pub compute_mode: Option<ComputeMode>,
    #[serde(deserialize_with = "timeslice")]
    pub timeslice: Option<Timeslice>,
    #[serde(deserialize_with = "absolute_path")]
    pub nvidia_smi: Option<PathBuf>,
    #[serde(deserialize_with = "command_timeout")]
    pub nvidia_smi_timeout: Option<Duration>,
    /// NVIDIA's device plugin config file, read for its `sharing.timeSlicing`.
    pub device_plugin_config: Option<Spanned<String>>,
    pub time_slicing: Option<TimeSlicingSection>,
    pub gpu: Vec<GpuSection>,
    pub device_plugin: DevicePluginConfig,
    pub memory_guard: MemoryGuardConfig,
}

/// `[sharing.time_slicing]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeSlicingSection {
    #[serde(default)]
    pub rename_by_default: bool,
    #[serde(default)]
    pub fail_requests_greater_than_one: bool,
    #[serde(deserialize_with = "resources")]
    pub resources: Vec<SharedResource>,
}

/// `[[sharing.time_slicing.resources]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourceSection {
    name: Spanned<String>,
    #[serde(deserialize_with = "replicas")]
    replicas: u32,
    #[serde(default)]
    devices: Option<DevicesSpec>,
    #[serde(default, deserialize_with = "memory_size")]
    memory_per_replica: Option<u64>,
}

/// `[[sharing.gpu]]`: settings for one GPU over the node-wide ones.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSection {
    pub id: Spanned<SelectorSpec>,
    #[serde(default, deserialize_with = "compute_mode")]
    pub compute_mode: Option<ComputeMode>,
    #[serde(default, deserialize_with = "timeslice")]
    pub timeslice: Option<Timeslice>,
}

/// A problem found after parsing, at a byte range of the file.
pub struct Misplaced {
    pub span: std::ops::Range<usize>,
    pub message: String,
}

impl SharingSection {
    /// Checks what parsing could not (overrides that set nothing, a YAML file and a TOML table
    /// both giving the resources) and builds the validated config. `time_slicing_yaml` is
    /// what [`super::yaml`] read from `device_plugin_config`, when given.
    pub fn into_config(
        self,
        time_slicing_yaml: Option<TimeSlicing>,
    ) -> Result<SharingConfig, Misplaced> {
        let d = SharingConfig::default();
        let mut gpus = Vec::new();
        for g in self.gpu {
            if g.compute_mode.is_none() && g.timeslice.is_none() {
                return Err(Misplaced {
                    span: g.id.span(),
                    message: format!(
                        "[[sharing.gpu]] for GPU '{}' sets nothing; add compute_mode or \
                         timeslice, or remove it",
                        g.id.get_ref().0
                    ),
                });
            }
            gpus.push(GpuOverride {
                gpu: g.id.into_inner().0,
                settings: NodeSettings {
                    compute_mode: g.compute_mode,
                    timeslice: g.timeslice,
                },
            });
        }
        let (time_slicing, time_slicing_file) =
            match (self.time_slicing, &self.device_plugin_config) {
                (Some(_), Some(file)) => {
                    return Err(Misplaced {
                        span: file.span(),
                        message:
                            "give the shared resources either in [sharing.time_slicing] or in \
                              device_plugin_config, not both; remove one"
                                .into(),
                    })
                }
                (Some(t), None) => (
                    Some(TimeSlicing {
                        rename_by_default: t.rename_by_default,
                        fail_requests_greater_than_one: t.fail_requests_greater_than_one,
                        resources: t.resources,
                    }),
                    None,
                ),
                (None, Some(file)) => (
                    time_slicing_yaml,
                    Some(PathBuf::from(file.get_ref().as_str())),
                ),
                (None, None) => (None, None),
            };
        Ok(SharingConfig {
            node: NodeSettings {
                compute_mode: self.compute_mode,
                timeslice: self.timeslice,
            },
            gpus,
            nvidia_smi: self.nvidia_smi.unwrap_or(d.nvidia_smi),
            nvidia_smi_timeout: self.nvidia_smi_timeout.unwrap_or(d.nvidia_smi_timeout),
            time_slicing,
            time_slicing_file,
            device_plugin: self.device_plugin,
            memory_guard: self.memory_guard,
        })
    }
}

const MODES: &str = "use \"default\", \"exclusive_process\" or \"prohibited\"";

fn compute_mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ComputeMode>, D::Error> {
    let s = String::deserialize(d)?;
    ComputeMode::parse(&s).map(Some).ok_or_else(|| {
        let hint = if s == "exclusive_thread" {
            " (NVIDIA removed exclusive_thread)"
        } else {
            ""
        };
        de::Error::custom(format!("unknown compute mode '{s}'{hint}; {MODES}"))
    })
}

fn timeslice<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timeslice>, D::Error> {
    let s = String::deserialize(d)?;
    Timeslice::parse(&s).map(Some).ok_or_else(|| {
        de::Error::custom(format!(
            "unknown time-slice '{s}'; use \"default\", \"short\", \"medium\" or \"long\""
        ))
    })
}

fn absolute_path<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    let s = String::deserialize(d)?;
    if s.starts_with('/') {
        Ok(Some(PathBuf::from(s)))
    } else {
        Err(de::Error::custom(format!(
            "path '{s}' is not absolute; commands run without a shell or PATH search, so write \
             the full path, e.g. '/usr/bin/nvidia-smi'"
        )))
    }
}

pub(super) fn absolute_dir<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
    let s = String::deserialize(d)?;
    if s.starts_with('/') {
        Ok(PathBuf::from(s))
    } else {
        Err(de::Error::custom(format!(
            "path '{s}' is not absolute; write it from the root, e.g. \
             '/var/lib/kubelet/device-plugins'"
        )))
    }
}

pub(super) fn absolute_dirs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
    let list = Vec::<String>::deserialize(d)?;
    if list.is_empty() {
        return Err(de::Error::custom(
            "cdi_spec_dirs is empty; list the directories the runtime reads CDI specs from, \
             e.g. [\"/etc/cdi\", \"/var/run/cdi\"]",
        ));
    }
    list.into_iter()
        .map(|s| {
            if s.starts_with('/') {
                Ok(PathBuf::from(s))
            } else {
                Err(de::Error::custom(format!(
                    "path '{s}' is not absolute; write it from the root, e.g. '/etc/cdi'"
                )))
            }
        })
        .collect()
}

pub(super) fn mig_strategy<'de, D: Deserializer<'de>>(d: D) -> Result<MigStrategy, D::Error> {
    let s = String::deserialize(d)?;
    MigStrategy::parse(&s).ok_or_else(|| {
        de::Error::custom(format!(
            "unknown mig_strategy '{s}'; use \"none\", \"single\" or \"mixed\" \
             (k8s-device-plugin's MIG_STRATEGY)"
        ))
    })
}

const LIST_STRATEGIES: &str = "use any of \"envvar\", \"cdi-cri\" and \"cdi-annotations\"";

pub(super) fn device_list_strategy<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<DeviceListStrategy>, D::Error> {
    // NVIDIA's plugin takes a single string as well as a list.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let names = match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(l) => l,
    };
    if names.is_empty() {
        return Err(de::Error::custom(format!(
            "device_list_strategy is empty, so Allocate would hand the container no GPU; \
             {LIST_STRATEGIES} (default [\"envvar\"])"
        )));
    }
    let mut out: Vec<DeviceListStrategy> = Vec::new();
    for n in names {
        let Some(s) = DeviceListStrategy::parse(&n) else {
            let hint = if n == "volume-mounts" {
                " (volume-mounts needs NVIDIA's runtime hook, which the agent does not ship)"
            } else {
                ""
            };
            return Err(de::Error::custom(format!(
                "unknown device_list_strategy '{n}'{hint}; {LIST_STRATEGIES}"
            )));
        };
        if out.contains(&s) {
            return Err(de::Error::custom(format!(
                "device_list_strategy lists '{n}' twice; keep one"
            )));
        }
        out.push(s);
    }
    Ok(out)
}

pub(super) fn device_id_strategy<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<DeviceIdStrategy, D::Error> {
    match String::deserialize(d)?.as_str() {
        "uuid" => Ok(DeviceIdStrategy::Uuid),
        "index" => Ok(DeviceIdStrategy::Index),
        other => Err(de::Error::custom(format!(
            "unknown device_id_strategy '{other}'; use \"uuid\" or \"index\""
        ))),
    }
}

/// Checks a CDI kind, `vendor/class` as the CDI spec defines them: the vendor a domain-like
/// name (letters, digits, `-`, `_`, `.`), the class letters, digits, `-` and `_`; both start
/// and end with a letter or digit.
pub fn check_cdi_kind(kind: &str) -> Result<(), String> {
    let part = |s: &str, extra: &[char]| {
        !s.is_empty()
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
    };
    match kind.split_once('/') {
        Some((vendor, class)) if part(vendor, &['-', '_', '.']) && part(class, &['-', '_']) => {
            Ok(())
        }
        _ => Err(format!(
            "cdi_kind '{kind}' is not a CDI kind 'vendor/class'; use the kind of the CDI spec, \
             \"nvidia.com/gpu\" for what `nvidia-ctk cdi generate` writes"
        )),
    }
}

pub(super) fn cdi_kind<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    check_cdi_kind(&s).map(|()| s).map_err(de::Error::custom)
}

fn command_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    match humantime::parse_duration(&s) {
        Ok(v) if v >= Duration::from_secs(1) && v <= Duration::from_secs(600) => Ok(Some(v)),
        Ok(_) => Err(de::Error::custom(format!(
            "nvidia_smi_timeout '{s}' is out of range; use 1s to 10m (default 30s)"
        ))),
        Err(e) => Err(de::Error::custom(format!(
            "invalid duration '{s}': {e}; write it like '30s' or '1m'"
        ))),
    }
}

pub(super) fn grace<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| {
        de::Error::custom(format!(
            "invalid duration '{s}': {e}; write it like '30s' or '5m'"
        ))
    })
}

pub(super) fn guard_action<'de, D: Deserializer<'de>>(d: D) -> Result<GuardAction, D::Error> {
    match String::deserialize(d)?.as_str() {
        "none" => Ok(GuardAction::None),
        "signal" => Ok(GuardAction::Signal),
        other => Err(de::Error::custom(format!(
            "unknown memory guard action '{other}'; use \"none\" (report only) or \"signal\""
        ))),
    }
}

pub(super) fn signal_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    let full = if s.starts_with("SIG") {
        s.clone()
    } else {
        format!("SIG{s}")
    };
    match full.parse::<nix::sys::signal::Signal>() {
        Ok(_) => Ok(full),
        Err(_) => Err(de::Error::custom(format!(
            "unknown signal '{s}'; use a name like \"SIGTERM\" or \"SIGKILL\""
        ))),
    }
}

/// Checks a resource name: `nvidia.com/gpu` or `nvidia.com/mig-<profile>`.
pub fn check_resource_name(name: &str) -> Result<(), String> {
    let ok = name == "nvidia.com/gpu"
        || name.strip_prefix("nvidia.com/mig-").is_some_and(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '+' || c == '-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "unknown resource '{name}'; use \"nvidia.com/gpu\" or \"nvidia.com/mig-<profile>\" \
             (e.g. \"nvidia.com/mig-1g.10gb\")"
        ))
    }
}

/// Checks a replica count as k8s-device-plugin does (2 or more), with an upper bound that keeps
/// the kubelet's device list small.
pub fn check_replicas(n: i64) -> Result<u32, String> {
    if (2..=256).contains(&n) {
        Ok(n as u32)
    } else {
        Err(format!(
            "replicas {n} is out of range; use 2 to 256 (a GPU that is not shared needs no \
             entry)"
        ))
    }
}

pub(super) fn replicas<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    check_replicas(i64::deserialize(d)?).map_err(de::Error::custom)
}

fn resources<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SharedResource>, D::Error> {
    let raw = Vec::<ResourceSection>::deserialize(d)?;
    checked_resources(raw.into_iter().map(|r| SharedResource {
        name: r.name.into_inner(),
        replicas: r.replicas,
        devices: r.devices.map_or(Devices::All, |d| d.0),
        memory_per_replica: r.memory_per_replica,
    }))
    .map_err(de::Error::custom)
}

/// Checks a list of shared resources: not empty, known names, each name once.
pub fn checked_resources(
    raw: impl IntoIterator<Item = SharedResource>,
) -> Result<Vec<SharedResource>, String> {
    let mut out: Vec<SharedResource> = Vec::new();
    for r in raw {
        check_resource_name(&r.name)?;
        if out.iter().any(|o| o.name == r.name) {
            return Err(format!(
                "resource '{}' is listed twice; keep one entry per resource",
                r.name
            ));
        }
        out.push(r);
    }
    if out.is_empty() {
        return Err(
            "resources is empty; list at least one, e.g. { name = \"nvidia.com/gpu\", replicas = 4 }"
                .into(),
        );
    }
    Ok(out)
}

pub(super) fn memory_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let s = String::deserialize(d)?;
    parse_memory_size(&s).map(Some).map_err(de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_memory_size("512Mi"), Ok(512 << 20));
        assert_eq!(parse_memory_size("1.5GB"), Ok(1_500_000_000));
        assert!(parse_memory_size("ten").is_err());
        assert!(parse_memory_size("0GiB").is_err());
        assert!(parse_memory_size("5 parsecs").is_err());
    }

    #[test]
    fn resource_names() {
        assert!(check_resource_name("nvidia.com/gpu").is_ok());
        assert!(check_resource_name("nvidia.com/mig-1g.10gb").is_ok());
        assert!(check_resource_name("nvidia.com/mig-1g.10gb+me").is_ok());
        assert!(check_resource_name("nvidia.com/gpu.shared").is_err());
        assert!(check_resource_name("amd.com/gpu").is_err());
        assert!(check_replicas(1).is_err() && check_replicas(4) == Ok(4));
    }
}

#[cfg(test)]
#[path = "section_tests.rs"]
mod section_tests;
