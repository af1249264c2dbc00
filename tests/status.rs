//! `gpu-steward status` as a person sees it: the real binary in a real terminal (`tmux`, a
//! pane of a known size, captured), against the real agent on the simulated NVML with a node in
//! trouble; piped, and with no agent to ask.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{bin, scenario, wait_for, Agent};

/// A tmux server of our own (its own socket), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(cols: u16, rows: u16, command: &str) -> Tmux {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let socket = format!("gpu-steward-status-{}-{n}", std::process::id());
        let ok = Command::new("tmux")
            .args(["-L", &socket, "-f", "/dev/null", "new-session", "-d"])
            .args(["-x", &cols.to_string(), "-y", &rows.to_string()])
            .args(["-s", "status", command])
            .env_remove("TMUX")
            .env("TERM", "xterm-256color")
            .status()
            .expect("tmux is installed (.ci/run installs it)");
        assert!(ok.success(), "tmux new-session");
        Tmux { socket }
    }

    /// The pane as text; with `escapes`, with its colour codes.
    fn capture(&self, escapes: bool) -> String {
        let mut cmd = Command::new("tmux");
        cmd.args(["-L", &self.socket, "capture-pane", "-p", "-t", "status"]);
        if escapes {
            cmd.arg("-e");
        }
        let out = cmd.output().expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
    }
}

fn record(ts: &str, component: &str, event: &str, extra: &str) -> String {
    format!("{{\"ts\":\"{ts}\",\"component\":\"{component}\",\"event\":\"{event}\"{extra}}}\n")
}

fn write_audit(dir: &Path) -> std::path::PathBuf {
    let audit = dir.join("audit.jsonl");
    let mut text = String::new();
    for i in 0..40 {
        text.push_str(&record(
            &format!("2026-11-25T10:00:{:02}.000Z", i),
            "reclaim",
            "idle_detected",
            &format!(",\"gpu\":{}", i % 4),
        ));
    }
    text.push_str(&record(
        "2026-11-25T11:22:33.000Z",
        "sharing",
        "apply.end",
        ",\"trigger\":\"cli\",\"ok\":true,\"applied\":2",
    ));
    std::fs::write(&audit, text).expect("audit");
    audit
}

#[test]
fn status_in_a_terminal_shows_the_node_on_one_screen_with_colour() {
    let agent = Agent::with_scenario(&scenario("faults.toml")).start();
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = write_audit(dir.path());
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[audit]\nfile = \"{}\"\n", audit.display()),
    )
    .expect("config");
    let command = format!(
        "{} status --url http://127.0.0.1:{} --config {}; sleep 60",
        bin(),
        agent.port,
        config.display()
    );
    let (cols, rows) = (100, 30);
    let tmux = Tmux::start(cols, rows, &command);
    let pane = wait_for("the status screen", Duration::from_secs(20), || {
        let p = tmux.capture(false);
        p.contains("LAST CHANGES").then_some(p)
    });
    let lines: Vec<&str> = pane.lines().collect();
    assert!(lines.len() <= rows as usize, "{pane}");
    assert!(
        lines.iter().all(|l| l.chars().count() <= cols as usize),
        "sized to the terminal:\n{pane}"
    );
    // The node in trouble: four GPUs, the lost one and the ECC one failing, with reasons.
    assert!(lines[0].contains("4 GPU(s)"), "{pane}");
    assert!(lines[0].contains("fail"), "{pane}");
    assert!(
        pane.contains("GPU MODEL          UUID     HEALTH UTIL"),
        "{pane}"
    );
    let fails = lines
        .iter()
        .filter(|l| {
            l.trim_start().starts_with(|c: char| c.is_ascii_digit()) && l.contains(" fail ")
        })
        .count();
    assert!(fails >= 2, "{pane}");
    assert!(
        pane.contains("gpu_lost [fail, action "),
        "the condition and its action are shown:\n{pane}"
    );
    assert!(pane.contains("NVML reports the GPU as lost"), "{pane}");
    // Telemetry in units, temperature of the throttled GPU, MIG column.
    assert!(pane.contains("91C"), "{pane}");
    assert!(pane.contains("off"), "{pane}");
    assert!(pane.contains("RECLAIM off"), "{pane}");
    // The newest change first, in words.
    let changes = pane
        .lines()
        .position(|l| l.starts_with("LAST CHANGES"))
        .expect("changes header");
    assert!(
        lines[changes + 1].contains("11:22:33 sharing apply.end"),
        "{pane}"
    );
    assert!(lines[changes + 1].contains("applied=2"), "{pane}");
    // Colour on a terminal: the health cells carry SGR codes.
    let coloured = tmux.capture(true);
    assert!(coloured.contains("\u{1b}["), "{coloured}");
}

