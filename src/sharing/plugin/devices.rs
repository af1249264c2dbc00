//! What the device plugin advertises and answers, as pure functions: the devices of each
//! resource from the GPUs and their health verdicts, Allocate's environment, and the preferred
//! allocation. No sockets here, so all of it is tested without a kubelet.

use std::collections::{BTreeMap, HashSet};

use super::proto::{ContainerAllocateResponse, Device, HEALTHY, UNHEALTHY};
use crate::sharing::settings::TimeSlicing;
use crate::snapshot::ReplicaCount;

/// The resource of whole GPUs (and of time-slicing replicas when not renamed).
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// One GPU as the plugin sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuState {
    pub index: u32,
    pub uuid: String,
    pub mig_enabled: bool,
    /// False when its verdict is fail, or it is lost or gone.
    pub healthy: bool,
    /// Its MIG devices, when MIG is enabled (they share the GPU's health).
    pub mig_devices: Vec<MigDevice>,
}

/// A MIG device (a compute instance with its own `MIG-…` UUID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    pub uuid: String,
    /// The GPU-instance profile, `1g.10gb` (mig-parted's naming).
    pub profile: String,
}

/// The resources the plugin registers, fixed by the configuration (so that sockets do not
/// come and go with GPUs): every shared resource under its advertised name, and
/// `nvidia.com/gpu` for whole GPUs unless a `nvidia.com/gpu` resource shares all of them (then,
/// renamed, only `nvidia.com/gpu.shared` is registered, as k8s-device-plugin does).
pub fn resource_names(ts: Option<&TimeSlicing>) -> Vec<String> {
    let Some(ts) = ts else {
        return vec![GPU_RESOURCE.to_string()];
    };
    let mut names: Vec<String> = ts.resources.iter().map(|r| ts.advertised_name(r)).collect();
    let all_shared = ts
        .resource(GPU_RESOURCE)
        .is_some_and(|r| r.devices == crate::sharing::Devices::All);
    if !all_shared && !names.iter().any(|n| n == GPU_RESOURCE) {
        names.push(GPU_RESOURCE.to_string());
    }
    names
}

/// The devices of every resource in [`resource_names`], and the replicas per GPU.
///
/// Full GPUs a `nvidia.com/gpu` resource covers are advertised as `<UUID>::<n>`, n in
/// 0..replicas (k8s-device-plugin's form); the others as `<UUID>`. GPUs with MIG enabled are
/// never whole GPUs: their MIG devices (`MIG-…` UUIDs from the poller's MIG layout) are
/// advertised under the `nvidia.com/mig-<profile>` resources the configuration shares.
pub fn inventory(
    ts: Option<&TimeSlicing>,
    gpus: &[GpuState],
) -> (BTreeMap<String, Vec<Device>>, Vec<ReplicaCount>) {
    let mut out: BTreeMap<String, Vec<Device>> = resource_names(ts)
        .into_iter()
        .map(|n| (n, Vec::new()))
        .collect();
    let mut replicas = Vec::new();
    let shared = ts.and_then(|t| t.resource(GPU_RESOURCE).map(|r| (t, r)));
    let mut sorted: Vec<&GpuState> = gpus.iter().collect();
    sorted.sort_by_key(|g| g.index);
    for (position, g) in sorted.into_iter().enumerate() {
        let health = if g.healthy { HEALTHY } else { UNHEALTHY };
        if g.mig_enabled {
            for m in &g.mig_devices {
                let name = format!("nvidia.com/mig-{}", m.profile);
                let Some((t, r)) = ts.and_then(|t| t.resource(&name).map(|r| (t, r))) else {
                    continue;
                };
                let covered = r.devices.covers(position, g.index, &g.uuid)
                    || matches!(&r.devices, crate::sharing::Devices::List(l)
                        if l.iter().any(|s| s.matches(u32::MAX, &m.uuid)));
                if !covered {
                    continue;
                }
                let list = out.entry(t.advertised_name(r)).or_default();
                for i in 0..r.replicas {
                    list.push(Device {
                        id: format!("{}::{i}", m.uuid),
                        health: health.to_string(),
                        topology: None,
                    });
                }
            }
            continue;
        }
        let device = |id: String| Device {
            id,
            health: health.to_string(),
            topology: None,
        };
        match shared {
            Some((t, r)) if r.devices.covers(position, g.index, &g.uuid) => {
                let name = t.advertised_name(r);
                let list = out.entry(name.clone()).or_default();
                for i in 0..r.replicas {
                    list.push(device(format!("{}::{i}", g.uuid)));
                }
                replicas.push(ReplicaCount {
                    gpu: g.index,
                    uuid: g.uuid.clone(),
                    resource: name,
                    replicas: r.replicas,
                });
            }
            _ => out
                .entry(GPU_RESOURCE.to_string())
                .or_default()
                .push(device(g.uuid.clone())),
        }
    }
    (out, replicas)
}

