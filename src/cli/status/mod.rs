//! `gpu-steward status [--url URL | --socket PATH] [--watch]`: one screen of the node from the
//! running agent. It asks the agent (`/api/v1/gpus`, `/readyz`, `/api/v1/reclaim`,
//! `/api/v1/events`: plain JSON,
//! no Prometheus text is parsed here) and reads the tail of the audit log named by `--config`,
//! else by an agent on this machine (the demo's is its own), else by the default configuration;
//! then it prints per GPU its model, short UUID, health and reasons, utilization,
//! memory, temperature, power, MIG layout and idle time; the processes with their user and pod;
//! the reclaim candidates; the newest health events (those from before a restart marked); and
//! the last changes to the node.
//!
//! On a terminal the screen is fitted to its size ([`screen`]) and health is coloured; into a
//! pipe every line is printed whole and plain (and `NO_COLOR` turns colour off). A value the
//! agent does not publish is shown as `-`, never as 0. Anything that came from outside (process,
//! user and pod names, reasons, audit records) is escaped before it reaches the terminal. Exit
//! codes: 0, 2 the agent cannot be asked or the configuration cannot be read.
//!
//! Must not: change anything, or call NVML.

mod changes;
mod events;
mod screen;

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::agent_client::{self, Target};
use super::StatusArgs;
use crate::config::{self, Overrides};
use crate::terminal::escape;

/// `--timeout`'s default: how long one question to the agent may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the command; the exit status.
pub fn run(args: &StatusArgs) -> u8 {
    let address = match (&args.socket, args.url.as_deref()) {
        (None, Some(url)) => super::check_health::agent_address_only(url),
        _ => Ok(()),
    };
    let target = match address.and_then(|()| Target::new(args.url.as_deref(), args.socket.clone()))
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("gpu-steward status: {e}");
            return 2;
        }
    };
    let audit_log = match audit_file(args.config.as_deref()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("gpu-steward status: {e}");
            return 2;
        }
    };
    let tty = std::io::stdout().is_terminal();
    let colour = tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    loop {
        let size = tty.then(terminal_size);
        let screen = match gather(&target, &audit_log, args.timeout) {
            Ok(node) => screen::render(&node, &target, &again(args), size, colour),
            Err(e) if !args.watch => {
                eprintln!("gpu-steward status: cannot ask the agent: {e}");
                return 2;
            }
            Err(e) => format!("cannot ask the agent: {e}\n"),
        };
        let mut out = std::io::stdout().lock();
        if args.watch && tty {
            // Home and clear, then the screen: no scrolling history of old screens.
            let _ = out.write_all(b"\x1b[H\x1b[2J");
        }
        if out.write_all(screen.as_bytes()).is_err() {
            return 0; // a closed pipe (`| head`)
        }
        let _ = out.flush();
        if !args.watch {
            return 0;
        }
        drop(out);
        std::thread::sleep(args.interval);
    }
}

/// The command line that asks the same agent again: `gpu-steward status` with the `--url`
/// (when not the default), `--socket` and `--config` this one was given.
fn again(args: &StatusArgs) -> String {
    let mut out = String::from("gpu-steward status");
    match (&args.socket, args.url.as_deref()) {
        (Some(s), _) => out.push_str(&format!(" --socket {}", s.display())),
        (None, Some(u)) if u != agent_client::DEFAULT_URL => out.push_str(&format!(" --url {u}")),
        _ => {}
    }
    if let Some(c) = &args.config {
        out.push_str(&format!(" --config {}", c.display()));
    }
    if args.timeout != DEFAULT_TIMEOUT {
        out.push_str(&format!(
            " --timeout {}",
            humantime::format_duration(args.timeout)
        ));
    }
    escape(&out).into_owned()
}

/// Which audit log LAST CHANGES reads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ChangesLog {
    /// The one `--config` names: always that one.
    Named(PathBuf),
    /// No `--config`: the one the agent says it writes (`/api/v1/events`' `audit_log`) when it
    /// runs on this machine, else this one (the default configuration's).
    Default(PathBuf),
}

impl ChangesLog {
    /// The file to read, given the path the agent named (if it did).
    fn file(&self, target: &Target, agents: Option<&str>) -> (PathBuf, bool) {
        match (self, agents) {
            (ChangesLog::Named(p), _) => (p.clone(), false),
            (ChangesLog::Default(_), Some(a)) if target.on_this_machine() && !a.is_empty() => {
                (PathBuf::from(a), true)
            }
            (ChangesLog::Default(p), _) => (p.clone(), false),
        }
    }
}

