//! Agent warnings: what a component that talks to the outside (the Slurm drain, the NVSentinel
//! connector, the journal file) currently cannot do, for `/health`'s `agent.warnings` and its
//! status (`warn` while any is set).
//!
//! Process-wide and keyed by component, like the audit log's health: a component sets its
//! warning when something fails and clears it when it works again. Must not: log (the component
//! words and logs its own failure once) or import anything of the crate.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

static WARNINGS: Mutex<BTreeMap<&'static str, String>> = Mutex::new(BTreeMap::new());

/// Sets (`Some`) or clears (`None`) the warning of `component`.
pub fn set(component: &'static str, warning: Option<String>) {
    let mut w = WARNINGS.lock().unwrap_or_else(PoisonError::into_inner);
    match warning {
        Some(text) => {
            w.insert(component, text);
        }
        None => {
            w.remove(component);
        }
    }
}

/// Every warning now set, by component.
pub fn all() -> BTreeMap<&'static str, String> {
    WARNINGS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_is_set_and_cleared_per_component() {
        set("test-a", Some("down".into()));
        set("test-b", Some("slow".into()));
        set("test-a", None);
        let now = all();
        assert!(!now.contains_key("test-a"));
        assert_eq!(now.get("test-b").map(String::as_str), Some("slow"));
        set("test-b", None);
    }
}