/// The physical device of an advertised ID (`GPU-x::3` → `GPU-x`).
pub fn physical(id: &str) -> &str {
    id.split_once("::").map_or(id, |(d, _)| d)
}

/// Allocate for one container: every ID must be advertised; with
/// `fail_requests_greater_than_one`, a request of more than one shared replica is refused (as
/// k8s-device-plugin does); `NVIDIA_VISIBLE_DEVICES` lists each physical GPU once.
pub fn allocate(
    advertised: &[Device],
    ids: &[String],
    fail_requests_greater_than_one: bool,
) -> Result<ContainerAllocateResponse, String> {
    if ids.is_empty() {
        return Err("the request names no device".into());
    }
    let known: HashSet<&str> = advertised.iter().map(|d| d.id.as_str()).collect();
    if let Some(unknown) = ids.iter().find(|id| !known.contains(id.as_str())) {
        return Err(format!("unknown device '{unknown}'"));
    }
    if fail_requests_greater_than_one && ids.len() > 1 && ids.iter().any(|i| i.contains("::")) {
        return Err(format!(
            "maximum request size for shared resources is 1; {} were requested",
            ids.len()
        ));
    }
    let mut seen = HashSet::new();
    let visible: Vec<&str> = ids
        .iter()
        .map(|i| physical(i))
        .filter(|d| seen.insert(*d))
        .collect();
    let mut response = ContainerAllocateResponse::default();
    response
        .envs
        .insert("NVIDIA_VISIBLE_DEVICES".into(), visible.join(","));
    Ok(response)
}

