//! Commands the configuration names (hooks, reset commands): argv and a timeout, as written in
//! the file. Plain data; [`crate::exec`] runs them.

use std::time::Duration;

use serde::Deserialize;

/// The default timeout of a hook.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A command to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    /// A name for logs and metrics.
    pub name: String,
    /// `argv[0]` is the program (a path, or a name looked up in `PATH`).
    pub argv: Vec<String>,
    pub timeout: Duration,
}

/// `command = ["/path", "arg"]`, `timeout = "30s"` as a config section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSection {
    pub name: String,
    #[serde(deserialize_with = "argv")]
    pub command: Vec<String>,
    #[serde(default = "default_timeout", deserialize_with = "timeout")]
    pub timeout: Duration,
}

impl HookSection {
    pub fn spec(&self) -> CommandSpec {
        CommandSpec {
            name: self.name.clone(),
            argv: self.command.clone(),
            timeout: self.timeout,
        }
    }
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

fn argv<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    match v.first() {
        None => Err(serde::de::Error::custom(
            "command is empty; give the program and its arguments as a list, \
             like [\"/usr/lib/gpu-steward/hooks/cordon.sh\", \"--reason\", \"xid\"]",
        )),
        Some(p) if p.is_empty() => Err(serde::de::Error::custom(
            "the program (first element of command) is empty",
        )),
        Some(p) if v.len() == 1 && p.contains(' ') => Err(serde::de::Error::custom(format!(
            "command '{p}' is one string with spaces, but commands run without a shell; \
             split it into a list, like [\"/bin/prog\", \"arg\"]"
        ))),
        Some(_) => Ok(v),
    }
}

fn timeout<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    match humantime::parse_duration(&s) {
        Ok(t) if !t.is_zero() => Ok(t),
        Ok(_) => Err(serde::de::Error::custom(
            "timeout must be longer than zero; write it like '30s'",
        )),
        Err(e) => Err(serde::de::Error::custom(format!(
            "invalid timeout '{s}': {e}; write it like '30s' or '2m'"
        ))),
    }
}
