//! The global MIG state of every simulated GPU ([`instances::MigGpu`] per index), its opaque
//! handles, and its persistence in `NVML_SIM_STATE`.
//!
//! - **Lifetime.** Built at the first `nvmlInit` of a scenario file: a GPU whose UUID is in the
//!   `NVML_SIM_STATE` file takes its state from there (MIG mode, pending mode, instances), like
//!   a driver that kept its configuration while the process was away; any other from the
//!   scenario's `mig_mode` and `mig_devices`. A later `nvmlInit` in the same process with the
//!   same scenario file keeps the in-memory state (the library, like a driver, stays loaded).
//! - **Pending mode.** CHOSEN after the real driver: a pending MIG mode stays pending across
//!   processes and becomes current only on a GPU reset. A reset is simulated by raising the
//!   GPU's `reset_count` in the scenario (rewrite the file, or start with a larger one): the
//!   first call that sees the larger count resets the GPU (pending → current, every instance
//!   gone, as instances do not survive a reset).
//! - **Handles.** GPU-instance, compute-instance and MIG-device handles are tagged integers
//!   (never dereferenced) encoding a serial that is unique for the library's lifetime; a
//!   destroyed instance's serial is found nowhere, so its stale handle answers INVALID_ARGUMENT.
//! - **Persistence.** Every change is serialised under the lock and written (temporary file,
//!   then rename) after it is released; a sequence number keeps an older snapshot from
//!   overwriting a newer one. A state file another process wrote is read at this library's
//!   next MIG call, so processes sharing `NVML_SIM_STATE` see one driver's state (handles of
//!   instances that are still there stay valid).
//!
//! Lock order: the `state` lock may be held when this one is taken (scenario install), never
//! the reverse.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_st, nvmlComputeInstance_t, nvmlDevice_st, nvmlDevice_t, nvmlGpuInstance_st,
    nvmlGpuInstance_t,
};
use serde::{Deserialize, Serialize};

use crate::ffi::{self, NvResult};
use crate::instances::MigGpu;
use crate::resolve::{Gpu, Process, Scenario};

#[derive(Default)]
struct World {
    scenario: Option<PathBuf>,
    gpus: Vec<MigGpu>,
    next_serial: u64,
    seq: u64,
    /// The state file as last read or written here: another process's write (a different
    /// identity) is read before the next call, as every process sees one driver's state.
    seen: Option<FileId>,
}

static WORLD: Mutex<World> = Mutex::new(World {
    scenario: None,
    gpus: Vec::new(),
    next_serial: 1,
    seq: 0,
    seen: None,
});

/// Serialises writes of the state file; holds the sequence number last written.
static WRITER: Mutex<u64> = Mutex::new(0);

/// Identity of the state file (a rename gives a new inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    ino: u64,
    len: u64,
    mtime: Option<std::time::SystemTime>,
}

fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(FileId {
        ino: m.ino(),
        len: m.len(),
        mtime: m.modified().ok(),
    })
}

fn lock() -> MutexGuard<'static, World> {
    WORLD.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    version: u32,
    gpus: Vec<MigGpu>,
}

fn state_path() -> Option<PathBuf> {
    std::env::var_os("NVML_SIM_STATE").map(PathBuf::from)
}

/// The GPUs of the state file; a missing file is empty, an unreadable one is reported once.
fn read_state(path: &Path) -> Vec<MigGpu> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            eprintln!(
                "nvml-sim: {}: cannot read the MIG state: {e}",
                path.display()
            );
            return Vec::new();
        }
    };
    match serde_json::from_str::<StateFile>(&text) {
        Ok(f) if f.version == 1 => f.gpus,
        Ok(f) => {
            eprintln!(
                "nvml-sim: {}: MIG state version {} is not 1; ignored",
                path.display(),
                f.version
            );
            Vec::new()
        }
        Err(e) => {
            eprintln!(
                "nvml-sim: {}: malformed MIG state ({e}); ignored",
                path.display()
            );
            Vec::new()
        }
    }
}

/// The MIG state a scenario GPU starts with when nothing is remembered.
fn from_scenario(g: &Gpu) -> MigGpu {
    let profiles: Vec<_> = g
        .mig_devices
        .iter()
        .filter_map(|n| g.model.mig_profile_named(n))
        .collect();
    let mut m = MigGpu::layout(g.model, &g.uuid, &profiles)
        // Validation rejected infeasible layouts; fall back to an empty one regardless.
        .unwrap_or_else(|| MigGpu::new(&g.uuid, true));
    m.current = g.mig_mode;
    m.pending = g.mig_mode;
    if !g.mig_mode {
        m.gpu_instances.clear();
    }
    m.reset_count = g.reset_count;
    m
}

impl World {
    fn serial(&mut self) -> u64 {
        let s = self.next_serial;
        self.next_serial += 1;
        s
    }

