//! Semantic checks of one `[[gpu]]` scenario entry against its model: everything serde cannot
//! express (known model, MIG profiles and slices, memory room, percentages, power constraints,
//! function and return-code names, unique event ids...). Each error carries the TOML span of
//! the offending key or value so the caller can print `FILE:LINE:COL`.
//!
//! The checks are data, like the models: [`RULES`] lists, in the order they run, the scenario
//! key each rule guards and the rule; the keys that share a rule shape (identity strings, their
//! forms, percentages, model features) are tables of their own.

use std::collections::BTreeSet;
use std::ops::Range;

use toml::Spanned;

use crate::error::{unknown_code, ScenarioError};
use crate::ffi::code_by_name;
use crate::ids;
use crate::models::{self, Model};
use crate::pci::PciAddr;
use crate::raw::RawGpu;

pub(crate) type ErrAt<'a> = dyn Fn(Range<usize>, String) -> ScenarioError + 'a;

/// One rule: `Ok` when entry `g` satisfies it on `model`, else the error at the offending span.
type Rule = fn(&RawGpu, &'static Model, &ErrAt<'_>) -> Result<(), ScenarioError>;

/// A string key of `[[gpu]]`, by name.
type StrKey = fn(&RawGpu) -> Option<&Spanned<String>>;

/// A percentage key of `[[gpu]]`, by name.
type PercentKey = fn(&RawGpu) -> Option<&Spanned<u32>>;

/// Every rule after the model lookup, in the order they run (the first failure is the error
/// reported): the scenario key(s) it guards, and the rule.
static RULES: &[(&str, Rule)] = &[
    ("uuid, serial, pci_bus_id", one_gpu_only),
    ("uuid, pci_bus_id", forms),
    ("serial", serial),
    ("mig_mode", |g, m, err| {
        feature(g.mig_mode.as_ref().map(Spanned::span), m, &MIG, err)
    }),
    ("mig_devices", mig_devices),
    ("mig_faults", mig_faults),
    ("power_limit_w", power_limit_w),
    ("power_w", power_w),
    ("*_util_percent, fan_percent", percents),
    ("memory_used_mib", memory_used_mib),
    ("ecc_sram", ecc_sram),
    ("pcie", pcie),
    ("remapped_rows", |g, m, err| {
        feature(
            g.remapped_rows.as_ref().map(Spanned::span),
            m,
            &ROW_REMAPPING,
            err,
        )
    }),
    ("retired_pages", |g, m, err| {
        feature(
            g.retired_pages.as_ref().map(Spanned::span),
            m,
            &PAGE_RETIREMENT,
            err,
        )
    }),
    ("unsupported, errors, delay_ms", function_names),
    ("delay_ms", delays),
    ("errors", error_codes),
    ("event", event_ids),
    ("gpm", gpm),
    ("process", processes),
    ("nvlink", nvlink),
    ("fabric", fabric),
];

/// Identity keys that name one GPU, so an entry with `count > 1` cannot give them.
static ONE_GPU_ONLY: &[(&str, StrKey)] = &[
    ("uuid", |g| g.uuid.as_ref()),
    ("serial", |g| g.serial.as_ref()),
    ("pci_bus_id", |g| g.pci_bus_id.as_ref()),
];

/// An identity key with a fixed form.
struct Form {
    key: &'static str,
    value: StrKey,
    valid: fn(&str) -> bool,
    /// The form, as the error shows it.
    form: &'static str,
}

static FORMS: &[Form] = &[
    Form {
        key: "uuid",
        value: |g| g.uuid.as_ref(),
        valid: ids::is_uuid,
        form: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
    },
    Form {
        key: "pci_bus_id",
        value: |g| g.pci_bus_id.as_ref(),
        valid: |s| PciAddr::parse(s).is_some(),
        form: "00000000:18:00.0",
    },
];

/// Keys that are percentages (0..=100).
static PERCENTS: &[(&str, PercentKey)] = &[
    ("gpu_util_percent", |g| g.gpu_util_percent.as_ref()),
    ("mem_util_percent", |g| g.mem_util_percent.as_ref()),
    ("enc_util_percent", |g| g.enc_util_percent.as_ref()),
    ("dec_util_percent", |g| g.dec_util_percent.as_ref()),
    ("fan_percent", |g| g.fan_percent.as_ref()),
];

