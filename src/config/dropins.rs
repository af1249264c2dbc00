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
//! Bounded: each file at most [`MAX_FILE_BYTES`], the file and its drop-ins together at most
//! [`MAX_TOTAL_BYTES`] (checked from their sizes before any is read, and again as each is
//! read), at most [`MAX_DROPINS`] of them, and at most [`MAX_ENTRIES`] entries in any one table
//! or array, so that what the parser builds stays a small multiple of what a real
//! configuration needs. Each file's text is parsed once (into the table merged); the merged
//! text once, by the configuration; a drop-in is parsed on its own again only to place an
//! error the merged text shows.
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
/// The most the file and its drop-ins may hold together: what one file may hold. A real
/// configuration is a few KiB; the parser's tables take a few times the text.
pub const MAX_TOTAL_BYTES: u64 = MAX_FILE_BYTES;
/// The most entries one table or array may have (a real one has tens).
pub const MAX_ENTRIES: usize = 4096;

/// The configuration text to parse, and the name its errors carry.
#[derive(Debug)]
pub struct Source {
    pub name: String,
    pub text: String,
    /// With drop-ins: each part as read (the file first, when there is one), for placing an
    /// error of the merged text in the part that caused it ([`Source::own_error`]).
    pub parts: Vec<(String, String)>,
}

impl Source {
    /// The error of the part that fails on its own (unknown keys, bad values, at their own
    /// file, line and column), if one does; only the merged text's error otherwise.
    pub fn own_error(&self) -> Option<ConfigError> {
        self.parts.iter().find_map(|(name, text)| {
            toml::from_str::<FileConfig>(text)
                .err()
                .map(|e| invalid(name, text, &e))
        })
    }
}

/// What the file and its drop-ins hold together, in bytes (their sizes now): `check-config`
/// says it, beside [`MAX_TOTAL_BYTES`].
pub fn total_bytes(config_file: &Path) -> u64 {
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    size(config_file)
        + list(config_file)
            .unwrap_or_default()
            .iter()
            .map(|p| size(p))
            .sum::<u64>()
}

/// The refusal of a file and drop-ins that hold more than [`MAX_TOTAL_BYTES`] together.
fn too_much(config_file: &Path, total: u64) -> ConfigError {
    ConfigError::Read {
        file: directory(config_file).display().to_string(),
        source: std::io::Error::other(format!(
            "the configuration file and its drop-ins hold {total} bytes or more together, over \
             the limit of {MAX_TOTAL_BYTES} bytes for their merged total; merge or shorten them"
        )),
    }
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
    let main = match read_one(path, MAX_FILE_BYTES) {
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
        // One file: parsed once, by the configuration (its size bounds what the parse builds).
        return Ok(main.map(|text| Source {
            name,
            text,
            parts: Vec::new(),
        }));
    }
    // The total from the sizes first: nothing more is read when it is over.
    let total = total_bytes(path);
    if total > MAX_TOTAL_BYTES {
        return Err(too_much(path, total));
    }
    let mut used = main.as_ref().map_or(0, |t| t.len() as u64);
    let mut parts = Vec::new();
    let mut merged = match main {
        Some(text) => {
            let t = table(&name, &text)?;
            check_entries(&name, &text, &t)?;
            parts.push((name.clone(), text));
            t
        }
        None => toml::Table::new(),
    };
    for d in &dropins {
        let shown = d.display().to_string();
        // What is left of the total (the files may have grown since their sizes were read).
        let left = MAX_TOTAL_BYTES - used;
        let text = read_one(d, left.min(MAX_FILE_BYTES)).map_err(|e| {
            let grown = match e.problem {
                bounded::Problem::TooLarge { size, .. } if left < MAX_FILE_BYTES => Some(size),
                _ => None,
            };
            match grown {
                Some(size) => too_much(path, used + size),
                None => ConfigError::Read {
                    file: shown.clone(),
                    source: e.into_io(),
                },
            }
        })?;
        used += text.len() as u64;
        // Parsed once; checked on its own only when the merged text shows an error.
        let t = table(&shown, &text)?;
        check_entries(&shown, &text, &t)?;
        merge(&mut merged, t);
        parts.push((shown, text));
    }
    check_entries(&name, "", &merged)?;
    let text = toml::to_string(&merged).map_err(|e| ConfigError::Invalid {
        file: name.clone(),
        line: 1,
        column: 1,
        message: format!(
            "cannot merge the drop-ins of {}: {e}",
            directory(path).display()
        ),
    })?;
    drop(merged);
    Ok(Some(Source {
        name: format!("{name} merged with {}/*.toml", directory(path).display()),
        text,
        parts,
    }))
}

