//! What the device plugin advertises and answers, as pure functions: the devices of each
//! resource from the GPUs and their health verdicts, Allocate's environment, and the preferred
//! allocation. No sockets here, so all of it is tested without a kubelet.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::proto::{CdiDevice, ContainerAllocateResponse, Device, HEALTHY, UNHEALTHY};
use crate::config::sharing::{
    DeviceIdStrategy, DeviceListStrategy, DevicePluginConfig, MigStrategy, TimeSlicing,
};
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
    /// False for a GPU seen before and gone now (still advertised, unhealthy).
    pub present: bool,
    /// Its MIG devices, when MIG is enabled (they share the GPU's health).
    pub mig_devices: Vec<MigDevice>,
}

/// A MIG device (a compute instance with its own `MIG-…` UUID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    pub uuid: String,
    /// The profile, `1g.10gb` (`1c.3g.40gb` for a partial compute instance), as NVIDIA's
    /// plugin names its `nvidia.com/mig-<profile>` resources.
    pub profile: String,
    /// Its index under the GPU (`nvmlDeviceGetMigDeviceHandleByIndex`), when known.
    pub index: Option<u32>,
}

/// The resources the plugin registers whatever the GPUs are: every shared resource under its
/// advertised name, and `nvidia.com/gpu` for whole GPUs unless a `nvidia.com/gpu` resource
/// shares all of them (then, renamed, only `nvidia.com/gpu.shared` is registered, as
/// k8s-device-plugin does). With `mig_strategy = "mixed"`, each `nvidia.com/mig-<profile>`
/// joins them when a MIG device of that profile is first seen (see [`inventory`]).
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

/// What the plugin advertises at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    /// Devices per resource: every name of [`resource_names`], and under `mixed` one per MIG
    /// profile present.
    pub devices: BTreeMap<String, Vec<Device>>,
    pub replicas: Vec<ReplicaCount>,
    /// Physical device (`GPU-…`, `MIG-…`) → its index name (`0`, `0:1`), for
    /// `device_id_strategy = "index"`.
    pub index_names: BTreeMap<String, String>,
    /// Why `mig_strategy = "single"` advertises no device now.
    pub problem: Option<String>,
}

/// `<UUID>` once, or `<UUID>::<n>` for each of `replicas` (k8s-device-plugin's form).
fn push_devices(list: &mut Vec<Device>, uuid: &str, replicas: Option<u32>, health: &str) {
    let device = |id: String| Device {
        id,
        health: health.to_string(),
        topology: None,
    };
    match replicas {
        Some(n) => list.extend((0..n).map(|i| device(format!("{uuid}::{i}")))),
        None => list.push(device(uuid.to_string())),
    }
}

