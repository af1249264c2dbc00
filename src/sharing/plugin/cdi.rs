//! The CDI check: with a CDI device list strategy, Allocate names devices `<kind>=<name>` and
//! the container runtime resolves them from the CDI spec files (`/etc/cdi`, `/var/run/cdi`);
//! a name in no spec fails the container in the runtime, long after the kubelet said yes. So
//! the plugin reads the specs and reports the names it advertises that no spec has.
//!
//! Read only: the spec is the job of `nvidia-ctk cdi generate` (or NVIDIA's
//! `nvidia-cdi-refresh` unit), never of the agent. Only `kind` and `devices[].name` are read;
//! a spec is JSON or YAML, in files `*.json`, `*.yaml`, `*.yml` directly in each directory, as
//! the CDI cache reads them.
//!
//! The spec directories are written by other programs, so every read is bounded: a regular
//! file only (a FIFO or a link to `/dev/zero` is refused, never waited on or read forever), at
//! most [`MAX_SPEC_BYTES`] per file and [`MAX_SPECS_PER_DIR`] files per directory, and a nesting
//! depth checked before parsing ([`MAX_DEPTH`]): libyaml's scanner pays for every token once
//! per open flow level, so 200 KB of `[[[[…` cost seconds of CPU. A JSON spec (or JSON in a
//! `.yaml` file) goes to serde_json first: linear, it skips unknown keys without recursing and
//! stops at 128 levels where it does recurse. Each refusal
//! names the file, the limit and what to do, in the log and in `/api/v1/sharing`
//! (`cdi.unreadable`); the other specs are still read and the plugin keeps serving.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::bounded;
use crate::snapshot::CdiReport;

/// The largest spec file read. `nvidia-ctk cdi generate` writes a few KiB per GPU (device
/// nodes, library mounts, hooks); a megabyte is far beyond any node.
pub const MAX_SPEC_BYTES: u64 = 1 << 20;
/// The most spec files read from one directory (by name order); the CDI cache has no limit,
/// but a node has a handful (one per vendor and generator).
pub const MAX_SPECS_PER_DIR: usize = 64;
/// The most directory entries looked at in one directory, spec or not.
const MAX_ENTRIES_PER_DIR: usize = 4096;
/// The deepest nesting of `[` and `{` accepted in a YAML spec. A CDI spec nests about 5 deep
/// (spec, devices, containerEdits, mounts, options); serde_yaml itself stops at 128, but only
/// after libyaml has scanned the whole file.
pub const MAX_DEPTH: usize = 64;

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
        let mut seen = 0;
        let mut paths: Vec<PathBuf> = entries
            .take(MAX_ENTRIES_PER_DIR)
            .inspect(|_| seen += 1)
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("json" | "yaml" | "yml")
                )
            })
            .collect();
        paths.sort();
        if seen == MAX_ENTRIES_PER_DIR || paths.len() > MAX_SPECS_PER_DIR {
            specs.unreadable.push(format!(
                "{}: more than {MAX_SPECS_PER_DIR} spec files (or {MAX_ENTRIES_PER_DIR} entries); \
                 only the first {MAX_SPECS_PER_DIR} by name were read; remove stale specs",
                dir.display()
            ));
            paths.truncate(MAX_SPECS_PER_DIR);
        }
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
                Err(e) => specs.unreadable.push(e),
            }
        }
    }
    specs
}