/// Refuses a table or array of `t` (parsed from `text`, the file `name`) with more than
/// [`MAX_ENTRIES`] entries, at the first line that names it.
fn check_entries(name: &str, text: &str, t: &toml::Table) -> Result<(), ConfigError> {
    fn walk(key: &str, v: &toml::Value) -> Option<(String, usize)> {
        match v {
            toml::Value::Table(t) => {
                if t.len() > MAX_ENTRIES {
                    return Some((key.to_string(), t.len()));
                }
                t.iter().find_map(|(k, v)| walk(&join(key, k), v))
            }
            toml::Value::Array(a) => {
                if a.len() > MAX_ENTRIES {
                    return Some((key.to_string(), a.len()));
                }
                a.iter().find_map(|v| walk(key, v))
            }
            _ => None,
        }
    }
    fn join(a: &str, b: &str) -> String {
        if a.is_empty() {
            b.to_string()
        } else {
            format!("{a}.{b}")
        }
    }
    let over = if t.len() > MAX_ENTRIES {
        Some((String::new(), t.len()))
    } else {
        t.iter().find_map(|(k, v)| walk(k, v))
    };
    let Some((key, n)) = over else {
        return Ok(());
    };
    let last = key.rsplit('.').next().unwrap_or("");
    let at = if last.is_empty() {
        0
    } else {
        text.find(last).unwrap_or(0)
    };
    let (line, column) = super::line_col(text, at);
    let what = if key.is_empty() {
        "the top level".to_string()
    } else {
        format!("'{key}'")
    };
    Err(ConfigError::Invalid {
        file: name.to_string(),
        line,
        column,
        message: format!(
            "{what} has {n} entries, over the limit of {MAX_ENTRIES} entries in one table or \
             array; a configuration needs far fewer"
        ),
    })
}

fn read_one(path: &Path, limit: u64) -> Result<String, bounded::Error> {
    bounded::read_to_string(path, Limits::provided(limit))
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
        // Placed where the merged text's error comes from, by the configuration's load.
        let e = crate::config::load(&f, true, &crate::config::Overrides::default())
            .expect_err("unknown key");
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

    #[test]
    fn the_merged_total_is_bounded_before_anything_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = write(dir.path(), "config.toml", "");
        let part = format!("# {}\n", "x".repeat(400 * 1024));
        for i in 0..3 {
            write(dir.path(), &format!("config.d/{i}.toml"), &part);
        }
        let e = read(&f, true).expect_err("1.2 MiB together").to_string();
        assert!(
            e.contains(&format!(
                "over the limit of {MAX_TOTAL_BYTES} bytes for their merged total"
            )),
            "{e}"
        );
        std::fs::remove_file(dir.path().join("config.d/2.toml")).expect("rm");
        read(&f, true).expect("800 KiB together");
    }

    #[test]
    fn a_table_or_array_with_too_many_entries_is_refused_at_its_file_and_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = write(dir.path(), "config.toml", "");
        let users: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("\"u{i}\"")).collect();
        let d = write(
            dir.path(),
            "config.d/10-a.toml",
            &format!("[reclaim]\nexempt_users = [{}]\n", users.join(",")),
        );
        let e = read(&f, true).expect_err("too many").to_string();
        assert!(
            e.starts_with(&format!(
                "{}:2:1: 'reclaim.exempt_users' has {} entries, over the limit of {MAX_ENTRIES}",
                d.display(),
                MAX_ENTRIES + 1
            )),
            "{e}"
        );
    }
}
