//! `[reclaim]` and `[accounting]`: the validated configuration the agent runs with. Their TOML
//! shape, validated while parsing so that errors carry positions, is in [`sections`].

#[path = "reclaim_sections.rs"]
pub mod sections;
pub use sections::{AccountingSection, ReclaimSection};

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The accounting state file's name under `[accounting] state_dir`.
pub const ACCOUNTING_STATE_FILE: &str = "accounting.json";

/// What to do with the holders of a GPU that stayed idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionKind {
    /// SIGTERM to each holder, SIGKILL after `grace` to those still alive.
    Signal,
    /// Run `[reclaim.hook]` with the GPU, PIDs, users and pods as JSON on stdin.
    Hook,
}

impl ActionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Signal => "signal",
            ActionKind::Hook => "hook",
        }
    }
}

/// A command run as argv (no shell), with a timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookCommand {
    pub command: Vec<String>,
    pub timeout: Duration,
}

/// `[reclaim.warn]`: run before reclaiming, then wait `grace`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarnStep {
    pub hook: Option<HookCommand>,
    pub grace: Duration,
}

/// Regular expressions, compared by their source (the config derives `PartialEq`).
///
/// The built-in defaults are compiled when first matched, not at start: with reclaim off
/// (the default) nothing matches process names, and compiling them at every start ran the
/// regex compiler and kept its output on the heap for nothing. Patterns from a file are
/// compiled as they are read, so a bad one is reported there.
#[derive(Debug, Clone, Default)]
pub struct Patterns {
    sources: Vec<String>,
    compiled: std::sync::OnceLock<Vec<regex::Regex>>,
}

impl PartialEq for Patterns {
    fn eq(&self, other: &Self) -> bool {
        self.sources == other.sources
    }
}

impl Patterns {
    /// Compiles each of `sources`; the first that does not compile is the error.
    pub fn new(sources: Vec<String>) -> Result<Self, (String, regex::Error)> {
        let compiled = sources
            .iter()
            .map(|p| regex::Regex::new(p).map_err(|e| (p.clone(), e)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Patterns {
            sources,
            compiled: compiled.into(),
        })
    }

    /// Known-good patterns, compiled on first use.
    fn builtin(sources: &[&str]) -> Self {
        Patterns {
            sources: sources.iter().map(|s| s.to_string()).collect(),
            compiled: std::sync::OnceLock::new(),
        }
    }

    pub fn sources(&self) -> &[String] {
        &self.sources
    }

    pub fn matches(&self, s: &str) -> Option<&str> {
        self.compiled
            .get_or_init(|| {
                self.sources
                    .iter()
                    .filter_map(|p| regex::Regex::new(p).ok())
                    .collect()
            })
            .iter()
            .find(|r| r.is_match(s))
            .map(|r| r.as_str())
    }
}

/// Who is never acted on (still reported).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exemptions {
    pub process_names: Patterns,
    pub users: Vec<String>,
    pub namespaces: Vec<String>,
    /// GPU indexes (`"0"`) or UUIDs.
    pub gpus: Vec<String>,
    /// `key=value`, or `key` for any value: pod labels from the container runtime.
    pub pod_labels: Vec<LabelSelector>,
}

/// One of `exempt_pod_labels`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSelector {
    pub key: String,
    pub value: Option<String>,
}

impl LabelSelector {
    pub fn matches(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        labels
            .get(&self.key)
            .is_some_and(|v| self.value.as_ref().is_none_or(|want| want == v))
    }
}

impl std::fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={v}", self.key),
            None => f.write_str(&self.key),
        }
    }
}

/// `[reclaim]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ReclaimConfig {
    pub enabled: bool,
    pub dry_run: bool,
    pub idle_after: Duration,
    pub utilization_threshold: f64,
    pub min_memory_mib: u64,
    pub action: ActionKind,
    /// SIGTERM → SIGKILL.
    pub grace: Duration,
    pub exempt: Exemptions,
    pub max_reclaims_per_hour: u32,
    pub warn: Option<WarnStep>,
    /// The command of `action = "hook"`.
    pub hook: Option<HookCommand>,
    /// The CRI socket pod labels are read from (only with `exempt.pod_labels`).
    pub cri_socket: PathBuf,
}

