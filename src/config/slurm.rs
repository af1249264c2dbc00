//! `[slurm]`: drain this node in Slurm when a GPU fails (docs/slurm.md). Plain data; the drain
//! itself is [`crate::slurm`]'s.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Every reason the agent writes starts with this; only such drains are resumed.
pub const REASON_PREFIX: &str = "gpu-steward:";

/// The longest reason written, in bytes: slurmdbd keeps node reasons in a MySQL `tinytext`
/// column (`event_table.reason`, 255 bytes); slurmctld itself has no limit, so a longer reason
/// would be cut in the accounting history only.
pub const MAX_REASON_BYTES: usize = 255;

/// How long one `scontrol` call may take before its process group is killed: Slurm's default
/// `MessageTimeout` (10 s).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The `scontrol` run when `[slurm] scontrol` is unset or empty.
const SCONTROL: &str = "scontrol";

/// `[slurm]`, as written and as used.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmConfig {
    pub drain: bool,
    /// The node's name in Slurm; empty: the short host name. One node name, never a hostlist.
    #[serde(deserialize_with = "node_name")]
    pub node_name: String,
    /// The `scontrol` program: a path, or a name looked up in `PATH` (empty: `scontrol`).
    #[serde(deserialize_with = "scontrol")]
    pub scontrol: String,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig {
            drain: false,
            node_name: String::new(),
            scontrol: SCONTROL.into(),
        }
    }
}

fn node_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() {
        return Ok(s);
    }
    one_node_name(&s).map_err(serde::de::Error::custom)?;
    Ok(s)
}

/// `name` if it is one Slurm node name: letters, digits, `-`, `_` and `.` only. A `[`, a `,` or
/// a space would make it a hostlist (`gpu[01-99],login1`), and `scontrol update NodeName=` would
/// drain every node it names.
pub fn one_node_name(name: &str) -> Result<&str, String> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(name)
    } else {
        Err(format!(
            "node_name '{}' is not one node name: only letters, digits, '-', '_' and '.' \
             ('[', ',' and spaces make a Slurm hostlist, and a drain would reach every node it \
             names); give this node's NodeName from slurm.conf",
            name.escape_debug()
        ))
    }
}

fn scontrol<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    Ok(if s.is_empty() { SCONTROL.into() } else { s })
}

impl SlurmConfig {
    /// The node name in force: the configured one, else the short host name, if it is one
    /// node name ([`one_node_name`]); the error says why not and what to set.
    pub fn node(&self) -> Result<String, String> {
        if !self.node_name.is_empty() {
            return one_node_name(&self.node_name).map(str::to_string);
        }
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .map(|h| h.split('.').next().unwrap_or_default().to_string())
            .unwrap_or_default();
        one_node_name(&host)
            .map(str::to_string)
            .map_err(|e| format!("the host name: {e} (set [slurm] node_name)"))
    }

    /// What `check-config` says about `[slurm]`.
    pub fn describe(&self) -> String {
        if !self.drain {
            return "slurm: off\n".to_string();
        }
        let node = match self.node() {
            Ok(n) => n,
            Err(e) => return format!("slurm: drains refused: {e}\n"),
        };
        format!(
            "slurm: drain node '{node}' with `{sc} update NodeName={node} State=DRAIN \
             Reason=\"{REASON_PREFIX} GPU <i> <UUID> <condition> (<action>)\"` when a GPU fails; \
             resume it when every GPU passes or warns again, only if the drain is ours (reason \
             starting '{REASON_PREFIX}'); each call at most {t}\n",
            node = node,
            sc = self.scontrol,
            t = humantime::format_duration(CALL_TIMEOUT),
        )
    }
}
