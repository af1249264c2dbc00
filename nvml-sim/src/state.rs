//! The global simulator state behind one mutex: the ref-counted init, the current scenario
//! (re-read when the file changes, checked at most every 50 ms from inside calls), the energy
//! counters, and the event sets. Device handles are addresses inside a static array, so they
//! are stable, non-null, survive reloads and can be validated without dereferencing. No code
//! here sleeps or blocks while holding the lock.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlEventSet_st, nvmlEventSet_t};

pub use crate::handles::{handle_of, index_of, MAX_GPUS};

use crate::events::{Delivered, EventSet};
use crate::ffi::{self, NvResult, Ret};
use crate::resolve::{Gpu, Scenario};

/// How often calls look at the scenario file's identity.
const RELOAD_CHECK: Duration = Duration::from_millis(50);

/// Identity of the scenario file, to notice a rewrite (rename gives a new inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: Option<SystemTime>,
}

fn file_id(path: &PathBuf) -> Option<FileId> {
    let m = std::fs::metadata(path).ok()?;
    Some(FileId {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime: m.modified().ok(),
    })
}

/// A counter integrated from a rate over wall time: energy in mJ from power in mW, NVLink
/// KiB from KiB/s.
#[derive(Debug, Clone, Copy)]
struct Energy {
    mj_at_since: f64,
    since: Instant,
    power_mw: f64,
}

impl Energy {
    fn at(&self, now: Instant) -> f64 {
        // mW × s = mJ
        self.mj_at_since + self.power_mw * now.duration_since(self.since).as_secs_f64()
    }

    /// The same counter from `now` on at `rate`.
    fn rerate(&self, now: Instant, rate: f64) -> Energy {
        Energy {
            mj_at_since: self.at(now),
            since: now,
            power_mw: rate,
        }
    }
}

/// CHOSEN: the counter starts at 1 kWh (3.6e9 mJ) plus 7.919 kJ per index, so it looks like
/// "energy since the driver loaded" and differs per GPU.
pub fn energy_base_mj(index: usize) -> f64 {
    3.6e9 + 7.919e6 * index as f64
}

struct EventSetEntry {
    /// Owns the allocation whose address is the `nvmlEventSet_t` handed out.
    _token: Box<u64>,
    set: EventSet,
}

/// Everything behind the lock.
pub struct Sim {
    refcount: u32,
    scenario: Option<Arc<Scenario>>,
    path: Option<PathBuf>,
    file: Option<FileId>,
    bad_file: Option<FileId>,
    last_check: Option<Instant>,
    /// Largest GPU count seen since init: handles below it that a rewrite removed are "lost".
    ever_count: usize,
    energy: Vec<Energy>,
    /// NVLink data KiB transmitted and received per GPU (`NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`,
    /// `_RX`), integrated from the scenario's rates like energy.
    nvlink_kib: Vec<[Energy; 2]>,
    /// Correctable ECC errors and PCIe replays per GPU added since the library loaded,
    /// integrated from the scenario's `ecc.correctable_per_s` and `pcie.replays_per_s`.
    grown: Vec<[Energy; 2]>,
    event_sets: BTreeMap<usize, EventSetEntry>,
    /// Event ids any set of this library instance received: kept across `nvmlShutdown` and
    /// `nvmlInit` while the library stays loaded, like a driver that stays loaded.
    delivered: Delivered,
    next_set_id: u64,
    /// Settings written through NVML (power limit, compute mode) by GPU index: like a driver's,
    /// they outlive `nvmlShutdown` while the library stays loaded, over whatever the scenario says.
    written: BTreeMap<usize, Written>,
}

/// Settings an NVML caller wrote.
#[derive(Clone, Copy, Default)]
pub struct Written {
    pub power_limit_mw: Option<u32>,
    pub compute_mode: Option<u32>,
}

static SIM: Mutex<Sim> = Mutex::new(Sim {
    refcount: 0,
    scenario: None,
    path: None,
    file: None,
    bad_file: None,
    last_check: None,
    ever_count: 0,
    energy: Vec::new(),
    nvlink_kib: Vec::new(),
    grown: Vec::new(),
    event_sets: BTreeMap::new(),
    delivered: Delivered::new(),
    next_set_id: 1,
    written: BTreeMap::new(),
});

