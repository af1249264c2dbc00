//! The MIG instance lifecycle of one GPU as plain data: MIG mode (current and pending), GPU
//! instances on the 8 memory slices and 7 compute slices, compute instances inside them, and
//! the driver's rules for creating and destroying them (`nvml-sim/README.md`, "MIG instances"):
//!
//! - a GPU instance takes `placement_size` memory slices at one of its profile's starts and
//!   `slices` compute slices; placements may not overlap, compute slices add up to at most 7,
//!   and a profile has at most `instances` GPU instances (so one `+me`);
//! - without a placement the driver chooses: CHOSEN, the highest free start of the profile.
//!   That reproduces the MIG User Guide's ordering effect on A100 (`-cgi 19,19,14,9` fails with
//!   Insufficient Resources, `-cgi 9,19,14,19` succeeds), which first-fit would not;
//! - GPU instance ids are the lowest free id from 1, compute instance ids the lowest from 0
//!   (the driver assigns them; nothing may key on them);
//! - destroying a GPU instance with live compute instances, or an instance a process runs in,
//!   is IN_USE; destroyed handles answer INVALID_ARGUMENT (they are looked up by serial).
//!
//! No locking and no C types here: `store` owns the global state and `exports/mig_*` the ABI.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ffi::{self, NvResult, Ret};
use crate::models::{GiProfile, Model};

/// Memory slices of every MIG-capable model (A100, H100, H200).
pub const MEMORY_SLICES: u32 = 8;
/// Compute slices of every MIG-capable model.
pub const COMPUTE_SLICES: u32 = 7;

/// One compute instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeInstance {
    pub id: u32,
    /// The CI profile id, equal to its `NVML_COMPUTE_INSTANCE_PROFILE_*` index.
    pub profile_id: u32,
    /// Compute-slice placement inside the GPU instance.
    pub start: u32,
    pub size: u32,
    /// `MIG-…`, the MIG device's UUID.
    pub uuid: String,
    /// What its handles encode; assigned anew each time the library loads the state.
    #[serde(skip)]
    pub serial: u64,
}

/// One GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInstance {
    pub id: u32,
    /// The hardware GI profile id (19, 14, 9, …).
    pub profile_id: u32,
    /// Memory-slice placement.
    pub start: u32,
    pub size: u32,
    pub compute_instances: Vec<ComputeInstance>,
    #[serde(skip)]
    pub serial: u64,
}

/// The MIG operations that can be made to fail (`mig_faults` in a scenario).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    SetMigMode,
    CreateGpuInstance,
    DestroyGpuInstance,
    CreateComputeInstance,
    DestroyComputeInstance,
}

impl Op {
    pub const ALL: [Op; 5] = [
        Op::SetMigMode,
        Op::CreateGpuInstance,
        Op::DestroyGpuInstance,
        Op::CreateComputeInstance,
        Op::DestroyComputeInstance,
    ];

    /// The scenario spelling.
    pub fn key(self) -> &'static str {
        match self {
            Op::SetMigMode => "set_mig_mode",
            Op::CreateGpuInstance => "create_gpu_instance",
            Op::DestroyGpuInstance => "destroy_gpu_instance",
            Op::CreateComputeInstance => "create_compute_instance",
            Op::DestroyComputeInstance => "destroy_compute_instance",
        }
    }

    pub fn by_key(key: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.key() == key)
    }
}

/// MIG state of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigGpu {
    pub uuid: String,
    pub current: bool,
    pub pending: bool,
    /// The scenario's `reset_count` last acted on: a larger one is a GPU reset.
    pub reset_count: u64,
    pub gpu_instances: Vec<GpuInstance>,
    /// Calls per operation on this GPU since the library loaded, for `mig_faults`.
    #[serde(skip)]
    pub calls: BTreeMap<String, u32>,
}

/// A compute-instance profile available inside a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CiProfile {
    /// Index and id (`NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE` = 0 …).
    pub id: u32,
    pub slices: u32,
    pub instances: u32,
}

