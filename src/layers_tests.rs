//! The import rules that docs/architecture.md states, checked against the source: each rule
//! names a folder or file and the modules of the crate it must not import, so that the page
//! stays true as the code changes. Reads the source text; runs nothing of the agent.
//!
//! A path is taken as written (`crate::metrics`, or `crate::{metrics, ...}`); comments are
//! skipped. `super::` reaches only inside a folder, which these rules do not restrict.

use std::path::{Path, PathBuf};

/// (folder or file under `src/`, modules it must not import, why).
const RULES: &[(&str, &[&str], &str)] = &[
    (
        "metrics",
        &[
            "rules",
            "remediation",
            "reclaim",
            "sharing",
            "mig",
            "poller",
            "http",
            "app",
            "cli",
        ],
        "the renderer knows no actor: actors hand it collectors",
    ),
    (
        "poller",
        &[
            "rules",
            "remediation",
            "reclaim",
            "sharing",
            "mig",
            "http",
            "app",
            "cli",
        ],
        "the poller calls no actor",
    ),
    (
        "publication.rs",
        &[
            "metrics",
            "poller",
            "rules",
            "remediation",
            "reclaim",
            "sharing",
            "mig",
            "http",
            "config",
        ],
        "the publication is data at the bottom",
    ),
    (
        "snapshot",
        &[
            "metrics",
            "poller",
            "rules",
            "remediation",
            "reclaim",
            "sharing",
            "mig",
            "http",
            "config",
        ],
        "the snapshot is data at the bottom",
    ),
    (
        "mig",
        &["changes", "http", "app", "cli"],
        "MIG's planner and applier are building blocks the owner of changes runs",
    ),
    (
        "gpu",
        &["changes", "mig", "sharing", "poller", "http", "app", "cli"],
        "the NVML boundary knows nobody who calls it",
    ),
    (
        "audit",
        &[
            "changes",
            "mig",
            "sharing",
            "reclaim",
            "remediation",
            "slurm",
        ],
        "the audit log is written through the owner of changes and knows none of its users",
    ),
    (
        "reclaim/jobs",
        &[
            "gpu",
            "poller",
            "changes",
            "audit",
            "metrics",
            "rules",
            "remediation",
            "sharing",
            "mig",
            "http",
            "app",
            "cli",
        ],
        "the job reports fold what the poller published, with the reclaim steps handed to them: \
         no NVML call, no change, no other actor",
    ),
    (
        "sharing/apply.rs",
        &["changes"],
        "the sharing applier is a building block the owner of changes runs",
    ),
    (
        "slurm/drain.rs",
        &["changes"],
        "the Slurm drainer is a building block the owner of changes runs",
    ),
    (
        "otlp",
        &[
            "gpu",
            "poller",
            "changes",
            "rules",
            "remediation",
            "reclaim",
            "sharing",
            "mig",
            "http",
            "app",
            "cli",
        ],
        "the OTLP exporter reads publications only: no NVML call, no actor, nothing that acts",
    ),
];

/// Where the audit log may be opened for writing: its own module, and the owner of changes,
/// which holds the one writer of the process (test code aside).
const AUDIT_WRITERS: &[&str] = &["audit.rs", "audit/", "changes/"];

/// Folders that may import only what is listed (a path of the crate, or its prefix), besides
/// themselves: (folder, allowed, why).
const ONLY: &[(&str, &[&str], &str)] = &[
    (
        "config",
        &["config", "bounded", "snapshot", "human"],
        "config is plain data: every section type lives in it, and it imports no subsystem \
         (a subsystem imports its section from config)",
    ),
    (
        "changes",
        &[
            "changes",
            "audit",
            "gpu",
            "mig",
            "config::mig",
            "config::mig_layout",
        ],
        "the owner of changes runs the building blocks below it and is given its settings and \
         its waker: it imports no poller, no Config and no actor (only the [mig] section it \
         applies)",
    ),
];

fn rust_files(at: &Path, out: &mut Vec<PathBuf>) {
    if at.is_file() {
        out.push(at.to_path_buf());
        return;
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(at)
        .expect("a source folder")
        .map(|e| e.expect("an entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() || p.extension().is_some_and(|e| e == "rs") {
            rust_files(&p, out);
        }
    }
}

/// Every `crate::` path a line names, one module path each (`crate::{a, b::c}` gives both).
fn crate_paths(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or("");
            out.extend(inner.split(',').map(|p| p.trim().to_string()));
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            out.push(rest[..end].to_string());
        }
    }
    out
}

#[test]
fn every_layer_imports_only_what_stands_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for (place, denied, why) in RULES {
        let mut files = Vec::new();
        rust_files(&src.join(place), &mut files);
        assert!(!files.is_empty(), "{place}: no source found");
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a source file");
            for (n, line) in text.lines().enumerate() {
                for path in crate_paths(line) {
                    let hit = denied.iter().any(|d| {
                        path == d.trim_end_matches("::")
                            || path.starts_with(&format!("{}::", d.trim_end_matches("::")))
                    });
                    if hit {
                        broken.push(format!(
                            "{}:{}: imports 'crate::{path}' ({why})",
                            file.strip_prefix(&src).unwrap_or(&file).display(),
                            n + 1
                        ));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn config_and_changes_import_only_what_they_are_allowed() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for (place, allowed, why) in ONLY {
        let mut files = Vec::new();
        rust_files(&src.join(place), &mut files);
        assert!(!files.is_empty(), "{place}: no source found");
        for file in files {
            let rel = file
                .strip_prefix(&src)
                .unwrap_or(&file)
                .display()
                .to_string();
            if rel.ends_with("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).expect("a source file");
            // Unit tests at the end of a file may use what they like.
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for (n, line) in code.lines().enumerate() {
                for path in crate_paths(line) {
                    let ok = allowed
                        .iter()
                        .any(|a| path == *a || path.starts_with(&format!("{a}::")));
                    if !ok {
                        broken.push(format!("{rel}:{}: imports 'crate::{path}' ({why})", n + 1));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn only_the_owner_of_changes_opens_the_audit_log() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut broken = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(&src)
            .unwrap_or(&file)
            .display()
            .to_string();
        if AUDIT_WRITERS.iter().any(|w| rel.starts_with(w)) || rel.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a source file");
        // Test modules at the end of a file may open logs of their own.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (n, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or("");
            if line.contains("AuditLog::open") || line.contains("AuditLog {") {
                broken.push(format!("{rel}:{}: opens the audit log", n + 1));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "every record goes through crate::changes::Owner (one writer):\n{}",
        broken.join("\n")
    );
}

#[test]
fn grouped_and_nested_paths_are_read() {
    assert_eq!(
        crate_paths("use crate::{metrics, rules::set::RuleSet}; // crate::http"),
        ["metrics", "rules::set::RuleSet"]
    );
    assert_eq!(
        crate_paths("    let a = crate::metrics::left_out(x);"),
        ["metrics::left_out"]
    );
}
