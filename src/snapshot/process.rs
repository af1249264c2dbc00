//! Plain data about the processes on a GPU and the Kubernetes containers it is allocated to:
//! what NVML lists, what procfs adds (`attribution` fills it in) and what the kubelet says
//! (`kubernetes` fills it in). Defined here, at the bottom of the import graph, so that the
//! snapshot depends on nothing and its producers depend on it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessKind {
    Compute,
    Graphics,
    /// In both lists (nvidia-smi's "C+G").
    ComputeAndGraphics,
}

impl ProcessKind {
    /// nvidia-smi's spelling: `C`, `G`, `C+G`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessKind::Compute => "C",
            ProcessKind::Graphics => "G",
            ProcessKind::ComputeAndGraphics => "C+G",
        }
    }
}

/// One process using a GPU, joined from the running-process lists and process utilization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    pub kind: ProcessKind,
    /// `None` when NVML reports `NVML_VALUE_NOT_AVAILABLE` (e.g. without privileges).
    pub used_memory_bytes: Option<u64>,
    pub sm_util_percent: Option<u32>,
    pub mem_util_percent: Option<u32>,
    /// The MIG GPU and compute instance running it (`None` off MIG).
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    /// Name, user and owner from procfs; `None` when the process could not be read (gone,
    /// another pid namespace without `hostPID`, or `[processes] enabled = false`).
    pub info: Option<Arc<ProcessInfo>>,
}

/// The attribution of one process; every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attribution {
    /// Like Kubernetes' `containerStatuses[].containerID`: `containerd://<id>`, `cri-o://<id>`,
    /// `docker://<id>`, or the bare 64-hex id when the runtime cannot be told from the path.
    /// Joins with kube-state-metrics' `kube_pod_container_info{container_id}`.
    pub container_id: Option<String>,
    /// The pod's UID with dashes, as `metadata.uid` spells it.
    pub pod_uid: Option<String>,
    /// The systemd unit (`ollama.service`, `session-3.scope`) of a process outside a container.
    pub systemd_unit: Option<String>,
    /// The Slurm job id (`job_<id>` in the path).
    pub slurm_job: Option<String>,
}

/// What procfs says about one process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// `/proc/<pid>/comm` (the kernel's 15-character name).
    pub name: String,
    /// The real user, by name when the agent's user database knows the uid, else the number.
    pub user: String,
    pub attribution: Attribution,
}

/// The label names for pod, namespace and container: `pod`, `namespace`, `container` like
/// dcgm-exporter's `--kubernetes`; rename them to avoid Prometheus' `exported_pod` clash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelNames {
    pub pod: String,
    pub namespace: String,
    pub container: String,
}

/// One container that was allocated a GPU, a MIG device or a time-slicing replica of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct PodRef {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// The replica number of a time-sliced GPU (`GPU-…::N`), as dcgm-exporter's `vgpu`.
    pub replica: Option<String>,
}

/// Device (GPU UUID or MIG UUID, replica suffix stripped) → the containers allocated it.
pub type PodMapping = HashMap<String, Vec<PodRef>>;

/// The client's state as the poller copies it into each snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeletStatus {
    /// Whether the last `List` succeeded.
    pub up: bool,
    pub refresh_errors: u64,
    pub last_refresh: Option<SystemTime>,
    pub labels: LabelNames,
    pub mapping: Arc<PodMapping>,
}
