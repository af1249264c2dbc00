//! The rule files the configuration names, loaded and checked: plain data (groups, rules and
//! what their expressions select), read once at load time and shared by every evaluation.
//!
//! At the bottom of `rules/`, so that the configuration can hold it: it imports only the rule
//! file parser (`file`, `check`, `template`, `limits`), never the engine, the metrics or the
//! configuration.

use std::path::{Path, PathBuf};

use super::check::Needs;
use super::file::{self, Group, RuleError};

/// Every group of every configured rule file, checked.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    pub groups: Vec<Group>,
    /// The files loaded, with their contents, so that two configurations compare equal exactly
    /// when they would evaluate the same rules.
    sources: Vec<(PathBuf, String)>,
    pub needs: Needs,
}

impl PartialEq for RuleSet {
    fn eq(&self, other: &Self) -> bool {
        self.sources == other.sources
    }
}

impl RuleSet {
    /// Loads the files matching `patterns` (glob syntax, sorted, each file once). A pattern
    /// without wildcards must name an existing file; a pattern with wildcards may match none.
    pub fn load(patterns: &[String]) -> Result<RuleSet, RuleError> {
        let mut files: Vec<PathBuf> = Vec::new();
        for p in patterns {
            let error = |message: String| RuleError {
                file: p.clone(),
                line: 0,
                column: 0,
                message,
            };
            let matched: Vec<PathBuf> = glob::glob(p)
                .map_err(|e| error(format!("invalid pattern: {e}")))?
                .filter_map(Result::ok)
                .collect();
            if matched.is_empty() && !p.contains(['*', '?', '[']) {
                return Err(RuleError {
                    file: p.clone(),
                    line: 1,
                    column: 1,
                    message: "rule file not found; fix the path in [rules] files".into(),
                });
            }
            for f in matched {
                if !files.contains(&f) {
                    files.push(f);
                }
            }
        }
        let mut set = RuleSet::default();
        for f in files {
            let limits = crate::bounded::Limits::provided(super::MAX_RULE_FILE);
            let text = crate::bounded::read_to_string(&f, limits).map_err(|e| RuleError {
                file: f.display().to_string(),
                line: 1,
                column: 1,
                message: format!("cannot read: {}", e.problem),
            })?;
            set.add(&f, text)?;
        }
        Ok(set)
    }

    /// Adds one file's rules.
    pub fn add(&mut self, path: &Path, text: String) -> Result<(), RuleError> {
        let groups = file::parse(path, &text, &mut self.needs)?;
        self.groups.extend(groups);
        self.sources.push((path.to_path_buf(), text));
        Ok(())
    }

    pub fn rule_count(&self) -> usize {
        self.groups.iter().map(|g| g.rules.len()).sum()
    }

    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.sources.iter().map(|(p, _)| p.as_path())
    }

    /// One line per group, with its file and its alerts, for `check-config`.
    pub fn listing(&self) -> String {
        self.groups
            .iter()
            .map(|g| {
                let names: Vec<&str> = g.rules.iter().map(|r| r.name.as_str()).collect();
                format!(
                    "  {} group '{}': {}\n",
                    g.file.display(),
                    g.name,
                    if names.is_empty() {
                        "no rules".to_string()
                    } else {
                        names.join(", ")
                    }
                )
            })
            .collect()
    }
}