/// CI profile index → compute slices (indices 0-4; 5, 6 and the REV1/NVL ones are not offered
/// on A100/H100/H200 here).
const CI_SLICES: [(u32, u32); 5] = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 7)];

/// The CI profiles a GPU instance of `g` compute slices offers: c ≤ g and (c = g or 2c ≤ g+1)
/// (`nvml-sim/README.md`, "Compute instances"), `instances` = ⌊g/c⌋.
pub fn ci_profiles(g: u32) -> Vec<CiProfile> {
    CI_SLICES
        .iter()
        .filter(|&&(_, c)| c <= g && (c == g || 2 * c <= g + 1))
        .map(|&(id, c)| CiProfile {
            id,
            slices: c,
            instances: g / c,
        })
        .collect()
}

/// The CI profile `id` inside a GPU instance of `g` slices.
pub fn ci_profile(g: u32, id: u32) -> Option<CiProfile> {
    ci_profiles(g).into_iter().find(|p| p.id == id)
}

/// Compute-slice starts of a CI profile of `c` slices in a GI of `g`: 0, c, 2c, ….
pub fn ci_starts(g: u32, c: u32) -> Vec<u32> {
    (0..g / c).map(|k| k * c).collect()
}

fn span_mask(start: u32, size: u32) -> u32 {
    ((1u32 << size) - 1) << start
}

impl MigGpu {
    pub fn new(uuid: &str, enabled: bool) -> MigGpu {
        MigGpu {
            uuid: uuid.to_owned(),
            current: enabled,
            pending: enabled,
            reset_count: 0,
            gpu_instances: Vec::new(),
            calls: BTreeMap::new(),
        }
    }

    /// Counts one call of `op` and says whether the scenario's `mig_faults` make it fail.
    pub fn fault(&mut self, op: Op, faults: &BTreeMap<String, Vec<u32>>) -> NvResult {
        let n = self.calls.entry(op.key().to_owned()).or_insert(0);
        *n += 1;
        match faults.get(op.key()) {
            Some(when) if when.contains(n) => Err(ffi::UNKNOWN),
            _ => Ok(()),
        }
    }

    fn memory_used(&self) -> u32 {
        self.gpu_instances
            .iter()
            .fold(0, |m, gi| m | span_mask(gi.start, gi.size))
    }

    fn compute_used(&self, model: &Model) -> u32 {
        self.gpu_instances
            .iter()
            .filter_map(|gi| model.mig_profile_by_id(gi.profile_id))
            .map(|p| p.slices)
            .sum()
    }

    /// Whether a GPU instance of `p` fits at `start` now.
    pub fn fits(&self, model: &Model, p: &GiProfile, start: u32) -> bool {
        p.placement_starts.contains(&start)
            && self.memory_used() & span_mask(start, p.placement_size) == 0
            && self.compute_used(model) + p.slices <= COMPUTE_SLICES
            && (self
                .gpu_instances
                .iter()
                .filter(|gi| gi.profile_id == p.id)
                .count() as u32)
                < p.instances
    }

    /// Where the driver puts a GPU instance of `p` created without a placement (CHOSEN: the
    /// highest free start; see the module comment).
    pub fn auto_start(&self, model: &Model, p: &GiProfile) -> Option<u32> {
        p.placement_starts
            .iter()
            .rev()
            .copied()
            .find(|&s| self.fits(model, p, s))
    }

    /// How many more GPU instances of `p` could be created, each where the driver would put it.
    pub fn remaining(&self, model: &Model, p: &GiProfile) -> u32 {
        if !self.current {
            return p.instances;
        }
        let mut probe = self.clone();
        let mut n = 0;
        while let Some(start) = probe.auto_start(model, p) {
            probe.gpu_instances.push(GpuInstance {
                id: 0,
                profile_id: p.id,
                start,
                size: p.placement_size,
                compute_instances: Vec::new(),
                serial: 0,
            });
            n += 1;
        }
        n
    }

