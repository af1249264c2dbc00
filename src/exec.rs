//! Running external commands (hooks) the safe way: argv executed directly, never through a
//! shell, in a process group of its own, with its input written and closed, its output captured
//! up to a bound, and a deadline after which the whole group is killed. When the command exits,
//! whatever it left running in its group is killed too: a hook's background children never
//! outlive it. Once the agent is stopping ([`crate::shutdown`]) no command starts, and a running
//! one is killed with its group [`crate::shutdown::HOOK_GRACE`] after the stop.
//!
//! As PID 1 (a container without an init) the agent inherits every orphan a hook leaves, and must
//! reap them: [`reap_orphans`]. It reaps only children that `run` is not waiting for itself, so
//! that a hook's own exit status is never taken from it (why this, rather than a blanket
//! `waitpid(-1)` or shipping tini only: the image then works under any runtime, `--init` or not).
//!
//! Blocking; from async code call it in `tokio::task::spawn_blocking`.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

pub use crate::config::hooks::{CommandSpec, HookSection, DEFAULT_TIMEOUT};

/// Hook leaders `run` is waiting for: the PID-1 reaper leaves them alone. Held across `spawn`,
/// so that a leader that exits at once is registered before the reaper can look at it.
static WAITED: std::sync::Mutex<std::collections::BTreeSet<u32>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

fn waited() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<u32>> {
    WAITED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes a leader from [`WAITED`] when `run` is done with it, on every path.
struct Registered(u32);

impl Drop for Registered {
    fn drop(&mut self) {
        waited().remove(&self.0);
    }
}

/// Starts a thread that reaps exited children `run` does not wait for (orphans re-parented to
/// the agent when it is PID 1). Call once, only as PID 1: elsewhere orphans go to init.
pub fn reap_orphans() -> std::io::Result<()> {
    use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag};
    thread::Builder::new()
        .name("reaper".into())
        .spawn(|| loop {
            let reaped = {
                let waited = waited();
                // Peek (WNOWAIT) at one exited child; reap it only if it is nobody's.
                let peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
                match waitid(Id::All, peek).ok().and_then(|s| s.pid()) {
                    Some(pid) if !waited.contains(&pid.as_raw().unsigned_abs()) => {
                        let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                        true
                    }
                    _ => false,
                }
            };
            if !reaped {
                thread::sleep(Duration::from_millis(200));
            }
        })
        .map(|_| ())
}

/// Output kept per stream; the rest is read and dropped so that the command never blocks.
pub const OUTPUT_LIMIT: usize = 16 * 1024;

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It exited with this status.
    Exited(i32),
    /// A signal ended it (not ours).
    Signaled(i32),
    /// It ran past its timeout; its process group was killed.
    TimedOut,
    /// It could not be started.
    SpawnFailed(String),
}

impl Outcome {
    pub fn success(&self) -> bool {
        matches!(self, Outcome::Exited(0))
    }

    /// `success`, `failure`, `timeout` or `error` (could not start): for metric labels.
    pub fn result_label(&self) -> &'static str {
        match self {
            Outcome::Exited(0) => "success",
            Outcome::Exited(_) | Outcome::Signaled(_) => "failure",
            Outcome::TimedOut => "timeout",
            Outcome::SpawnFailed(_) => "error",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Exited(c) => write!(f, "exited with status {c}"),
            Outcome::Signaled(s) => write!(f, "killed by signal {s}"),
            Outcome::TimedOut => write!(f, "timed out; its process group was killed"),
            Outcome::SpawnFailed(e) => write!(f, "could not be started: {e}"),
        }
    }
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct RunOutput {
    pub outcome: Outcome,
    pub duration: Duration,
    /// At most [`OUTPUT_LIMIT`] bytes each, lossy UTF-8.
    pub stdout: String,
    pub stderr: String,
}

