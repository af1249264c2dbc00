//! The rules against the page: a rule on a series that this configuration leaves off the page
//! would never fire, so it is refused when the configuration is loaded (at start, on reload and
//! by `check-config`), with the rule's position and what to do.
//!
//! Here, where both are known: the configuration (which holds the loaded rules) stays plain data
//! and imports no renderer; the renderer's table of what it serves is [`left_out`]. Must not:
//! evaluate anything, or read files.

use super::check::{check as check_expr, Needs};
use crate::config::{Config, ConfigError};
use crate::metrics::left_out;

/// The agent's rules read its own page: a rule on a series this profile and name set leave off
/// the page would never fire. Refused, with the rule's position and what to do.
pub fn check(c: &Config) -> Result<(), ConfigError> {
    let absent = left_out(
        c.metrics_dcgm,
        c.metrics_native,
        c.metrics_profile,
        c.dcgm_names,
    );
    for rule in c.rules.groups.iter().flat_map(|g| &g.rules) {
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

/// `config`, if its rules read only series that its page serves: what the daemon (at start and
/// on reload) and `check-config` load.
pub fn checked(config: Config) -> Result<Config, ConfigError> {
    check(&config)?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{from_text, Overrides};

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
        let e = check(&config).expect_err("refused").to_string();
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
        assert!(checked(config).is_ok());
    }
}