/// A model feature a key needs: whether the model has it, and what the error says it lacks.
struct Feature {
    has: fn(&Model) -> bool,
    lacks: &'static str,
}

static MIG: Feature = Feature {
    has: Model::mig_capable,
    lacks: "does not support MIG",
};
static ROW_REMAPPING: Feature = Feature {
    has: |m| m.row_remapping,
    lacks: "has no row remapping",
};
static PAGE_RETIREMENT: Feature = Feature {
    has: |m| m.page_retirement,
    lacks: "uses row remapping, not page retirement",
};

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
    for (_key, rule) in RULES {
        rule(g, model, err)?;
    }
    Ok(model)
}

fn mig_on(g: &RawGpu) -> bool {
    g.mig_mode.as_ref().is_some_and(|m| *m.get_ref())
}

/// A key given (at `span`) on a model without the feature it needs.
fn feature(
    span: Option<Range<usize>>,
    model: &Model,
    f: &Feature,
    err: &ErrAt<'_>,
) -> Result<(), ScenarioError> {
    match span {
        Some(span) if !(f.has)(model) => {
            Err(err(span, format!("model '{}' {}", model.key, f.lacks)))
        }
        _ => Ok(()),
    }
}

fn one_gpu_only(g: &RawGpu, _: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    let count = g.count.as_ref().map_or(1, |c| *c.get_ref());
    for (name, key) in ONE_GPU_ONLY {
        if let (Some(v), true) = (key(g), count > 1) {
            return Err(err(
                v.span(),
                format!("'{name}' cannot be given with count > 1"),
            ));
        }
    }
    Ok(())
}

fn forms(g: &RawGpu, _: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    for f in FORMS {
        if let Some(v) = (f.value)(g) {
            if !(f.valid)(v.get_ref()) {
                return Err(err(
                    v.span(),
                    format!("{} '{}' is not of the form {}", f.key, v.get_ref(), f.form),
                ));
            }
        }
    }
    Ok(())
}

fn serial(g: &RawGpu, _: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    if let Some(s) = &g.serial {
        if s.get_ref().is_empty() || s.get_ref().len() >= 30 {
            return Err(err(s.span(), "serial must have 1 to 29 characters".into()));
        }
    }
    Ok(())
}