/// Runs `spec` with `stdin` as its input and `env` added to the agent's environment.
///
/// The command is the leader of a new process group. When it outlives `spec.timeout` (or the
/// stop's hook grace), the whole group gets SIGKILL and the outcome is [`Outcome::TimedOut`].
/// When it exits in time, what it left running in its group is killed at once, so that nothing a
/// hook starts outlives it or holds the agent.
pub fn run(spec: &CommandSpec, stdin: &[u8], env: &[(String, String)]) -> RunOutput {
    let start = Instant::now();
    let deadline = start + spec.timeout;
    let done = |outcome, stdout, stderr| RunOutput {
        outcome,
        duration: start.elapsed(),
        stdout,
        stderr,
    };
    let Some((program, args)) = spec.argv.split_first() else {
        return done(
            Outcome::SpawnFailed("empty command".into()),
            String::new(),
            String::new(),
        );
    };
    if crate::shutdown::requested() {
        return done(
            Outcome::SpawnFailed(format!("{program}: not started, the agent is stopping")),
            String::new(),
            String::new(),
        );
    }
    let mut command = Command::new(program);
    command
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let spawned = {
        let mut waited = waited();
        command.spawn().map(|c| {
            waited.insert(c.id());
            let registered = Registered(c.id());
            (c, registered)
        })
    };
    let (mut child, _registered) = match spawned {
        Ok(c) => c,
        Err(e) => {
            return done(
                Outcome::SpawnFailed(format!("{program}: {e}")),
                String::new(),
                String::new(),
            )
        }
    };
    let group = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));

    // The input is written from a thread of its own: a command that never reads it must not
    // block us. The thread ends when the pipe closes (EPIPE once the group is gone).
    if let Some(mut pipe) = child.stdin.take() {
        let input = stdin.to_vec();
        let _ = thread::Builder::new()
            .name("exec-stdin".into())
            .spawn(move || {
                let _ = pipe.write_all(&input);
            });
    }
    let stdout = child.stdout.take().map(capture);
    let stderr = child.stderr.take().map(capture);

    let status = match wait(&mut child, group, deadline) {
        Ok(status) => status,
        Err(e) => {
            return done(
                Outcome::SpawnFailed(format!("waiting for {program}: {e}")),
                String::new(),
                String::new(),
            )
        }
    };
    let outcome = match status {
        None => Outcome::TimedOut,
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) => Outcome::Exited(code),
            (None, Some(sig)) => Outcome::Signaled(sig),
            (None, None) => Outcome::Exited(-1),
        },
    };
    // Output is complete when every holder of the pipes is gone. Whatever the command left
    // running past the deadline is killed; a process that left the group (setsid) and keeps
    // the pipe is abandoned after a second rather than waited for.
    let collect = |rx: Option<mpsc::Receiver<String>>| -> String {
        let Some(rx) = rx else {
            return String::new();
        };
        let wait = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(s) => s,
            Err(_) => {
                let _ = killpg(group, Signal::SIGKILL);
                rx.recv_timeout(Duration::from_secs(1)).unwrap_or_default()
            }
        }
    };
    let stdout = collect(stdout);
    let stderr = collect(stderr);
    done(outcome, stdout, stderr)
}