/// What was written to GPU `index` so far.
pub fn written(index: usize) -> Written {
    lock().written.get(&index).copied().unwrap_or_default()
}

/// Records a write to GPU `index`.
pub fn write(index: usize, f: impl FnOnce(&mut Written)) {
    f(lock().written.entry(index).or_default());
}

fn lock() -> MutexGuard<'static, Sim> {
    SIM.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Notified whenever a scenario is installed, so that event waits sleep until something may
/// have changed instead of polling.
static INSTALLED: Condvar = Condvar::new();

/// Blocks the calling thread for at most `timeout`, or until a scenario is installed (by any
/// thread's call noticing a rewrite, or by an init). Like a real driver's wait, it costs no CPU
/// while nothing happens.
pub fn wait_for_install(timeout: Duration) {
    let sim = lock();
    let _ = INSTALLED
        .wait_timeout(sim, timeout)
        .unwrap_or_else(PoisonError::into_inner);
}

impl Sim {
    fn install(&mut self, scenario: Scenario, now: Instant, init: bool) {
        crate::store::on_install(&scenario, self.path.as_deref(), init);
        for (i, gpu) in scenario.gpus.iter().enumerate() {
            let power = f64::from(gpu.power_mw);
            match self.energy.get_mut(i) {
                // Integrate the old power up to the instant the new one applies.
                Some(e) => *e = e.rerate(now, power),
                None => self.energy.push(Energy {
                    mj_at_since: energy_base_mj(i),
                    since: now,
                    power_mw: power,
                }),
            }
            let (tx, rx) = gpu
                .nvlink
                .as_ref()
                .map_or((0.0, 0.0), |l| (l.tx_kib_s as f64, l.rx_kib_s as f64));
            match self.nvlink_kib.get_mut(i) {
                Some([t, r]) => {
                    *t = t.rerate(now, tx);
                    *r = r.rerate(now, rx);
                }
                None => {
                    let zero = |rate| Energy {
                        mj_at_since: 0.0,
                        since: now,
                        power_mw: rate,
                    };
                    self.nvlink_kib.push([zero(tx), zero(rx)]);
                }
            }
        }
        for (i, gpu) in scenario.gpus.iter().enumerate() {
            let rates = [gpu.ecc.correctable_per_s as f64, gpu.pcie_replays_per_s];
            match self.grown.get_mut(i) {
                Some(counters) => {
                    for (c, rate) in counters.iter_mut().zip(rates) {
                        *c = c.rerate(now, rate);
                    }
                }
                None => self.grown.push(rates.map(|rate| Energy {
                    mj_at_since: 0.0,
                    since: now,
                    power_mw: rate,
                })),
            }
        }
        self.ever_count = self.ever_count.max(scenario.gpus.len());
        self.scenario = Some(Arc::new(scenario));
        INSTALLED.notify_all();
    }

    /// Re-reads the scenario if its file changed; a malformed rewrite keeps the old scenario
    /// and prints one error line (once per bad file version).
    fn maybe_reload(&mut self, now: Instant) {
        if self
            .last_check
            .is_some_and(|t| now.duration_since(t) < RELOAD_CHECK)
        {
            return;
        }
        self.last_check = Some(now);
        let Some(path) = self.path.clone() else {
            return;
        };
        let id = file_id(&path);
        if id.is_none() || id == self.file || id == self.bad_file {
            return;
        }
        match load(&path) {
            Ok(sc) => {
                self.file = id;
                self.install(sc, now, false);
            }
            Err(line) => {
                self.bad_file = id;
                eprintln!("{line}");
            }
        }
    }

    fn scenario(&mut self) -> NvResult<Arc<Scenario>> {
        if self.refcount == 0 {
            return Err(ffi::UNINITIALIZED);
        }
        self.maybe_reload(Instant::now());
        self.scenario.clone().ok_or(ffi::UNINITIALIZED)
    }
}

