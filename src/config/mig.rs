//! `[mig]` in the agent's TOML config, and mig-parted's own YAML file.
//!
//! ```toml
//! [mig]
//! layout = "all-balanced"          # converge to it at start and on SIGHUP (optional)
//! mig_config = "/etc/nvidia-mig-manager/config.yaml"   # take layouts from mig-parted's file
//! reset_command = ["nvidia-smi", "-r", "-i", "{pci_bus_id}"]   # optional: after a mode change
//! reset_timeout = "120s"
//!
//! [[mig.hooks]]                    # pre-apply, post-apply, on-failure
//! name = "pre-apply"
//! command = ["/usr/lib/gpu-steward/hooks/drain.sh"]
//! timeout = "60s"
//!
//! [[mig.layouts.all-balanced]]     # mig-parted's keys, with its meaning
//! device-filter = ["0x233010DE"]
//! devices = "all"
//! mig-enabled = true
//! mig-devices = { "1g.10gb" = 2, "2g.20gb" = 1, "3g.40gb" = 1 }
//! ```
//!
//! Anything MIG changes is off unless configured: without `layout` the agent never touches MIG
//! on its own; the CLI and the API apply only what they are asked to.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::hooks::{CommandSpec, HookSection};
use super::mig_layout::Layouts;
use super::ConfigError;
use crate::bounded::{self, Limits};

/// The hook names `[[mig.hooks]]` accepts.
pub const HOOK_NAMES: [&str; 3] = ["pre-apply", "post-apply", "on-failure"];

/// `[mig]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MigSection {
    pub layout: Option<toml::Spanned<String>>,
    pub mig_config: Option<PathBuf>,
    #[serde(deserialize_with = "reset_command")]
    pub reset_command: Option<Vec<String>>,
    #[serde(deserialize_with = "duration")]
    pub reset_timeout: Option<Duration>,
    /// Spanned, so that a bad name is reported at its own `[[mig.hooks]]`, not the first.
    pub hooks: Vec<toml::Spanned<HookSection>>,
    pub layouts: Layouts,
}

/// The largest mig-parted file read: NVIDIA's published `config-default.yaml` (every layout of
/// every GPU it knows, tests/data/mig-parted) is 9.5 KiB.
pub const MAX_MIG_PARTED_FILE: u64 = 1 << 20;

/// `[mig]`, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MigConfig {
    /// The layout to converge to at start and on SIGHUP.
    pub layout: Option<String>,
    /// The mig-parted YAML file (`mig_config`) the layouts of [`MigConfig::parted`] came from.
    pub mig_config: Option<PathBuf>,
    /// The layouts of `mig_config`, read once when the configuration is loaded (at start, on
    /// SIGHUP, by `check-config`), never at apply time.
    pub parted: Layouts,
    pub reset: Option<CommandSpec>,
    pub hooks: Vec<CommandSpec>,
    pub layouts: Layouts,
}

impl MigConfig {
    pub fn hook(&self, name: &str) -> Option<&CommandSpec> {
        self.hooks.iter().find(|h| h.name == name)
    }

    /// One line for `check-config`.
    pub fn describe(&self) -> String {
        let mut names: Vec<&str> = self.layouts.keys().map(String::as_str).collect();
        if let Some(f) = &self.mig_config {
            names.push("(and the layouts of");
            names.push(f.to_str().unwrap_or("the mig_config file"));
            names.push(")");
        }
        let layouts = if names.is_empty() {
            "none".to_string()
        } else {
            names.join(" ")
        };
        match &self.layout {
            Some(l) => format!(
                "MIG: converge to layout '{l}' at start and on SIGHUP; layouts: {layouts}; \
                 hooks: {}; reset command: {}\n",
                self.hooks.len(),
                if self.reset.is_some() { "yes" } else { "none" }
            ),
            None => format!("MIG: never changed on its own; layouts: {layouts}\n"),
        }
    }

    /// Every layout: the `mig_config` file's (read at load) and `[mig.layouts]` (which win on a
    /// name clash).
    pub fn all_layouts(&self) -> Layouts {
        let mut all = self.parted.clone();
        all.extend(self.layouts.clone());
        all
    }
}

/// Default time a reset command may take.
pub const DEFAULT_RESET_TIMEOUT: Duration = Duration::from_secs(120);

