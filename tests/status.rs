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
    assert!(pane.contains("GPU  HEALTH  UTIL"), "{pane}");
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
    let out = Command::new(bin())
        .args(["status", "--config", "/dev/null", "--socket"])
        .arg(&socket)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", agent.log());
    assert!(
        text.starts_with(&format!("gpu-steward at unix:{}", socket.display()))
            && text.contains("8 GPU(s): 8 pass"),
        "{text}"
    );
}
