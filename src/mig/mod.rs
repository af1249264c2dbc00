//! MIG layouts: declare (named layouts, mig-parted compatible), plan (a pure function from the
//! found layout to the steps that reach the target, with placements chosen by search), and apply
//! (mode, destroy compute then GPU instances, create with explicit placements, hooks, audit,
//! and a way back to the found layout when any step fails).
//!
//! - the layouts and `[mig]` (mig-parted's YAML, read once at load) are configuration data:
//!   [`crate::config::mig_layout`] and [`crate::config::mig`]; [`plan`]: the planner; [`apply`]: the applier; [`show`]: `mig show` rendering; [`intent`]: the node lock and the intent record.
//!
//! Only [`apply`] changes anything, and only through `gpu::MigControl`; nothing here runs unless
//! a command, a configured `layout` or an authenticated API call asks for it.

pub mod apply;
pub mod intent;
pub mod plan;
pub mod show;