/// The preferred allocation of `size` devices from `available`, with `must_include` first:
/// each next device comes from a physical GPU not used yet by this allocation if there is one,
/// taking the GPU with the most free replicas (the least loaded), ties by ID.
pub fn preferred(available: &[String], must_include: &[String], size: usize) -> Vec<String> {
    let mut chosen: Vec<String> = Vec::new();
    for id in must_include {
        if chosen.len() < size && !chosen.contains(id) {
            chosen.push(id.clone());
        }
    }
    // Free replicas per physical GPU, in ID order.
    let mut free: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
    for id in available.iter().filter(|i| !chosen.contains(i)) {
        free.entry(physical(id)).or_default().push(id);
    }
    for list in free.values_mut() {
        list.sort();
        list.reverse(); // pop() takes the lowest replica first
    }
    let mut used: BTreeMap<String, usize> = BTreeMap::new();
    for c in &chosen {
        *used.entry(physical(c).to_string()).or_default() += 1;
    }
    while chosen.len() < size {
        let next = free
            .iter()
            .filter(|(_, l)| !l.is_empty())
            .min_by_key(|(gpu, l)| (used.get(**gpu).copied().unwrap_or(0), usize::MAX - l.len()))
            .map(|(gpu, _)| *gpu);
        let Some(gpu) = next else { break };
        if let Some(id) = free.get_mut(gpu).and_then(Vec::pop) {
            *used.entry(gpu.to_string()).or_default() += 1;
            chosen.push(id.clone());
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharing::settings::{Devices, GpuSelector, SharedResource};

    fn gpus() -> Vec<GpuState> {
        (0..3)
            .map(|i| GpuState {
                index: i,
                uuid: format!("GPU-{i}"),
                mig_enabled: i == 2,
                healthy: i != 1,
                mig_devices: if i == 2 {
                    vec![
                        MigDevice {
                            uuid: "MIG-a".into(),
                            profile: "1g.10gb".into(),
                        },
                        MigDevice {
                            uuid: "MIG-b".into(),
                            profile: "3g.40gb".into(),
                        },
                    ]
                } else {
                    vec![]
                },
            })
            .collect()
    }

    fn sharing(rename: bool, devices: Devices) -> TimeSlicing {
        TimeSlicing {
            rename_by_default: rename,
            fail_requests_greater_than_one: false,
            resources: vec![SharedResource {
                name: GPU_RESOURCE.into(),
                replicas: 2,
                devices,
                memory_per_replica: None,
            }],
        }
    }

    fn ids(list: &[Device]) -> Vec<(String, String)> {
        list.iter()
            .map(|d| (d.id.clone(), d.health.clone()))
            .collect()
    }

    #[test]
    fn whole_gpus_without_sharing_and_no_mig_gpu() {
        let (inv, replicas) = inventory(None, &gpus());
        assert_eq!(
            ids(&inv[GPU_RESOURCE]),
            [
                ("GPU-0".to_string(), "Healthy".to_string()),
                ("GPU-1".into(), "Unhealthy".into())
            ]
        );
        assert!(replicas.is_empty());
    }

    #[test]
    fn replicas_renamed_and_uncovered_gpus_stay_whole() {
        let ts = sharing(true, Devices::List(vec![GpuSelector::Index(1)]));
        assert_eq!(
            resource_names(Some(&ts)),
            ["nvidia.com/gpu.shared", GPU_RESOURCE]
        );
        let (inv, replicas) = inventory(Some(&ts), &gpus());
        assert_eq!(
            ids(&inv["nvidia.com/gpu.shared"]),
            [
                ("GPU-1::0".to_string(), "Unhealthy".to_string()),
                ("GPU-1::1".into(), "Unhealthy".into())
            ]
        );
        assert_eq!(
            ids(&inv[GPU_RESOURCE]),
            [("GPU-0".into(), "Healthy".into())]
        );
        assert_eq!(replicas.len(), 1);
        assert_eq!(replicas[0].resource, "nvidia.com/gpu.shared");
        let ts = sharing(false, Devices::All);
        assert_eq!(resource_names(Some(&ts)), [GPU_RESOURCE]);
        assert_eq!(
            resource_names(Some(&sharing(true, Devices::All))),
            ["nvidia.com/gpu.shared"]
        );
        assert_eq!(inventory(Some(&ts), &gpus()).0[GPU_RESOURCE].len(), 4);
    }

    #[test]
    fn configured_mig_profiles_are_advertised_with_replicas() {
        let mut ts = sharing(true, Devices::All);
        ts.resources.push(SharedResource {
            name: "nvidia.com/mig-1g.10gb".into(),
            replicas: 3,
            devices: Devices::All,
            memory_per_replica: None,
        });
        assert_eq!(
            resource_names(Some(&ts)),
            ["nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb.shared"]
        );
        let (inv, _) = inventory(Some(&ts), &gpus());
        assert_eq!(
            ids(&inv["nvidia.com/mig-1g.10gb.shared"]),
            [
                ("MIG-a::0".to_string(), "Healthy".to_string()),
                ("MIG-a::1".into(), "Healthy".into()),
                ("MIG-a::2".into(), "Healthy".into())
            ]
        );
        // 3g.40gb is not configured: not advertised; the MIG GPU is never whole.
        assert!(inv
            .values()
            .flatten()
            .all(|d| !d.id.starts_with("MIG-b") && !d.id.starts_with("GPU-2")));
        let r = allocate(
            &inv["nvidia.com/mig-1g.10gb.shared"],
            &["MIG-a::2".into()],
            false,
        )
        .expect("allocated");
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "MIG-a");
    }

    #[test]
    fn allocate_dedups_and_honours_fail_requests_greater_than_one() {
        let (inv, _) = inventory(Some(&sharing(false, Devices::All)), &gpus());
        let list = &inv[GPU_RESOURCE];
        let r = allocate(
            list,
            &["GPU-0::1".into(), "GPU-0::0".into(), "GPU-1::0".into()],
            false,
        )
        .expect("allowed");
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-0,GPU-1");
        let e = allocate(list, &["GPU-0::1".into(), "GPU-1::0".into()], true).expect_err("refused");
        assert!(
            e.contains("maximum request size for shared resources is 1"),
            "{e}"
        );
        assert!(allocate(list, &["GPU-0::0".into()], true).is_ok());
        let e = allocate(list, &["GPU-9::0".into()], false).expect_err("unknown");
        assert_eq!(e, "unknown device 'GPU-9::0'");
    }

    #[test]
    fn preferred_spreads_over_physical_gpus_least_loaded_first() {
        let available: Vec<String> = [
            "GPU-a::0", "GPU-a::1", "GPU-a::2", "GPU-b::3", "GPU-c::0", "GPU-c::1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(preferred(&available, &[], 2), ["GPU-a::0", "GPU-c::0"]);
        assert_eq!(
            preferred(&available, &[], 4),
            ["GPU-a::0", "GPU-c::0", "GPU-b::3", "GPU-a::1"]
        );
        assert_eq!(
            preferred(&available, &["GPU-c::1".into()], 2),
            ["GPU-c::1", "GPU-a::0"]
        );
        assert_eq!(preferred(&available, &[], 9).len(), 6);
    }
}