#[test]
fn status_watch_follows_new_changes_and_a_pipe_gets_plain_text() {
    let agent = Agent::with_scenario(&scenario("faults.toml")).start();
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = write_audit(dir.path());
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[audit]\nfile = \"{}\"\n", audit.display()),
    )
    .expect("config");

    let out = Command::new(bin())
        .args([
            "status",
            "--url",
            &format!("http://127.0.0.1:{}", agent.port),
        ])
        .arg("--config")
        .arg(&config)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains('\u{1b}'), "no colour into a pipe: {text:?}");
    assert!(
        text.lines()
            .filter(|l| l.contains("reclaim idle_detected"))
            .count()
            >= 40,
        "a pipe gets every line: {text}"
    );

    let command = format!(
        "{} status --watch --interval 300ms --url http://127.0.0.1:{} --config {}",
        bin(),
        agent.port,
        config.display()
    );
    let tmux = Tmux::start(100, 30, &command);
    wait_for("the first screen", Duration::from_secs(20), || {
        tmux.capture(false).contains("LAST CHANGES").then_some(())
    });
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&audit)
        .expect("open audit");
    std::io::Write::write_all(
        &mut f,
        record(
            "2026-11-25T12:34:56.000Z",
            "mig",
            "apply.end",
            ",\"layout\":\"balanced\"",
        )
        .as_bytes(),
    )
    .expect("append");
    wait_for("the new change on screen", Duration::from_secs(20), || {
        tmux.capture(false)
            .contains("12:34:56 mig apply.end layout=balanced")
            .then_some(())
    });
}

#[test]
fn status_without_an_agent_exits_2_and_says_why() {
    // A port nothing listens on: bind, note it, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let out = Command::new(bin())
        .args(["status", "--url", &format!("http://127.0.0.1:{port}")])
        .output()
        .expect("status");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot ask the agent") && err.contains(&port.to_string()),
        "{err}"
    );
    let out = Command::new(bin())
        .args(["status", "--url", "https://127.0.0.1:9400"])
        .output()
        .expect("status");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("https is not supported"));
}

/// An agent that accepts and never answers: `status` gives up after `--timeout`, the flag its
/// message names (it once named a flag `status` did not accept).
#[test]
fn status_against_a_silent_agent_gives_up_after_its_timeout_flag() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let started = std::time::Instant::now();
    let out = Command::new(bin())
        .args(["status", "--url", &format!("http://127.0.0.1:{port}")])
        .args(["--timeout", "300ms"])
        .output()
        .expect("status");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no answer within 300ms") && err.contains("give it more with --timeout"),
        "{err}"
    );
    // One question (the first fails the screen), not the 5 s default.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    drop(silent);
}

#[test]
fn status_asks_the_agent_on_its_api_socket() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "a-token-of-at-least-thirty-two-chars\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let socket = dir.path().join("api.sock");
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .config(&format!(
            "[api]\nenabled = true\ntoken_file = \"{}\"\nsocket = \"{}\"\n",
            token.display(),
            socket.display()
        ))
        .start();
    let empty = dir.path().join("config.toml");
    std::fs::write(&empty, "").expect("config");
    let out = Command::new(bin())
        .args(["status", "--config"])
        .arg(&empty)
        .arg("--socket")
        .arg(&socket)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", agent.log());
    assert!(
        text.starts_with("8 GPU(s): 8 pass")
            && text.contains(&format!(" · unix:{}", socket.display())),
        "{text}"
    );
}