    /// Gives every instance that has none (new from a file or a layout) a fresh serial.
    fn assign_serials(&mut self) {
        let mut next = self.next_serial;
        for gpu in &mut self.gpus {
            for gi in &mut gpu.gpu_instances {
                if gi.serial == 0 {
                    gi.serial = next;
                    next += 1;
                }
                for ci in &mut gi.compute_instances {
                    if ci.serial == 0 {
                        ci.serial = next;
                        next += 1;
                    }
                }
            }
        }
        self.next_serial = next;
    }

    /// Serialises the state for the file, when there is one.
    fn snapshot(&mut self) -> Option<(u64, String)> {
        state_path()?;
        self.seq += 1;
        let file = StateFile {
            version: 1,
            gpus: self.gpus.clone(),
        };
        serde_json::to_string_pretty(&file)
            .ok()
            .map(|j| (self.seq, j))
    }
}

/// Writes a snapshot taken by [`World::snapshot`], unless a newer one was written already.
fn write(snapshot: Option<(u64, String)>) {
    let (Some((seq, json)), Some(path)) = (snapshot, state_path()) else {
        return;
    };
    let mut last = WRITER.lock().unwrap_or_else(PoisonError::into_inner);
    if seq <= *last {
        return;
    }
    let mut tmp = path.clone().into_os_string();
    tmp.push(format!(".tmp.{}", std::process::id()));
    match std::fs::write(&tmp, json).and_then(|()| std::fs::rename(&tmp, &path)) {
        Ok(()) => {
            *last = seq;
            // Our own write is not news. (Lock order: WRITER then WORLD, only here.)
            lock().seen = file_id(&path);
        }
        Err(e) => eprintln!(
            "nvml-sim: cannot write the MIG state to '{}': {e}",
            path.display()
        ),
    }
}

impl World {
    /// Takes in a state file another process wrote since we last looked, keeping the serials
    /// (so the handles) of instances that are still there.
    fn refresh(&mut self) {
        let Some(path) = state_path() else { return };
        let id = file_id(&path);
        if id.is_none() || id == self.seen {
            return;
        }
        self.seen = id;
        for theirs in read_state(&path) {
            let Some(ours) = self.gpus.iter_mut().find(|g| g.uuid == theirs.uuid) else {
                continue;
            };
            let mut next = theirs.clone();
            next.calls = std::mem::take(&mut ours.calls);
            for gi in &mut next.gpu_instances {
                let old = ours
                    .gpu_instances
                    .iter()
                    .find(|o| (o.id, o.profile_id, o.start) == (gi.id, gi.profile_id, gi.start));
                if let Some(old) = old {
                    gi.serial = old.serial;
                    for ci in &mut gi.compute_instances {
                        if let Some(oc) = old.compute_instances.iter().find(|c| c.uuid == ci.uuid) {
                            ci.serial = oc.serial;
                        }
                    }
                }
            }
            *ours = next;
        }
        self.assign_serials();
    }
}

/// Called whenever a scenario is installed (`init`: at the 0 → 1 `nvmlInit`, with the
/// scenario's path). Builds or keeps the MIG state and applies simulated resets.
pub fn on_install(scenario: &Scenario, path: Option<&Path>, init: bool) {
    let mut w = lock();
    if init && w.scenario.as_deref() != path {
        let remembered = state_path().map(|p| read_state(&p)).unwrap_or_default();
        w.seen = state_path().and_then(|p| file_id(&p));
        w.gpus = scenario
            .gpus
            .iter()
            .map(|g| {
                remembered
                    .iter()
                    .find(|m| m.uuid == g.uuid && g.model.mig_capable())
                    .cloned()
                    .unwrap_or_else(|| from_scenario(g))
            })
            .collect();
        w.scenario = path.map(Path::to_path_buf);
    }
    // GPUs a rewrite added, or whose board changed, start from the scenario.
    for g in &scenario.gpus {
        let i = g.index as usize;
        match w.gpus.get(i) {
            Some(m) if m.uuid == g.uuid => {}
            Some(_) => w.gpus[i] = from_scenario(g),
            None => w.gpus.push(from_scenario(g)),
        }
    }
    let mut changed = false;
    for g in &scenario.gpus {
        let m = &mut w.gpus[g.index as usize];
        if g.reset_count > m.reset_count {
            m.reset();
            m.reset_count = g.reset_count;
            changed = true;
        }
    }
    w.assign_serials();
    let snap = if changed || init { w.snapshot() } else { None };
    drop(w);
    write(snap);
}

/// Runs `f` on GPU `index`'s MIG state, read-only.
pub fn read<T>(index: u32, f: impl FnOnce(&MigGpu) -> NvResult<T>) -> NvResult<T> {
    let mut w = lock();
    w.refresh();
    let m = w.gpus.get(index as usize).ok_or(ffi::UNKNOWN)?;
    f(m)
}

/// Runs `f` on GPU `index`'s MIG state with a fresh serial for anything it creates; the state
/// file is rewritten when `f` succeeds.
pub fn change<T>(index: u32, f: impl FnOnce(&mut MigGpu, u64) -> NvResult<T>) -> NvResult<T> {
    let mut w = lock();
    w.refresh();
    let serial = w.serial();
    let m = w.gpus.get_mut(index as usize).ok_or(ffi::UNKNOWN)?;
    let before = m.clone();
    let out = f(m, serial);
    let snap = if out.is_ok() && *m != before {
        w.snapshot()
    } else {
        None
    };
    drop(w);
    write(snap);
    out
}

