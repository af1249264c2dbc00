//! Remediation: alerts in (from the agent's own rules and from Alertmanager's webhook), routes
//! matched, safety rails applied, hooks run, every decision and outcome audited.
//!
//! - [`alert`]: the Alertmanager alert object, the one shape every source hands in and every
//!   hook reads on stdin; plain data.
//! - `[rules]` and `[remediation]` are configuration data: [`crate::config::remediation`].
//! - [`rails`]: the pure decision per (route, alert): idempotence by fingerprint, cooldown,
//!   the node-wide hourly limit, dry run.
//! - [`replay`]: the rails rebuilt at start from the audit log's decision records, so that
//!   restarts and crash loops keep idempotence, cooldowns and the hourly limit.
//! - [`dispatch`]: the task that applies decisions and runs hooks through [`crate::exec::run`],
//!   one action at a time per GPU, recorded and carried out through the owner of changes ([`crate::changes`]).
//! - [`actions`]: built-in actions (signal the processes on a GPU).
//! - [`metrics`]: hook runs and durations for `/metrics`.
//!
//! Nothing here runs unless routes and hooks are configured; hooks run as argv, never through
//! a shell, with the shared runner's timeout that kills the whole process group.

pub mod actions;
pub mod alert;
pub mod dispatch;
pub mod metrics;
pub mod rails;
pub mod replay;

pub use crate::config::remediation::RemediationConfig;
pub use dispatch::{Handle, Source};