impl Default for ReclaimConfig {
    fn default() -> Self {
        ReclaimConfig {
            enabled: false,
            dry_run: true,
            idle_after: Duration::from_secs(30 * 60),
            utilization_threshold: 0.01,
            min_memory_mib: 256,
            action: ActionKind::Signal,
            grace: Duration::from_secs(30),
            exempt: Exemptions {
                process_names: Patterns::builtin(&["^nvidia-", "^dcgm"]),
                ..Exemptions::default()
            },
            max_reclaims_per_hour: 10,
            warn: None,
            hook: None,
            cri_socket: PathBuf::from(DEFAULT_CRI_SOCKET),
        }
    }
}

/// containerd's socket; CRI-O's is `/var/run/crio/crio.sock`.
pub const DEFAULT_CRI_SOCKET: &str = "/run/containerd/containerd.sock";

impl ReclaimConfig {
    /// One paragraph for `check-config`.
    pub fn describe(&self) -> String {
        if !self.enabled {
            return "reclaim: off (idle time is measured for the metrics; nothing is reported to /health nor acted on)\n".into();
        }
        let d = |v: Duration| humantime::format_duration(v).to_string();
        let action = match self.action {
            ActionKind::Signal => format!("SIGTERM the holders, SIGKILL after {}", d(self.grace)),
            ActionKind::Hook => format!(
                "run {}",
                self.hook
                    .as_ref()
                    .map_or_else(|| "no hook".to_string(), |h| quoted(&h.command))
            ),
        };
        let warn = match &self.warn {
            Some(w) => format!(
                "warn ({}) and wait {}, then ",
                w.hook
                    .as_ref()
                    .map_or("no hook".to_string(), |h| quoted(&h.command)),
                d(w.grace)
            ),
            None => String::new(),
        };
        format!(
            "reclaim: {mode}; a GPU held (processes with >= {mem} MiB) at <= {thr}% utilization \
             for {after} is reported, then {warn}{action}; at most {max} reclaims per hour; \
             exempt: process names {names}, users {users}, namespaces {ns}, pod labels \
             {labels}, GPUs {gpus}\n",
            mode = if self.dry_run {
                "DRY RUN (decisions are logged and audited, nothing is done)"
            } else {
                "ACTING"
            },
            mem = self.min_memory_mib,
            thr = self.utilization_threshold * 100.0,
            after = d(self.idle_after),
            max = self.max_reclaims_per_hour,
            names = quoted(self.exempt.process_names.sources()),
            users = quoted(&self.exempt.users),
            ns = quoted(&self.exempt.namespaces),
            gpus = quoted(&self.exempt.gpus),
            labels = quoted(
                &self
                    .exempt
                    .pod_labels
                    .iter()
                    .map(|l| format!("{l} (from {})", self.cri_socket.display()))
                    .collect::<Vec<_>>()
            ),
        )
    }
}

/// `[accounting]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountingConfig {
    pub enabled: bool,
    /// Where `accounting.json` is kept across restarts; `None`: in memory only. Default:
    /// `$STATE_DIRECTORY` (systemd), else none.
    pub state_dir: Option<PathBuf>,
    /// How often the state file is rewritten (and at shutdown).
    pub persist_every: Duration,
    /// An owner that held nothing for this long is dropped from the series and the file.
    pub forget_after: Duration,
}

impl Default for AccountingConfig {
    fn default() -> Self {
        AccountingConfig {
            enabled: true,
            state_dir: None,
            persist_every: Duration::from_secs(30),
            forget_after: Duration::from_secs(3600),
        }
    }
}

impl AccountingConfig {
    pub fn describe(&self) -> String {
        if !self.enabled {
            return "accounting: off\n".into();
        }
        match &self.state_dir {
            Some(dir) => format!(
                "accounting: per-owner GPU seconds and energy, kept in {} (rewritten every {} \
                 and at shutdown)\n",
                dir.join(ACCOUNTING_STATE_FILE).display(),
                humantime::format_duration(self.persist_every)
            ),
            None => "accounting: per-owner GPU seconds and energy, in memory only (set \
                     [accounting] state_dir, or run under systemd with StateDirectory=, to keep \
                     them across restarts)\n"
                .into(),
        }
    }
}

#[cfg(test)]
#[path = "reclaim_tests.rs"]
mod tests;

/// `'a', 'b'`, or `none`: a list in words for `check-config`, not Rust's `["a", "b"]`.
fn quoted<T: std::fmt::Display>(items: &[T]) -> String {
    if items.is_empty() {
        return "none".into();
    }
    items
        .iter()
        .map(|i| format!("'{i}'"))
        .collect::<Vec<_>>()
        .join(", ")
}
