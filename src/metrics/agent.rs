//! The agent's own metrics: build, NVML state, poll duration, failing sources, errors by NVML
//! function, snapshot timestamp, config reloads. Always rendered, whatever the families.
//!
//! The lean page folds the per-source detail (two series for each of 14 sources, 28 of a
//! node's series) into one count of failing sources; which source, and why, is in
//! `gpu_steward_nvml_errors_total{function,error}`, always on, and the full page keeps the
//! per-source series. This module must not put a series per NVML function or per source on
//! the lean page: it is the fleet's budget (CONTRACT §4).

use std::sync::atomic::{AtomicU64, Ordering};

use super::{flag, unix_seconds, Families, Family};
use crate::snapshot::{NvmlStatus, Snapshot};
use crate::AgentCounters;

pub(super) fn render(
    snapshot: &Snapshot,
    counters: &AgentCounters,
    full: bool,
    out: &mut Families,
) {
    process(counters, out);
    nvml(snapshot, full, out);
    polls(snapshot, full, out);
    reloads(counters, out);
    audit(&crate::audit::health(), out);
}

/// Audit log writes that failed, per component; every component is present from the start, so
/// that `increase()` sees the first failure. A failed write means the change was refused.
fn audit(health: &crate::audit::AuditHealth, out: &mut Families) {
    let mut errors = Family::counter(
        "gpu_steward_audit_write_errors_total",
        "Audit log records that could not be written, by component; the change each would have \
         recorded was not made.",
    );
    for component in crate::audit::COMPONENTS {
        let n = health.write_errors.get(*component).copied().unwrap_or(0);
        errors.add(&[("component", component)], n as f64);
    }
    for (component, n) in health
        .write_errors
        .iter()
        .filter(|(c, _)| !crate::audit::COMPONENTS.contains(&c.as_str()))
    {
        errors.add(&[("component", component.as_str())], *n as f64);
    }
    out.push(errors);
    let mut failing = Family::gauge(
        "gpu_steward_audit_failing",
        "1 while the last audit log write failed (changes to the node are refused), else 0.",
    );
    failing.add::<&str>(&[], if health.failing.is_some() { 1.0 } else { 0.0 });
    out.push(failing);
}

/// What the process is and when it started.
fn process(counters: &AgentCounters, out: &mut Families) {
    let mut build = Family::gauge(
        "gpu_steward_build_info",
        "Build of the running agent, value 1.",
    );
    build.add(
        &[
            ("version", env!("CARGO_PKG_VERSION")),
            (
                "revision",
                option_env!("GPU_STEWARD_REVISION").unwrap_or("unknown"),
            ),
        ],
        1.0,
    );
    out.push(build);

    let mut start = Family::gauge(
        "gpu_steward_start_time_seconds",
        "When the agent started (Unix time).",
    );
    start.add::<&str>(&[], unix_seconds(counters.started_at));
    out.push(start);
}

