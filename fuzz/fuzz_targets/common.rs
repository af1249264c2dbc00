//! What the HTTP fuzz targets share: the agent's state over a fixed 2-GPU snapshot (the
//! crate's own HTTP tests use the same fixture).

use std::time::Duration;

use gpu_steward::http::fixture::{gpu, state as with};
use gpu_steward::http::AppState;
use gpu_steward::snapshot::{GpuStatus, NvmlStatus};

pub fn state() -> AppState {
    with(
        NvmlStatus::Up,
        vec![gpu(0, GpuStatus::Up), gpu(1, GpuStatus::Up)],
        Duration::ZERO,
    )
}
