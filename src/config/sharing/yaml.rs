//! A reader for k8s-device-plugin's own config file (YAML, `version: v1`), so that a node moving
//! from NVIDIA's plugin keeps its ConfigMap: only `sharing.timeSlicing` is read; `flags` and the
//! rest are NVIDIA-specific and ignored. Keys inside `sharing` are checked strictly, and every
//! error names the file, line and column (format: NVIDIA/k8s-device-plugin `api/config/v1/`).

use std::path::Path;

use serde::{de, Deserialize, Deserializer};

use super::section::{checked_resources, replicas, DevicesSpec};
use super::{Devices, SharedResource, TimeSlicing};

/// Why the YAML file cannot be used; `line`/`column` are 1-based (0 when unknown).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct YamlError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

#[derive(Deserialize)]
struct PluginConfig {
    #[serde(default, deserialize_with = "version")]
    #[allow(dead_code)] // checked while parsing
    version: Option<String>,
    #[serde(default)]
    sharing: Option<Sharing>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Sharing {
    #[serde(default)]
    time_slicing: Option<TimeSlicingYaml>,
    #[serde(default, deserialize_with = "mps")]
    #[allow(dead_code)] // refused while parsing
    mps: Option<()>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TimeSlicingYaml {
    #[serde(default)]
    rename_by_default: bool,
    #[serde(default)]
    fail_requests_greater_than_one: bool,
    #[serde(deserialize_with = "resources")]
    resources: Vec<SharedResource>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ResourceYaml {
    name: String,
    #[serde(deserialize_with = "replicas")]
    replicas: u32,
    /// Parsed and ignored, as k8s-device-plugin ignores it (`renameByDefault` decides).
    #[serde(default)]
    #[allow(dead_code)]
    rename: Option<String>,
    #[serde(default)]
    devices: Option<DevicesSpec>,
}

fn version<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v = String::deserialize(d)?;
    if v == "v1" {
        Ok(Some(v))
    } else {
        Err(de::Error::custom(format!(
            "unknown config version '{v}'; k8s-device-plugin configs are version v1"
        )))
    }
}

fn mps<'de, D: Deserializer<'de>>(d: D) -> Result<Option<()>, D::Error> {
    let v = serde_yaml::Value::deserialize(d)?;
    if v.is_null() {
        return Ok(None);
    }
    Err(de::Error::custom(
        "sharing.mps is not supported by gpu-steward (it shares by time-slicing only); remove \
         it or keep NVIDIA's plugin for MPS",
    ))
}

fn resources<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SharedResource>, D::Error> {
    let raw = Vec::<ResourceYaml>::deserialize(d)?;
    checked_resources(raw.into_iter().map(|r| SharedResource {
        name: r.name,
        replicas: r.replicas,
        devices: r.devices.map_or(Devices::All, |d| d.0),
        memory_per_replica: None,
    }))
    .map_err(de::Error::custom)
}

/// Parses the text of a k8s-device-plugin config; `name` is used in errors. `Ok(None)` when
/// it has no `sharing.timeSlicing`.
pub fn parse(name: &str, text: &str) -> Result<Option<TimeSlicing>, YamlError> {
    let c: PluginConfig = serde_yaml::from_str(text).map_err(|e| {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        // serde_yaml prefixes its own position ("at line 3 column 5"); ours is in front.
        let message = e.to_string();
        let message = match message.rfind(" at line ") {
            Some(i) if line > 0 => message[..i].to_string(),
            _ => message,
        };
        YamlError {
            file: name.to_string(),
            line,
            column,
            message,
        }
    })?;
    Ok(c.sharing.and_then(|s| s.time_slicing).map(|t| TimeSlicing {
        rename_by_default: t.rename_by_default,
        fail_requests_greater_than_one: t.fail_requests_greater_than_one,
        resources: t.resources,
    }))
}

/// The largest device-plugin config read (NVIDIA's examples are under 2 KiB).
pub const MAX_FILE: u64 = 1 << 20;

/// Reads the file at `path` (see [`parse`]) through the bounded reader: a regular file within
/// [`MAX_FILE`] and its deadline (a FIFO or a device there is refused, never waited on).
pub fn read(path: &Path) -> Result<Option<TimeSlicing>, YamlError> {
    let name = path.display().to_string();
    let limits = crate::bounded::Limits::provided(MAX_FILE);
    let text = crate::bounded::read_to_string(path, limits).map_err(|e| YamlError {
        file: name.clone(),
        line: 0,
        column: 0,
        message: format!("cannot read k8s-device-plugin config: {e}"),
    })?;
    parse(&name, &text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::sharing::GpuSelector;

    const NVIDIA: &str = r#"version: v1
flags:
  migStrategy: none
  plugin:
    deviceIDStrategy: uuid
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
    - name: nvidia.com/mig-1g.10gb
      replicas: 2
      devices: [0, "GPU-abc"]
"#;

    #[test]
    fn reads_nvidia_time_slicing() {
        let t = parse("c.yaml", NVIDIA)
            .expect("valid")
            .expect("has timeSlicing");
        assert!(t.rename_by_default && t.fail_requests_greater_than_one);
        assert_eq!(t.resources.len(), 2);
        assert_eq!(t.resources[0].replicas, 4);
        assert_eq!(t.resources[0].devices, Devices::All);
        assert_eq!(t.advertised_name(&t.resources[0]), "nvidia.com/gpu.shared");
        assert_eq!(
            t.resources[1].devices,
            Devices::List(vec![
                GpuSelector::Index(0),
                GpuSelector::Uuid("GPU-abc".into())
            ])
        );
        assert_eq!(parse("c.yaml", "version: v1\nflags: {}\n"), Ok(None));
    }

    #[test]
    fn errors_have_positions_and_say_what_to_do() {
        let e = parse("c.yaml", &NVIDIA.replace("replicas: 4", "replicas: 1"))
            .expect_err("one replica is no sharing");
        // serde_yaml places errors of a value at the start of the entry that holds it.
        assert_eq!((e.line, e.column), (11, 7), "{e}");
        assert!(
            e.message
                .starts_with("sharing.timeSlicing.resources[0]: replicas 1 is out of range"),
            "{e}"
        );
        let e = parse(
            "c.yaml",
            &NVIDIA.replace("renameByDefault", "renameByDefualt"),
        )
        .expect_err("typo");
        assert_eq!(e.line, 8, "{e}");
        assert!(e.message.contains("unknown field `renameByDefualt`"), "{e}");
        let e = parse("c.yaml", "version: v2\n").expect_err("v2");
        assert!(e.to_string().starts_with("c.yaml:1:"), "{e}");
        let e = parse(
            "c.yaml",
            "sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
        )
        .expect_err("mps");
        assert!(e.message.contains("mps is not supported"), "{e}");
        let e = parse(
            "c.yaml",
            "sharing:\n  timeSlicing:\n    resources:\n    - name: amd.com/gpu\n      replicas: 2\n",
        )
        .expect_err("name");
        assert!(e.message.contains("unknown resource 'amd.com/gpu'"), "{e}");
        assert!(e.line >= 3, "{e}");
    }

    /// Issue [25/28]: a FIFO as the device plugin's config is refused at load, not waited on.
    #[test]
    fn a_fifo_as_the_plugin_config_is_refused_not_waited_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("plugin.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let t = std::time::Instant::now();
        let e = read(&fifo).expect_err("a FIFO is no config");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            t.elapsed()
        );
        assert!(e.message.contains("FIFO"), "{}", e.message);
    }
}
