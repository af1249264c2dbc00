//! The CDI check: with a CDI device list strategy, Allocate names devices `<kind>=<name>` and
//! the container runtime resolves them from the CDI spec files (`/etc/cdi`, `/var/run/cdi`);
//! a name in no spec fails the container in the runtime, long after the kubelet said yes. So
//! the plugin reads the specs and reports the names it advertises that no spec has.
//!
//! Read only: the spec is the job of `nvidia-ctk cdi generate` (or NVIDIA's
//! `nvidia-cdi-refresh` unit), never of the agent. Only `kind` and `devices[].name` are read;
//! a spec is JSON or YAML (JSON being YAML, one parser reads both), in files `*.json`,
//! `*.yaml`, `*.yml` directly in each directory, as the CDI cache reads them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::snapshot::CdiReport;

#[derive(Deserialize)]
struct Spec {
    kind: String,
    #[serde(default)]
    devices: Vec<SpecDevice>,
}

#[derive(Deserialize)]
struct SpecDevice {
    name: String,
}

/// The device names of `kind` found in `dirs` (fully qualified, `<kind>=<name>`), the files
/// they came from, and the files that could not be read.
#[derive(Debug, Default)]
pub struct Specs {
    pub names: BTreeSet<String>,
    pub files: Vec<PathBuf>,
    pub unreadable: Vec<String>,
}

/// Reads every spec in `dirs` (a missing directory is no error: most nodes have one of the two).
pub fn load(dirs: &[PathBuf], kind: &str) -> Specs {
    let mut specs = Specs::default();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("json" | "yaml" | "yml")
                )
            })
            .collect();
        paths.sort();
        for path in paths {
            match read(&path) {
                Ok(spec) if spec.kind == kind => {
                    specs.names.extend(
                        spec.devices
                            .into_iter()
                            .map(|d| format!("{kind}={}", d.name)),
                    );
                    specs.files.push(path);
                }
                Ok(_) => {}
                Err(e) => specs.unreadable.push(format!("{}: {e}", path.display())),
            }
        }
    }
    specs
}

fn read(path: &Path) -> Result<Spec, String> {
    // A spec is a few KiB; anything far larger is not one.
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if meta.len() > 4 << 20 {
        return Err(format!("{} bytes is too large for a CDI spec", meta.len()));
    }
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    serde_yaml::from_str(&text).map_err(|e| e.to_string())
}

/// The report for `wanted` (the CDI names Allocate would give) against `specs`.
pub fn report(kind: &str, specs: &Specs, wanted: &BTreeSet<String>) -> CdiReport {
    CdiReport {
        kind: kind.to_string(),
        spec_files: specs
            .files
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        missing_devices: wanted.difference(&specs.names).cloned().collect(),
        unreadable: specs.unreadable.clone(),
    }
}

/// One sentence for the log, `None` when every advertised device is in a spec.
pub fn problem(report: &CdiReport, dirs: &[PathBuf]) -> Option<String> {
    let dirs = dirs
        .iter()
        .map(|d| format!("'{}'", d.display()))
        .collect::<Vec<_>>()
        .join(" and ");
    if report.spec_files.is_empty() {
        return Some(format!(
            "no CDI spec of kind '{}' in {dirs}: containers allocated through CDI will get no \
             GPU; create it with `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml` \
             (or enable nvidia-cdi-refresh)",
            report.kind
        ));
    }
    if report.missing_devices.is_empty() {
        return None;
    }
    let mut shown: Vec<&str> = report
        .missing_devices
        .iter()
        .take(4)
        .map(String::as_str)
        .collect();
    if report.missing_devices.len() > 4 {
        shown.push("…");
    }
    Some(format!(
        "the CDI spec ({}) lacks {} advertised device(s): {}; their allocations will fail in \
         the runtime; regenerate it with `nvidia-ctk cdi generate` (after a MIG change too), \
         with --device-name-strategy matching device_id_strategy",
        report.spec_files.join(", "),
        report.missing_devices.len(),
        shown.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_json_and_yaml_specs_of_its_kind_and_names_what_is_missing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let other = dir.path().join("absent");
        std::fs::write(
            dir.path().join("nvidia.yaml"),
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits: {}\n- name: GPU-a\n  containerEdits: {}\n- name: all\n  containerEdits: {}\ncontainerEdits: {}\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join("other.json"),
            r#"{"cdiVersion":"0.6.0","kind":"vendor.com/net","devices":[{"name":"GPU-b"}]}"#,
        )
        .expect("write");
        std::fs::write(dir.path().join("broken.json"), "{not json").expect("write");
        std::fs::write(dir.path().join("notes.txt"), "ignored").expect("write");
        let dirs = vec![dir.path().to_path_buf(), other];
        let specs = load(&dirs, "nvidia.com/gpu");
        assert_eq!(specs.files, [dir.path().join("nvidia.yaml")]);
        assert_eq!(specs.unreadable.len(), 1, "{:?}", specs.unreadable);
        assert!(specs.unreadable[0].contains("broken.json"));
        let wanted: BTreeSet<String> = ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let r = report("nvidia.com/gpu", &specs, &wanted);
        assert_eq!(r.missing_devices, ["nvidia.com/gpu=GPU-b"]);
        let p = problem(&r, &dirs).expect("a problem");
        assert!(
            p.contains("lacks 1 advertised device(s): nvidia.com/gpu=GPU-b"),
            "{p}"
        );
        let all: BTreeSet<String> = ["nvidia.com/gpu=GPU-a".to_string()].into();
        assert_eq!(
            problem(&report("nvidia.com/gpu", &specs, &all), &dirs),
            None
        );
        let none = load(&dirs, "example.com/gpu");
        let p = problem(&report("example.com/gpu", &none, &all), &dirs).expect("missing");
        assert!(
            p.starts_with("no CDI spec of kind 'example.com/gpu' in"),
            "{p}"
        );
    }
}