/// Waits for `child` until `deadline` (shortened to the hook grace once the agent stops): its
/// status, or `None` when it ran out of time. Its process group is killed either way (what it
/// left running goes with it), and so on an error.
fn wait(child: &mut Child, group: Pid, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
    let mut pause = Duration::from_millis(1);
    loop {
        // A stop shortens the deadline to the hook grace (systemd's TimeoutStopSec is shorter
        // than a hook's timeout may be).
        let deadline = crate::shutdown::hook_deadline().map_or(deadline, |d| d.min(deadline));
        match child.try_wait() {
            Ok(Some(status)) => {
                // The group outlives its leader only through what the command left running
                // (`cmd &`): that goes with it. The group id cannot be reused while any member
                // is alive, so this reaches nothing else.
                let _ = killpg(group, Signal::SIGKILL);
                return Ok(Some(status));
            }
            Ok(None) if Instant::now() >= deadline => {
                let _ = killpg(group, Signal::SIGKILL);
                let _ = child.wait();
                return Ok(None);
            }
            Ok(None) => {
                thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            Err(e) => {
                let _ = killpg(group, Signal::SIGKILL);
                let _ = child.wait();
                return Err(e);
            }
        }
    }
}

/// Reads a pipe to its end on a thread, keeping the first [`OUTPUT_LIMIT`] bytes.
fn capture<R: Read + Send + 'static>(mut pipe: R) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let _ = thread::Builder::new()
        .name("exec-output".into())
        .spawn(move || {
            let mut kept = Vec::new();
            let mut buf = [0u8; 8192];
            let mut dropped = 0usize;
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let room = OUTPUT_LIMIT.saturating_sub(kept.len()).min(n);
                        kept.extend_from_slice(&buf[..room]);
                        dropped += n - room;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let mut s = String::from_utf8_lossy(&kept).into_owned();
            if dropped > 0 {
                s.push_str(&format!("\n[{dropped} more bytes not kept]"));
            }
            let _ = tx.send(s);
        });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(argv: &[&str], timeout_ms: u64) -> CommandSpec {
        CommandSpec {
            name: "t".into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            timeout: Duration::from_millis(timeout_ms),
        }
    }

    #[test]
    fn input_environment_and_output_pass_as_data() {
        let script =
            r#"read -r line; printf '%s|%s' "$line" "$GPU_STEWARD_X"; echo err >&2; exit 3"#;
        let out = run(
            &spec(&["/bin/sh", "-c", script], 10_000),
            b"$(touch /tmp/never); rm -rf /\n",
            &[("GPU_STEWARD_X".into(), "a;b `c`".into())],
        );
        assert_eq!(out.outcome, Outcome::Exited(3));
        assert_eq!(out.outcome.result_label(), "failure");
        assert_eq!(out.stdout, "$(touch /tmp/never); rm -rf /|a;b `c`");
        assert_eq!(out.stderr, "err\n");
    }

    #[test]
    fn a_missing_program_is_an_error_not_a_panic() {
        let out = run(&spec(&["/nonexistent/hook"], 1000), b"", &[]);
        assert!(
            matches!(out.outcome, Outcome::SpawnFailed(ref e) if e.contains("/nonexistent/hook"))
        );
        assert_eq!(out.outcome.result_label(), "error");
        let out = run(&spec(&[], 1000), b"", &[]);
        assert!(matches!(out.outcome, Outcome::SpawnFailed(_)));
    }

    #[test]
    fn a_hung_command_is_killed_with_its_children() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("child.pid");
        // The child sleeps in the background and its pid is written down; the leader waits.
        let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
        let out = run(&spec(&["/bin/sh", "-c", &script], 300), b"", &[]);
        assert_eq!(out.outcome, Outcome::TimedOut);
        assert_eq!(out.outcome.result_label(), "timeout");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .expect("pid written")
            .trim()
            .parse()
            .expect("pid");
        assert!(gone(pid), "the background child {pid} survived the timeout");
    }

    #[test]
    fn what_a_command_leaves_running_is_killed_when_it_exits() {
        let dir = tempfile::tempdir().expect("tempdir");
        // One child keeps the output open, the other does not: both go with the leader, long
        // before the deadline.
        let held = dir.path().join("held.pid");
        let quiet = dir.path().join("quiet.pid");
        let script = format!(
            "sleep 300 & echo $! > {}; sleep 300 >/dev/null 2>&1 & echo $! > {}; echo started",
            held.display(),
            quiet.display()
        );
        let out = run(&spec(&["/bin/sh", "-c", &script], 60_000), b"", &[]);
        assert_eq!(out.outcome, Outcome::Exited(0));
        assert_eq!(out.stdout, "started\n");
        assert!(out.duration < Duration::from_secs(30), "{:?}", out.duration);
        for f in [held, quiet] {
            let pid: i32 = std::fs::read_to_string(&f)
                .expect("pid written")
                .trim()
                .parse()
                .expect("pid");
            assert!(gone(pid), "the leftover child {pid} was not killed");
        }
    }

    #[test]
    fn output_is_bounded_and_the_command_never_blocks_on_it() {
        let out = run(
            &spec(
                &["/bin/sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' x"],
                10_000,
            ),
            b"",
            &[],
        );
        assert_eq!(out.outcome, Outcome::Exited(0));
        assert!(out.stdout.starts_with(&"x".repeat(OUTPUT_LIMIT)));
        assert!(
            out.stdout.ends_with(&format!(
                "[{} more bytes not kept]",
                1_000_000 - OUTPUT_LIMIT
            )),
            "{}",
            &out.stdout[OUTPUT_LIMIT..]
        );
    }

    #[test]
    fn large_input_to_a_command_that_ignores_it_does_not_block() {
        let out = run(&spec(&["/bin/true"], 10_000), &vec![b'x'; 1 << 20], &[]);
        assert_eq!(out.outcome, Outcome::Exited(0));
    }

    #[test]
    fn hook_sections_refuse_shell_strings_and_empty_commands() {
        let ok: HookSection =
            toml::from_str("name = \"a\"\ncommand = [\"/bin/x\", \"y z\"]\n").expect("valid");
        assert_eq!(ok.spec().timeout, DEFAULT_TIMEOUT);
        let e = toml::from_str::<HookSection>("name = \"a\"\ncommand = [\"/bin/x --flag\"]\n")
            .expect_err("one string with spaces");
        assert!(e.to_string().contains("without a shell"), "{e}");
        let e = toml::from_str::<HookSection>("name = \"a\"\ncommand = []\n").expect_err("empty");
        assert!(e.to_string().contains("command is empty"), "{e}");
        let e =
            toml::from_str::<HookSection>("name = \"a\"\ncommand = [\"/x\"]\ntimeout = \"0s\"\n")
                .expect_err("zero");
        assert!(e.to_string().contains("longer than zero"), "{e}");
    }

    /// Gone, or a zombie nobody reaps (this machine's init does not).
    fn gone(pid: i32) -> bool {
        for _ in 0..100 {
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => return true,
                Ok(stat) => {
                    let state = stat
                        .rsplit(')')
                        .next()
                        .and_then(|r| r.split_whitespace().next());
                    if matches!(state, Some("Z" | "X")) {
                        return true;
                    }
                }
            }
            thread::sleep(Duration::from_millis(20));
        }
        false
    }
}