/// Why the GPUs cannot be advertised under `mig_strategy = "single"`, if they cannot: every
/// GPU must have MIG on, each with at least one MIG device, all of one profile (NVIDIA's
/// `assertAllMigDevicesAreValid(uniform)` and "all devices on the node must be configured
/// with the same migEnabled value"). `Ok(false)`: no GPU has MIG on (whole GPUs, as NVIDIA).
fn single_is_uniform(gpus: &[&GpuState]) -> Result<bool, String> {
    let present: Vec<&&GpuState> = gpus.iter().filter(|g| g.present).collect();
    let (on, off): (Vec<&&GpuState>, Vec<&&GpuState>) = present.iter().partition(|g| g.mig_enabled);
    if on.is_empty() {
        return Ok(false);
    }
    let list = |l: &[&&GpuState]| {
        l.iter()
            .map(|g| g.index.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !off.is_empty() {
        return Err(format!(
            "mig_strategy \"single\" needs MIG on every GPU, but it is on for GPU {} and off \
             for GPU {}; advertising no device until the node is uniform (apply one layout to \
             every GPU, or use mig_strategy \"mixed\")",
            list(&on),
            list(&off)
        ));
    }
    if let Some(empty) = on.iter().find(|g| g.mig_devices.is_empty()) {
        return Err(format!(
            "mig_strategy \"single\": GPU {} has MIG on but no MIG device; advertising no \
             device until every GPU has its instances",
            empty.index
        ));
    }
    let profiles: BTreeSet<&str> = on
        .iter()
        .flat_map(|g| g.mig_devices.iter().map(|m| m.profile.as_str()))
        .collect();
    if profiles.len() > 1 {
        return Err(format!(
            "mig_strategy \"single\" needs one MIG profile on the whole node, but it has {}; \
             advertising no device until the node is uniform (or use mig_strategy \"mixed\")",
            profiles.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(true)
}

/// The devices of every resource, the replicas per GPU and the index names.
///
/// Full GPUs a `nvidia.com/gpu` resource covers are advertised as `<UUID>::<n>`, n in
/// 0..replicas; the others as `<UUID>`. GPUs with MIG enabled are never whole GPUs; their MIG
/// devices (`MIG-…` UUIDs) are advertised by `strategy`:
/// - `none`: only under the `nvidia.com/mig-<profile>` resources the configuration shares;
/// - `mixed`: every one under `nvidia.com/mig-<profile>` (replicas where shared);
/// - `single`: every one as `nvidia.com/gpu` (replicas where `nvidia.com/gpu` is shared)
///   when the node is uniform, none at all otherwise (see [`single_is_uniform`]).
pub fn inventory(ts: Option<&TimeSlicing>, strategy: MigStrategy, gpus: &[GpuState]) -> Inventory {
    let mut inv = Inventory {
        devices: resource_names(ts)
            .into_iter()
            .map(|n| (n, Vec::new()))
            .collect(),
        ..Inventory::default()
    };
    let shared = ts.and_then(|t| t.resource(GPU_RESOURCE).map(|r| (t, r)));
    let mut sorted: Vec<&GpuState> = gpus.iter().collect();
    sorted.sort_by_key(|g| g.index);
    let single = match strategy {
        MigStrategy::Single => match single_is_uniform(&sorted) {
            Ok(uniform) => uniform,
            Err(problem) => {
                inv.problem = Some(problem);
                return inv;
            }
        },
        _ => false,
    };
    for (position, g) in sorted.into_iter().enumerate() {
        let health = if g.healthy { HEALTHY } else { UNHEALTHY };
        inv.index_names.insert(g.uuid.clone(), g.index.to_string());
        // The resource a GPU-like device (a whole GPU, or a MIG device under `single`) goes to.
        let gpu_like = |inv: &mut Inventory, uuid: &str| match shared {
            Some((t, r)) if r.devices.covers(position, g.index, &g.uuid) => {
                let name = t.advertised_name(r);
                push_devices(
                    inv.devices.entry(name).or_default(),
                    uuid,
                    Some(r.replicas),
                    health,
                );
            }
            _ => push_devices(
                inv.devices.entry(GPU_RESOURCE.to_string()).or_default(),
                uuid,
                None,
                health,
            ),
        };
        if !g.mig_enabled {
            gpu_like(&mut inv, &g.uuid);
            if let Some((t, r)) =
                shared.filter(|(_, r)| r.devices.covers(position, g.index, &g.uuid))
            {
                inv.replicas.push(ReplicaCount {
                    gpu: g.index,
                    uuid: g.uuid.clone(),
                    resource: t.advertised_name(r),
                    replicas: r.replicas,
                });
            }
            continue;
        }
        for m in &g.mig_devices {
            if let Some(i) = m.index {
                inv.index_names
                    .insert(m.uuid.clone(), format!("{}:{i}", g.index));
            }
            if single {
                gpu_like(&mut inv, &m.uuid);
                continue;
            }
            let name = format!("nvidia.com/mig-{}", m.profile);
            let configured = ts
                .and_then(|t| t.resource(&name).map(|r| (t, r)))
                .filter(|(_, r)| {
                    r.devices.covers(position, g.index, &g.uuid)
                        || matches!(&r.devices, crate::sharing::Devices::List(l)
                        if l.iter().any(|s| s.matches(u32::MAX, &m.uuid)))
                });
            match (configured, strategy) {
                (Some((t, r)), _) => push_devices(
                    inv.devices.entry(t.advertised_name(r)).or_default(),
                    &m.uuid,
                    Some(r.replicas),
                    health,
                ),
                (None, MigStrategy::Mixed) => {
                    push_devices(inv.devices.entry(name).or_default(), &m.uuid, None, health)
                }
                (None, _) => {}
            }
        }
    }
    inv
}

/// How Allocate names the devices to the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocateOptions {
    pub fail_requests_greater_than_one: bool,
    pub lists: Vec<DeviceListStrategy>,
    pub ids: DeviceIdStrategy,
    pub cdi_kind: String,
}

impl AllocateOptions {
    pub fn new(config: &DevicePluginConfig, fail_requests_greater_than_one: bool) -> Self {
        AllocateOptions {
            fail_requests_greater_than_one,
            lists: config.device_list_strategy.clone(),
            ids: config.device_id_strategy,
            cdi_kind: config.cdi_kind.clone(),
        }
    }
}

impl Default for AllocateOptions {
    fn default() -> Self {
        AllocateOptions::new(&DevicePluginConfig::default(), false)
    }
}

/// The name of physical device `uuid` under `ids` (the UUID, or its index name).
pub fn device_name(
    uuid: &str,
    ids: DeviceIdStrategy,
    index_names: &BTreeMap<String, String>,
) -> Result<String, String> {
    match ids {
        DeviceIdStrategy::Uuid => Ok(uuid.to_string()),
        DeviceIdStrategy::Index => index_names.get(uuid).cloned().ok_or_else(|| {
            format!(
                "device '{uuid}' has no index name (the driver did not say its MIG device \
                 index); use device_id_strategy = \"uuid\""
            )
        }),
    }
}

/// The physical device of an advertised ID (`GPU-x::3` → `GPU-x`).
pub fn physical(id: &str) -> &str {
    id.split_once("::").map_or(id, |(d, _)| d)
}

/// Allocate for one container: every ID must be advertised; with
/// `fail_requests_greater_than_one`, a request of more than one shared replica is refused (as
/// k8s-device-plugin does). Each physical device is named once, by `options.ids`, in each of
/// `options.lists`: `NVIDIA_VISIBLE_DEVICES`, the CDI devices `<cdi_kind>=<name>`
/// (`cdi_devices`), and the `cdi.k8s.io/gpu-steward_<first UUID>` annotation listing them.
pub fn allocate(
    advertised: &[Device],
    ids: &[String],
    options: &AllocateOptions,
    index_names: &BTreeMap<String, String>,
) -> Result<ContainerAllocateResponse, String> {
    if ids.is_empty() {
        return Err("the request names no device".into());
    }
    let known: HashSet<&str> = advertised.iter().map(|d| d.id.as_str()).collect();
    if let Some(unknown) = ids.iter().find(|id| !known.contains(id.as_str())) {
        return Err(format!("unknown device '{unknown}'"));
    }
    if options.fail_requests_greater_than_one
        && ids.len() > 1
        && ids.iter().any(|i| i.contains("::"))
    {
        return Err(format!(
            "maximum request size for shared resources is 1; {} were requested",
            ids.len()
        ));
    }
    let mut seen = HashSet::new();
    let physical: Vec<&str> = ids
        .iter()
        .map(|i| physical(i))
        .filter(|d| seen.insert(*d))
        .collect();
    let names = physical
        .iter()
        .map(|d| device_name(d, options.ids, index_names))
        .collect::<Result<Vec<String>, String>>()?;
    let cdi: Vec<String> = names
        .iter()
        .map(|n| format!("{}={n}", options.cdi_kind))
        .collect();
    let mut response = ContainerAllocateResponse::default();
    for list in &options.lists {
        match list {
            DeviceListStrategy::Envvar => {
                response
                    .envs
                    .insert("NVIDIA_VISIBLE_DEVICES".into(), names.join(","));
            }
            DeviceListStrategy::CdiCri => {
                response.cdi_devices = cdi.iter().map(|n| CdiDevice { name: n.clone() }).collect();
            }
            DeviceListStrategy::CdiAnnotations => {
                // The CDI annotation key is `cdi.k8s.io/<plugin>_<device>`, its name part at
                // most 63 characters (a `MIG-…` UUID makes 52); one key per container.
                response.annotations.insert(
                    format!("cdi.k8s.io/gpu-steward_{}", physical[0]),
                    cdi.join(","),
                );
            }
        }
    }
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
    use crate::config::sharing::{Devices, GpuSelector, SharedResource};

    fn gpus() -> Vec<GpuState> {
        (0..3)
            .map(|i| GpuState {
                index: i,
                uuid: format!("GPU-{i}"),
                mig_enabled: i == 2,
                healthy: i != 1,
                present: true,
                mig_devices: if i == 2 {
                    vec![
                        MigDevice {
                            uuid: "MIG-a".into(),
                            profile: "1g.10gb".into(),
                            index: Some(0),
                        },
                        MigDevice {
                            uuid: "MIG-b".into(),
                            profile: "3g.40gb".into(),
                            index: Some(1),
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
        let Inventory {
            devices: inv,
            replicas,
            ..
        } = inventory(None, MigStrategy::None, &gpus());
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
        let Inventory {
            devices: inv,
            replicas,
            ..
        } = inventory(Some(&ts), MigStrategy::None, &gpus());
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
        assert_eq!(
            inventory(Some(&ts), MigStrategy::None, &gpus()).devices[GPU_RESOURCE].len(),
            4
        );
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
        let inv = inventory(Some(&ts), MigStrategy::None, &gpus()).devices;
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
            &AllocateOptions::default(),
            &BTreeMap::new(),
        )
        .expect("allocated");
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "MIG-a");
    }

    #[test]
    fn allocate_dedups_and_honours_fail_requests_greater_than_one() {
        let inv = inventory(
            Some(&sharing(false, Devices::All)),
            MigStrategy::None,
            &gpus(),
        )
        .devices;
        let list = &inv[GPU_RESOURCE];
        let r = allocate(
            list,
            &["GPU-0::1".into(), "GPU-0::0".into(), "GPU-1::0".into()],
            &AllocateOptions::default(),
            &BTreeMap::new(),
        )
        .expect("allowed");
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-0,GPU-1");
        let strict = AllocateOptions::new(&Default::default(), true);
        let none = BTreeMap::new();
        let e = allocate(
            list,
            &["GPU-0::1".into(), "GPU-1::0".into()],
            &strict,
            &none,
        )
        .expect_err("refused");
        assert!(
            e.contains("maximum request size for shared resources is 1"),
            "{e}"
        );
        assert!(allocate(list, &["GPU-0::0".into()], &strict, &none).is_ok());
        let e = allocate(
            list,
            &["GPU-9::0".into()],
            &AllocateOptions::default(),
            &none,
        )
        .expect_err("unknown");
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
    fn mig_gpu(index: u32, profiles: &[&str]) -> GpuState {
        GpuState {
            index,
            uuid: format!("GPU-{index}"),
            mig_enabled: true,
            healthy: true,
            present: true,
            mig_devices: profiles
                .iter()
                .enumerate()
                .map(|(j, p)| MigDevice {
                    uuid: format!("MIG-{index}-{j}"),
                    profile: p.to_string(),
                    index: Some(j as u32),
                })
                .collect(),
        }
    }

    #[test]
    fn mixed_advertises_every_mig_device_under_its_profile_and_whole_gpus_as_gpu() {
        let mut whole = mig_gpu(0, &[]);
        whole.mig_enabled = false;
        let gpus = vec![whole, mig_gpu(1, &["1g.10gb", "1g.10gb", "3g.40gb"])];
        let inv = inventory(None, MigStrategy::Mixed, &gpus);
        assert_eq!(inv.problem, None);
        assert_eq!(
            ids(&inv.devices[GPU_RESOURCE]),
            [("GPU-0".into(), "Healthy".into())]
        );
        assert_eq!(
            ids(&inv.devices["nvidia.com/mig-1g.10gb"]),
            [
                ("MIG-1-0".to_string(), "Healthy".to_string()),
                ("MIG-1-1".into(), "Healthy".into())
            ]
        );
        assert_eq!(inv.devices["nvidia.com/mig-3g.40gb"].len(), 1);
        assert_eq!(inv.index_names["MIG-1-2"], "1:2");
        assert_eq!(inv.index_names["GPU-0"], "0");
        // A shared profile gets replicas under its advertised name; the others stay plain.
        let mut ts = sharing(false, Devices::List(vec![GpuSelector::Index(7)]));
        ts.resources.push(SharedResource {
            name: "nvidia.com/mig-1g.10gb".into(),
            replicas: 2,
            devices: Devices::All,
            memory_per_replica: None,
        });
        let inv = inventory(Some(&ts), MigStrategy::Mixed, &gpus);
        assert_eq!(inv.devices["nvidia.com/mig-1g.10gb"].len(), 4);
        assert_eq!(inv.devices["nvidia.com/mig-3g.40gb"][0].id, "MIG-1-2");
        // Under none, the unshared profile is not advertised at all.
        let inv = inventory(Some(&ts), MigStrategy::None, &gpus);
        assert!(!inv.devices.contains_key("nvidia.com/mig-3g.40gb"));
    }

    #[test]
    fn single_advertises_uniform_mig_devices_as_gpu_and_nothing_on_a_mixed_node() {
        let uniform = vec![mig_gpu(0, &["1g.10gb"; 2]), mig_gpu(1, &["1g.10gb"; 2])];
        let inv = inventory(None, MigStrategy::Single, &uniform);
        assert_eq!(inv.problem, None);
        assert_eq!(
            ids(&inv.devices[GPU_RESOURCE])
                .into_iter()
                .map(|(i, _)| i)
                .collect::<Vec<_>>(),
            ["MIG-0-0", "MIG-0-1", "MIG-1-0", "MIG-1-1"]
        );
        // Time-slicing nvidia.com/gpu shares the MIG devices, as NVIDIA's plugin does.
        let ts = sharing(true, Devices::All);
        let inv = inventory(Some(&ts), MigStrategy::Single, &uniform);
        assert_eq!(inv.devices["nvidia.com/gpu.shared"].len(), 8);
        assert_eq!(inv.devices["nvidia.com/gpu.shared"][1].id, "MIG-0-0::1");

        let profiles = vec![mig_gpu(0, &["1g.10gb"]), mig_gpu(1, &["3g.40gb"])];
        let inv = inventory(None, MigStrategy::Single, &profiles);
        let why = inv.problem.expect("not uniform");
        assert!(
            why.contains("one MIG profile") && why.contains("1g.10gb, 3g.40gb"),
            "{why}"
        );
        assert!(inv.devices.values().all(Vec::is_empty), "{:?}", inv.devices);
        assert!(inv.devices.contains_key(GPU_RESOURCE), "stays registered");

        let mut off = mig_gpu(1, &[]);
        off.mig_enabled = false;
        let inv = inventory(
            None,
            MigStrategy::Single,
            &[mig_gpu(0, &["1g.10gb"]), off.clone()],
        );
        let why = inv.problem.expect("MIG on and off");
        assert!(why.contains("on for GPU 0 and off for GPU 1"), "{why}");
        let inv = inventory(
            None,
            MigStrategy::Single,
            &[mig_gpu(0, &["1g.10gb"]), mig_gpu(1, &[])],
        );
        assert!(inv
            .problem
            .expect("empty")
            .contains("GPU 1 has MIG on but no MIG device"));
        // No GPU with MIG: whole GPUs, as NVIDIA's plugin does.
        let inv = inventory(None, MigStrategy::Single, &[off]);
        assert_eq!(inv.problem, None);
        assert_eq!(inv.devices[GPU_RESOURCE][0].id, "GPU-1");
        // A gone GPU does not make the node non-uniform; its devices turn Unhealthy.
        let mut gone = mig_gpu(1, &["1g.10gb"]);
        gone.present = false;
        gone.healthy = false;
        let inv = inventory(None, MigStrategy::Single, &[mig_gpu(0, &["1g.10gb"]), gone]);
        assert_eq!(inv.problem, None);
        assert_eq!(inv.devices[GPU_RESOURCE][1].health, UNHEALTHY);
    }

    #[test]
    fn allocate_names_devices_by_each_list_strategy_and_id_strategy() {
        let gpus = vec![mig_gpu(1, &["1g.10gb", "1g.10gb"])];
        let inv = inventory(None, MigStrategy::Mixed, &gpus);
        let list = &inv.devices["nvidia.com/mig-1g.10gb"];
        let config = DevicePluginConfig {
            device_list_strategy: DeviceListStrategy::ALL.to_vec(),
            ..DevicePluginConfig::default()
        };
        let options = AllocateOptions::new(&config, false);
        let ids = ["MIG-1-1".to_string(), "MIG-1-0".to_string()];
        let r = allocate(list, &ids, &options, &inv.index_names).expect("allocated");
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "MIG-1-1,MIG-1-0");
        let cdi: Vec<&str> = r.cdi_devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(cdi, ["nvidia.com/gpu=MIG-1-1", "nvidia.com/gpu=MIG-1-0"]);
        assert_eq!(
            r.annotations["cdi.k8s.io/gpu-steward_MIG-1-1"],
            "nvidia.com/gpu=MIG-1-1,nvidia.com/gpu=MIG-1-0"
        );
        // By index: `<gpu>:<mig device>` as nvidia-ctk names MIG devices; CDI only.
        let config = DevicePluginConfig {
            device_list_strategy: vec![DeviceListStrategy::CdiCri],
            device_id_strategy: DeviceIdStrategy::Index,
            cdi_kind: "example.com/accel".into(),
            ..DevicePluginConfig::default()
        };
        let options = AllocateOptions::new(&config, false);
        let r = allocate(list, &ids[..1], &options, &inv.index_names).expect("allocated");
        assert!(r.envs.is_empty() && r.annotations.is_empty());
        assert_eq!(r.cdi_devices[0].name, "example.com/accel=1:1");
        let e = allocate(list, &ids[..1], &options, &BTreeMap::new()).expect_err("no index");
        assert!(e.contains("has no index name"), "{e}");
    }
}
