//! Which metric names a configuration leaves off the page, so that a node-side alert rule
//! reading one of them is refused when the config is read, instead of never firing: the agent's
//! rules evaluate its own page (`rules/task.rs`), and a lean page has no
//! `gpu_steward_temperature_celsius`.
//!
//! Built from the same tables the collectors render from; a family that asks the profile adds
//! its names here too.

use super::dcgm::FIELDS;
use super::dcgm_sets::NameSet;
use super::native::Keep;
use super::{RenderConfig, View};
use crate::config::{DcgmNames, Profile};

/// Names the page never carries with these settings, although other settings would.
pub fn left_out(dcgm: bool, native: bool, profile: Profile, names: DcgmNames) -> Vec<&'static str> {
    let config = &RenderConfig {
        dcgm,
        native,
        hostname: String::new(),
        hostname_label: String::new(),
        profile,
        names,
        nvlink_links: false,
        labelled: Default::default(),
    };
    let view: View = config.view();
    let mut served: Vec<&'static str> = Vec::new();
    let mut all: Vec<&'static str> = Vec::new();
    let sets: Vec<NameSet> = NameSet::chosen(config.names).collect();
    for f in FIELDS {
        for set in [NameSet::V48, NameSet::V49] {
            all.push(f.name(set));
            if config.dcgm && sets.contains(&set) && (view.full || f.lean(set)) {
                served.push(f.name(set));
            }
        }
    }
    for (v48, v49, lean, native) in super::gpm::names() {
        all.extend([v48, v49, native]);
        if config.dcgm && (view.full || lean) {
            for set in &sets {
                served.push(match set {
                    NameSet::V48 => v48,
                    NameSet::V49 => v49,
                });
            }
        }
        if config.native && view.duplicates {
            served.push(native);
        }
    }
    for (name, keep) in super::native::names()
        .into_iter()
        .chain(super::mig::names())
        .chain([
            ("gpu_steward_compute_mode", Keep::Full),
            ("gpu_steward_processes_dropped_total", Keep::Full),
        ])
    {
        all.push(name);
        if config.native && keep.shown(view) {
            served.push(name);
        }
    }
    // Agent self-metrics are on whatever the families; these only on the full page.
    for name in [
        "gpu_steward_nvml_calls_total",
        "gpu_steward_nvml_call_seconds_total",
        "gpu_steward_poll_source_duration_seconds",
        "gpu_steward_poll_source_success",
    ] {
        all.push(name);
        if view.full {
            served.push(name);
        }
    }
    all.sort_unstable();
    all.dedup();
    all.retain(|n| !served.contains(n));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lean_page_leaves_out_native_copies_and_the_other_name_set() {
        let out = left_out(true, true, Profile::Lean, DcgmNames::V48);
        for name in [
            "gpu_steward_temperature_celsius",
            "gpu_steward_clock_event_active",
            "gpu_steward_compute_mode",
            "gpu_steward_sm_active_ratio",
            "DCGM_FI_DEV_GPU_UTIL_RATIO",
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "gpu_steward_poll_source_success",
            "gpu_steward_poll_source_duration_seconds",
        ] {
            assert!(out.contains(&name), "{name}");
        }
        for name in [
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            "gpu_steward_gpu_processes",
            "gpu_steward_mig_instance_info",
        ] {
            assert!(!out.contains(&name), "{name}");
        }
        let full = left_out(true, true, Profile::Full, DcgmNames::Both);
        assert!(full.is_empty(), "{full:?}");
    }
}
