//! GPU sharing (native family): the compute mode the poller read, and what the sharing
//! subsystem published: replicas per GPU and resource, the device plugin's registration and
//! allocations, applies, and the replica memory guard. Families without series are left out.

use super::{Families, Family};
use crate::snapshot::{ComputeMode, SharingStatus, Snapshot};

const MODES: [ComputeMode; 4] = [
    ComputeMode::Default,
    ComputeMode::ExclusiveThread,
    ComputeMode::Prohibited,
    ComputeMode::ExclusiveProcess,
];

pub(super) fn render(snapshot: &Snapshot, view: super::View, out: &mut Families) {
    // Four series per GPU for one enum, which `gpu-steward sharing` and the API also show: the
    // full page only.
    if view.full {
        compute_mode(snapshot, out);
    }
    let Some(s) = &snapshot.sharing else {
        return;
    };
    replicas(s, out);
    plugin(s, out);
    applies(s, out);
    guard(s, out);
}

fn compute_mode(snapshot: &Snapshot, out: &mut Families) {
    let mut mode = Family::gauge(
        "gpu_steward_compute_mode",
        "1 for the GPU's current compute mode (nvmlDeviceGetComputeMode), 0 for the others.",
    );
    for g in snapshot.gpus.iter().filter(|g| g.identity.is_some()) {
        if let Some(current) = g.reading.compute_mode {
            for m in MODES {
                mode.add(
                    &[
                        ("gpu", g.index.to_string()),
                        ("uuid", g.uuid().to_string()),
                        ("mode", m.as_str().to_string()),
                    ],
                    if m == current { 1.0 } else { 0.0 },
                );
            }
        }
    }
    out.push(mode);
}

fn replicas(s: &SharingStatus, out: &mut Families) {
    let mut replicas = Family::gauge(
        "gpu_steward_sharing_replicas",
        "Time-slicing replicas of the GPU advertised under the resource.",
    );
    for r in &s.replicas {
        replicas.add(
            &[
                ("gpu", r.gpu.to_string()),
                ("uuid", r.uuid.clone()),
                ("resource", r.resource.clone()),
            ],
            f64::from(r.replicas),
        );
    }
    out.push(replicas);
}

fn plugin(s: &SharingStatus, out: &mut Families) {
    type Field = fn(&crate::snapshot::PluginResource) -> f64;
    let plugin: [(&'static str, &'static str, bool, Field); 6] = [
        ("gpu_steward_device_plugin_registered", "1 while the resource is registered with the kubelet.", false, |p| super::flag(p.registered)),
        ("gpu_steward_device_plugin_registrations_total", "Successful registrations with the kubelet (a kubelet restart adds one).", true, |p| p.registrations_total as f64),
        ("gpu_steward_device_plugin_registration_failures_total", "Failed registration attempts.", true, |p| p.registration_failures_total as f64),
        ("gpu_steward_device_plugin_allocations_total", "Allocate requests answered with devices.", true, |p| p.allocations_total as f64),
        ("gpu_steward_device_plugin_allocations_rejected_total", "Allocate requests refused (unknown device, more than one shared replica when failRequestsGreaterThanOne).", true, |p| p.allocations_rejected_total as f64),
        ("gpu_steward_device_plugin_unhealthy_devices", "Devices (replicas) advertised as Unhealthy.", false, |p| p.unhealthy_devices as f64),
    ];
    for (name, help, counter, field) in plugin {
        let mut f = Family::new(name, help, counter);
        for p in &s.plugin {
            f.add(&[("resource", p.resource.as_str())], field(p));
        }
        out.push(f);
    }
}

fn applies(s: &SharingStatus, out: &mut Families) {
    let mut applies = Family::counter(
        "gpu_steward_sharing_applies_total",
        "Sharing applies (compute mode, time-slice) by trigger and result.",
    );
    for ((trigger, result), n) in &s.applies {
        applies.add(
            &[("trigger", trigger.as_str()), ("result", result)],
            *n as f64,
        );
    }
    out.push(applies);
}

fn guard(s: &SharingStatus, out: &mut Families) {
    let mut over = Family::gauge(
        "gpu_steward_sharing_memory_over_limit_bytes",
        "Observed GPU memory of a process above its replica's memory_per_replica (not a limit \
         the driver enforces).",
    );
    for o in &s.over_limit {
        over.add(
            &[
                ("gpu", o.gpu.to_string()),
                ("uuid", o.uuid.clone()),
                ("pid", o.pid.to_string()),
            ],
            o.used_bytes.saturating_sub(o.limit_bytes) as f64,
        );
    }
    out.push(over);
    let mut signals = Family::counter(
        "gpu_steward_sharing_memory_guard_signals_total",
        "Signals the memory guard sent (or, in a dry run, would have sent), by result.",
    );
    for (result, n) in &s.guard_signals_total {
        signals.add(&[("result", *result)], *n as f64);
    }
    out.push(signals);
}
