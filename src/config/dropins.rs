//! Drop-in files: `config.d/*.toml` beside the config file, merged over it in name order.
//!
//! Packaging composes a configuration out of parts (a Kubernetes component adds the device
//! plugin's keys, another turns the kubelet client off) without rewriting one shared file, as
//! systemd's `*.d/` directories do. Tables merge key by key; a key set again (a value, an array,
//! an array of tables) replaces the earlier one. Each drop-in is first checked on its own, so an
//! unknown key or a bad value is reported at its own file, line and column; what only the merged
//! whole can tell (a route naming a hook defined in another file) is reported against the merged
//! text, which the error says.
//!
//! This module reads and merges text; it must not interpret the configuration.

use std::path::{Path, PathBuf};

use super::file::FileConfig;
use super::ConfigError;
use crate::bounded::{self, Limits};

/// The largest config file or drop-in read.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// The most drop-ins read; more is an error.
pub const MAX_DROPINS: usize = 64;

/// The configuration text to parse, and the name its errors carry.
#[derive(Debug)]
pub struct Source {
    pub name: String,
    pub text: String,
}

/// The drop-in directory of a config file: `config.d` beside it.
pub fn directory(config_file: &Path) -> PathBuf {
    config_file
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("config.d")
}

/// The drop-ins of `config_file`, sorted by name: `*.toml` in its `config.d`, hidden files
/// (a ConfigMap volume's `..data`) left out. A missing directory has none.
pub fn list(config_file: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let dir = directory(config_file);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ConfigError::Read {
                file: dir.display().to_string(),
                source,
            })
        }
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !name.starts_with('.') && name.ends_with(".toml")
        })
        .collect();
    out.sort();
    if out.len() > MAX_DROPINS {
        return Err(ConfigError::Read {
            file: dir.display().to_string(),
            source: std::io::Error::other(format!(
                "holds {} drop-in files, over the limit of {MAX_DROPINS}; merge some of them",
                out.len()
            )),
        });
    }
    Ok(out)
}

/// Reads `path` (if it exists, or fails if `required`) and its drop-ins; `None` when there is
/// neither. With drop-ins, the text is their merge over the file.
pub fn read(path: &Path, required: bool) -> Result<Option<Source>, ConfigError> {
    let main = match read_one(path) {
        Ok(text) => Some(text),
        Err(e) if e.is_not_found() && !required => None,
        Err(e) => {
            return Err(ConfigError::Read {
                file: path.display().to_string(),
                source: e.into_io(),
            })
        }
    };
    let dropins = list(path)?;
    let name = path.display().to_string();
    if dropins.is_empty() {
        return Ok(main.map(|text| Source { name, text }));
    }
    let mut merged = match &main {
        Some(text) => table(&name, text)?,
        None => toml::Table::new(),
    };
    for d in &dropins {
        let shown = d.display().to_string();
        let text = read_one(d).map_err(|e| ConfigError::Read {
            file: shown.clone(),
            source: e.into_io(),
        })?;
        // On its own first: unknown keys and bad values at their own position.
        let _: FileConfig = toml::from_str(&text).map_err(|e| invalid(&shown, &text, &e))?;
        merge(&mut merged, table(&shown, &text)?);
    }
    let text = toml::to_string(&merged).map_err(|e| ConfigError::Invalid {
        file: name.clone(),
        line: 1,
        column: 1,
        message: format!(
            "cannot merge the drop-ins of {}: {e}",
            directory(path).display()
        ),
    })?;
    Ok(Some(Source {
        name: format!("{name} merged with {}/*.toml", directory(path).display()),
        text,
    }))
}

fn read_one(path: &Path) -> Result<String, bounded::Error> {
    bounded::read_to_string(path, Limits::provided(MAX_FILE_BYTES))
}

fn table(name: &str, text: &str) -> Result<toml::Table, ConfigError> {
    text.parse::<toml::Table>()
        .map_err(|e| invalid(name, text, &e))
}

fn invalid(name: &str, text: &str, e: &toml::de::Error) -> ConfigError {
    let at = e.span().map_or(0, |s| s.start);
    let (line, column) = super::line_col(text, at);
    ConfigError::Invalid {
        file: name.to_string(),
        line,
        column,
        message: super::toml_message(e.message(), text, at),
    }
}

/// `over` merged into `base`: tables key by key, anything else replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, text).expect("write");
        p
    }

    #[test]
    fn without_drop_ins_the_file_is_read_as_it_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = write(dir.path(), "config.toml", "[poller]\ninterval = \"1s\"\n");
        let s = read(&f, true).expect("read").expect("some");
        assert_eq!(s.text, "[poller]\ninterval = \"1s\"\n");
        assert_eq!(s.name, f.display().to_string());
    }

    #[test]
    fn drop_ins_merge_over_the_file_in_name_order_key_by_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = write(
            dir.path(),
            "config.toml",
            "[kubernetes]\nenabled = true\n[processes]\nenabled = true\n",
        );
        write(
            dir.path(),
            "config.d/20-b.toml",
            "[kubernetes]\nenabled = false\n",
        );
        write(
            dir.path(),
            "config.d/10-a.toml",
            "[kubernetes]\nenabled = true\nrefresh = \"5s\"\n",
        );
        write(dir.path(), "config.d/.hidden.toml", "not toml at all [");
        write(dir.path(), "config.d/README", "not toml either [");
        let s = read(&f, true).expect("read").expect("some");
        let t: toml::Table = s.text.parse().expect("merged toml");
        assert_eq!(t["kubernetes"]["enabled"].as_bool(), Some(false));
        assert_eq!(t["kubernetes"]["refresh"].as_str(), Some("5s"));
        assert_eq!(t["processes"]["enabled"].as_bool(), Some(true));
        assert!(s.name.contains("merged with"), "{}", s.name);
    }

    #[test]
    fn an_unknown_key_in_a_drop_in_is_reported_at_its_own_line_and_column() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = write(dir.path(), "config.toml", "");
        let d = write(
            dir.path(),
            "config.d/10-a.toml",
            "[kubernetes]\nenabled = true\nbogus = 1\n",
        );
        let e = read(&f, true).expect_err("unknown key");
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("{}:3:1: unknown field `bogus`", d.display())),
            "{text}"
        );
    }

    #[test]
    fn drop_ins_apply_when_the_file_itself_is_absent_and_not_required() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("config.toml");
        write(
            dir.path(),
            "config.d/a.toml",
            "[processes]\nenabled = false\n",
        );
        let s = read(&f, false).expect("read").expect("some");
        let t: toml::Table = s.text.parse().expect("merged toml");
        assert_eq!(t["processes"]["enabled"].as_bool(), Some(false));
        assert!(read(&dir.path().join("none/config.toml"), false)
            .expect("read")
            .is_none());
    }
}
