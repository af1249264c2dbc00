//! The status screen, fitted to the terminal: what matters most is kept and what does not fit
//! says so.
//!
//! The header leads with the GPU count, the pass/warn/fail counts and readiness (a narrow
//! terminal cuts the address and the time, never those); a process row puts its memory before
//! the names, which vary in width. When the rows run out, the blank separators go first, then
//! each GPU's conditions fold into one line (`2 conditions: …`), then the processes, reclaim
//! candidates and changes share what is left and each says how many lines it left out
//! (`… 3 more (…)`). A line cut at the width ends in `…`. Into a pipe (`size` is `None`)
//! every line is printed whole.
//!
//! Must not: fetch anything, or print text that was not escaped (the node's strings are
//! escaped when read).

use std::fmt::Write as _;

use super::{Gpu, Node};
use crate::cli::agent_client::Target;

/// One line and the health it is coloured by.
type Line = (String, Option<String>);

/// What a section that was cut says in place of its last lines: how many, and the command
/// that shows them all (`again`: this one, with its `--url`, `--socket` and `--config`), short
/// enough that 80 columns keep it.
fn more(n: usize, again: &str) -> String {
    format!("  … {n} more: {again} | less")
}

/// A titled list that may be cut to fit.
struct Section {
    title: String,
    items: Vec<Line>,
}

impl Section {
    fn lines(&self, room: usize, again: &str) -> Vec<Line> {
        let mut out = vec![(self.title.clone(), None)];
        if self.items.len() < room {
            out.extend(self.items.iter().cloned());
        } else {
            let shown = room.saturating_sub(2);
            out.extend(self.items.iter().take(shown).cloned());
            out.push((more(self.items.len() - shown, again), None));
        }
        out
    }
}

