//! A GPU's MIG layout as plain data: what the NVML boundary reads (`gpu::MigControl::read`) and
//! what the planner, the applier, `mig show` and the API work from. Imports nothing of the agent.

use serde::Serialize;

/// MIG mode: `current` is in effect, `pending` takes effect at the next GPU reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
}

/// A GPU-instance profile the GPU offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GiProfile {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` index.
    pub index: u32,
    /// The hardware profile id every other call takes.
    pub id: u32,
    /// `1g.10gb`, `1g.10gb+me`, … (mig-parted's naming).
    pub name: String,
    /// Compute slices.
    pub slices: u32,
    /// Most instances of this profile per GPU.
    pub instances: u32,
    pub memory_mib: u64,
    /// Memory-slice placements `(start, size)`.
    pub placements: Vec<(u32, u32)>,
}

/// A compute instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComputeInstance {
    /// `3g.40gb` for the full-size CI, `1c.3g.40gb` for a partial one.
    pub profile: String,
    pub profile_id: u32,
    pub compute_instance_id: u32,
    pub start: u32,
    pub size: u32,
    /// The MIG device's `MIG-…` UUID, when the driver lists it.
    pub uuid: Option<String>,
    /// The MIG device's index under its GPU (`nvmlDeviceGetMigDeviceHandleByIndex`), which
    /// `nvidia-ctk` and k8s-device-plugin name it by (`<gpu>:<index>`); with the UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_index: Option<u32>,
}

/// A GPU instance and its compute instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuInstance {
    pub profile: String,
    pub profile_id: u32,
    pub gpu_instance_id: u32,
    /// Memory-slice placement.
    pub start: u32,
    pub size: u32,
    pub memory_mib: u64,
    /// Memory in use in the GPU instance (`nvmlDeviceGetMemoryInfo_v2` on its MIG device).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_used_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_free_bytes: Option<u64>,
    pub compute_instances: Vec<ComputeInstance>,
}

/// A process on the GPU and, on MIG GPUs, the instance it runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
}

/// A Kubernetes container allocated a MIG device (the kubelet hands out `MIG-…` ids), joined
/// to the instance behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigPod {
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub mig_uuid: String,
    pub pod: super::PodRef,
}

/// One GPU as MIG sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigGpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// PCI device and vendor id, `0x233010DE` (mig-parted's `device-filter`).
    pub pci_device_id: u32,
    /// PCI bus id as NVML writes it (`00000000:18:00.0`), for `{pci_bus_id}` in
    /// `[mig] reset_command`.
    #[serde(skip)]
    pub pci_bus_id: String,
    /// PCI subsystem id (`0x16C110DE`), for filters that name one.
    #[serde(skip)]
    pub pci_subsystem_id: u32,
    /// `None`: the GPU has no MIG.
    pub mig: Option<MigMode>,
    #[serde(skip)]
    pub profiles: Vec<GiProfile>,
    pub instances: Vec<GpuInstance>,
    pub processes: Vec<GpuProcess>,
}

impl MigGpu {
    /// The profile named `name` on this GPU.
    pub fn profile(&self, name: &str) -> Option<&GiProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

/// G (compute slices) and the name suffix of a GPU-instance profile index (go-nvlib's
/// `NewMigProfile`): `1_SLICE_REV1` (7) is `+me`, `1_SLICE_REV2` (9) the double-memory 1g.
pub fn profile_index_shape(index: u32) -> Option<(u32, &'static str)> {
    Some(match index {
        0 | 9 => (1, ""),
        7 => (1, "+me"),
        1 => (2, ""),
        2 => (3, ""),
        3 => (4, ""),
        4 => (7, ""),
        5 => (8, ""),
        6 => (6, ""),
        0xD => (1, "-me"),
        0xE => (2, "-me"),
        0xF => (1, "+me.all"),
        0x10 => (2, "+me.all"),
        0xA => (1, "+gfx"),
        0xB => (2, "+gfx"),
        0xC => (4, "+gfx"),
        0x11 => (3, "+gfx"),
        8 => (2, "+me"),
        _ => return None,
    })
}

/// mig-parted's profile name for a GI profile: `{G}g.{GB}gb{attrs}` with
/// GB = round(ceil(mem / total × 8) / 8 × ceil(total in GiB)) (NVIDIA/go-nvlib
/// `pkg/nvlib/device/mig_profile.go`).
pub fn profile_name(index: u32, memory_mib: u64, total_mib: u64) -> Option<String> {
    let (g, attrs) = profile_index_shape(index)?;
    if total_mib == 0 {
        return None;
    }
    let eighths = (memory_mib as f64 / total_mib as f64 * 8.0).ceil();
    let total_gib = (total_mib as f64 / 1024.0).ceil();
    let gb = (eighths / 8.0 * total_gib).round() as u64;
    Some(format!("{g}g.{gb}gb{attrs}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_go_nvlib() {
        // H100 80GB HBM3 (81559 MiB) and H200 (143771 MiB). A worked check of the formula: the
        // H200's 3g has 71168 MiB, 71168 / 143771 × 8 = 3.96 → 4/8 × 141 GiB = 70.5 → 3g.71gb.
        assert_eq!(profile_name(0, 9984, 81559).as_deref(), Some("1g.10gb"));
        assert_eq!(profile_name(7, 9984, 81559).as_deref(), Some("1g.10gb+me"));
        assert_eq!(profile_name(2, 40448, 81559).as_deref(), Some("3g.40gb"));
        assert_eq!(profile_name(2, 71168, 143771).as_deref(), Some("3g.71gb"));
        assert_eq!(profile_name(4, 40192, 40960).as_deref(), Some("7g.40gb"));
        assert_eq!(profile_name(99, 1, 1), None);
    }
}