/// A real `sleep` whose name (`/proc/PID/comm`, from the name it was started by) carries a
/// terminal title sequence and a colour: what another user on the node can do.
struct Renamed {
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

/// The hostile name: `ESC ] 0 ; t BEL ESC [ 3 1 m x` (12 characters, under comm's 15).
const HOSTILE: &str = "\u{1b}]0;t\u{7}\u{1b}[31mx";

impl Renamed {
    fn start() -> Renamed {
        let dir = tempfile::tempdir().expect("tempdir");
        let sleep = ["/bin/sleep", "/usr/bin/sleep"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("sleep is installed");
        let link = dir.path().join(HOSTILE);
        std::os::unix::fs::symlink(sleep, &link).expect("symlink");
        let child = Command::new(&link).arg("300").spawn().expect("spawn");
        let comm = format!("/proc/{}/comm", child.id());
        wait_for("the renamed process", Duration::from_secs(5), || {
            let c = std::fs::read_to_string(&comm).ok()?;
            (c.trim_end_matches('\n') == HOSTILE).then_some(())
        });
        Renamed { child, _dir: dir }
    }
}

impl Drop for Renamed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// faults.toml with UUIDs on two GPUs and its one process being `pid`.
fn faults_with(pid: u32) -> String {
    let text = scenario("faults.toml");
    let text = text.replacen(
        "pci_bus_id = \"00000000:3B:00.0\"",
        "pci_bus_id = \"00000000:3B:00.0\"\nuuid = \"GPU-0badc0de-1111-2222-3333-444455556666\"",
        1,
    );
    let text = text.replacen(
        "pci_bus_id = \"00000000:5D:00.0\"",
        "pci_bus_id = \"00000000:5D:00.0\"\nuuid = \"GPU-5d5d5d5d-1111-2222-3333-444455556666\"",
        1,
    );
    assert!(
        text.contains("pid = 51001"),
        "faults.toml still has its process"
    );
    text.replacen("pid = 51001", &format!("pid = {pid}"), 1)
}

#[test]
fn status_in_80x24_keeps_counts_memory_and_says_what_it_left_out() {
    let renamed = Renamed::start();
    let pid = renamed.child.id();
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = Agent::with_scenario(&faults_with(pid)).start();
    let audit = write_audit(dir.path());
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[audit]\nfile = \"{}\"\n", audit.display()),
    )
    .expect("config");
    let command = format!(
        "{} status --url http://127.0.0.1:{} --config {}; sleep 60",
        bin(),
        agent.port,
        config.display()
    );
    let tmux = Tmux::start(80, 24, &command);
    let pid_text = pid.to_string();
    let pane = wait_for("the status screen", Duration::from_secs(20), || {
        let p = tmux.capture(false);
        (p.contains("LAST CHANGES") && p.contains(&pid_text)).then_some(p)
    });
    let lines: Vec<&str> = pane.lines().collect();
    assert!(lines.len() <= 24, "{pane}");
    assert!(lines.iter().all(|l| l.chars().count() <= 80), "{pane}");
    // faults.toml: one GPU lost and one with an uncorrectable ECC error fail; NVML is up.
    assert!(
        lines[0].starts_with("4 GPU(s): ") && lines[0].contains(", 2 fail · ready"),
        "{pane}"
    );
    // Which GPU: model and the short UUID the scenario gave it.
    let row = |i: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("{i:>3} ")))
            .unwrap_or_else(|| panic!("GPU {i} row in\n{pane}"))
    };
    assert!(
        row("1").contains("H200") && row("1").contains("0badc0de"),
        "{pane}"
    );
    assert!(
        row("2").contains("5d5d5d5d") && row("2").contains("91C"),
        "{pane}"
    );
    // The scenario's process: 129536 MiB is 126.5 GiB, in its column, name escaped.
    let p = lines
        .iter()
        .find(|l| l.contains(&format!(" {pid} ")))
        .unwrap_or_else(|| panic!("process row in\n{pane}"));
    assert!(p.contains(" 126.5 "), "{pane}");
    assert!(p.contains(r"\u{1b}]0;t\u{7}\u{1b}[31mx"), "{pane}");
    // Every section is on screen; the 41 changes do not fit and the screen says so.
    assert!(pane.contains("RECLAIM off"), "{pane}");
    let changes = lines
        .iter()
        .position(|l| l.starts_with("LAST CHANGES"))
        .expect("changes header");
    assert!(
        lines[changes + 1].contains("11:22:33 sharing apply.end"),
        "{pane}"
    );
    let last = lines.iter().rev().find(|l| !l.is_empty()).expect("a line");
    assert!(
        last.starts_with("  … ") && last.contains(" more: gpu-steward status --url "),
        "{pane}"
    );
    // No colour but the health cells': the hostile name painted nothing.
    let coloured = tmux.capture(true);
    let prow = coloured
        .lines()
        .find(|l| l.contains(&format!(" {pid} ")))
        .expect("process row");
    assert!(!prow.contains("\u{1b}[31m"), "{prow:?}");
}