impl MigSection {
    /// Checks what needs the whole section and the layouts of its mig-parted file (`parted`);
    /// `Err((byte offset, message))`.
    pub fn check(&self, parted: &Layouts) -> Result<(), (usize, String)> {
        for (i, h) in self.hooks.iter().enumerate() {
            let name = &h.get_ref().name;
            if !HOOK_NAMES.contains(&name.as_str()) {
                return Err((
                    h.span().start,
                    format!(
                        "MIG hook '{name}' is unknown; use one of {}",
                        HOOK_NAMES.join(", ")
                    ),
                ));
            }
            if self.hooks[..i].iter().any(|o| o.get_ref().name == *name) {
                return Err((
                    h.span().start,
                    format!("MIG hook '{name}' is given twice; keep one"),
                ));
            }
        }
        if let Some(l) = &self.layout {
            let name = l.get_ref();
            if !self.layouts.contains_key(name) && !parted.contains_key(name) {
                let mut known: Vec<&str> = self.layouts.keys().map(String::as_str).collect();
                known.extend(parted.keys().map(String::as_str));
                known.sort_unstable();
                let known = if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                };
                let message = match &self.mig_config {
                    None => format!(
                        "layout '{name}' is not defined; define [[mig.layouts.{name}]] or set \
                         mig_config to a mig-parted file (known: {known})"
                    ),
                    Some(f) => format!(
                        "layout '{name}' is not defined in [mig.layouts] nor in mig_config '{}'; \
                         define it in one of them (known: {known})",
                        f.display()
                    ),
                };
                return Err((l.span().start, message));
            }
        }
        Ok(())
    }

    /// The validated section, with the layouts of its mig-parted file (`parted`).
    pub fn into_config(self, parted: Layouts) -> MigConfig {
        MigConfig {
            layout: self.layout.map(toml::Spanned::into_inner),
            mig_config: self.mig_config,
            parted,
            reset: self.reset_command.map(|argv| CommandSpec {
                name: "mig-reset".into(),
                argv,
                timeout: self.reset_timeout.unwrap_or(DEFAULT_RESET_TIMEOUT),
            }),
            hooks: self.hooks.iter().map(|h| h.get_ref().spec()).collect(),
            layouts: self.layouts,
        }
    }
}

fn reset_command<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    if v.first().is_none_or(String::is_empty) {
        return Err(serde::de::Error::custom(
            "reset_command is empty; give the program and its arguments as a list, like \
             [\"nvidia-smi\", \"-r\", \"-i\", \"{pci_bus_id}\"]",
        ));
    }
    Ok(Some(v))
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    match humantime::parse_duration(&s) {
        Ok(t) if !t.is_zero() => Ok(Some(t)),
        _ => Err(serde::de::Error::custom(format!(
            "invalid duration '{s}'; write it like '120s' or '2m'"
        ))),
    }
}

/// mig-parted's file: `version: v1` and `mig-configs`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MigPartedFile {
    version: String,
    #[serde(rename = "mig-configs")]
    mig_configs: Layouts,
}

/// Reads a mig-parted YAML file through the bounded reader (a regular file of at most
/// [`MAX_MIG_PARTED_FILE`], read within its deadline: a FIFO or a device there is refused, not
/// waited on); errors are `FILE:LINE:COLUMN: message` or `FILE: cannot read: why`.
pub fn read_mig_parted(path: &Path) -> Result<Layouts, ConfigError> {
    let shown = path.display().to_string();
    let text =
        bounded::read_to_string(path, Limits::provided(MAX_MIG_PARTED_FILE)).map_err(|e| {
            ConfigError::Read {
                file: shown.clone(),
                source: e.into_io(),
            }
        })?;
    parse_mig_parted(&text).map_err(|(line, column, message)| ConfigError::Invalid {
        file: shown,
        line,
        column,
        message,
    })
}

/// Parses mig-parted YAML text; an error is its line, column and message.
pub fn parse_mig_parted(text: &str) -> Result<Layouts, (usize, usize, String)> {
    let f: MigPartedFile = serde_yaml::from_str(text).map_err(|e| {
        let (line, col) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
        (line, col, e.to_string())
    })?;
    if f.version != "v1" {
        let line = text
            .lines()
            .position(|l| l.trim_start().starts_with("version"))
            .map_or(1, |i| i + 1);
        return Err((
            line,
            1,
            format!(
                "version '{}' is not supported; mig-parted files say 'version: v1'",
                f.version
            ),
        ));
    }
    if f.mig_configs.is_empty() {
        return Err((
            1,
            1,
            "mig-configs is empty; define at least one layout".to_string(),
        ));
    }
    Ok(f.mig_configs)
}