fn mig_devices(g: &RawGpu, model: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    let Some(devices) = &g.mig_devices else {
        return Ok(());
    };
    let mut compute_slices = 0;
    for d in devices {
        if !mig_on(g) {
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
    Ok(())
}

fn mig_faults(g: &RawGpu, model: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    let Some(faults) = &g.mig_faults else {
        return Ok(());
    };
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
    let span = faults.keys().next().map_or(0..0, Spanned::span);
    feature(Some(span), model, &MIG, err)
}

fn power_limit_w(g: &RawGpu, model: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
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
    Ok(())
}

fn power_w(g: &RawGpu, _: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    if let Some(p) = &g.power_w {
        if !p.get_ref().is_finite() || *p.get_ref() < 0.0 {
            return Err(err(p.span(), "power_w must be a finite number >= 0".into()));
        }
    }
    Ok(())
}

fn percents(g: &RawGpu, _: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    for (_key, value) in PERCENTS {
        if let Some(p) = value(g) {
            check_percent(p, err)?;
        }
    }
    Ok(())
}

fn memory_used_mib(g: &RawGpu, model: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
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
    Ok(())
}

/// PCIe link widths a link trains to (PCIe base specification: x1, x2, x4, x8, x16, x32).
const PCIE_WIDTHS: [u32; 6] = [1, 2, 4, 8, 16, 32];

/// `pcie = { gen, width, replays_per_s }`: a link the board can train to, a rate that is one.
fn pcie(g: &RawGpu, m: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    let Some(p) = &g.pcie else { return Ok(()) };
    let p = p.get_ref();
    if let Some(gen) = &p.gen {
        if !(1..=m.pcie_max_gen).contains(gen.get_ref()) {
            return Err(err(
                gen.span(),
                format!(
                    "pcie gen {} is not one the {} trains to: 1 to {}",
                    gen.get_ref(),
                    m.key,
                    m.pcie_max_gen
                ),
            ));
        }
    }
    if let Some(width) = &p.width {
        let w = *width.get_ref();
        if !PCIE_WIDTHS.contains(&w) || w > m.pcie_max_width {
            return Err(err(
                width.span(),
                format!(
                    "pcie width {w} is not one the {} trains to: 1, 2, 4, 8 or 16 lanes, at most {}",
                    m.key, m.pcie_max_width
                ),
            ));
        }
    }
    if let Some(rate) = &p.replays_per_s {
        let r = *rate.get_ref();
        if !r.is_finite() || r < 0.0 {
            return Err(err(
                rate.span(),
                format!("replays_per_s must be a rate of 0 or more, not {r}"),
            ));
        }
    }
    Ok(())
}

fn ecc_sram(g: &RawGpu, _: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    if let Some(sram) = &g.ecc_sram {
        let (s, t) = (sram.get_ref(), g.ecc.unwrap_or_default());
        let parts = [
            (s.sbe_volatile, t.sbe_volatile),
            (s.dbe_volatile, t.dbe_volatile),
            (s.sbe_aggregate, t.sbe_aggregate),
            (s.dbe_aggregate, t.dbe_aggregate),
        ];
        if s.correctable_per_s > 0 {
            return Err(err(
                sram.span(),
                "correctable_per_s grows device memory's counters; give it in 'ecc', not \
                 'ecc_sram'"
                    .into(),
            ));
        }
        if parts.iter().any(|(part, total)| part > total) {
            return Err(err(
                sram.span(),
                "ecc_sram counts are the SRAM part of 'ecc' and cannot exceed it".into(),
            ));
        }
    }
    Ok(())
}

fn function_names(g: &RawGpu, _: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
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
    Ok(())
}

fn delays(g: &RawGpu, _: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
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
    Ok(())
}

fn error_codes(g: &RawGpu, _: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    for v in g.errors.iter().flat_map(|e| e.values()) {
        code_by_name(v.get_ref()).ok_or_else(|| err(v.span(), unknown_code(v.get_ref())))?;
    }
    Ok(())
}

fn event_ids(g: &RawGpu, _: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    let mut ids = BTreeSet::new();
    for e in &g.event {
        if !ids.insert(*e.id.get_ref()) {
            return Err(err(
                e.id.span(),
                format!("duplicate event id {} on this GPU", e.id.get_ref()),
            ));
        }
    }
    Ok(())
}

fn gpm(g: &RawGpu, _: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    let Some(gpm) = &g.gpm else {
        return Ok(());
    };
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
    Ok(())
}

fn processes(g: &RawGpu, _: &Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
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
            if !mig_on(g) || !listed {
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
    Ok(())
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

/// `nvlink` needs a board with NVLinks; `down` names links it has, once each.
fn nvlink(g: &RawGpu, model: &'static Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    let Some(n) = &g.nvlink else { return Ok(()) };
    if model.nvlinks == 0 {
        return Err(err(
            n.span(),
            format!(
                "model '{}' has no NVLink (a PCIe board); remove 'nvlink'",
                model.key
            ),
        ));
    }
    let mut seen = BTreeSet::new();
    for d in &n.get_ref().down {
        if *d.get_ref() >= model.nvlinks {
            return Err(err(
                d.span(),
                format!(
                    "link {} does not exist: model '{}' has links 0 to {}",
                    d.get_ref(),
                    model.key,
                    model.nvlinks - 1
                ),
            ));
        }
        if !seen.insert(*d.get_ref()) {
            return Err(err(
                d.span(),
                format!("link {} is listed twice", d.get_ref()),
            ));
        }
    }
    Ok(())
}

/// `fabric` needs `nvlink` on Hopper or newer (`nvmlDeviceGetGpuFabricInfoV` is Hopper+), and a
/// known return-code name as its status.
fn fabric(g: &RawGpu, model: &'static Model, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    let Some(f) = &g.fabric else { return Ok(()) };
    if model.architecture < models::HOPPER {
        return Err(err(
            f.span(),
            format!(
                "model '{}' has no GPU fabric info (Hopper and newer); remove 'fabric'",
                model.key
            ),
        ));
    }
    if g.nvlink.is_none() {
        return Err(err(
            f.span(),
            "'fabric' needs 'nvlink' on the same GPU (without NVLink there is no fabric)".into(),
        ));
    }
    if let Some(status) = &f.get_ref().status {
        if crate::resolve::fabric_status(status.get_ref()).is_none() {
            return Err(err(status.span(), unknown_code(status.get_ref())));
        }
    }
    Ok(())
}