    /// Creates a GPU instance of `p` at `start` (or where the driver chooses); returns its id. NOT_SUPPORTED with MIG disabled, INSUFFICIENT_RESOURCES when
    /// it does not fit, INVALID_ARGUMENT for a start the profile does not have.
    pub fn create_gi(
        &mut self,
        model: &Model,
        p: &GiProfile,
        start: Option<(u32, u32)>,
        serial: u64,
    ) -> NvResult<u32> {
        if !self.current {
            return Err(ffi::NOT_SUPPORTED);
        }
        let start = match start {
            Some((s, size)) => {
                if size != p.placement_size || !p.placement_starts.contains(&s) {
                    return Err(ffi::INVALID_ARGUMENT);
                }
                if !self.fits(model, p, s) {
                    return Err(INSUFFICIENT_RESOURCES);
                }
                s
            }
            None => self.auto_start(model, p).ok_or(INSUFFICIENT_RESOURCES)?,
        };
        let id = (1..)
            .find(|id| self.gpu_instances.iter().all(|gi| gi.id != *id))
            .unwrap_or(1);
        self.gpu_instances.push(GpuInstance {
            id,
            profile_id: p.id,
            start,
            size: p.placement_size,
            compute_instances: Vec::new(),
            serial,
        });
        self.gpu_instances.sort_by_key(|gi| gi.id);
        Ok(id)
    }

    /// Destroys GPU instance `id`: IN_USE with compute instances or `busy` (processes in it).
    pub fn destroy_gi(&mut self, id: u32, busy: bool) -> NvResult {
        let at = self
            .gpu_instances
            .iter()
            .position(|gi| gi.id == id)
            .ok_or(ffi::INVALID_ARGUMENT)?;
        if busy || !self.gpu_instances[at].compute_instances.is_empty() {
            return Err(IN_USE);
        }
        self.gpu_instances.remove(at);
        Ok(())
    }

    /// Creates a compute instance of CI profile `profile_id` in GI `gi_id`.
    pub fn create_ci(
        &mut self,
        model: &Model,
        gi_id: u32,
        profile_id: u32,
        start: Option<(u32, u32)>,
        serial: u64,
    ) -> NvResult<ComputeInstance> {
        let gpu_uuid = self.uuid.clone();
        let gi = self
            .gpu_instances
            .iter_mut()
            .find(|gi| gi.id == gi_id)
            .ok_or(ffi::INVALID_ARGUMENT)?;
        let g = model
            .mig_profile_by_id(gi.profile_id)
            .ok_or(ffi::UNKNOWN)?
            .slices;
        let cp = ci_profile(g, profile_id).ok_or(ffi::NOT_SUPPORTED)?;
        let used = gi
            .compute_instances
            .iter()
            .fold(0, |m, ci| m | span_mask(ci.start, ci.size));
        let count = gi
            .compute_instances
            .iter()
            .filter(|ci| ci.profile_id == profile_id)
            .count() as u32;
        let free = |s: u32| used & span_mask(s, cp.slices) == 0;
        let start = match start {
            Some((s, size)) => {
                if size != cp.slices || !ci_starts(g, cp.slices).contains(&s) {
                    return Err(ffi::INVALID_ARGUMENT);
                }
                if !free(s) || count >= cp.instances {
                    return Err(INSUFFICIENT_RESOURCES);
                }
                s
            }
            None if count >= cp.instances => return Err(INSUFFICIENT_RESOURCES),
            None => ci_starts(g, cp.slices)
                .into_iter()
                .find(|&s| free(s))
                .ok_or(INSUFFICIENT_RESOURCES)?,
        };
        let id = (0..)
            .find(|id| gi.compute_instances.iter().all(|ci| ci.id != *id))
            .unwrap_or(0);
        let ci = ComputeInstance {
            id,
            profile_id,
            start,
            size: cp.slices,
            uuid: mig_uuid(&gpu_uuid, gi_id, id, serial),
            serial,
        };
        gi.compute_instances.push(ci.clone());
        gi.compute_instances.sort_by_key(|c| c.id);
        Ok(ci)
    }

