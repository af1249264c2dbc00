//! `gpu-steward status [--url URL | --socket PATH] [--watch]`: one screen of the node from the
//! running agent. It asks the agent (`/health/gpus`, `/metrics`, `/api/v1/mig`,
//! `/api/v1/reclaim`) and reads the tail of the audit log named by the configuration, then
//! prints per GPU its health and reasons, utilization, memory, temperature, power, MIG layout
//! and idle time; the processes with their user and pod; the reclaim candidates; and the last
//! changes to the node.
//!
//! On a terminal the screen is cut to its size and health is coloured; into a pipe every line
//! is printed whole and plain (and `NO_COLOR` turns colour off). A value the agent does not
//! publish is shown as `-`, never as 0. Exit codes: 0, 2 the agent cannot be asked.
//!
//! Must not: change anything, or call NVML.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::agent_client::{self, Target};

/// How long one question to the agent may take.
const ASK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
use super::StatusArgs;
use crate::config::{self, Overrides};

/// Runs the command; the exit status.
pub fn run(args: &StatusArgs) -> u8 {
    let target = match Target::new(args.url.as_deref(), args.socket.clone()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("gpu-steward status: {e}");
            return 2;
        }
    };
    let audit_file = audit_file(args.config.as_deref());
    let tty = std::io::stdout().is_terminal();
    let colour = tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    loop {
        let (width, height) = if tty {
            terminal_size()
        } else {
            (usize::MAX, usize::MAX)
        };
        let screen = match gather(&target, &audit_file) {
            Ok(node) => render(&node, &target, width, height, colour),
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

/// The audit log of `--config` (or the default configuration), for the last changes.
fn audit_file(config: Option<&Path>) -> PathBuf {
    let (path, required) = match config {
        Some(p) => (p.to_path_buf(), true),
        None => (PathBuf::from(config::DEFAULT_CONFIG), false),
    };
    config::load(&path, required, &Overrides::default())
        .map(|c| c.audit_file)
        .unwrap_or_else(|_| PathBuf::from(crate::audit::DEFAULT_FILE))
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

/// What the agent said, per GPU and for the node.
#[derive(Debug)]
struct Node {
    gpus: BTreeMap<u32, Gpu>,
    processes: Vec<Process>,
    /// `None`: reclaim is off; else the candidates as lines.
    reclaim: Option<Vec<String>>,
    changes: Result<Vec<String>, String>,
    ready: bool,
}

#[derive(Debug, Default)]
struct Gpu {
    name: String,
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
    pod: String,
    memory: f64,
}

fn json(target: &Target, path: &str) -> Result<(u16, Value), String> {
    let a = agent_client::get(target, path, ASK_TIMEOUT)?;
    let v = serde_json::from_slice(&a.body).map_err(|e| {
        format!(
            "{}{path} answered {} without JSON: {e}",
            target.describe(),
            a.status
        )
    })?;
    Ok((a.status, v))
}

fn gather(target: &Target, audit_file: &Path) -> Result<Node, String> {
    let mut node = Node {
        gpus: BTreeMap::new(),
        processes: Vec::new(),
        reclaim: None,
        changes: Ok(Vec::new()),
        ready: false,
    };
    // /health/gpus is 503 when a GPU fails: still the answer.
    let (_, health) = json(target, "/health/gpus")?;
    let checks = health["checks"].as_object().cloned().unwrap_or_default();
    for (key, v) in &checks {
        let Some(index) = key.strip_prefix("gpu:").and_then(|i| i.parse::<u32>().ok()) else {
            continue;
        };
        let c = &v[0];
        let g = node.gpus.entry(index).or_default();
        g.name = c["name"].as_str().unwrap_or("").to_string();
        g.status = c["status"].as_str().unwrap_or("unknown").to_string();
        g.reasons = c["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|k| {
                // The action before the reason: a narrow screen cuts the end of the line.
                format!(
                    "{} [{}, action {}]: {}",
                    k["name"].as_str().unwrap_or("?"),
                    k["severity"].as_str().unwrap_or("?"),
                    k["action"].as_str().unwrap_or("none"),
                    k["reason"].as_str().unwrap_or("")
                )
            })
            .collect();
    }
    node.ready = agent_client::get(target, "/readyz", ASK_TIMEOUT).is_ok_and(|a| a.status == 200);
    let metrics = agent_client::get(target, "/metrics", ASK_TIMEOUT)?;
    let page = String::from_utf8_lossy(&metrics.body);
    read_metrics(&page, &mut node);
    if let Ok((_, mig)) = json(target, "/api/v1/mig") {
        for g in mig["gpus"].as_array().into_iter().flatten() {
            let Some(index) = g["index"].as_u64().and_then(|i| u32::try_from(i).ok()) else {
                continue;
            };
            let entry = node.gpus.entry(index).or_default();
            entry.mig = mig_text(g);
        }
    }
    if let Ok((_, r)) = json(target, "/api/v1/reclaim") {
        if r["enabled"].as_bool() == Some(true) {
            let dry = if r["dry_run"].as_bool() == Some(true) {
                " (dry run)"
            } else {
                ""
            };
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
    node.changes = last_changes(audit_file, 50);
    Ok(node)
}

fn mig_text(g: &Value) -> String {
    let (current, pending) = (g["mig"]["current"].as_bool(), g["mig"]["pending"].as_bool());
    let profiles: Vec<&str> = g["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["profile"].as_str())
        .collect();
    match (current, pending) {
        (None, _) => "n/a".into(),
        (Some(c), Some(p)) if c != p => {
            format!("{} (pending {})", on(c), on(p))
        }
        (Some(true), _) if profiles.is_empty() => "on, no instances".into(),
        (Some(true), _) => format!("on: {}", profiles.join(" ")),
        (Some(false), _) => "off".into(),
    }
}

fn on(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

fn candidate_text(c: &Value, dry: &str) -> String {
    let state = c["state"]["state"]
        .as_str()
        .or_else(|| c["state"].as_str())
        .unwrap_or("?");
    let next = match (&c["next"], c["no_next"].as_str()) {
        (Value::Object(n), _) => format!(
            "next: {}{dry} at {}",
            n.get("step").and_then(Value::as_str).unwrap_or("?"),
            n.get("at").and_then(Value::as_str).unwrap_or("?")
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
        c["idle_seconds"].as_f64().map_or("-".into(), duration),
        if pids.is_empty() {
            "none".to_string()
        } else {
            pids.join(", ")
        }
    )
}

/// One sample: its labels and value.
type Sample = (BTreeMap<String, String>, f64);

/// The Prometheus text page, by family.
fn samples(page: &str) -> BTreeMap<&str, Vec<Sample>> {
    let mut out: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for line in page.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (name, labels, rest) = match line.find('{') {
            Some(b) => {
                let Some(e) = line.rfind('}') else { continue };
                (&line[..b], parse_labels(&line[b + 1..e]), &line[e + 1..])
            }
            None => match line.split_once(' ') {
                Some((n, r)) => (n, BTreeMap::new(), r),
                None => continue,
            },
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        out.entry(name).or_default().push((labels, value));
    }
    out
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        let key = key.trim_start_matches([',', ' ']).to_string();
        if key.is_empty() || chars.next() != Some('"') {
            return out;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(o) => value.push(o),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        out.insert(key, value);
    }
}

fn read_metrics(page: &str, node: &mut Node) {
    let s = samples(page);
    let per_gpu = |names: &[(&str, f64)]| -> BTreeMap<u32, f64> {
        // The first family the agent publishes wins (native, else dcgm-exporter's names).
        for (name, scale) in names {
            if let Some(v) = s.get(name) {
                return v
                    .iter()
                    .filter(|(l, _)| !l.contains_key("GPU_I_ID") && !l.contains_key("gpu_instance"))
                    .filter_map(|(l, x)| Some((l.get("gpu")?.parse().ok()?, x * scale)))
                    .collect();
            }
        }
        BTreeMap::new()
    };
    let mib = 1024.0 * 1024.0;
    let util = per_gpu(&[
        ("gpu_steward_gpu_utilization_ratio", 100.0),
        ("DCGM_FI_DEV_GPU_UTIL", 1.0),
    ]);
    let used = per_gpu(&[
        ("gpu_steward_memory_used_bytes", 1.0),
        ("DCGM_FI_DEV_FB_USED", mib),
    ]);
    let total = per_gpu(&[
        ("gpu_steward_memory_total_bytes", 1.0),
        ("DCGM_FI_DEV_FB_TOTAL", mib),
    ]);
    let temp = per_gpu(&[
        ("gpu_steward_temperature_celsius", 1.0),
        ("DCGM_FI_DEV_GPU_TEMP", 1.0),
    ]);
    let power = per_gpu(&[
        ("gpu_steward_power_watts", 1.0),
        ("DCGM_FI_DEV_POWER_USAGE", 1.0),
    ]);
    let idle = per_gpu(&[("gpu_steward_gpu_idle_seconds", 1.0)]);
    for (i, g) in node.gpus.iter_mut() {
        g.util = util.get(i).copied();
        g.mem_used = used.get(i).copied();
        g.mem_total = total.get(i).copied();
        g.temp = temp.get(i).copied();
        g.power = power.get(i).copied();
        g.idle = idle.get(i).copied();
    }
    for (l, v) in s
        .get("gpu_steward_process_memory_used_bytes")
        .into_iter()
        .flatten()
    {
        let get = |k: &str| l.get(k).filter(|v| !v.is_empty()).cloned();
        let pod = match (get("namespace"), get("pod")) {
            (Some(ns), Some(p)) => format!("{ns}/{p}"),
            (None, Some(p)) => p,
            _ => get("pod_uid")
                .map(|u| format!("pod {u}"))
                .or_else(|| get("systemd_unit"))
                .or_else(|| get("slurm_job").map(|j| format!("slurm job {j}")))
                .unwrap_or_else(|| "-".into()),
        };
        node.processes.push(Process {
            gpu: get("gpu").and_then(|g| g.parse().ok()).unwrap_or(u32::MAX),
            pid: get("pid").unwrap_or_else(|| "?".into()),
            name: get("process").unwrap_or_else(|| "-".into()),
            user: get("user").unwrap_or_else(|| "-".into()),
            pod,
            memory: *v,
        });
    }
    node.processes.sort_by(|a, b| {
        (a.gpu, b.memory)
            .partial_cmp(&(b.gpu, a.memory))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
}

/// The last `n` records of the audit log, newest first, one line each.
fn last_changes(file: &Path, n: usize) -> Result<Vec<String>, String> {
    use std::io::{Read as _, Seek, SeekFrom};
    let mut f = std::fs::File::open(file).map_err(|e| format!("'{}': {e}", file.display()))?;
    // The tail is enough: the last 256 KiB hold far more than a screen of records.
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(256 * 1024);
    f.seek(SeekFrom::Start(from)).map_err(|e| e.to_string())?;
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let mut lines: Vec<&str> = text.lines().collect();
    if from > 0 && !lines.is_empty() {
        lines.remove(0); // cut mid-line
    }
    Ok(lines
        .iter()
        .rev()
        .take(n)
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|r| change_text(&r))
        .collect())
}

fn change_text(r: &Value) -> String {
    let ts = r["ts"].as_str().unwrap_or("?");
    // `2026-11-25T18:17:57.629Z` → `18:17:57`: the date is today's on a live screen.
    let time = ts.get(11..19).unwrap_or(ts);
    let mut detail = Vec::new();
    if let Some(o) = r.as_object() {
        for (k, v) in o {
            if matches!(k.as_str(), "ts" | "component" | "event") {
                continue;
            }
            let v = match v {
                Value::String(s) => s.clone(),
                Value::Null => continue,
                Value::Array(_) | Value::Object(_) => continue,
                other => other.to_string(),
            };
            detail.push(format!("{k}={v}"));
        }
    }
    format!(
        "{time} {} {} {}",
        r["component"].as_str().unwrap_or("?"),
        r["event"].as_str().unwrap_or("?"),
        detail.join(" ")
    )
    .trim_end()
    .to_string()
}

fn duration(s: f64) -> String {
    let s = s.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

fn gib(b: f64) -> String {
    format!("{:.1}", b / (1024.0 * 1024.0 * 1024.0))
}

/// Cuts `line` to `width` characters (by char, the screen is plain text plus colour codes
/// added after the cut).
fn cut(line: &str, width: usize) -> String {
    if line.chars().count() <= width {
        return line.to_string();
    }
    let mut s: String = line.chars().take(width.saturating_sub(1)).collect();
    s.push('…');
    s
}

fn paint(text: &str, status: &str, colour: bool) -> String {
    if !colour {
        return text.to_string();
    }
    let code = match status {
        "pass" => "32",
        "warn" => "33",
        "fail" => "1;31",
        _ => return text.to_string(),
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

fn render(node: &Node, target: &Target, width: usize, height: usize, colour: bool) -> String {
    let mut lines: Vec<(String, Option<String>)> = Vec::new(); // (text, status to colour)
    let count = |s: &str| node.gpus.values().filter(|g| g.status == s).count();
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    lines.push((
        format!(
            "gpu-steward at {} · {} · {} GPU(s): {} pass, {} warn, {} fail · {}",
            target.describe(),
            now.get(11..19).unwrap_or(&now),
            node.gpus.len(),
            count("pass"),
            count("warn"),
            count("fail"),
            if node.ready { "ready" } else { "NOT READY" }
        ),
        None,
    ));
    lines.push((String::new(), None));
    lines.push((
        format!(
            "{:>3}  {:<6} {:>5} {:>13} {:>5} {:>7} {:>8}  {}",
            "GPU", "HEALTH", "UTIL", "MEMORY GiB", "TEMP", "POWER", "IDLE", "MIG"
        ),
        None,
    ));
    for (i, g) in &node.gpus {
        let mem = match (g.mem_used, g.mem_total) {
            (Some(u), Some(t)) => format!("{}/{}", gib(u), gib(t)),
            (Some(u), None) => gib(u),
            _ => "-".into(),
        };
        let line = format!(
            "{i:>3}  {:<6} {:>5} {mem:>13} {:>5} {:>7} {:>8}  {}",
            g.status,
            opt(g.util, |u| format!("{u:.0}%")),
            opt(g.temp, |t| format!("{t:.0}C")),
            opt(g.power, |p| format!("{p:.0}W")),
            opt(g.idle, |s| if s > 0.0 { duration(s) } else { "-".into() }),
            if g.mig.is_empty() { "-" } else { &g.mig }
        );
        lines.push((line, Some(g.status.clone())));
        for r in &g.reasons {
            lines.push((format!("       {r}"), Some(g.status.clone())));
        }
    }
    lines.push((String::new(), None));
    lines.push((format!("PROCESSES ({})", node.processes.len()), None));
    if node.processes.is_empty() {
        lines.push(("  none".into(), None));
    }
    for p in &node.processes {
        lines.push((
            format!(
                "  GPU {:<2} pid {:<8} {:<16} user {:<12} {:<28} {} GiB",
                p.gpu,
                p.pid,
                p.name,
                p.user,
                p.pod,
                gib(p.memory)
            ),
            None,
        ));
    }
    lines.push((String::new(), None));
    match &node.reclaim {
        None => lines.push(("RECLAIM off".into(), None)),
        Some(c) => {
            lines.push((format!("RECLAIM CANDIDATES ({})", c.len()), None));
            if c.is_empty() {
                lines.push(("  none".into(), None));
            }
            for l in c {
                lines.push((format!("  {l}"), None));
            }
        }
    }
    lines.push((String::new(), None));
    let fixed = lines.len() + 1;
    match &node.changes {
        Err(e) => {
            lines.push(("LAST CHANGES".into(), None));
            lines.push((format!("  cannot read the audit log {e}"), None));
        }
        Ok(c) => {
            lines.push(("LAST CHANGES (audit log, newest first)".into(), None));
            if c.is_empty() {
                lines.push(("  none".into(), None));
            }
            // What is left of the screen is for the changes; at least three.
            let room = height.saturating_sub(fixed).max(3);
            for l in c.iter().take(room) {
                lines.push((format!("  {l}"), None));
            }
        }
    }
    let mut out = String::new();
    let shown = lines.len().min(height.saturating_sub(1).max(1));
    for (text, status) in lines.iter().take(shown) {
        let text = cut(text, width);
        let _ = writeln!(
            out,
            "{}",
            match status {
                Some(s) => paint(&text, s, colour),
                None => text,
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_with_escapes_and_families_by_name() {
        let page = "# HELP x y\nx{gpu=\"0\",name=\"a \\\"b\\\"\"} 1.5\nx{gpu=\"1\"} 2\ny 3\n";
        let s = samples(page);
        assert_eq!(s["x"].len(), 2);
        assert_eq!(s["x"][0].0["name"], "a \"b\"");
        assert_eq!(s["y"][0].1, 3.0);
    }

    #[test]
    fn an_absent_value_is_a_dash_never_zero() {
        let mut node = Node {
            gpus: BTreeMap::new(),
            processes: Vec::new(),
            reclaim: None,
            changes: Ok(Vec::new()),
            ready: true,
        };
        node.gpus.insert(
            0,
            Gpu {
                status: "pass".into(),
                ..Gpu::default()
            },
        );
        let text = render(&node, &Target::Tcp("x:1".into()), 200, 100, false);
        let row = text.lines().find(|l| l.starts_with("  0")).expect("row");
        assert!(
            !row.contains("0%") && !row.contains("0C") && !row.contains("0W"),
            "{row}"
        );
        assert!(row.contains(" - "), "{row}");
    }
}
