//! The scenario file (version 1; keys in `nvml-sim/README.md`, examples in `tests/scenarios/`):
//! [`parse`] turns its text into one validated, resolved [`Scenario`], reporting the first
//! problem as `LINE:COL: message` (1-based, from the TOML span of the offending key or value,
//! else the `[[gpu]]` table). Validation accepts exactly what the format allows; anything else
//! (unknown keys, models, return-code or function names, impossible memory or MIG layouts,
//! out-of-range percentages...) is an error, so a typo in a test scenario fails loudly instead
//! of silently taking a default.
//!
//! This is the top of the scenario side: the serde shape is in [`crate::raw`], the per-entry
//! checks in `validate`, the resolution in [`crate::resolve`]. The public types of the format
//! are re-exported here, where they have always been reached.

use std::collections::BTreeSet;
use std::ops::Range;

use toml::Spanned;

use crate::error::unknown_code;
pub use crate::error::ScenarioError;
use crate::ffi::code_by_name;
use crate::raw::RawScenario;
pub use crate::raw::{
    ComputeModeName, Ecc, FabricHealthBit, FabricState, FaultCalls, ProcessKind, RawGpm,
    RecoveryAction, RemappedRows, RetiredPages, ThrottleReason, VirtualizationMode,
};
use crate::resolve::{self, Scenario};
use crate::validate::validate_gpu;

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
    // The driver of the real H100 and H200 captured in tests/data/real-h*.
    let (mut driver_version, mut cuda_version) = (String::from("580.159.04"), 13000);
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
    if gpus.len() > crate::handles::MAX_GPUS {
        return Err(err(
            0..0,
            format!("at most {} GPUs are supported", crate::handles::MAX_GPUS),
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

#[cfg(test)]
#[path = "scenario_tests.rs"]
mod tests;