#[cfg(test)]
mod tests {
    use super::super::mig_layout::Devices;
    use super::*;

    /// What the loader says of a bad file named `f.yaml`.
    fn parse_mig_parted_as(name: &str, text: &str) -> Result<Layouts, String> {
        parse_mig_parted(text).map_err(|(l, c, m)| format!("{name}:{l}:{c}: {m}"))
    }

    #[test]
    fn reads_mig_parted_files_with_positions() {
        let ok = "version: v1\nmig-configs:\n  a:\n    - devices: [0, 2]\n      mig-enabled: true\n      \
                  mig-devices:\n        \"1g.10gb\": 2\n    - device-filter: \"0x233010DE\"\n      \
                  devices: all\n      mig-enabled: false\n";
        let l = parse_mig_parted_as("f.yaml", ok).expect("valid");
        let a = &l["a"].entries;
        assert_eq!(a[0].devices, Devices::Indices(vec![0, 2]));
        assert_eq!(a[0].mig_devices["1g.10gb"], 2);
        assert_eq!(a[1].device_filter[0].device, 0x2330_10DE);

        let cases = [
            (ok.replace("v1", "v2"), "f.yaml:1:1: version 'v2'"),
            (ok.replace("devices: [0, 2]", "devices: some"), "f.yaml:4:"),
            (
                ok.replace("\"1g.10gb\"", "\"1x.10gb\""),
                "is not of the form",
            ),
            (
                ok.replace(
                    "mig-enabled: false",
                    "mig-enabled: false\n      mig-devices: {\"1g.10gb\": 1}",
                ),
                "mig-enabled is false",
            ),
            (
                ok.replace("devices: all", "devices: all\n      colour: red"),
                "unknown field `colour`",
            ),
            (ok.replace("0x233010DE", "0x2330"), "is not a PCI id"),
        ];
        for (text, want) in cases {
            let e = parse_mig_parted_as("f.yaml", &text).expect_err(want);
            assert!(e.contains(want), "{e} should contain {want}");
            assert!(e.starts_with("f.yaml:"), "{e}");
        }
    }

    #[test]
    fn reads_the_published_files() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mig-parted");
        for f in ["examples-config.yaml", "config-default.yaml"] {
            let l = read_mig_parted(&dir.join(f)).expect("mig-parted's own files parse");
            assert!(l.contains_key("all-balanced"), "{f}");
        }
    }

    /// Issue [25/28] (and [26/28]'s "Also"): the file is read once, at load, through the bounded
    /// reader. A FIFO at `mig_config` is refused at once (it used to hang `check-config`); a bad
    /// file is refused at load with its position, not at the first apply; a layout it lacks is
    /// refused at `[mig] layout`.
    #[test]
    fn the_mig_parted_file_is_read_at_load_and_a_fifo_there_is_refused() {
        use crate::config::{from_text, Overrides};
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("config.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let toml = |path: &Path, layout: &str| {
            format!(
                "[mig]\n{layout}mig_config = {:?}\n",
                path.display().to_string()
            )
        };
        let t = std::time::Instant::now();
        let e = from_text("c.toml", &toml(&fifo, ""), &Overrides::default())
            .expect_err("a FIFO is no mig-parted file")
            .to_string();
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "waited {:?}",
            t.elapsed()
        );
        assert!(e.contains("cannot read") && e.contains("FIFO"), "{e}");

        let bad = dir.path().join("bad.yaml");
        std::fs::write(
            &bad,
            "version: v1\nmig-configs:\n  a:\n    - devices: some\n",
        )
        .expect("write");
        let e = from_text("c.toml", &toml(&bad, ""), &Overrides::default())
            .expect_err("refused at load")
            .to_string();
        assert!(e.starts_with(&format!("{}:4:", bad.display())), "{e}");

        let published =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mig-parted/config-default.yaml");
        let c = from_text(
            "c.toml",
            &toml(&published, "layout = \"all-balanced\"\n"),
            &Overrides::default(),
        )
        .expect("a layout of the file");
        assert!(c.mig.parted.contains_key("all-balanced"));
        assert!(c.mig.all_layouts().contains_key("all-1g.10gb"));
        let e = from_text(
            "c.toml",
            &toml(&published, "layout = \"no-such\"\n"),
            &Overrides::default(),
        )
        .expect_err("a layout the file lacks")
        .to_string();
        assert!(
            e.starts_with(
                "c.toml:2:10: layout 'no-such' is not defined in [mig.layouts] nor in mig_config"
            ),
            "{e}"
        );
    }
}
