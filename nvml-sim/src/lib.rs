//! A simulated `libnvidia-ml.so`: a cdylib exporting the NVML C ABI (symbol names and struct
//! layouts of `nvml.h` as `nvml-wrapper-sys` 0.10 binds them), driven by a TOML scenario file
//! named by `NVML_SIM_SCENARIO`. It lets gpu-steward's tests run the real NVML code paths on a
//! machine without a GPU. It must never let a panic cross the C boundary, never block while
//! holding its state lock, and must answer with the real driver's units and return codes.
//!
//! Layout:
//! - [`ffi`]: return codes, error strings, the `export!` guard (panic catching, call counting)
//!   and the pointer helpers every export uses.
//! - [`models`]: the per-model table (data, one struct per GPU model).
//! - [`raw`]: the scenario file's serde shape (plain data, at the bottom).
//! - [`scenario`]: parsing a scenario text into a validated, resolved scenario, with
//!   `FILE:LINE:COL` errors.
//! - [`error`]: [`error::ScenarioError`], a message at the scenario's `LINE:COL`.
//! - `validate`: semantic checks of one `[[gpu]]` entry against its model.
//! - [`pci`]: PCI bus ids in NVML's forms; [`ids`]: the stable hash and the UUID form.
//! - [`resolve`]: turns a validated scenario entry into one concrete [`resolve::Gpu`] per index.
//! - [`handles`]: the stable device handles (addresses in a static array).
//! - [`state`]: the global state (ref-counted init, live reload, stable handles, energy).
//! - [`events`]: per-event-set delivery bookkeeping (each XID id once per set).
//! - [`instances`]: one GPU's MIG lifecycle as plain data (mode, GPU and compute instances,
//!   placement and capacity rules); [`store`]: every GPU's MIG state, its handles and
//!   `NVML_SIM_STATE`.
//! - [`modes`]: settings the driver keeps while loaded (the compute mode).
//! - [`stats`]: the `NVML_SIM_STATS` call-count file.
//! - [`cost`]: the `NVML_SIM_COST` cost model (wall and CPU time per call, spent outside locks).
//! - `exports/*`: the `extern "C"` functions, grouped like nvml.h.

pub mod cost;
pub mod error;
pub mod events;
pub mod ffi;
pub mod handles;
pub mod ids;
pub mod instances;
pub mod models;
pub mod modes;
pub mod pci;
pub mod raw;
pub mod resolve;
pub mod scenario;
pub mod state;
pub mod stats;
pub mod store;
mod validate;

mod exports;

pub use exports::EXPORTED;