    /// Destroys compute instance `ci_id` of GI `gi_id`: IN_USE when `busy`.
    pub fn destroy_ci(&mut self, gi_id: u32, ci_id: u32, busy: bool) -> NvResult {
        let gi = self
            .gpu_instances
            .iter_mut()
            .find(|gi| gi.id == gi_id)
            .ok_or(ffi::INVALID_ARGUMENT)?;
        let at = gi
            .compute_instances
            .iter()
            .position(|ci| ci.id == ci_id)
            .ok_or(ffi::INVALID_ARGUMENT)?;
        if busy {
            return Err(IN_USE);
        }
        gi.compute_instances.remove(at);
        Ok(())
    }

    /// `nvmlDeviceSetMigMode`: the function's own result and the activation status. With
    /// processes on the GPU or `needs_reset` the change stays pending (IN_USE /
    /// RESET_REQUIRED); otherwise it applies at once, as the driver does on an idle bare-metal
    /// GPU (it resets the GPU itself). CHOSEN: disabling with GPU instances left is IN_USE.
    pub fn set_mode(&mut self, enable: bool, busy: bool, needs_reset: bool) -> NvResult<Ret> {
        if !enable && !self.gpu_instances.is_empty() {
            return Err(IN_USE);
        }
        self.pending = enable;
        if enable == self.current {
            return Ok(ffi::SUCCESS);
        }
        if busy {
            return Ok(IN_USE);
        }
        if needs_reset {
            return Ok(RESET_REQUIRED);
        }
        self.current = enable;
        Ok(ffi::SUCCESS)
    }

    /// A GPU reset: the pending mode becomes current and every instance is gone (instances do
    /// not survive a reset, MIG User Guide).
    pub fn reset(&mut self) {
        self.current = self.pending;
        self.gpu_instances.clear();
    }

    /// Lays out `profiles` (names of `model`'s GI profiles) with one full compute instance each,
    /// searching placements so any feasible list fits; `None` if it cannot. For a scenario's
    /// initial `mig_devices`.
    pub fn layout(model: &Model, uuid: &str, profiles: &[&GiProfile]) -> Option<MigGpu> {
        let mut gpu = MigGpu::new(uuid, true);
        if !place(&mut gpu, model, profiles) {
            return None;
        }
        let ids: Vec<(u32, u32)> = gpu
            .gpu_instances
            .iter()
            .filter_map(|gi| Some((gi.id, model.mig_profile_by_id(gi.profile_id)?.slices)))
            .collect();
        for (gi_id, g) in ids {
            let full = ci_profiles(g).into_iter().find(|c| c.slices == g)?;
            gpu.create_ci(model, gi_id, full.id, None, 0).ok()?;
        }
        Some(gpu)
    }
}

/// Depth-first search over placements for `todo` (the first entry first).
fn place(gpu: &mut MigGpu, model: &Model, todo: &[&GiProfile]) -> bool {
    let Some((p, rest)) = todo.split_first() else {
        return true;
    };
    for &s in p.placement_starts {
        if let Ok(id) = gpu.create_gi(model, p, Some((s, p.placement_size)), 0) {
            if place(gpu, model, rest) {
                return true;
            }
            let _ = gpu.destroy_gi(id, false);
        }
    }
    false
}

pub const IN_USE: Ret = 19;
pub const RESET_REQUIRED: Ret = 16;
pub const INSUFFICIENT_RESOURCES: Ret = 23;

/// A `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` UUID, new for every creation (`nonce`), like
/// the driver's.
pub fn mig_uuid(gpu_uuid: &str, gi: u32, ci: u32, nonce: u64) -> String {
    let seed = format!("{gpu_uuid}/{gi}/{ci}/{nonce}");
    let a = crate::ids::stable_hash(seed.as_bytes());
    let b = crate::ids::stable_hash(format!("{seed}#").as_bytes());
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "MIG-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
#[path = "instances_tests.rs"]
mod tests;