/// Reads and parses the scenario at `path`; `Err` is the complete stderr line.
fn load(path: &PathBuf) -> Result<Scenario, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("nvml-sim: {shown}: cannot read the scenario: {e}"))?;
    crate::scenario::parse(&text).map_err(|e| e.render(&shown.to_string()))
}

/// `nvmlInit*`: the 0 → 1 transition (re)reads the scenario from `NVML_SIM_SCENARIO`.
pub fn init() -> Ret {
    let mut sim = lock();
    if sim.refcount > 0 {
        sim.refcount += 1;
        return ffi::SUCCESS;
    }
    let Some(path) = std::env::var_os("NVML_SIM_SCENARIO").map(PathBuf::from) else {
        eprintln!("nvml-sim: NVML_SIM_SCENARIO is not set; point it at a scenario file");
        return ffi::DRIVER_NOT_LOADED;
    };
    let id = file_id(&path);
    let scenario = match load(&path) {
        Ok(s) => s,
        Err(line) => {
            eprintln!("{line}");
            return ffi::UNKNOWN;
        }
    };
    if let Some(code) = scenario.init_error {
        return code;
    }
    if let Err(line) = crate::cost::load_from_env() {
        eprintln!("{line}");
        return ffi::UNKNOWN;
    }
    sim.path = Some(path);
    sim.file = id;
    sim.bad_file = None;
    sim.last_check = Some(Instant::now());
    sim.ever_count = 0;
    sim.install(scenario, Instant::now(), true);
    sim.refcount = 1;
    crate::stats::start();
    ffi::SUCCESS
}

/// `nvmlShutdown`: UNINITIALIZED when not initialised; the last one flushes the stats file.
pub fn shutdown() -> Ret {
    let mut sim = lock();
    if sim.refcount == 0 {
        return ffi::UNINITIALIZED;
    }
    sim.refcount -= 1;
    let last = sim.refcount == 0;
    drop(sim);
    if last {
        crate::stats::stop();
        crate::cost::unload();
    }
    ffi::SUCCESS
}

/// The current scenario, for calls that are not about one device.
pub fn scenario() -> NvResult<Arc<Scenario>> {
    lock().scenario()
}

/// A GPU of the current scenario, found through a handle and checked for the current call:
/// derefs to [`Gpu`].
pub struct GpuRef {
    scenario: Arc<Scenario>,
    index: usize,
}

impl std::ops::Deref for GpuRef {
    type Target = Gpu;
    fn deref(&self) -> &Gpu {
        &self.scenario.gpus[self.index]
    }
}

/// Validates `handle` for the running export: initialised, one of ours, a GPU of the scenario
/// (a GPU that a rewrite removed answers GPU_IS_LOST), not lost, and not overridden by the
/// scenario's `errors`/`unsupported` for this function; first waits the scenario's `delay_ms`
/// for this function, if any.
pub fn gpu(handle: nvmlDevice_t) -> NvResult<GpuRef> {
    let index = index_of(handle).ok_or(ffi::INVALID_ARGUMENT)?;
    let mut sim = lock();
    let scenario = sim.scenario()?;
    if index >= scenario.gpus.len() {
        return Err(if index < sim.ever_count {
            ffi::GPU_IS_LOST
        } else {
            ffi::INVALID_ARGUMENT
        });
    }
    drop(sim);
    let g = &scenario.gpus[index];
    if let Some(delay) = g.delays.get(ffi::current_function()) {
        // No lock is held here: other GPUs' calls go on meanwhile.
        std::thread::sleep(*delay);
    }
    if g.lost {
        return Err(ffi::GPU_IS_LOST);
    }
    if let Some(code) = g.override_for(ffi::current_function()) {
        return Err(code);
    }
    Ok(GpuRef { scenario, index })
}