/// Counts a call of `op` on GPU `index` and fails it if the scenario says so.
pub fn fault(
    index: u32,
    op: crate::instances::Op,
    faults: &BTreeMap<String, Vec<u32>>,
) -> NvResult {
    let mut w = lock();
    let m = w.gpus.get_mut(index as usize).ok_or(ffi::UNKNOWN)?;
    m.fault(op, faults)
}

/// Whether GPU `index` has MIG enabled now (false for models without MIG).
pub fn enabled(g: &Gpu) -> bool {
    g.model.mig_capable() && read(g.index, |m| Ok(m.current)).unwrap_or(g.mig_mode)
}

// Handles: tagged integers, one tag per kind, 16 apart per serial.
const TAG_GI: usize = 0x0000_4d49_4700_0000;
const TAG_CI: usize = 0x0000_4d49_4300_0000;
const TAG_MIG: usize = 0x0000_4d49_4400_0000;
const SPAN: usize = 0x0000_0000_00ff_fff0;

fn encode(tag: usize, serial: u64) -> usize {
    tag + (serial as usize & (SPAN >> 4)) * 16
}

fn decode(tag: usize, h: usize) -> Option<u64> {
    let off = h.checked_sub(tag)?;
    (off % 16 == 0 && off <= SPAN && off > 0).then_some((off / 16) as u64)
}

pub fn gi_handle(serial: u64) -> nvmlGpuInstance_t {
    encode(TAG_GI, serial) as *mut nvmlGpuInstance_st
}

pub fn ci_handle(serial: u64) -> nvmlComputeInstance_t {
    encode(TAG_CI, serial) as *mut nvmlComputeInstance_st
}

pub fn mig_handle(serial: u64) -> nvmlDevice_t {
    encode(TAG_MIG, serial) as *mut nvmlDevice_st
}

/// Where a live instance is: GPU index, GI id, CI id (for compute instances).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub gpu: u32,
    pub gi: u32,
    pub ci: Option<u32>,
}

fn find_serial(serial: u64, want_ci: bool) -> NvResult<Found> {
    let mut w = lock();
    w.refresh();
    for (i, m) in w.gpus.iter().enumerate() {
        for gi in &m.gpu_instances {
            if !want_ci && gi.serial == serial {
                return Ok(Found {
                    gpu: i as u32,
                    gi: gi.id,
                    ci: None,
                });
            }
            if let Some(ci) = gi.compute_instances.iter().find(|c| c.serial == serial) {
                if want_ci {
                    return Ok(Found {
                        gpu: i as u32,
                        gi: gi.id,
                        ci: Some(ci.id),
                    });
                }
            }
        }
    }
    Err(ffi::INVALID_ARGUMENT)
}

/// The live GPU instance behind a handle (INVALID_ARGUMENT for stale or foreign ones).
pub fn gi_of(h: nvmlGpuInstance_t) -> NvResult<Found> {
    find_serial(
        decode(TAG_GI, h as usize).ok_or(ffi::INVALID_ARGUMENT)?,
        false,
    )
}

/// The live compute instance behind a handle.
pub fn ci_of(h: nvmlComputeInstance_t) -> NvResult<Found> {
    find_serial(
        decode(TAG_CI, h as usize).ok_or(ffi::INVALID_ARGUMENT)?,
        true,
    )
}

/// The live MIG device behind a device handle, if it is a MIG device handle at all (`None`:
/// not one; `Some(Err)`: a MIG handle whose instance is gone).
pub fn mig_of(h: nvmlDevice_t) -> Option<NvResult<Found>> {
    decode(TAG_MIG, h as usize).map(|s| find_serial(s, true))
}

/// The GPU and compute instance a scenario process runs in: its `mig_device` names a GI
/// profile; CHOSEN: the live GI of that profile with the lowest id, and its first CI.
pub fn process_instance(g: &Gpu, m: &MigGpu, p: &Process) -> Option<(u32, u32)> {
    if !m.current {
        return None;
    }
    let name = g.mig_devices.get(p.mig_device?)?;
    m.gpu_instances
        .iter()
        .filter(|gi| {
            g.model
                .mig_profile_by_id(gi.profile_id)
                .is_some_and(|pr| pr.name == name)
        })
        .find_map(|gi| gi.compute_instances.first().map(|ci| (gi.id, ci.id)))
}

/// Whether a scenario process runs in GI `gi` (and CI `ci`, when given).
pub fn busy(g: &Gpu, m: &MigGpu, gi: u32, ci: Option<u32>) -> bool {
    g.processes.iter().any(|p| {
        process_instance(g, m, p).is_some_and(|(pg, pc)| pg == gi && ci.is_none_or(|c| c == pc))
    })
}
