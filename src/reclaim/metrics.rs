//! The reclaim and accounting series, rendered once per poll from the stage's [`View`] and
//! appended to the native family.

use super::idle::UnitState;
use super::stage::View;
use crate::metrics::Family;
use crate::snapshot::{GpuStatus, Snapshot};

/// Renders every reclaim and accounting family, in page order (empty ones are left out when
/// the page is written).
pub fn render(view: &View, snapshot: &Snapshot) -> Vec<Family> {
    let mut out = Vec::new();
    idle(view, snapshot, &mut out);
    actions(view, &mut out);
    accounting(view, &mut out);
    out
}

fn idle(view: &View, snapshot: &Snapshot, out: &mut Vec<Family>) {
    let mut seconds = Family::gauge(
        "gpu_steward_gpu_idle_seconds",
        "Seconds the GPU has been held (a process with [reclaim] min_memory_mib or more) at or below [reclaim] utilization_threshold; 0 when not held or active. Any activity resets it.",
    );
    let mut memory = Family::gauge(
        "gpu_steward_idle_held_memory_bytes",
        "GPU memory held by the processes of an idle GPU; 0 when the GPU is not idle.",
    );
    for g in &snapshot.gpus {
        if g.status != GpuStatus::Up || g.identity.is_none() || g.reading.processes.is_none() {
            continue;
        }
        let unit = view
            .units
            .iter()
            .find(|u| u.key.gpu_instance.is_none() && u.key.uuid == g.uuid())
            .filter(|u| matches!(u.state, UnitState::Idle { .. }));
        let labels = [("gpu", g.index.to_string()), ("uuid", g.uuid().to_string())];
        seconds.add(
            &labels,
            unit.map_or(0.0, |u| u.idle_for(view.taken_at).as_secs_f64()),
        );
        memory.add(&labels, unit.map_or(0.0, |u| u.held_memory_bytes as f64));
    }
    out.push(seconds);
    out.push(memory);
}

fn actions(view: &View, out: &mut Vec<Family>) {
    if !view.config.enabled {
        return;
    }
    let mut f = Family::counter(
        "gpu_steward_reclaim_actions_total",
        "Steps of the reclaim ladder carried out, by action (warn, signal, hook) and result (success, failure, timeout, error, dry_run, rate_limited, logged).",
    );
    let mut counts = view.actions.clone();
    // The configured action is always shown, so that rate() has a start.
    counts
        .entry((view.config.action.as_str(), "success"))
        .or_insert(0);
    for ((action, result), n) in counts {
        f.add(&[("action", action), ("result", result)], n as f64);
    }
    out.push(f);
    let mut dry = Family::gauge(
        "gpu_steward_reclaim_dry_run",
        "1 while reclaim only reports what it would do ([reclaim] dry_run, or the audit log cannot be written).",
    );
    dry.add::<&str>(&[], crate::metrics::flag(view.dry_run));
    out.push(dry);
    if let Some((up, _, _)) = &view.pod_labels {
        let mut f = Family::gauge(
            "gpu_steward_reclaim_pod_labels_up",
            "1 when the last ListPodSandbox on the container runtime's socket succeeded ([reclaim] exempt_pod_labels); while 0, processes in pods are exempt.",
        );
        f.add::<&str>(&[], crate::metrics::flag(*up));
        out.push(f);
    }
}

fn accounting(view: &View, out: &mut Vec<Family>) {
    if !view.accounting {
        return;
    }
    type Pick = fn(&super::accounting::Totals) -> f64;
    let families: [(&'static str, &'static str, Pick); 3] = [
        (
            "gpu_steward_owner_held_seconds_total",
            "Seconds the owner had at least one process on the GPU, at poll resolution.",
            |t| t.held_seconds,
        ),
        (
            "gpu_steward_owner_busy_seconds_total",
            "Seconds the owner's processes kept the GPU's SMs busy: held seconds weighted by the owner's SM utilization.",
            |t| t.busy_seconds,
        ),
        (
            "gpu_steward_owner_energy_joules_total",
            "GPU energy (power x time) attributed to the owner by its share of SM utilization, or equally among holders when none computes.",
            |t| t.energy_joules,
        ),
    ];
    for (name, help, pick) in families {
        let mut f = Family::counter(name, help);
        for (k, t) in &view.owners {
            let mut labels = vec![
                ("gpu", k.gpu.to_string()),
                ("uuid", k.uuid.clone()),
                ("owner_kind", k.kind.as_str().to_string()),
                ("owner", k.owner.clone()),
            ];
            if k.kind == super::accounting::OwnerKind::Pod {
                labels.push(("namespace", k.namespace.clone()));
            }
            f.add(&labels, pick(t));
        }
        out.push(f);
    }
    let mut idle = Family::counter(
        "gpu_steward_gpu_idle_held_seconds_total",
        "Seconds the GPU was held and idle (the idleness rule of [reclaim], at each poll, without the window).",
    );
    for ((gpu, uuid), s) in &view.idle_held {
        idle.add(&[("gpu", gpu.to_string()), ("uuid", uuid.clone())], *s);
    }
    out.push(idle);
    let mut errors = Family::counter(
        "gpu_steward_accounting_state_write_errors_total",
        "Failed writes of the accounting state file ([accounting] state_dir).",
    );
    errors.add::<&str>(&[], view.state_write_errors as f64);
    out.push(errors);
}
