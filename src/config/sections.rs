//! `[processes]` and `[kubernetes]`: the TOML shape of per-process telemetry and kubelet
//! attribution, validated while parsing so that errors carry the position of the bad value.

use std::path::PathBuf;
use std::time::Duration;

use serde::de;
use serde::{Deserialize, Deserializer};

use crate::snapshot::LabelNames;

/// `[kubernetes]`: every key optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesSection {
    pub enabled: bool,
    #[serde(deserialize_with = "absolute_path")]
    pub pod_resources_socket: PathBuf,
    #[serde(deserialize_with = "refresh")]
    pub refresh: Duration,
    #[serde(deserialize_with = "super::labels::label")]
    pub pod_label: toml::Spanned<String>,
    #[serde(deserialize_with = "super::labels::label")]
    pub namespace_label: toml::Spanned<String>,
    #[serde(deserialize_with = "super::labels::label")]
    pub container_label: toml::Spanned<String>,
}

impl Default for KubernetesSection {
    fn default() -> Self {
        let d = KubernetesConfig::default();
        KubernetesSection {
            enabled: d.enabled,
            pod_resources_socket: d.pod_resources_socket,
            refresh: d.refresh,
            pod_label: toml::Spanned::new(0..0, d.labels.pod),
            namespace_label: toml::Spanned::new(0..0, d.labels.namespace),
            container_label: toml::Spanned::new(0..0, d.labels.container),
        }
    }
}

impl KubernetesSection {
    pub fn into_config(self) -> KubernetesConfig {
        KubernetesConfig {
            enabled: self.enabled,
            pod_resources_socket: self.pod_resources_socket,
            refresh: self.refresh,
            labels: LabelNames {
                pod: self.pod_label.into_inner(),
                namespace: self.namespace_label.into_inner(),
                container: self.container_label.into_inner(),
            },
        }
    }
}

fn absolute_path<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
    let s = String::deserialize(d)?;
    if s.starts_with('/') {
        Ok(PathBuf::from(s))
    } else {
        Err(de::Error::custom(format!(
            "path '{s}' is not absolute; write it from the root, e.g. '/host/proc'"
        )))
    }
}

fn refresh<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    match humantime::parse_duration(&s) {
        Ok(v) if v >= Duration::from_secs(1) => Ok(v),
        Ok(_) => Err(de::Error::custom(format!(
            "refresh '{s}' is shorter than 1s; the kubelet limits pod-resources to 100 QPS per \
             node, so use '1s' or more"
        ))),
        Err(e) => Err(de::Error::custom(format!(
            "invalid duration '{s}': {e}; write it like '10s' or '1m'"
        ))),
    }
}

/// `[processes]`, as written (every key optional) and as used.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProcessesConfig {
    /// Per-process series and procfs reads; `false` keeps only the per-GPU process count.
    pub enabled: bool,
    /// The procfs root: `/proc`, or `/host/proc` in a container.
    #[serde(deserialize_with = "absolute_path")]
    pub procfs: PathBuf,
    /// Most processes exported per GPU (largest memory first); the rest are counted.
    pub max_per_gpu: u32,
    /// Believe `SLURM_JOB_ID` in the environment of any process (each process's own claim), not
    /// only of a descendant of a root `slurmstepd`: for `ProctrackType=proctrack/linuxproc` (or
    /// `pgid`) nodes whose jobs' processes leave slurmstepd's tree. Off: anyone can set it.
    pub trust_slurm_job_env: bool,
}

impl Default for ProcessesConfig {
    fn default() -> Self {
        ProcessesConfig {
            enabled: true,
            procfs: PathBuf::from("/proc"),
            max_per_gpu: 64,
            trust_slurm_job_env: false,
        }
    }
}

impl ProcessesConfig {
    /// One line for `check-config`.
    pub fn describe(&self) -> String {
        if self.enabled {
            format!(
                "processes: per-process series on, at most {} per GPU, names and owners from {}; \
                 SLURM_JOB_ID believed {}\n",
                self.max_per_gpu,
                self.procfs.display(),
                if self.trust_slurm_job_env {
                    "from any process (trust_slurm_job_env)"
                } else {
                    "only under a root slurmstepd"
                }
            )
        } else {
            "processes: per-process series off (process count per GPU only)\n".to_string()
        }
    }
}

/// `[kubernetes]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    pub enabled: bool,
    pub pod_resources_socket: PathBuf,
    pub refresh: Duration,
    pub labels: LabelNames,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            enabled: false,
            pod_resources_socket: PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
            refresh: Duration::from_secs(10),
            labels: LabelNames {
                pod: "pod".into(),
                namespace: "namespace".into(),
                container: "container".into(),
            },
        }
    }
}

impl KubernetesConfig {
    /// One line for `check-config`.
    pub fn describe(&self) -> String {
        if self.enabled {
            format!(
                "kubernetes: pod labels from '{}' every {}, labels {}/{}/{}\n",
                self.pod_resources_socket.display(),
                humantime::format_duration(self.refresh),
                self.labels.pod,
                self.labels.namespace,
                self.labels.container
            )
        } else {
            "kubernetes: off\n".to_string()
        }
    }
}
