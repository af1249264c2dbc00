//! The planner: from the layout found on each GPU and a target layout, the steps that reach the
//! target with the fewest changes, or the reason it cannot be reached. Pure: no NVML, no clock.
//!
//! - GPU instances that already match a wanted profile (and hold one full-size compute
//!   instance, or none yet) are **kept**: as many as possible, chosen by search over the
//!   subsets of the found instances, largest first.
//! - The instances still to create get **placements chosen by search** (depth-first over each
//!   profile's memory-slice starts, largest profiles first) in the slices the kept ones leave, so
//!   a target that fits in any arrangement is found; mig-parted instead lets the driver place
//!   instances and retries creation orders (NVIDIA/mig-parted `pkg/mig/config/config.go`).
//! - A target that cannot fit at all (unknown profile, more instances than the profile allows,
//!   more than the GPU's compute slices, or no arrangement of memory slices) is **rejected**
//!   before anything changes, naming the GPU and the reason.
//! - Compute instances are destroyed before their GPU instance; each new GPU instance gets one
//!   compute instance of its full size, as mig-parted and `nvidia-smi mig -cgi … -C` make.

use std::collections::BTreeMap;
use std::fmt;

pub use crate::audit::mig::{GpuPlan, Plan, Step};
use crate::config::mig_layout::{GpuTarget, Layout};
use crate::snapshot::mig::{GiProfile, GpuInstance, MigGpu};

/// Compute slices of every MIG GPU (A100, H100, H200).
const COMPUTE_SLICES: u32 = 7;

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::SetMigMode { enable } => {
                write!(f, "{} MIG mode", if *enable { "enable" } else { "disable" })
            }
            Step::DestroyComputeInstance {
                gpu_instance_id,
                compute_instance_id,
                ..
            } => write!(
                f,
                "destroy compute instance {compute_instance_id} of GPU instance {gpu_instance_id}"
            ),
            Step::DestroyGpuInstance {
                gpu_instance_id,
                profile,
                start,
                size,
                ..
            } => write!(
                f,
                "destroy GPU instance {gpu_instance_id} ({profile} at {start}:{size})"
            ),
            Step::CreateComputeInstance {
                gpu_instance_id,
                size,
                ..
            } => write!(
                f,
                "create a {size}-slice compute instance in GPU instance {gpu_instance_id}"
            ),
            Step::CreateInstance {
                profile,
                start,
                size,
                ..
            } => write!(
                f,
                "create {profile} at {start}:{size} with its compute instance"
            ),
        }
    }
}

impl Plan {
    pub fn is_noop(&self) -> bool {
        self.gpus.iter().all(|g| g.steps.is_empty())
    }
}

/// Why a layout cannot be reached on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPU {index} ({uuid}): {reason}")]
pub struct Infeasible {
    pub index: u32,
    pub uuid: String,
    pub reason: String,
}

/// Plans `layout` for every GPU of `gpus`; the first GPU it cannot reach fails the whole plan.
pub fn plan(gpus: &[MigGpu], layout: &Layout) -> Result<Plan, Infeasible> {
    let mut out = Vec::new();
    for gpu in gpus {
        let p = match layout.target_for(gpu) {
            None => GpuPlan {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                selected: false,
                kept: Vec::new(),
                steps: Vec::new(),
                blocking_pids: Vec::new(),
            },
            Some(t) => plan_gpu(gpu, &t).map_err(|reason| Infeasible {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                reason,
            })?,
        };
        out.push(p);
    }
    Ok(Plan { gpus: out })
}

/// The CI profile id (= `NVML_COMPUTE_INSTANCE_PROFILE_*` index) of a full-size compute
/// instance in a GPU instance of `g` compute slices.
pub fn full_ci_profile(g: u32) -> Option<u32> {
    Some(match g {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        7 => 4,
        8 => 5,
        6 => 6,
        _ => return None,
    })
}

fn span(start: u32, size: u32) -> u32 {
    if size >= 32 {
        return u32::MAX;
    }
    ((1u32 << size) - 1) << start
}

