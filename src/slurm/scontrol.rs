//! `scontrol`, run without a shell through [`crate::exec`] (its own process group, output
//! bounded, killed at the timeout), and its one-line node record read.
//!
//! Must not: interpret a failure as a node state. A missing program, an unknown node, a
//! controller that does not answer are each an [`Error`] that names what failed and what to do.
//! Blocking: call it off the async runtime.

use std::time::Duration;

use crate::exec::{self, CommandSpec, Outcome};

/// A node's state as `scontrol show node -o <name>` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// `NodeName=`: the node the record is about.
    pub name: String,
    /// `State=`, e.g. `IDLE+DRAIN`, `MIXED`, `DOWN+DRAIN+NOT_RESPONDING`.
    pub state: String,
    /// `Reason=` without Slurm's trailing ` [user@time]`; empty when none.
    pub reason: String,
}

impl NodeState {
    /// Whether the node is drained or draining (the `DRAIN` flag: `IDLE+DRAIN`, `MIXED+DRAIN`;
    /// `sinfo` shows them as `drained`/`draining`).
    pub fn drained(&self) -> bool {
        self.state.split('+').any(|f| f == "DRAIN")
    }
}

/// A failed `scontrol` call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{command}' {outcome}{detail}")]
pub struct Error {
    /// The command line, for the log.
    pub command: String,
    pub outcome: String,
    /// `: <stderr>` and a hint, or empty.
    pub detail: String,
    /// `failure`, `timeout` or `error` (could not be started), for the series.
    pub result: &'static str,
}

/// How to run `scontrol`.
#[derive(Debug, Clone)]
pub struct Scontrol {
    pub program: String,
    pub timeout: Duration,
}

impl Scontrol {
    fn run(&self, args: &[&str]) -> Result<String, Error> {
        let mut argv = vec![self.program.clone()];
        argv.extend(args.iter().map(|a| (*a).to_string()));
        let command = argv.join(" ");
        let spec = CommandSpec {
            name: "scontrol".into(),
            argv,
            timeout: self.timeout,
        };
        let out = exec::run(&spec, b"", &[]);
        if out.outcome.success() {
            return Ok(out.stdout);
        }
        // scontrol says some failures on stdout ("Node x not found"), others on stderr.
        let said = match out.stderr.trim() {
            "" => out.stdout.trim(),
            e => e,
        };
        let stderr = crate::terminal::escape(said);
        let hint = match &out.outcome {
            Outcome::SpawnFailed(_) => format!(
                "; install Slurm's client or set [slurm] scontrol to its path (now '{}')",
                self.program
            ),
            Outcome::TimedOut => "; is slurmctld up and reachable from this node?".to_string(),
            _ if stderr.contains("not found") => {
                "; set [slurm] node_name to this node's NodeName in slurm.conf".to_string()
            }
            _ => String::new(),
        };
        let detail = match stderr.is_empty() {
            true => hint,
            false => format!(": {stderr}{hint}"),
        };
        Err(Error {
            command,
            outcome: out.outcome.to_string(),
            detail,
            result: out.outcome.result_label(),
        })
    }

    /// `scontrol show node -o <node>`.
    /// `scontrol show node -o <node>`: the record of that node, and of no other (a record for
    /// another node, or several, is an error: nothing is drained or resumed on it).
    pub fn show_node(&self, node: &str) -> Result<NodeState, Error> {
        let text = self.run(&["show", "node", "-o", node])?;
        let error = |outcome: String| Error {
            command: format!("{} show node -o {node}", self.program),
            outcome,
            detail: format!(": '{}'", crate::terminal::escape(text.trim())),
            result: "failure",
        };
        let records = text.lines().filter(|l| l.contains("NodeName=")).count();
        let state =
            parse_node(&text).ok_or_else(|| error("answered without a State= field".into()))?;
        if records != 1 || state.name != node {
            return Err(error(format!(
                "answered {records} record(s), the first for node '{}', not the one record of \
                 node '{node}'; [slurm] node_name must be this node's own NodeName",
                crate::terminal::escape(&state.name)
            )));
        }
        Ok(state)
    }

    /// `scontrol update NodeName=<node> State=DRAIN Reason=<reason>`.
    pub fn drain(&self, node: &str, reason: &str) -> Result<(), Error> {
        let name = format!("NodeName={node}");
        let reason = format!("Reason={reason}");
        self.run(&["update", &name, "State=DRAIN", &reason])
            .map(drop)
    }

    /// `scontrol update NodeName=<node> State=RESUME`.
    pub fn resume(&self, node: &str) -> Result<(), Error> {
        let name = format!("NodeName={node}");
        self.run(&["update", &name, "State=RESUME"]).map(drop)
    }
}

/// Reads `State=` and `Reason=` from a one-line node record. `Reason=` holds spaces and, in the
/// one-line form, is the last field but for Slurm's ` [user@time]` stamp.
pub fn parse_node(text: &str) -> Option<NodeState> {
    let line = text.lines().find(|l| l.contains("NodeName="))?;
    let name = line
        .split(' ')
        .find_map(|f| f.strip_prefix("NodeName="))?
        .to_string();
    let state = line
        .split(' ')
        .find_map(|f| f.strip_prefix("State="))?
        .to_string();
    let reason = match line.find(" Reason=") {
        None => String::new(),
        Some(at) => {
            let r = &line[at + " Reason=".len()..];
            let r = match r.rfind(" [") {
                Some(stamp) if r.trim_end().ends_with(']') => &r[..stamp],
                _ => r,
            };
            r.trim().to_string()
        }
    };
    Some(NodeState {
        name,
        state,
        reason,
    })
}
