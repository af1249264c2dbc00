//! `gpu-steward mig show`: the found layout per GPU, as text or JSON, and the text form of
//! plans and apply outcomes.

use std::fmt::Write as _;

use serde_json::json;

use super::apply::PendingReset;
use super::plan::Plan;
use crate::snapshot::mig::MigGpu;

/// `{"gpus": [...]}` with mode, instances (profile, placement, ids, memory, MIG UUIDs) and
/// processes per GPU.
pub fn json(gpus: &[MigGpu]) -> serde_json::Value {
    json!({ "gpus": gpus })
}

fn on(b: bool) -> &'static str {
    if b {
        "enabled"
    } else {
        "disabled"
    }
}

/// The human form.
pub fn text(gpus: &[MigGpu]) -> String {
    let mut s = String::new();
    for g in gpus {
        let _ = write!(s, "GPU {} {} {}: ", g.index, g.uuid, g.name);
        match g.mig {
            None => {
                let _ = writeln!(s, "no MIG");
                continue;
            }
            Some(m) if m.current == m.pending => {
                let _ = writeln!(s, "MIG {}", on(m.current));
            }
            Some(m) => {
                let _ = writeln!(
                    s,
                    "MIG {}, {} at the next GPU reset (pending)",
                    on(m.current),
                    on(m.pending)
                );
            }
        }
        for gi in &g.instances {
            let _ = writeln!(
                s,
                "  GPU instance {:>2}  {:<12} placement {}:{}  {} MiB",
                gi.gpu_instance_id, gi.profile, gi.start, gi.size, gi.memory_mib
            );
            if gi.compute_instances.is_empty() {
                // The applier always makes both: a change was interrupted (health: mig_incomplete).
                let _ = writeln!(
                    s,
                    "    no compute instance (mig_incomplete): a MIG change was interrupted; \
                     apply the layout again with `gpu-steward mig apply --layout NAME`"
                );
            }
            for ci in &gi.compute_instances {
                let _ = writeln!(
                    s,
                    "    compute instance {}  {:<14} {}",
                    ci.compute_instance_id,
                    ci.profile,
                    ci.uuid.as_deref().unwrap_or("-")
                );
            }
        }
        for p in &g.processes {
            let at = match (p.gpu_instance_id, p.compute_instance_id) {
                (Some(gi), Some(ci)) => format!(" in GPU instance {gi}, compute instance {ci}"),
                _ => String::new(),
            };
            let _ = writeln!(s, "  process {}{at}", p.pid);
        }
    }
    s
}

/// A plan as lines of steps per GPU.
pub fn plan_text(layout: &str, plan: &Plan) -> String {
    let mut s = String::new();
    for g in &plan.gpus {
        if !g.selected {
            let _ = writeln!(
                s,
                "GPU {} {}: not selected by '{layout}'; left alone",
                g.index, g.uuid
            );
            continue;
        }
        if g.steps.is_empty() {
            let _ = writeln!(s, "GPU {} {}: already matches '{layout}'", g.index, g.uuid);
            continue;
        }
        let kept = if g.kept.is_empty() {
            String::new()
        } else {
            format!(" (keeps GPU instances {})", list(&g.kept))
        };
        let _ = writeln!(
            s,
            "GPU {} {}: {} step(s){kept}",
            g.index,
            g.uuid,
            g.steps.len()
        );
        for (n, step) in g.steps.iter().enumerate() {
            let _ = writeln!(s, "  {}. {step}", n + 1);
        }
        if !g.blocking_pids.is_empty() {
            let _ = writeln!(s, "  processes in the way: pid {}", list(&g.blocking_pids));
        }
    }
    s
}

/// The pending mode changes, with what to do.
pub fn pending_text(pending: &[PendingReset]) -> String {
    let mut s = String::new();
    for p in pending {
        let blockers = if p.blocking_pids.is_empty() {
            String::new()
        } else {
            format!(
                "; processes holding the GPU: pid {}",
                list(&p.blocking_pids)
            )
        };
        let _ = writeln!(
            s,
            "GPU {} {}: MIG mode change to {} is pending ({}){blockers}; stop what holds the \
             GPU (processes, nvidia-persistenced, dcgm, the nvidia_drm module) and reset it \
             (nvidia-smi -r -i {}), or configure [mig] reset_command, then apply again",
            p.index,
            p.uuid,
            on(p.enable),
            p.status,
            p.index
        );
    }
    s
}

/// `1, 2, 3`: a list in words, not Rust's `[1, 2, 3]`.
fn list<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