/// Handle lookup: the first GPU matching `pred`; NOT_FOUND if none, GPU_IS_LOST if it is lost.
pub fn find(pred: impl Fn(&Gpu) -> bool) -> NvResult<nvmlDevice_t> {
    let scenario = scenario()?;
    let g = scenario
        .gpus
        .iter()
        .find(|g| pred(g))
        .ok_or(ffi::NOT_FOUND)?;
    if g.lost {
        return Err(ffi::GPU_IS_LOST);
    }
    if let Some(code) = g.override_for(ffi::current_function()) {
        return Err(code);
    }
    Ok(handle_of(g.index as usize))
}

/// Total energy of GPU `index` in mJ, now.
pub fn energy_mj(index: usize) -> NvResult<u64> {
    let sim = lock();
    let e = sim.energy.get(index).ok_or(ffi::UNKNOWN)?;
    Ok(e.at(Instant::now()) as u64)
}

/// NVLink data KiB GPU `index` transmitted (`rx = false`) or received since the library
/// loaded, over all its links.
pub fn nvlink_kib(index: usize, rx: bool) -> NvResult<u64> {
    let sim = lock();
    let c = sim.nvlink_kib.get(index).ok_or(ffi::UNKNOWN)?;
    Ok(c[usize::from(rx)].at(Instant::now()) as u64)
}

/// What a rate of the scenario added to a counter of GPU `index` since the library loaded.
#[derive(Debug, Clone, Copy)]
pub enum Grown {
    /// Correctable ECC errors (`ecc.correctable_per_s`).
    CorrectableEcc = 0,
    /// PCIe replays (`pcie.replays_per_s`).
    PcieReplays = 1,
}

/// The count `what` grew by on GPU `index`, now.
pub fn grown(index: usize, what: Grown) -> u64 {
    let sim = lock();
    sim.grown
        .get(index)
        .map_or(0, |c| c[what as usize].at(Instant::now()) as u64)
}

/// `nvmlEventSetCreate`.
pub fn event_set_create() -> NvResult<nvmlEventSet_t> {
    let mut sim = lock();
    sim.scenario()?;
    let id = sim.next_set_id;
    sim.next_set_id += 1;
    let token = Box::new(id);
    let ptr = std::ptr::from_ref::<u64>(&token)
        .cast_mut()
        .cast::<nvmlEventSet_st>();
    sim.event_sets.insert(
        ptr as usize,
        EventSetEntry {
            _token: token,
            set: EventSet::default(),
        },
    );
    Ok(ptr)
}

/// Runs `f` on a registered event set (INVALID_ARGUMENT for an unknown handle), with the
/// current scenario and the ids delivered to any set so far.
pub fn with_event_set<T>(
    set: nvmlEventSet_t,
    f: impl FnOnce(&mut EventSet, &Scenario, &mut Delivered) -> NvResult<T>,
) -> NvResult<T> {
    let mut sim = lock();
    let scenario = sim.scenario()?;
    let Sim {
        event_sets,
        delivered,
        ..
    } = &mut *sim;
    let entry = event_sets
        .get_mut(&(set as usize))
        .ok_or(ffi::INVALID_ARGUMENT)?;
    f(&mut entry.set, &scenario, delivered)
}

/// `nvmlEventSetFree`.
pub fn event_set_free(set: nvmlEventSet_t) -> NvResult {
    let mut sim = lock();
    sim.scenario()?;
    sim.event_sets
        .remove(&(set as usize))
        .map(drop)
        .ok_or(ffi::INVALID_ARGUMENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn energy_integrates_power_and_survives_power_changes() {
        let t0 = Instant::now();
        let e = Energy {
            mj_at_since: 1000.0,
            since: t0,
            power_mw: 500_000.0,
        };
        let t1 = t0 + Duration::from_secs(2);
        assert!(
            (e.at(t1) - (1000.0 + 1_000_000.0)).abs() < 1e-6,
            "500 W × 2 s = 1000 J"
        );
        let e2 = Energy {
            mj_at_since: e.at(t1),
            since: t1,
            power_mw: 100_000.0,
        };
        let t2 = t1 + Duration::from_millis(500);
        assert!((e2.at(t2) - (1_001_000.0 + 50_000.0)).abs() < 1e-6);
        assert!(energy_base_mj(1) > energy_base_mj(0) && energy_base_mj(0) > 0.0);
    }
}