/// Whether a found GPU instance can be kept as an instance of its profile: it holds exactly
/// one full-size compute instance, or none yet.
fn keepable(gi: &GpuInstance, p: &GiProfile) -> bool {
    match gi.compute_instances.as_slice() {
        [] => true,
        [ci] => ci.size == p.slices && ci.start == 0,
        _ => false,
    }
}

/// The wanted profiles of `t` on `gpu`, each once per instance, largest first.
fn wanted<'g>(gpu: &'g MigGpu, t: &GpuTarget) -> Result<Vec<&'g GiProfile>, String> {
    let mut out = Vec::new();
    for (name, &count) in &t.mig_devices {
        let Some(p) = gpu.profile(name) else {
            let known: Vec<&str> = gpu.profiles.iter().map(|p| p.name.as_str()).collect();
            let hint = if name.contains('c') && name.matches('.').count() == 2 {
                " (compute-instance profiles such as '1c.3g.40gb' are not supported; name GPU \
                 instance profiles)"
            } else {
                ""
            };
            return Err(format!(
                "profile '{name}' does not exist on {}{hint}; it has {}",
                gpu.name,
                known.join(", ")
            ));
        };
        if count > p.instances {
            return Err(format!(
                "{count} × {name} asked, but the GPU allows at most {} of it",
                p.instances
            ));
        }
        out.extend(std::iter::repeat_n(p, count as usize));
    }
    let slices: u32 = out.iter().map(|p| p.slices).sum();
    if slices > COMPUTE_SLICES {
        return Err(format!(
            "the layout needs {slices} compute slices; the GPU has {COMPUTE_SLICES}"
        ));
    }
    out.sort_by(|a, b| {
        let size = |p: &GiProfile| p.placements.first().map_or(0, |&(_, s)| s);
        size(b)
            .cmp(&size(a))
            .then(b.slices.cmp(&a.slices))
            .then(a.placements.len().cmp(&b.placements.len()))
            .then(a.name.cmp(&b.name))
    });
    Ok(out)
}

/// Depth-first placement of `todo` in the memory slices not in `used`; the starts, in order.
fn place(used: u32, todo: &[&GiProfile], out: &mut Vec<u32>) -> bool {
    let Some((p, rest)) = todo.split_first() else {
        return true;
    };
    for &(start, size) in &p.placements {
        let m = span(start, size);
        if used & m != 0 {
            continue;
        }
        out.push(start);
        if place(used | m, rest, out) {
            return true;
        }
        out.pop();
    }
    false
}

/// Index subsets of `n` items, largest first, each in ascending order.
fn subsets_largest_first(n: usize) -> Vec<Vec<usize>> {
    let mut all: Vec<Vec<usize>> = (0u32..(1 << n))
        .map(|mask| (0..n).filter(|i| mask & (1 << i) != 0).collect())
        .collect();
    all.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
    all
}

