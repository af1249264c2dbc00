//! A report as text for a person: every line at most 80 columns, one line saying what share of
//! the GPU time it held was busy. `gpu-steward job report` prints it and Slurm's epilog keeps
//! it beside the JSON.

use std::fmt::Write;
use std::time::SystemTime;

use super::{Key, Report};

/// The widest line.
pub const WIDTH: usize = 80;

pub fn render(r: &Report) -> String {
    let mut lines: Vec<String> = Vec::new();
    let key = Key {
        kind: r.kind,
        namespace: r.namespace.clone(),
        id: r.id.clone(),
    };
    lines.push(format!("GPU report of {}", key.describe()));
    lines.push(format!(
        "seen on GPUs from {} to {} ({})",
        time(r.first_seen),
        time(r.last_seen),
        duration(
            r.last_seen
                .duration_since(r.first_seen)
                .unwrap_or_default()
                .as_secs_f64()
        )
    ));
    let n = r.gpus.len();
    lines.push(format!(
        "held {} GPU{} for {} GPU-seconds ({})",
        n,
        if n == 1 { "" } else { "s" },
        round(r.held_seconds),
        duration(r.held_seconds)
    ));
    lines.push(match (r.busy_share(), r.sampled_share()) {
        (Some(share), Some(sampled)) => format!(
            "busy: {:.0}% of the GPU time it held (sampled {} of {} GPU-s, {:.0}%)",
            share * 100.0,
            round(r.sampled_seconds),
            round(r.held_seconds),
            sampled * 100.0
        ),
        (None, Some(_)) => format!(
            "busy: not known, no utilization sample in its {} GPU-seconds",
            round(r.held_seconds)
        ),
        _ => "busy: no GPU time held yet".into(),
    });
    lines.push(format!(
        "SM utilization: mean {}, max {}",
        percent(r.sm_utilization.mean),
        percent(r.sm_utilization.max)
    ));
    lines.push(format!("memory used: max {}", mib(r.memory_used_bytes.max)));
    lines.push(format!("energy: {}", energy(r.energy_joules)));
    lines.push(String::new());
    lines
        .push("GPU  model / UUID                             held s  busy  SM max  mem max".into());
    for g in &r.gpus {
        let busy = (g.sampled_seconds > 0.0)
            .then(|| g.busy_seconds / g.sampled_seconds)
            .map_or("-".into(), |s| format!("{:.0}%", s * 100.0));
        lines.push(format!(
            "{:<4} {:<38} {:>7} {:>5} {:>7} {:>8}",
            g.index,
            cut(&g.model, 38),
            round(g.held_seconds),
            busy,
            percent(g.sm_utilization.max),
            mib(g.memory_used_bytes.max)
        ));
        lines.push(format!("     {}", g.uuid));
    }
    lines.push(String::new());
    if r.xids.is_empty() {
        lines.push("XIDs: none".into());
    } else {
        lines.push("XIDs:".into());
        for x in &r.xids {
            lines.push(format!(
                "  {} GPU {} XID {} (x{})",
                time(x.time),
                x.gpu,
                x.xid,
                x.count
            ));
        }
    }
    if r.conditions.is_empty() {
        lines.push("health conditions on its GPUs: none".into());
    } else {
        lines.push("health conditions on its GPUs while it held them:".into());
        for c in &r.conditions {
            lines.push(format!(
                "  GPU {} {} [{}] since {}: {}",
                c.gpu,
                c.condition,
                c.severity.as_str(),
                time(c.since),
                c.reason
            ));
        }
    }
    if r.reclaim_actions.is_empty() {
        lines.push("reclaim actions: none".into());
    } else {
        lines.push("reclaim actions:".into());
        for a in &r.reclaim_actions {
            lines.push(format!(
                "  {} GPU {} {} ({}{}) pids {:?}",
                time(a.time),
                a.gpu,
                a.step,
                a.action,
                if a.dry_run { ", dry run" } else { "" },
                a.pids
            ));
        }
    }
    let mut out = String::new();
    for l in lines {
        let _ = writeln!(out, "{}", cut(&l, WIDTH));
    }
    out
}

/// At most `width` characters: longer text ends in `…`.
fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut t: String = s.chars().take(width - 1).collect();
    t.push('…');
    t
}

fn time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn round(s: f64) -> String {
    format!("{s:.0}")
}

fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    format!("{}h{:02}m{:02}s", s / 3600, s / 60 % 60, s % 60)
}

fn percent(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.0}%", v * 100.0))
}

fn mib(v: Option<u64>) -> String {
    v.map_or("-".into(), |b| format!("{} MiB", b / (1 << 20)))
}

fn energy(j: Option<f64>) -> String {
    j.map_or("not read".into(), |j| {
        format!("{:.1} kJ ({:.3} kWh)", j / 1000.0, j / 3.6e6)
    })
}