/// The screen; `size` is (columns, rows) on a terminal, `None` into a pipe; `again`: the
/// command line that asks the same agent again (for the `… N more` hints).
pub(super) fn render(
    node: &Node,
    target: &Target,
    again: &str,
    size: Option<(usize, usize)>,
    colour: bool,
) -> String {
    let count = |s: &str| node.gpus.values().filter(|g| g.status == s).count();
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let header = format!(
        "{} GPU(s): {} pass, {} warn, {} fail · {} · {} · {}",
        node.gpus.len(),
        count("pass"),
        count("warn"),
        count("fail"),
        if node.ready { "ready" } else { "NOT READY" },
        now.get(11..19).unwrap_or(&now),
        target.describe(),
    );
    let table = format!(
        "{:>3} {:<14} {:<8} {:<6} {:>4} {:>11} {:>4} {:>5} {:>7} {}",
        "GPU", "MODEL", "UUID", "HEALTH", "UTIL", "MEMORY GiB", "TEMP", "POWER", "IDLE", "MIG"
    );
    let sections = [processes(node), reclaim(node), events(node), changes(node)];
    let full = |gpu_lines: &[Line], blanks: bool, rooms: Option<&[usize]>| {
        let mut out: Vec<Line> = vec![(header.clone(), None)];
        let blank = |out: &mut Vec<Line>| {
            if blanks {
                out.push((String::new(), None));
            }
        };
        blank(&mut out);
        out.push((table.clone(), None));
        out.extend(gpu_lines.iter().cloned());
        for (i, s) in sections.iter().enumerate() {
            blank(&mut out);
            out.extend(s.lines(rooms.map_or(usize::MAX, |r| r[i]), again));
        }
        out
    };
    let all = full(&gpu_rows(node, Conditions::All), true, None);
    let lines = match size {
        None => all,
        // The last row is left for the cursor (and the shell's prompt after it).
        Some((_, rows)) if all.len() < rows => all,
        Some((_, rows)) => {
            let rows = rows.saturating_sub(1);
            let wanted = |s: &Section| s.items.len() + 1;
            let mut gpu_lines = gpu_rows(node, Conditions::Folded);
            let minimum: usize = sections.iter().map(|s| wanted(s).min(2)).sum();
            if 2 + gpu_lines.len() + minimum > rows {
                // Too short even for one condition line per GPU: the HEALTH column remains.
                gpu_lines = gpu_rows(node, Conditions::None);
            }
            let mut left = rows.saturating_sub(2 + gpu_lines.len());
            let mut rooms: Vec<usize> = sections
                .iter()
                .map(|s| {
                    let r = wanted(s).min(2).min(left);
                    left -= r;
                    r
                })
                .collect();
            // What is left goes one row at a time to each section that wants more.
            while left > 0 {
                let before = left;
                for (s, room) in sections.iter().zip(rooms.iter_mut()) {
                    if left > 0 && *room < wanted(s) {
                        *room += 1;
                        left -= 1;
                    }
                }
                if left == before {
                    break;
                }
            }
            let mut lines = full(&gpu_lines, false, Some(&rooms));
            if lines.len() > rows {
                // More GPUs than rows: the last row says how much is missing.
                let cut = lines.len() - rows + 1;
                lines.truncate(rows.saturating_sub(1));
                lines.push((
                    format!("… {cut} more lines (a taller terminal shows all)"),
                    None,
                ));
            }
            lines
        }
    };
    let width = size.map_or(usize::MAX, |(c, _)| c);
    let mut out = String::new();
    for (text, status) in &lines {
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

/// How many lines a GPU's conditions get under its row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Conditions {
    All,
    /// The first one, with how many there are.
    Folded,
    /// None: the HEALTH column still says pass, warn or fail.
    None,
}

/// One row per GPU and, under it, its conditions as `how` says.
fn gpu_rows(node: &Node, how: Conditions) -> Vec<Line> {
    let mut lines = Vec::new();
    for (i, g) in &node.gpus {
        lines.push((gpu_row(*i, g), Some(g.status.clone())));
        let status = Some(g.status.clone());
        match (how, g.reasons.as_slice()) {
            (_, []) | (Conditions::None, _) => {}
            (Conditions::Folded, [first, rest @ ..]) if !rest.is_empty() => lines.push((
                format!("      {} conditions: {first}", rest.len() + 1),
                status,
            )),
            (_, all) => {
                lines.extend(all.iter().map(|r| (format!("      {r}"), status.clone())));
            }
        }
    }
    lines
}

fn gpu_row(i: u32, g: &Gpu) -> String {
    let mem = match (g.mem_used, g.mem_total) {
        (Some(u), Some(t)) => format!("{}/{}", gib(u), gib(t)),
        (Some(u), None) => gib(u),
        _ => "-".into(),
    };
    // `GPU-6d9d3a2e-…` → `6d9d3a2e`: enough to tell GPUs apart and to find the whole UUID.
    let uuid = g.uuid.as_deref().map_or("unknown", |u| {
        let hex = u.strip_prefix("GPU-").unwrap_or(u);
        hex.get(..8).unwrap_or(hex)
    });
    format!(
        "{i:>3} {:<14} {uuid:<8} {:<6} {:>4} {mem:>11} {:>4} {:>5} {:>7} {}",
        cut(g.model.as_deref().unwrap_or("-"), 14),
        g.status,
        opt(g.util, |u| format!("{u:.0}%")),
        opt(g.temp, |t| format!("{t:.0}C")),
        opt(g.power, |p| format!("{p:.0}W")),
        opt(g.idle, |s| if s > 0.0 {
            crate::human::seconds(s)
        } else {
            "-".into()
        }),
        if g.mig.is_empty() { "-" } else { &g.mig }
    )
}

fn processes(node: &Node) -> Section {
    let mut items: Vec<Line> = Vec::new();
    if node.processes.is_empty() {
        items.push(("  none".into(), None));
    }
    for p in &node.processes {
        items.push((
            format!(
                "  {:>3} {:>8} {:>8}  {:<10} {:<15} {}",
                p.gpu,
                p.pid,
                opt(p.memory, gib),
                cut(&p.user, 10),
                p.name,
                p.owner
            ),
            None,
        ));
    }
    Section {
        title: format!(
            "PROCESSES ({:>2}) GPU      PID  MEM GiB  USER       NAME            POD / OWNER",
            node.processes.len()
        ),
        items,
    }
}

fn reclaim(node: &Node) -> Section {
    match &node.reclaim {
        None => Section {
            title: "RECLAIM off".into(),
            items: Vec::new(),
        },
        Some(c) => Section {
            title: format!("RECLAIM CANDIDATES ({})", c.len()),
            items: if c.is_empty() {
                vec![("  none".into(), None)]
            } else {
                c.iter().map(|l| (format!("  {l}"), None)).collect()
            },
        },
    }
}

fn events(node: &Node) -> Section {
    match &node.events {
        None => Section {
            title: "HEALTH EVENTS".into(),
            items: vec![("  the agent did not say (GET /api/v1/events)".into(), None)],
        },
        Some(e) => Section {
            title: "HEALTH EVENTS (journal, newest first)".into(),
            items: if e.is_empty() {
                vec![("  none".into(), None)]
            } else {
                e.iter().map(|l| (format!("  {l}"), None)).collect()
            },
        },
    }
}

fn changes(node: &Node) -> Section {
    match &node.changes {
        Err(e) => Section {
            title: "LAST CHANGES".into(),
            items: vec![(format!("  cannot read the audit log: {e}"), None)],
        },
        Ok(c) => Section {
            title: "LAST CHANGES (audit log, newest first)".into(),
            items: if c.is_empty() {
                vec![("  none".into(), None)]
            } else {
                c.iter().map(|l| (format!("  {l}"), None)).collect()
            },
        },
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

fn gib(b: f64) -> String {
    format!("{:.1}", b / (1024.0 * 1024.0 * 1024.0))
}

/// Cuts `line` to `width` characters, the last one `…` (by char: the screen is plain text, and
/// colour codes are added after the cut).
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(gpus: u32, reasons: usize, processes: usize, changes: usize) -> Node {
        let mut n = Node {
            gpus: BTreeMap::new(),
            processes: Vec::new(),
            reclaim: Some(vec!["GPU 1: idle".into(); 2]),
            changes: Ok((0..changes)
                .map(|i| format!("10:00:{i:02} mig x"))
                .collect()),
            events: Some(vec![
                "10:00:00 GPU 0 raised xid_79 [fail, reboot_node]: XID 79".into(),
            ]),
            ready: true,
        };
        for i in 0..gpus {
            n.gpus.insert(
                i,
                Gpu {
                    status: if reasons > 0 { "fail" } else { "pass" }.into(),
                    reasons: (0..reasons).map(|r| format!("cond_{r} [fail]")).collect(),
                    ..Gpu::default()
                },
            );
        }
        for i in 0..processes {
            n.processes.push(super::super::Process {
                gpu: 0,
                pid: (1000 + i).to_string(),
                name: "python3".into(),
                user: "alice".into(),
                owner: "-".into(),
                memory: Some(1073741824.0 * 3.0),
            });
        }
        n
    }

    const AGAIN: &str = "gpu-steward status --url http://x:1";

    fn screen(n: &Node, cols: usize, rows: usize) -> Vec<String> {
        let text = render(
            n,
            &Target::Tcp("x:1".into()),
            AGAIN,
            Some((cols, rows)),
            false,
        );
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn an_absent_value_is_a_dash_never_zero() {
        let n = node(1, 0, 0, 0);
        let text = render(&n, &Target::Tcp("x:1".into()), AGAIN, None, false);
        let row = text.lines().find(|l| l.starts_with("  0")).expect("row");
        assert!(
            !row.contains("0%") && !row.contains("0C") && !row.contains("0W"),
            "{row}"
        );
        assert!(row.contains(" - "), "{row}");
    }

    #[test]
    fn a_crowded_node_fits_80_by_24_and_every_cut_says_so() {
        // 4 failing GPUs with 3 conditions each, 12 processes, 2 candidates, 40 changes.
        let n = node(4, 3, 12, 40);
        let lines = screen(&n, 80, 24);
        assert!(lines.len() <= 23, "{lines:#?}");
        assert!(lines.iter().all(|l| l.chars().count() <= 80), "{lines:#?}");
        assert!(lines[0].starts_with("4 GPU(s): 0 pass, 0 warn, 4 fail · ready"));
        // Each GPU's three conditions folded into one line that says so.
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.contains("3 conditions: cond_0"))
                .count(),
            4
        );
        // Every section present, each cut one with how many lines it left out.
        let at = |t: &str| lines.iter().position(|l| l.starts_with(t)).expect(t);
        let (p, r) = (at("PROCESSES (12)"), at("RECLAIM"));
        let (e, c) = (at("HEALTH EVENTS"), at("LAST CHANGES"));
        let shown = r - p - 2;
        assert_eq!(lines[r - 1], more(12 - shown, AGAIN), "{lines:#?}");
        assert!(lines[e - 1].contains("GPU 1: idle"), "{lines:#?}");
        assert!(lines[c - 1].contains("raised xid_79"), "{lines:#?}");
        let changes = lines.len() - c - 2;
        assert_eq!(
            lines[lines.len() - 1],
            more(40 - changes, AGAIN),
            "{lines:#?}"
        );
        // A process row keeps its memory column.
        assert!(lines[p + 1].contains(" 3.0  alice"), "{lines:#?}");
    }

    #[test]
    fn more_gpus_than_rows_end_with_what_is_missing() {
        let n = node(30, 1, 0, 0);
        let lines = screen(&n, 80, 24);
        assert_eq!(lines.len(), 23);
        assert!(lines[22].contains("more lines"), "{lines:#?}");
    }
}