/// Chooses the found GPU instances to keep and placements for the rest: (kept indices into
/// `gpu.instances`, new profiles with their starts).
#[allow(clippy::type_complexity)]
fn arrange<'g>(
    gpu: &'g MigGpu,
    want: &[&'g GiProfile],
) -> Option<(Vec<usize>, Vec<(&'g GiProfile, u32)>)> {
    let candidates: Vec<usize> = gpu
        .instances
        .iter()
        .enumerate()
        .filter(|(_, gi)| {
            gpu.profile(&gi.profile)
                .is_some_and(|p| want.iter().any(|w| w.name == p.name) && keepable(gi, p))
        })
        .map(|(i, _)| i)
        .collect();
    for subset in subsets_largest_first(candidates.len()) {
        let kept: Vec<usize> = subset.iter().map(|&i| candidates[i]).collect();
        // Each kept instance uses up one wanted instance of its profile.
        let mut rest: Vec<&GiProfile> = want.to_vec();
        let mut ok = true;
        for &k in &kept {
            match rest.iter().position(|p| p.name == gpu.instances[k].profile) {
                Some(at) => {
                    rest.remove(at);
                }
                None => ok = false,
            }
        }
        if !ok {
            continue;
        }
        let used = kept.iter().fold(0, |m, &k| {
            m | span(gpu.instances[k].start, gpu.instances[k].size)
        });
        let mut starts = Vec::new();
        if place(used, &rest, &mut starts) {
            return Some((kept, rest.into_iter().zip(starts).collect()));
        }
    }
    None
}

fn plan_gpu(gpu: &MigGpu, t: &GpuTarget) -> Result<GpuPlan, String> {
    let mut plan = GpuPlan {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        selected: true,
        kept: Vec::new(),
        steps: Vec::new(),
        blocking_pids: Vec::new(),
    };
    let Some(mode) = gpu.mig else {
        // mig-parted: a GPU without MIG is skipped under `devices: all` and an error only when
        // named by index with `mig-enabled: true`.
        if t.mig_enabled && t.explicit {
            return Err(format!("{} does not support MIG", gpu.name));
        }
        plan.selected = false;
        return Ok(plan);
    };
    if !t.mig_enabled {
        destroy_all(gpu, &gpu.instances, &mut plan);
        if mode.current || mode.pending {
            plan.steps.push(Step::SetMigMode { enable: false });
            plan.blocking_pids = gpu.processes.iter().map(|p| p.pid).collect();
        }
        return Ok(plan);
    }
    let want = wanted(gpu, t)?;
    let (kept, create) = arrange(gpu, &want).ok_or_else(|| {
        let names: Vec<&str> = want.iter().map(|p| p.name.as_str()).collect();
        format!(
            "{} do not fit the GPU's 8 memory slices in any placement",
            names.join(" + ")
        )
    })?;
    if !mode.current {
        plan.steps.push(Step::SetMigMode { enable: true });
        plan.blocking_pids = gpu.processes.iter().map(|p| p.pid).collect();
    }
    let doomed: Vec<GpuInstance> = gpu
        .instances
        .iter()
        .enumerate()
        .filter(|(i, _)| !kept.contains(i))
        .map(|(_, gi)| gi.clone())
        .collect();
    destroy_all(gpu, &doomed, &mut plan);
    for &k in &kept {
        let gi = &gpu.instances[k];
        plan.kept.push(gi.gpu_instance_id);
        if gi.compute_instances.is_empty() {
            let g = gpu.profile(&gi.profile).map_or(0, |p| p.slices);
            if let Some(ci) = full_ci_profile(g) {
                plan.steps.push(Step::CreateComputeInstance {
                    gpu_instance_id: gi.gpu_instance_id,
                    profile_id: ci,
                    start: 0,
                    size: g,
                });
            }
        }
    }
    for (p, start) in create {
        let ci = full_ci_profile(p.slices)
            .ok_or_else(|| format!("no full-size compute instance profile for {}", p.name))?;
        let size = p
            .placements
            .iter()
            .find(|(s, _)| *s == start)
            .map_or(0, |&(_, size)| size);
        plan.steps.push(Step::CreateInstance {
            profile: p.name.clone(),
            profile_id: p.id,
            start,
            size,
            ci_profile_id: ci,
            ci_size: p.slices,
        });
    }
    plan.kept.sort_unstable();
    plan.blocking_pids.sort_unstable();
    plan.blocking_pids.dedup();
    Ok(plan)
}

/// Destroy steps (compute instances first) for `doomed`, and the processes that block them.
fn destroy_all(gpu: &MigGpu, doomed: &[GpuInstance], plan: &mut GpuPlan) {
    for gi in doomed {
        for ci in &gi.compute_instances {
            plan.steps.push(Step::DestroyComputeInstance {
                gpu_instance_id: gi.gpu_instance_id,
                compute_instance_id: ci.compute_instance_id,
                profile_id: ci.profile_id,
                start: ci.start,
                size: ci.size,
            });
        }
        plan.steps.push(Step::DestroyGpuInstance {
            gpu_instance_id: gi.gpu_instance_id,
            profile: gi.profile.clone(),
            profile_id: gi.profile_id,
            start: gi.start,
            size: gi.size,
        });
        plan.blocking_pids.extend(
            gpu.processes
                .iter()
                .filter(|p| p.gpu_instance_id == Some(gi.gpu_instance_id))
                .map(|p| p.pid),
        );
    }
}

/// Counts of profile names in a found layout (for messages and tests).
pub fn found_counts(gpu: &MigGpu) -> BTreeMap<String, u32> {
    let mut m = BTreeMap::new();
    for gi in &gpu.instances {
        *m.entry(gi.profile.clone()).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