/// One spec file, bounded; the error names the file, the limit and what to do.
fn read(path: &Path) -> Result<Spec, String> {
    let text = bounded::read_to_string(path, bounded::Limits::provided(MAX_SPEC_BYTES))
        .map_err(|e| format!("{e} (CDI specs are read up to {MAX_SPEC_BYTES} bytes)"))?;
    parse(&text, path.extension().is_some_and(|e| e == "json"))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// A spec from its text: JSON (a `.json` file, or a YAML file holding JSON) by serde_json,
/// anything else by serde_yaml once its nesting is known to be shallow.
fn parse(text: &str, json_file: bool) -> Result<Spec, String> {
    let looks_json = text.trim_start().starts_with('{');
    if json_file || looks_json {
        match serde_json::from_str(text) {
            Ok(spec) => return Ok(spec),
            Err(e) if json_file || e.to_string().contains("recursion limit") => {
                return Err(format!("is not a valid CDI spec: {e}"))
            }
            // YAML's flow style is wider than JSON: let the YAML parser try.
            Err(_) => {}
        }
    }
    let depth = flow_depth(text);
    if depth > MAX_DEPTH {
        return Err(format!(
            "nests '[' and '{{' {depth} deep, over the limit of {MAX_DEPTH}; this is not a CDI \
             spec: regenerate it with `nvidia-ctk cdi generate`"
        ));
    }
    serde_yaml::from_str(text).map_err(|e| format!("is not a valid CDI spec: {e}"))
}

/// The deepest nesting of YAML flow collections (`[`, `{`) in `text`, outside quoted scalars
/// and comments as YAML's scanner finds them: a quote opens a scalar only where a token starts
/// (after white space, a flow indicator or `:`), a `#` starts a comment only after white space.
/// Linear, no allocation. A lexical guard, not a parser: it bounds what ordinary files (and
/// accidents such as a runaway generator) cost libyaml; the spec directories are root's.
fn flow_depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut quote: Option<u8> = None;
    let mut comment = false;
    let mut escaped = false;
    // Just after a single-quoted scalar: a second `'` is the `''` escape, still inside it.
    let mut closed_single = false;
    let mut prev = b'\n';
    for &c in text.as_bytes() {
        let reopen = std::mem::take(&mut closed_single) && c == b'\'';
        if comment {
            comment = c != b'\n';
        } else if reopen {
            quote = Some(c);
        } else if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if q == b'"' && c == b'\\' {
                escaped = true;
            } else if c == q {
                quote = None;
                closed_single = q == b'\'';
            }
        } else {
            let token_start = prev.is_ascii_whitespace() || b"[{,:".contains(&prev);
            match c {
                b'"' | b'\'' if token_start => quote = Some(c),
                b'#' if prev.is_ascii_whitespace() => comment = true,
                b'[' | b'{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        prev = c;
    }
    deepest
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

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).expect("write");
    }

    const GOOD: &str =
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: GPU-a\n  containerEdits: {}\n";

    /// The unreadable entry that names `file`.
    fn refusal<'a>(specs: &'a Specs, file: &str) -> &'a str {
        specs
            .unreadable
            .iter()
            .find(|u| u.contains(file))
            .unwrap_or_else(|| panic!("no refusal of {file}: {:?}", specs.unreadable))
    }

    #[test]
    fn a_fifo_a_link_to_dev_zero_and_a_huge_file_are_refused_by_name_and_the_rest_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "nvidia.yaml", GOOD);
        nix::unistd::mkfifo(
            &dir.path().join("fifo.yaml"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .expect("mkfifo");
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.json")).expect("symlink");
        let huge = format!("{GOOD}# {}\n", "x".repeat(MAX_SPEC_BYTES as usize));
        write(dir.path(), "huge.yaml", &huge);
        let specs = load(&[dir.path().to_path_buf()], "nvidia.com/gpu");
        assert_eq!(specs.files, [dir.path().join("nvidia.yaml")]);
        assert!(specs.names.contains("nvidia.com/gpu=GPU-a"));
        assert_eq!(specs.unreadable.len(), 3, "{:?}", specs.unreadable);
        assert!(refusal(&specs, "fifo.yaml").contains("is a FIFO, not a regular file"));
        assert!(refusal(&specs, "zero.json").contains("is a character device"));
        let big = refusal(&specs, "huge.yaml");
        assert!(
            big.contains(&format!(
                "is {} bytes, over the limit of {MAX_SPEC_BYTES} bytes",
                huge.len()
            )),
            "{big}"
        );
    }

    #[test]
    fn deeply_nested_specs_are_refused_before_the_yaml_parser_sees_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        // 200 KB each, as in the report: YAML flow sequences, JSON objects, YAML flow maps.
        let n = 200_000;
        write(dir.path(), "seq.yaml", &"[".repeat(n));
        write(dir.path(), "obj.json", &r#"{"a":"#.repeat(n / 5));
        write(dir.path(), "map.yaml", &"{a: ".repeat(n / 4));
        // JSON in a YAML file goes to the JSON parser first.
        write(dir.path(), "obj.yaml", &r#"{"a":"#.repeat(n / 5));
        let started = std::time::Instant::now();
        let specs = load(&[dir.path().to_path_buf()], "nvidia.com/gpu");
        let took = started.elapsed();
        // The figure for docs/sharing.md; no assertion on time (a loaded machine is slow).
        eprintln!("four 200 KB nested specs refused in {took:?}");
        assert!(specs.files.is_empty());
        assert_eq!(specs.unreadable.len(), 4, "{:?}", specs.unreadable);
        // YAML, and JSON the JSON parser refused, by the depth guard.
        for f in ["seq.yaml", "map.yaml", "obj.yaml"] {
            let r = refusal(&specs, f);
            assert!(r.contains("deep, over the limit of 64"), "{r}");
        }
        // serde_json skips the unknown key `a` without recursing and finds the end missing.
        let r = refusal(&specs, "obj.json");
        assert!(
            r.contains("is not a valid CDI spec: EOF while parsing"),
            "{r}"
        );
    }

    #[test]
    fn the_depth_guard_skips_quotes_and_comments_as_yaml_does() {
        assert_eq!(flow_depth(GOOD), 1);
        assert_eq!(
            flow_depth("args: [\"[[[\", '{{{', it's, a]  # [[[[\nx: [[1]]\n"),
            2
        );
        assert_eq!(flow_depth("a: \"\\\"[[\"\nb: 'it''s [['\n"), 0);
        // A spec of realistic shape, JSON or YAML, parses.
        let json = r#"{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0"}]}}],"containerEdits":{"hooks":[{"hookName":"createContainer","path":"/usr/bin/nvidia-cdi-hook","args":["nvidia-cdi-hook","update-ldcache"]}]}}"#;
        assert_eq!(parse(json, true).expect("json").devices[0].name, "0");
        assert_eq!(
            parse(json, false).expect("json in yaml").kind,
            "nvidia.com/gpu"
        );
        assert_eq!(parse(GOOD, false).expect("yaml").devices[0].name, "GPU-a");
    }

    #[test]
    fn only_the_first_specs_of_a_crowded_directory_are_read_and_that_is_said() {
        let dir = tempfile::tempdir().expect("tempdir");
        for i in 0..=MAX_SPECS_PER_DIR {
            let text = GOOD.replace("GPU-a", &format!("GPU-{i:03}"));
            write(dir.path(), &format!("s{i:03}.yaml"), &text);
        }
        let specs = load(&[dir.path().to_path_buf()], "nvidia.com/gpu");
        assert_eq!(specs.files.len(), MAX_SPECS_PER_DIR);
        assert!(!specs
            .names
            .contains(&format!("nvidia.com/gpu=GPU-{MAX_SPECS_PER_DIR:03}")));
        assert_eq!(specs.unreadable.len(), 1, "{:?}", specs.unreadable);
        assert!(specs.unreadable[0].contains("more than 64 spec files"));
    }
}