/// The audit log of `--config` (or of the default configuration when it exists). A `--config`
/// that is missing or broken is an error naming it: falling back to the default audit log would
/// show another agent's changes as this one's. The default configuration, not named, may be
/// unreadable to the operator (root's 0600 file): then the default audit log, as before.
fn audit_file(config: Option<&Path>) -> Result<ChangesLog, String> {
    let Some(path) = config else {
        return Ok(ChangesLog::Default(
            config::load(
                Path::new(config::DEFAULT_CONFIG),
                false,
                &Overrides::default(),
            )
            .map_or_else(
                |_| PathBuf::from(crate::audit::DEFAULT_AUDIT_FILE),
                |c| c.audit_file,
            ),
        ));
    };
    config::load(path, true, &Overrides::default())
        .map(|c| ChangesLog::Named(c.audit_file))
        .map_err(|e| {
            format!(
                "{e} (LAST CHANGES reads the audit log that '{}' names: fix it, or give another \
                 --config)",
                path.display()
            )
        })
}

/// Columns and rows: `$COLUMNS`/`$LINES` when set, else the terminal's (`stty size`), else 80×24.
fn terminal_size() -> (usize, usize) {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
    if let (Some(c), Some(l)) = (env("COLUMNS"), env("LINES")) {
        return (c.max(20), l.max(5));
    }
    let asked = std::fs::File::open("/dev/tty").ok().and_then(|tty| {
        let out = std::process::Command::new("stty")
            .arg("size")
            .stdin(tty)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        let mut it = text.split_whitespace().map(|v| v.parse::<usize>().ok());
        Some((it.next()??, it.next()??))
    });
    match asked {
        Some((rows, cols)) if rows > 0 && cols > 0 => (cols.max(20), rows.max(5)),
        _ => (80, 24),
    }
}

/// What the agent said, per GPU and for the node. Every string in it is escaped already.
#[derive(Debug)]
struct Node {
    gpus: BTreeMap<u32, Gpu>,
    processes: Vec<Process>,
    /// `None`: reclaim is off; else the candidates as lines.
    reclaim: Option<Vec<String>>,
    changes: Result<Vec<String>, String>,
    /// The journal's newest events (`None`: the agent did not say).
    events: Option<Vec<String>>,
    ready: bool,
}

#[derive(Debug, Default)]
struct Gpu {
    /// The model without its `NVIDIA ` prefix; `None` when the agent has not read it.
    model: Option<String>,
    uuid: Option<String>,
    status: String,
    reasons: Vec<String>,
    util: Option<f64>,
    mem_used: Option<f64>,
    mem_total: Option<f64>,
    temp: Option<f64>,
    power: Option<f64>,
    idle: Option<f64>,
    mig: String,
}

#[derive(Debug)]
struct Process {
    gpu: u32,
    pid: String,
    name: String,
    user: String,
    owner: String,
    memory: Option<f64>,
}

fn json(target: &Target, path: &str, timeout: Duration) -> Result<(u16, Value), String> {
    let a = agent_client::get(target, path, timeout)?;
    let v = serde_json::from_slice(&a.body).map_err(|e| {
        format!(
            "{}{path} answered {} without JSON: {e}",
            target.describe(),
            a.status
        )
    })?;
    Ok((a.status, v))
}

/// A string field, escaped; `None` when absent, null or empty.
fn text(v: &Value) -> Option<String> {
    v.as_str()
        .filter(|s| !s.is_empty())
        .map(|s| escape(s).into_owned())
}