/// NVML: up, GPUs counted, what failed, what the calls cost.
fn nvml(snapshot: &Snapshot, full: bool, out: &mut Families) {
    let mut up = Family::gauge(
        "gpu_steward_nvml_up",
        "1 if NVML is initialised and answering, 0 while the agent retries.",
    );
    up.add::<&str>(
        &[],
        if snapshot.nvml == NvmlStatus::Up {
            1.0
        } else {
            0.0
        },
    );
    out.push(up);

    let mut count = Family::gauge(
        "gpu_steward_gpus",
        "GPUs NVML reports, including lost ones (nvmlDeviceGetCount_v2).",
    );
    count.add_opt::<&str, f64>(&[], snapshot.gpu_count.map(f64::from));
    out.push(count);

    let mut init = Family::counter(
        "gpu_steward_nvml_init_errors_total",
        "Failed attempts to load or initialise NVML, by error.",
    );
    for (error, n) in &snapshot.nvml_init_errors {
        init.add(&[("error", error.label().as_ref())], *n as f64);
    }
    out.push(init);

    let mut errors = Family::counter(
        "gpu_steward_nvml_errors_total",
        "NVML calls that failed (not counting 'not supported'), by function and error.",
    );
    for ((function, error), n) in &snapshot.nvml_errors {
        errors.add(
            &[("function", *function), ("error", error.label().as_ref())],
            *n as f64,
        );
    }
    out.push(errors);

    // Two series per NVML function (98 on an H100 node, 12 per GPU): where polling spends its
    // time, for whoever tunes the poller. The full page only, and built only for it: the lean
    // page used to format them every poll and drop them. Failures are always on
    // (gpu_steward_nvml_errors_total), and so is the poll's cost per source.
    if !full {
        return;
    }
    let mut calls = Family::counter(
        "gpu_steward_nvml_calls_total",
        "NVML calls the poller made, by function (the XID waiter's blocking waits excluded).",
    );
    let mut seconds = Family::counter(
        "gpu_steward_nvml_call_seconds_total",
        "Wall time spent in NVML calls, by function: what polling costs, where.",
    );
    for (function, stat) in &snapshot.nvml_calls {
        calls.add(&[("function", *function)], stat.calls as f64);
        seconds.add(&[("function", *function)], stat.seconds);
    }
    out.push(calls);
    out.push(seconds);
}

/// Polls: how many, how long, which sources fail (by source on the full page), and the
/// snapshot's time.
fn polls(snapshot: &Snapshot, full: bool, out: &mut Families) {
    let mut polls = Family::counter("gpu_steward_polls_total", "Polls completed.");
    polls.add::<&str>(&[], snapshot.polls as f64);
    out.push(polls);

    let mut duration = Family::gauge(
        "gpu_steward_poll_duration_seconds",
        "How long the last poll took.",
    );
    duration.add::<&str>(&[], snapshot.poll_duration.as_secs_f64());
    out.push(duration);

    let mut failing = Family::gauge(
        "gpu_steward_poll_failing_sources",
        "Sources (groups of NVML calls) whose last run failed on some GPU; 0 when every call succeeded or was not supported. Which: gpu_steward_nvml_errors_total, or gpu_steward_poll_source_success on the full profile.",
    );
    let failed = snapshot.sources.values().filter(|s| !s.success).count();
    failing.add::<&str>(&[], failed as f64);
    out.push(failing);
    // Two series per source (28 on a node): the full page only (see the module's doc), and
    // built only for it.
    if full {
        let mut source_duration = Family::gauge(
            "gpu_steward_poll_source_duration_seconds",
            "Time of the last run of each read of the source (group of NVML calls) on the poll's path, summed over GPUs.",
        );
        let mut source_success = Family::gauge(
            "gpu_steward_poll_source_success",
            "1 if, in the last run of each read of the source on every GPU, every call succeeded or was not supported.",
        );
        for (source, status) in &snapshot.sources {
            source_duration.add(&[("source", *source)], status.duration.as_secs_f64());
            source_success.add(&[("source", *source)], flag(status.success));
        }
        out.push(source_duration);
        out.push(source_success);
    }

    let mut taken = Family::gauge(
        "gpu_steward_snapshot_timestamp_seconds",
        "When the snapshot served was taken (Unix time).",
    );
    taken.add::<&str>(&[], unix_seconds(snapshot.taken_at));
    out.push(taken);
}

fn reloads(counters: &AgentCounters, out: &mut Families) {
    out.push(by_label(
        "gpu_steward_config_reloads_total",
        "Configuration reloads (SIGHUP), by result.",
        "result",
        [
            ("success", &counters.reloads_ok),
            ("failure", &counters.reloads_failed),
        ],
    ));
}

/// A counter family of the agent's own atomics, one series per value of `label`.
fn by_label<const N: usize>(
    name: &'static str,
    help: &'static str,
    label: &str,
    series: [(&str, &AtomicU64); N],
) -> Family {
    let mut family = Family::counter(name, help);
    for (value, count) in series {
        family.add(&[(label, value)], count.load(Ordering::Relaxed) as f64);
    }
    family
}
