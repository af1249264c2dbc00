//! What the agent runs with, built one way at start, on SIGHUP and by `check-config`: the
//! configuration ([`crate::config::load`], plain data), then the rule files it names, loaded
//! beside it ([`RuleSet::load`]: bounded reads, positions in errors), then the rules against the
//! page: a rule on a series that this configuration leaves off the page would never fire, so it
//! is refused here, with the rule's position and what to do.
//!
//! Here, where both are known: the configuration imports no renderer and no rule engine; the
//! renderer's table of what it serves is [`left_out`]. Must not: evaluate anything.

use std::path::Path;
use std::sync::Arc;

use super::check::{check as check_expr, Needs};
use super::set::RuleSet;
use crate::config::{self, Config, ConfigError, Overrides};
use crate::metrics::left_out;

/// A configuration and the rules its `[rules] files` name, checked against the page it serves.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub rules: Arc<RuleSet>,
}

/// The one builder: `path` (with its drop-ins and `overrides`), its rule files, the check.
pub fn load(path: &Path, required: bool, overrides: &Overrides) -> Result<Loaded, ConfigError> {
    build(config::load(path, required, overrides)?)
}

/// The rules `config` names, loaded and checked against its page (what [`load`] does once the
/// file is read; public for tests and fuzzing that start from text).
pub fn build(config: Config) -> Result<Loaded, ConfigError> {
    let rules = if config.rule_files.is_empty() {
        RuleSet::default()
    } else {
        // Relative patterns are relative to the config file's directory (as Prometheus does).
        RuleSet::load(&config.rule_patterns()).map_err(|e| ConfigError::Invalid {
            file: e.file,
            line: e.line,
            column: e.column,
            message: e.message,
        })?
    };
    check(&config, &rules)?;
    Ok(Loaded {
        config,
        rules: Arc::new(rules),
    })
}

impl Loaded {
    /// `check-config`'s summary: the configuration's, with the rules loaded.
    pub fn describe(&self) -> String {
        self.config.describe(&self.rules_summary())
    }

    /// The alert rules loaded, one line per group.
    fn rules_summary(&self) -> String {
        let c = &self.config;
        if c.rule_files.is_empty() {
            return "alert rules: none ([rules] files)\n".to_string();
        }
        format!(
            "alert rules: {} rule(s) from {} file(s) matching {}\n{}",
            self.rules.rule_count(),
            self.rules.files().count(),
            c.rule_files
                .iter()
                .map(|p| format!("'{p}'"))
                .collect::<Vec<_>>()
                .join(", "),
            self.rules.listing()
        )
    }
}

/// The agent's rules read its own page: a rule on a series this profile and name set leave off
/// the page would never fire. Refused, with the rule's position and what to do.
pub fn check(c: &Config, rules: &RuleSet) -> Result<(), ConfigError> {
    let absent = left_out(
        c.metrics_dcgm,
        c.metrics_native,
        c.metrics_profile,
        c.dcgm_names,
    );
    for rule in rules.groups.iter().flat_map(|g| &g.rules) {
        let mut needs = Needs::default();
        // Checked when the file was read; here only for the names it collects.
        let _ = check_expr(&rule.expr, &mut needs);
        let mut names: Vec<&String> = needs.names.iter().collect();
        names.sort();
        if let Some(name) = names.into_iter().find(|n| absent.contains(&n.as_str())) {
            let mut parts = rule.origin.rsplitn(3, ':');
            let column = parts.next().and_then(|n| n.parse().ok()).unwrap_or(1);
            let line = parts.next().and_then(|n| n.parse().ok()).unwrap_or(1);
            let file = parts.next().unwrap_or(&rule.origin).to_string();
            return Err(ConfigError::Invalid {
                file,
                line,
                column,
                message: format!(
                    "rule '{}' reads '{name}', which this configuration does not serve \
                     ([metrics] profile = \"{}\", dcgm_names = \"{}\", dcgm = {}, native = {}): \
                     read the series the page has (docs/metrics.md, \"What lean leaves out\") \
                     or set profile = \"full\"",
                    rule.name,
                    c.metrics_profile.as_str(),
                    c.dcgm_names.as_str(),
                    c.metrics_dcgm,
                    c.metrics_native,
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_text;

    #[test]
    fn a_rule_on_a_left_out_series_is_refused_with_the_message_the_docs_show() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rules = dir.path().join("node.yml");
        std::fs::write(
            &rules,
            "groups:\n  - name: node\n    rules:\n      - alert: Hot\n        expr: gpu_steward_temperature_celsius > 85\n",
        )
        .expect("rules");
        let text = format!("[rules]\nfiles = [{:?}]\n", rules.display().to_string());
        let config = from_text("c.toml", &text, &Overrides::default()).expect("loads");
        let e = build(config).expect_err("refused").to_string();
        // The example in docs/rules.md, with this file's path.
        let docs = "/etc/gpu-steward/rules/node.yml:4:9: rule 'Hot' reads 'gpu_steward_temperature_celsius', which this configuration does not serve ([metrics] profile = \"lean\", dcgm_names = \"4.8\", dcgm = true, native = true): read the series the page has (docs/metrics.md, \"What lean leaves out\") or set profile = \"full\"";
        assert_eq!(
            e,
            docs.replace(
                "/etc/gpu-steward/rules/node.yml",
                &rules.display().to_string()
            )
        );
        let full = format!("{text}[metrics]\nprofile = \"full\"\n");
        let config = from_text("c.toml", &full, &Overrides::default()).expect("loads");
        assert_eq!(build(config).expect("loads").rules.rule_count(), 1);
    }
}