#[test]
fn status_with_a_missing_or_broken_config_exits_2_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope.toml");
    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, "[audit]\nfile = \n").expect("write");
    for file in [&missing, &broken] {
        let out = Command::new(bin())
            .args(["status", "--url", "http://127.0.0.1:9", "--config"])
            .arg(file)
            .output()
            .expect("status");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(&file.display().to_string()), "{err}");
        assert!(!err.contains("cannot ask the agent"), "{err}");
    }
}

/// Where docs/status.md keeps the screen this test writes.
const DOC_BEGIN: &str =
    "<!-- status 80x24: written by tests/status.rs (GPU_STEWARD_BLESS_DOCS=1) -->\n```text\n";
const DOC_END: &str = "```\n<!-- end of status 80x24 -->";

/// The screen in docs/status.md is what `status` shows in an 80×24 terminal on the demo node
/// (tests/scenarios/demo.toml, the bundled scenario), with the port and the clock written
/// as the docs give them. `GPU_STEWARD_BLESS_DOCS=1` rewrites the block.
#[test]
fn the_screen_in_docs_status_md_is_what_status_shows() {
    let agent = Agent::with_scenario(&scenario("demo.toml")).start();
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    std::fs::write(
        &audit,
        record(
            "2026-01-15T11:22:33.000Z",
            "sharing",
            "apply.end",
            ",\"trigger\":\"cli\",\"ok\":true,\"applied\":8",
        ),
    )
    .expect("audit");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[audit]\nfile = \"{}\"\n", audit.display()),
    )
    .expect("config");
    let command = format!(
        "{} status --url http://127.0.0.1:{} --config {}; sleep 60",
        bin(),
        agent.port,
        config.display()
    );
    let tmux = Tmux::start(80, 24, &command);
    let pane = wait_for("the status screen", Duration::from_secs(20), || {
        let p = tmux.capture(false);
        p.contains("LAST CHANGES").then_some(p)
    });
    let port = format!("127.0.0.1:{}", agent.port);
    let mut shown: Vec<String> = pane
        .trim_end()
        .lines()
        .map(|l| l.replace(&port, "127.0.0.1:9400"))
        .collect();
    // The clock: `… · ready · HH:MM:SS · http://…`.
    let at = shown[0].find(" · ready · ").expect("ready") + " · ready · ".len();
    shown[0].replace_range(at..at + 8, "18:25:20");
    let screen = shown.join("\n") + "\n";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/status.md");
    let doc = std::fs::read_to_string(&path).expect("docs/status.md");
    let start = doc.find(DOC_BEGIN).expect("the block's start marker") + DOC_BEGIN.len();
    let end = start + doc[start..].find(DOC_END).expect("the block's end marker");
    if std::env::var_os("GPU_STEWARD_BLESS_DOCS").is_some() {
        let mut new = doc.clone();
        new.replace_range(start..end, &screen);
        std::fs::write(&path, new).expect("write docs/status.md");
        return;
    }
    assert_eq!(
        doc[start..end],
        screen,
        "docs/status.md is out of date: run GPU_STEWARD_BLESS_DOCS=1 cargo test --test status"
    );
}

