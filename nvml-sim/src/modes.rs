//! Settings a privileged caller changes on a GPU and the driver keeps while it is loaded: the
//! compute mode (`nvmlDeviceSetComputeMode`). Kept by UUID, so a scenario rewrite (a GPU made
//! to fail, telemetry changed) does not undo them, and across `nvmlShutdown`/`nvmlInit` while
//! the library stays loaded, like a driver that stays loaded. The scenario's `compute_mode`
//! gives the mode before any change.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

static COMPUTE_MODES: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());

/// The compute mode of the GPU `uuid`: the last one set, else `initial` (the scenario's).
pub fn compute_mode(uuid: &str, initial: u32) -> u32 {
    COMPUTE_MODES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(uuid)
        .copied()
        .unwrap_or(initial)
}

/// Sets the compute mode of the GPU `uuid`.
pub fn set_compute_mode(uuid: &str, mode: u32) {
    COMPUTE_MODES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(uuid.to_string(), mode);
}
