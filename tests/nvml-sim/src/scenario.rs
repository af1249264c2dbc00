//! The scenario file (CONTRACT §5, version 1): its serde shape, and strict validation that
//! reports the first problem as `LINE:COL: message` (1-based, from the TOML span of the
//! offending key or value, else the `[[gpu]]` table). Validation accepts exactly what the
//! contract allows; anything else (unknown keys, models, return-code or function names,
//! impossible memory or MIG layouts, out-of-range percentages...) is an error, so a typo in a
//! test scenario fails loudly instead of silently taking a default.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use crate::ffi::code_by_name;
use crate::models::{self, Model};
use crate::resolve::{self, Scenario};

/// A validation or syntax error, positioned in the scenario text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl ScenarioError {
    fn at(text: &str, span: Option<Range<usize>>, message: impl Into<String>) -> Self {
        let offset = span.map_or(0, |s| s.start).min(text.len());
        let before = &text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        ScenarioError {
            line,
            col,
            message: message.into(),
        }
    }

    /// The stderr line: `nvml-sim: FILE:LINE:COL: message`.
    pub fn render(&self, file: &str) -> String {
        format!(
            "nvml-sim: {file}:{}:{}: {}",
            self.line, self.col, self.message
        )
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScenario {
    version: Spanned<u32>,
    #[serde(default)]
    driver: Option<RawDriver>,
    #[serde(default)]
    gpu: Vec<Spanned<RawGpu>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDriver {
    version: Option<String>,
    cuda_version: Option<i32>,
    init_error: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryAction {
    #[default]
    None,
    GpuReset,
    NodeReboot,
    DrainP2p,
    DrainAndReset,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ProcessKind {
    #[default]
    Compute,
    Graphics,
}

/// Clock throttle / event reasons, with their `nvmlClocksEventReason*` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThrottleReason {
    GpuIdle = 0x1,
    ApplicationsClocksSetting = 0x2,
    SwPowerCap = 0x4,
    HwSlowdown = 0x8,
    SyncBoost = 0x10,
    SwThermalSlowdown = 0x20,
    HwThermalSlowdown = 0x40,
    HwPowerBrakeSlowdown = 0x80,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Ecc {
    pub sbe_volatile: u64,
    pub dbe_volatile: u64,
    pub sbe_aggregate: u64,
    pub dbe_aggregate: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetiredPages {
    pub sbe: u32,
    pub dbe: u32,
    pub pending: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGpu {
    pub model: Spanned<String>,
    pub count: Option<Spanned<u32>>,
    pub uuid: Option<Spanned<String>>,
    pub pci_bus_id: Option<Spanned<String>>,
    pub serial: Option<Spanned<String>>,
    pub mig_mode: Option<Spanned<bool>>,
    pub mig_devices: Option<Vec<Spanned<String>>>,
    pub power_limit_w: Option<Spanned<u32>>,
    pub lost: Option<bool>,
    pub recovery_action: Option<RecoveryAction>,
    pub unsupported: Option<Vec<Spanned<String>>>,
    pub errors: Option<BTreeMap<Spanned<String>, Spanned<String>>>,
    pub gpu_util_percent: Option<Spanned<u32>>,
    pub mem_util_percent: Option<Spanned<u32>>,
    pub enc_util_percent: Option<Spanned<u32>>,
    pub dec_util_percent: Option<Spanned<u32>>,
    pub memory_used_mib: Option<Spanned<u64>>,
    pub temperature_c: Option<u32>,
    pub memory_temperature_c: Option<u32>,
    pub power_w: Option<Spanned<f64>>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub pcie_tx_kib_s: Option<u32>,
    pub pcie_rx_kib_s: Option<u32>,
    pub pcie_replay_count: Option<u32>,
    pub fan_percent: Option<Spanned<u32>>,
    pub ecc: Option<Ecc>,
    pub remapped_rows: Option<Spanned<RemappedRows>>,
    pub retired_pages: Option<Spanned<RetiredPages>>,
    pub throttle_reasons: Option<Vec<ThrottleReason>>,
    #[serde(default)]
    pub process: Vec<Spanned<RawProcess>>,
    #[serde(default)]
    pub event: Vec<RawEvent>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProcess {
    pub pid: u32,
    #[serde(default)]
    pub kind: ProcessKind,
    #[serde(default)]
    pub used_memory_mib: u64,
    pub sm_util_percent: Option<Spanned<u32>>,
    pub mem_util_percent: Option<Spanned<u32>>,
    pub mig_device: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEvent {
    pub id: Spanned<u64>,
    pub xid: u64,
}

/// Parses and validates a scenario text into one resolved [`Scenario`].
pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
    let raw: RawScenario = toml::from_str(text)
        .map_err(|e| ScenarioError::at(text, e.span(), e.message().trim().to_owned()))?;
    let err = |span: Range<usize>, msg: String| ScenarioError::at(text, Some(span), msg);
    if *raw.version.get_ref() != 1 {
        return Err(err(
            raw.version.span(),
            format!(
                "unsupported scenario version {}; this simulator reads version 1",
                raw.version.get_ref()
            ),
        ));
    }
    let mut init_error = None;
    let (mut driver_version, mut cuda_version) = (String::from("580.95.05"), 13000);
    if let Some(d) = raw.driver {
        if let Some(v) = d.version {
            driver_version = v;
        }
        if let Some(c) = d.cuda_version {
            cuda_version = c;
        }
        if let Some(name) = d.init_error {
            let code = code_by_name(name.get_ref())
                .ok_or_else(|| err(name.span(), unknown_code(name.get_ref())))?;
            init_error = Some(code);
        }
    }
    let mut gpus = Vec::new();
    let mut spans = Vec::new();
    for entry in &raw.gpu {
        let g = entry.get_ref();
        let model = validate_gpu(g, &err)?;
        let count = g.count.as_ref().map_or(1, |c| *c.get_ref());
        if count == 0 {
            let span = g.count.as_ref().map_or(entry.span(), Spanned::span);
            return Err(err(span, "'count' must be at least 1".into()));
        }
        for _ in 0..count {
            let index = gpus.len() as u32;
            gpus.push(resolve::Gpu::build(index, model, g));
            spans.push(entry.span());
        }
    }
    if gpus.len() > crate::state::MAX_GPUS {
        return Err(err(
            0..0,
            format!("at most {} GPUs are supported", crate::state::MAX_GPUS),
        ));
    }
    let at = |(i, m): (usize, String)| err(spans[i].clone(), m);
    check_unique(&gpus, |g| g.uuid.clone(), "uuid").map_err(at)?;
    check_unique(&gpus, |g| g.serial.clone(), "serial").map_err(at)?;
    check_unique(&gpus, |g| g.pci.bus_id(), "pci_bus_id").map_err(at)?;
    Ok(Scenario {
        driver_version,
        cuda_version,
        init_error,
        gpus,
    })
}

fn unknown_code(name: &str) -> String {
    format!("unknown nvmlReturn_t name '{name}'; use a name such as 'UNKNOWN' or 'GPU_IS_LOST'")
}

fn check_unique(
    gpus: &[resolve::Gpu],
    key: impl Fn(&resolve::Gpu) -> String,
    what: &str,
) -> Result<(), (usize, String)> {
    let mut seen = BTreeSet::new();
    for (i, g) in gpus.iter().enumerate() {
        if !seen.insert(key(g)) {
            let msg = format!(
                "GPU {} repeats the {what} '{}' of an earlier GPU",
                g.index,
                key(g)
            );
            return Err((i, msg));
        }
    }
    Ok(())
}

type ErrAt<'a> = dyn Fn(Range<usize>, String) -> ScenarioError + 'a;

/// Checks one `[[gpu]]` entry against its model; returns the model.
fn validate_gpu(g: &RawGpu, err: &ErrAt<'_>) -> Result<&'static Model, ScenarioError> {
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
        if !model.mig_profiles.contains(&d.get_ref().as_str()) {
            return Err(err(
                d.span(),
                format!(
                    "'{}' is not a MIG profile of {}; use one of {}",
                    d.get_ref(),
                    model.key,
                    model.mig_profiles.join(", ")
                ),
            ));
        }
        compute_slices += d
            .get_ref()
            .split('g')
            .next()
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0);
        if compute_slices > 7 {
            return Err(err(
                d.span(),
                "MIG devices use more than the 7 compute slices".into(),
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
        let room = model.memory_total_mib - model.memory_reserved_mib;
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
    {
        if !crate::EXPORTED.contains(&f.get_ref().as_str()) {
            return Err(err(
                f.span(),
                format!("'{}' is not a function this library exports", f.get_ref()),
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

#[cfg(test)]
#[path = "scenario_tests.rs"]
mod tests;