/// In 80×24, an event from before the agent's restart says so first (the end of a long line
/// is cut), and a cut section's hint repeats the `--url` the screen was asked with.
#[test]
fn status_in_80x24_marks_old_events_first_and_its_hint_keeps_the_url() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir(&state).expect("mkdir");
    let node = "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\n\
                [[gpu.event]]\nid = 1\nxid = 48\n";
    let state_env = state.display().to_string();
    let mut first = Agent::with_scenario(node)
        .env("STATE_DIRECTORY", &state_env)
        .start();
    wait_for("the XID in the journal", Duration::from_secs(20), || {
        first
            .get("/api/v1/events")
            .text()
            .contains("xid_48")
            .then_some(())
    });
    first.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(first.wait_exit(Duration::from_secs(20)).success());
    let agent = Agent::with_scenario(node)
        .env("STATE_DIRECTORY", &state_env)
        .start();
    let audit = write_audit(dir.path());
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[audit]\nfile = \"{}\"\n", audit.display()),
    )
    .expect("config");
    let url = format!("http://127.0.0.1:{}", agent.port);
    let command = format!(
        "{} status --url {url} --config {}; sleep 60",
        bin(),
        config.display()
    );
    let tmux = Tmux::start(80, 24, &command);
    let pane = wait_for("the status screen", Duration::from_secs(20), || {
        let p = tmux.capture(false);
        p.contains("LAST CHANGES").then_some(p)
    });
    let lines: Vec<&str> = pane.lines().collect();
    assert!(lines.iter().all(|l| l.chars().count() <= 80), "{pane}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("  (before the agent's restart) ") && l.contains("xid_48")),
        "{pane}"
    );
    let last = lines.iter().rev().find(|l| !l.is_empty()).expect("a line");
    assert!(
        last.starts_with("  … ")
            && last.contains(&format!(" more: gpu-steward status --url {url} ")),
        "{pane}"
    );
}

/// The faults excerpt in docs/status.md (between its markers) is what an 80×24 terminal shows
/// on tests/scenarios/faults.toml.
#[test]
fn the_faults_excerpt_in_docs_status_md_is_what_status_shows() {
    let agent = Agent::with_scenario(&scenario("faults.toml")).start();
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    std::fs::write(&audit, "").expect("audit");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[audit]\nfile = \"{}\"\n", audit.display()),
    )
    .expect("config");
    let command = format!(
        "{} status --url http://127.0.0.1:{} --config {}; sleep 60",
        bin(),
        agent.port,
        config.display()
    );
    let tmux = Tmux::start(80, 24, &command);
    let pane = wait_for("the status screen", Duration::from_secs(20), || {
        let p = tmux.capture(false);
        p.contains("LAST CHANGES").then_some(p)
    });
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/status.md"))
        .expect("docs/status.md");
    let begin = "<!-- status faults 80x24: checked by tests/status.rs -->\n```text\n";
    let start = doc.find(begin).expect("the excerpt's marker") + begin.len();
    let end = start + doc[start..].find("```").expect("the excerpt's end");
    let excerpt = &doc[start..end];
    assert!(
        pane.contains(excerpt),
        "docs/status.md's faults excerpt is not on the screen:\n{excerpt}\nscreen:\n{pane}"
    );
}

/// Without `--config`, LAST CHANGES reads the audit log the agent it asks on this machine names
/// (`/api/v1/events`' `audit_log`): the demo's own, in its throwaway directory, never the node's.
#[test]
fn status_without_a_config_reads_the_audit_log_of_the_demo_it_asks() {
    let status = |agent: &Agent| {
        let out = Command::new(bin())
            .args([
                "status",
                "--url",
                &format!("http://127.0.0.1:{}", agent.port),
            ])
            .output()
            .expect("status");
        assert_eq!(out.status.code(), Some(0));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // A demo that has changed nothing yet: its log does not exist, and that is no change.
    let quiet = Agent::with_scenario("").demo().start();
    let text = status(&quiet);
    assert!(
        text.contains("LAST CHANGES (audit log, newest first)\n  none"),
        "{text}"
    );
    drop(quiet);
    // A demo that applies a time-slice at start (through its stand-in nvidia-smi) and records
    // it in its own log.
    let busy = Agent::with_scenario("")
        .demo()
        .config("[sharing]\ntimeslice = \"long\"\n")
        .start();
    let text = wait_for(
        "the start apply in LAST CHANGES",
        Duration::from_secs(20),
        || {
            let text = status(&busy);
            text.contains("sharing apply.end").then_some(text)
        },
    );
    assert!(!text.contains("cannot read the audit log"), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("sharing apply.end"))
        .expect("the apply's line");
    assert!(
        line.contains("applied=8") && line.contains("trigger=start"),
        "{line}"
    );
}