/// Asks the agent; each question may take `timeout` (`--timeout`).
fn gather(target: &Target, audit_log: &ChangesLog, timeout: Duration) -> Result<Node, String> {
    let mut node = Node {
        gpus: BTreeMap::new(),
        processes: Vec::new(),
        reclaim: None,
        changes: Ok(Vec::new()),
        events: None,
        ready: false,
    };
    let (status, gpus) = json(target, "/api/v1/gpus", timeout)?;
    if status != 200 {
        return Err(format!(
            "{}/api/v1/gpus answered HTTP {status}",
            target.describe()
        ));
    }
    for g in gpus["gpus"].as_array().into_iter().flatten() {
        let Some(index) = g["index"].as_u64().and_then(|i| u32::try_from(i).ok()) else {
            continue;
        };
        node.gpus.insert(index, read_gpu(g));
        for p in g["processes"].as_array().into_iter().flatten() {
            node.processes.push(read_process(index, p));
        }
    }
    node.processes.sort_by(|a, b| {
        (a.gpu, b.memory)
            .partial_cmp(&(b.gpu, a.memory))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    node.ready = agent_client::get(target, "/readyz", timeout).is_ok_and(|a| a.status == 200);
    if let Ok((_, r)) = json(target, "/api/v1/reclaim", timeout) {
        if r["enabled"].as_bool() == Some(true) {
            let dry = r["dry_run"].as_bool() == Some(true);
            node.reclaim = Some(
                r["candidates"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| candidate_text(c, dry))
                    .collect(),
            );
        }
    }
    let now = std::time::SystemTime::now();
    let mut agents_log = None;
    if let Ok((200, e)) = json(target, "/api/v1/events", timeout) {
        let stamp = humantime::format_rfc3339_seconds(now).to_string();
        node.events = Some(events::lines(&e, stamp.get(..10).unwrap_or("")));
        agents_log = e["audit_log"].as_str().map(str::to_string);
    }
    let (file, named_by_agent) = audit_log.file(target, agents_log.as_deref());
    // The agent creates its log with its first change: none yet is no change, not an error.
    let not_yet = named_by_agent
        && std::fs::symlink_metadata(&file)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
    node.changes = match not_yet {
        true => Ok(Vec::new()),
        false => changes::last(&file, 50, now),
    };
    Ok(node)
}

fn read_gpu(g: &Value) -> Gpu {
    let health = &g["health"];
    let reasons = health["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|k| {
            // The action before the reason: a narrow screen cuts the end of the line.
            format!(
                "{} [{}, action {}]: {}",
                text(&k["name"]).unwrap_or_else(|| "?".into()),
                text(&k["severity"]).unwrap_or_else(|| "?".into()),
                text(&k["action"]).unwrap_or_else(|| "none".into()),
                text(&k["reason"]).unwrap_or_default()
            )
        })
        .collect();
    let memory = &g["memory"];
    Gpu {
        model: text(&g["model"]).map(|m| m.trim_start_matches("NVIDIA ").to_string()),
        uuid: text(&g["uuid"]),
        status: text(&health["status"]).unwrap_or_else(|| "unknown".into()),
        reasons,
        util: g["utilization_percent"].as_f64(),
        mem_used: memory["used_bytes"].as_f64(),
        mem_total: memory["total_bytes"].as_f64(),
        temp: g["temperature_celsius"].as_f64(),
        power: g["power_watts"].as_f64(),
        idle: g["idle_seconds"].as_f64(),
        mig: mig_text(&g["mig"]),
    }
}

fn read_process(gpu: u32, p: &Value) -> Process {
    let owner = match (text(&p["namespace"]), text(&p["pod"])) {
        (Some(ns), Some(pod)) => format!("{ns}/{pod}"),
        (None, Some(pod)) => pod,
        _ => text(&p["pod_uid"])
            .map(|u| format!("pod {u}"))
            .or_else(|| text(&p["systemd_unit"]))
            .or_else(|| text(&p["slurm_job"]).map(|j| format!("slurm job {j}")))
            .unwrap_or_else(|| "-".into()),
    };
    Process {
        gpu,
        pid: p["pid"]
            .as_u64()
            .map_or_else(|| "?".into(), |p| p.to_string()),
        name: text(&p["name"]).unwrap_or_else(|| "-".into()),
        user: text(&p["user"]).unwrap_or_else(|| "-".into()),
        owner,
        memory: p["memory_bytes"].as_f64(),
    }
}

/// `off`, `on: 7×1g.10gb`, `on (pending off)`; `n/a` where the GPU has no MIG.
fn mig_text(m: &Value) -> String {
    let (Some(current), pending) = (m["current"].as_bool(), m["pending"].as_bool()) else {
        return "n/a".into();
    };
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for p in m["instances"].as_array().into_iter().flatten() {
        if let Some(p) = text(p) {
            *counts.entry(p).or_default() += 1;
        }
    }
    let on = |b: bool| if b { "on" } else { "off" };
    match pending {
        Some(p) if p != current => format!("{} (pending {})", on(current), on(p)),
        _ if !current => "off".into(),
        _ if counts.is_empty() => "on, no instances".into(),
        _ => {
            let layout: Vec<String> = counts
                .iter()
                .map(|(p, n)| {
                    if *n == 1 {
                        p.clone()
                    } else {
                        format!("{n}×{p}")
                    }
                })
                .collect();
            format!("on: {}", layout.join(" "))
        }
    }
}

fn candidate_text(c: &Value, dry: bool) -> String {
    let state = text(&c["state"]["state"])
        .or_else(|| text(&c["state"]))
        .unwrap_or_else(|| "?".into());
    let next = match (&c["next"], text(&c["no_next"])) {
        (Value::Object(n), _) => format!(
            "next: {}{} at {}",
            n.get("step").and_then(text).unwrap_or_else(|| "?".into()),
            if dry { " (dry run)" } else { "" },
            n.get("at").and_then(text).unwrap_or_else(|| "?".into())
        ),
        (_, Some(why)) => format!("no next step: {why}"),
        _ => "no next step".into(),
    };
    let pids: Vec<String> = c["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
        .map(|p| p.to_string())
        .collect();
    format!(
        "GPU {}: {state}, idle {}, targets {}; {next}",
        c["gpu"].as_u64().map_or("?".into(), |g| g.to_string()),
        c["idle_seconds"]
            .as_f64()
            .map_or("-".into(), crate::human::seconds),
        if pids.is_empty() {
            "none".to_string()
        } else {
            pids.join(", ")
        }
    )
}
