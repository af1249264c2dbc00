//! Semantic checks of one `[[gpu]]` scenario entry against its model: everything serde cannot
//! express (known model, MIG profiles and slices, memory room, percentages, power constraints,
//! function and return-code names, unique event ids...). Each error carries the TOML span of
//! the offending key or value so the caller can print `FILE:LINE:COL`.

use std::collections::BTreeSet;
use std::ops::Range;

use toml::Spanned;

use crate::ffi::code_by_name;
use crate::models::{self, Model};
use crate::resolve;
use crate::scenario::{unknown_code, RawGpu, ScenarioError};

pub(crate) type ErrAt<'a> = dyn Fn(Range<usize>, String) -> ScenarioError + 'a;

/// Checks one `[[gpu]]` entry against its model; returns the model.
pub(crate) fn validate_gpu(g: &RawGpu, err: &ErrAt<'_>) -> Result<&'static Model, ScenarioError> {
    let model = models::by_key(g.model.get_ref()).ok_or_else(|| {
        let known: Vec<&str> = models::MODELS.iter().map(|m| m.key).collect();
        err(
            g.model.span(),
            format!(
                "unknown model '{}'; use one of {}",
                g.model.get_ref(),
                known.join(", ")
            ),
        )
    })?;
    let count = g.count.as_ref().map_or(1, |c| *c.get_ref());
    for (field, name) in [
        (&g.uuid, "uuid"),
        (&g.serial, "serial"),
        (&g.pci_bus_id, "pci_bus_id"),
    ] {
        if let (Some(v), true) = (field, count > 1) {
            return Err(err(
                v.span(),
                format!("'{name}' cannot be given with count > 1"),
            ));
        }
    }
    if let Some(u) = &g.uuid {
        if !resolve::is_uuid(u.get_ref()) {
            return Err(err(
                u.span(),
                format!(
                    "uuid '{}' is not of the form GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
                    u.get_ref()
                ),
            ));
        }
    }
    if let Some(p) = &g.pci_bus_id {
        if resolve::PciAddr::parse(p.get_ref()).is_none() {
            return Err(err(
                p.span(),
                format!(
                    "pci_bus_id '{}' is not of the form 00000000:18:00.0",
                    p.get_ref()
                ),
            ));
        }
    }
    if let Some(s) = &g.serial {
        if s.get_ref().is_empty() || s.get_ref().len() >= 30 {
            return Err(err(s.span(), "serial must have 1 to 29 characters".into()));
        }
    }
    let mig_on = g.mig_mode.as_ref().is_some_and(|m| *m.get_ref());
    if let (Some(m), false) = (&g.mig_mode, model.mig_capable()) {
        return Err(err(
            m.span(),
            format!("model '{}' does not support MIG", model.key),
        ));
    }
    let mut compute_slices = 0;
    for d in g.mig_devices.iter().flatten() {
        if !mig_on {
            return Err(err(
                d.span(),
                "'mig_devices' needs 'mig_mode = true'".into(),
            ));
        }
        let Some(profile) = model.mig_profile_named(d.get_ref()) else {
            let names: Vec<&str> = model.mig_profiles.iter().map(|p| p.name).collect();
            return Err(err(
                d.span(),
                format!(
                    "'{}' is not a MIG profile of {}; use one of {}",
                    d.get_ref(),
                    model.key,
                    names.join(", ")
                ),
            ));
        };
        compute_slices += profile.slices;
        if compute_slices > 7 {
            return Err(err(
                d.span(),
                "MIG devices use more than the 7 compute slices".into(),
            ));
        }
    }
    if let Some(devices) = &g.mig_devices {
        let profiles: Vec<_> = devices
            .iter()
            .filter_map(|d| model.mig_profile_named(d.get_ref()))
            .collect();
        if crate::instances::MigGpu::layout(model, "", &profiles).is_none() {
            let span = devices.first().map_or(0..0, Spanned::span);
            return Err(err(
                span,
                "these mig_devices do not fit the GPU's memory slices in any placement".into(),
            ));
        }
    }
    if let Some(faults) = &g.mig_faults {
        for (op, when) in faults {
            if crate::instances::Op::by_key(op.get_ref()).is_none() {
                let ops: Vec<&str> = crate::instances::Op::ALL.iter().map(|o| o.key()).collect();
                return Err(err(
                    op.span(),
                    format!(
                        "unknown MIG operation '{}' in mig_faults; use one of {}",
                        op.get_ref(),
                        ops.join(", ")
                    ),
                ));
            }
            if when.get_ref().calls().contains(&0) {
                return Err(err(when.span(), "mig_faults counts calls from 1".into()));
            }
        }
        if !model.mig_capable() {
            let span = faults.keys().next().map_or(0..0, Spanned::span);
            return Err(err(
                span,
                format!("model '{}' does not support MIG", model.key),
            ));
        }
    }
    if let Some(p) = &g.power_limit_w {
        let w = *p.get_ref();
        if w < model.power_min_w || w > model.power_max_w {
            return Err(err(
                p.span(),
                format!(
                    "power_limit_w {w} is outside {}'s constraints {}..={} W",
                    model.key, model.power_min_w, model.power_max_w
                ),
            ));
        }
    }
    if let Some(p) = &g.power_w {
        if !p.get_ref().is_finite() || *p.get_ref() < 0.0 {
            return Err(err(p.span(), "power_w must be a finite number >= 0".into()));
        }
    }
    let percents = [
        &g.gpu_util_percent,
        &g.mem_util_percent,
        &g.enc_util_percent,
        &g.dec_util_percent,
        &g.fan_percent,
    ];
    for p in percents.into_iter().flatten() {
        check_percent(p, err)?;
    }
    if let Some(m) = &g.memory_used_mib {
        let room = (model.memory_total_bytes() - model.memory_reserved_bytes) / (1024 * 1024);
        if *m.get_ref() > room {
            return Err(err(
                m.span(),
                format!(
                    "memory_used_mib {} exceeds {}'s total minus reserved ({room} MiB)",
                    m.get_ref(),
                    model.key
                ),
            ));
        }
    }
    if let Some(sram) = &g.ecc_sram {
        let (s, t) = (sram.get_ref(), g.ecc.unwrap_or_default());
        let parts = [
            (s.sbe_volatile, t.sbe_volatile),
            (s.dbe_volatile, t.dbe_volatile),
            (s.sbe_aggregate, t.sbe_aggregate),
            (s.dbe_aggregate, t.dbe_aggregate),
        ];
        if parts.iter().any(|(part, total)| part > total) {
            return Err(err(
                sram.span(),
                "ecc_sram counts are the SRAM part of 'ecc' and cannot exceed it".into(),
            ));
        }
    }
    if let (Some(r), false) = (&g.remapped_rows, model.row_remapping) {
        return Err(err(
            r.span(),
            format!("model '{}' has no row remapping", model.key),
        ));
    }
    if let (Some(r), false) = (&g.retired_pages, model.page_retirement) {
        return Err(err(
            r.span(),
            format!(
                "model '{}' uses row remapping, not page retirement",
                model.key
            ),
        ));
    }
    for f in g
        .unsupported
        .iter()
        .flatten()
        .chain(g.errors.iter().flat_map(|e| e.keys()))
        .chain(g.delay_ms.iter().flat_map(|e| e.keys()))
    {
        if !crate::EXPORTED.contains(&f.get_ref().as_str()) {
            return Err(err(
                f.span(),
                format!("'{}' is not a function this library exports", f.get_ref()),
            ));
        }
    }
    for v in g.delay_ms.iter().flat_map(|e| e.values()) {
        if *v.get_ref() > 600_000 {
            return Err(err(
                v.span(),
                format!(
                    "delay {} ms is over the 600000 ms (10 min) allowed",
                    v.get_ref()
                ),
            ));
        }
    }
    for v in g.errors.iter().flat_map(|e| e.values()) {
        code_by_name(v.get_ref()).ok_or_else(|| err(v.span(), unknown_code(v.get_ref())))?;
    }
    let mut ids = BTreeSet::new();
    for e in &g.event {
        if !ids.insert(*e.id.get_ref()) {
            return Err(err(
                e.id.span(),
                format!("duplicate event id {} on this GPU", e.id.get_ref()),
            ));
        }
    }
    if let Some(gpm) = &g.gpm {
        let v = gpm.get_ref();
        let ratios = [
            v.gr_engine_active,
            v.sm_active,
            v.sm_occupancy,
            v.tensor_active,
            v.dram_active,
            v.fp64_active,
            v.fp32_active,
            v.fp16_active,
        ];
        if ratios.iter().flatten().any(|r| !(0.0..=1.0).contains(r)) {
            return Err(err(
                gpm.span(),
                "gpm ratios must be between 0.0 and 1.0".to_string(),
            ));
        }
        let rates = [v.pcie_tx_bytes_per_s, v.pcie_rx_bytes_per_s];
        if rates.iter().flatten().any(|r| !r.is_finite() || *r < 0.0) {
            return Err(err(
                gpm.span(),
                "gpm PCIe rates must be bytes per second, 0 or more".to_string(),
            ));
        }
    }
    for p in &g.process {
        let pr = p.get_ref();
        for u in [&pr.sm_util_percent, &pr.mem_util_percent]
            .into_iter()
            .flatten()
        {
            check_percent(u, err)?;
        }
        if let Some(d) = &pr.mig_device {
            let listed = g
                .mig_devices
                .iter()
                .flatten()
                .any(|m| m.get_ref() == d.get_ref());
            if !mig_on || !listed {
                return Err(err(
                    d.span(),
                    format!(
                        "mig_device '{}' is not one of this GPU's mig_devices",
                        d.get_ref()
                    ),
                ));
            }
        }
    }
    Ok(model)
}

fn check_percent(p: &Spanned<u32>, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    if *p.get_ref() > 100 {
        return Err(err(
            p.span(),
            format!("{} is not a percentage (0..=100)", p.get_ref()),
        ));
    }
    Ok(())
}
