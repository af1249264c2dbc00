//! Runs docs/walkthrough.md as written, command by command, in a scratch directory that stands
//! for the repository root (it holds `tests/scenarios/`), with `gpu-steward` on PATH as the
//! page says; every output the page shows must match (tests/walkthrough_support). A page that
//! drifts from the agent fails here.
//!
//! It must not touch the repository: the page's `walk/` is made in the scratch directory.

mod common;
mod walkthrough_support;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{bin, sim_lib, wait_for};
use walkthrough_support::{matches, parse, Step};

/// The port the page's demo listens on; the test moves it to a free one.
const DOC_PORT: &str = "127.0.0.1:19420";

/// A command left running in the background, with its output file; killed when dropped.
struct Job {
    child: Child,
    log: PathBuf,
    command: String,
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Shell {
    root: PathBuf,
    cwd: PathBuf,
    path: String,
    last_status: i32,
    jobs: Vec<Job>,
}

impl Shell {
    fn command(&self, script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).current_dir(&self.cwd);
        cmd.env("PATH", &self.path);
        for k in [
            "RUST_LOG",
            "NO_COLOR",
            "NVML_SIM_SCENARIO",
            "COLUMNS",
            "LINES",
        ] {
            cmd.env_remove(k);
        }
        for (k, _) in std::env::vars() {
            if k.starts_with("GPU_STEWARD_") {
                cmd.env_remove(k);
            }
        }
        cmd
    }

    /// Runs one command as the page's shell would: `$?` is the last command's status, `cd`
    /// carries over, stderr goes where stdout goes (a terminal shows both).
    fn run(&mut self, command: &str) -> (i32, String) {
        let cwd_file = self.root.join(".cwd");
        let script = format!(
            "(exit {})\n{{ {command}\n}} 2>&1\n__status=$?\npwd > '{}'\nexit $__status\n",
            self.last_status,
            cwd_file.display()
        );
        let out = self
            .command(&script)
            .stdin(Stdio::null())
            .output()
            .expect("sh runs");
        let status = out.status.code().unwrap_or(128);
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        if let Ok(dir) = std::fs::read_to_string(&cwd_file) {
            self.cwd = PathBuf::from(dir.trim_end());
        }
        self.last_status = status;
        (status, text)
    }

    fn start(&mut self, command: &str) {
        let log = self.root.join(format!(".job{}.log", self.jobs.len() + 1));
        let out = File::create(&log).expect("the scratch directory is writable");
        let err = out.try_clone().expect("a file handle clones");
        // `exec`: the job is the command itself, so that `kill %1` reaches it.
        let child = self
            .command(&format!("exec {command}"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("sh starts");
        self.jobs.push(Job {
            child,
            log,
            command: command.to_string(),
        });
        self.last_status = 0;
    }

    /// `kill [-SIG] %N`: the shell's job control, which a fresh `sh` per command does not have.
    fn kill_job(&mut self, command: &str) -> Option<()> {
        let mut words = command.split_whitespace();
        if words.next()? != "kill" {
            return None;
        }
        let (sig, job) = match (words.next()?, words.next()) {
            (s, Some(j)) => (s.trim_start_matches('-').to_string(), j),
            (j, None) => ("TERM".to_string(), j),
        };
        let n: usize = job.strip_prefix('%')?.parse().ok()?;
        let signal: nix::sys::signal::Signal = format!("SIG{sig}").parse().ok()?;
        let job = self.jobs.get_mut(n.checked_sub(1)?)?;
        let pid = nix::unistd::Pid::from_raw(job.child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("the job is ours to signal");
        if signal != nix::sys::signal::Signal::SIGHUP {
            wait_for(
                &format!("job %{n} ({}) to exit", job.command),
                Duration::from_secs(30),
                || job.child.try_wait().ok().flatten(),
            );
        }
        self.last_status = 0;
        Some(())
    }
}

fn here(step_line: usize) -> String {
    format!("docs/walkthrough.md:{step_line}")
}

fn expect_output(at: &str, command: &str, expected: &[String], actual: &str) {
    assert!(
        matches(expected, actual),
        "{at}: the output of `{command}` differs from the page\n--- page:\n{}\n--- real run:\n{actual}",
        expected.join("\n")
    );
}

#[test]
fn the_walkthrough_runs_as_written() {
    let sim = sim_lib(); // says how to build the simulator when it is missing
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(manifest.join("docs/walkthrough.md")).expect("the page");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.to_string())
        .expect("a free loopback port");
    let doc = doc.replace(DOC_PORT, &port);
    let steps = parse(&doc).expect("the page parses");
    assert!(steps.len() > 20, "the page's steps were not found");

    // The scratch "repository root": what the page copies from it.
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let root = scratch.path().to_path_buf();
    let scenarios = root.join("tests/scenarios");
    std::fs::create_dir_all(&scenarios).expect("scratch tests/scenarios");
    for e in std::fs::read_dir(manifest.join("tests/scenarios")).expect("tests/scenarios") {
        let e = e.expect("a directory entry");
        // Only the scenario files: a demo run leaves its stand-in's state directory beside
        // its scenario (`<scenario>.nvidia-smi/`).
        if e.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::copy(e.path(), scenarios.join(e.file_name())).expect("a scenario copies");
        }
    }
    // The page puts `target/debug` on PATH (its `export` runs here too, in a shell of its own,
    // and finds no `target/` in the scratch root): a directory with the built binary and the
    // simulator beside it (as `cargo build --workspace` leaves them) stands for it. `cargo test`
    // alone leaves the simulator in `deps/` only, where `--scenario` would not find it.
    let bin_dir = scratch.path().join("bin");
    std::fs::create_dir_all(&bin_dir).expect("scratch bin");
    for (from, name) in [
        (Path::new(bin()), "gpu-steward"),
        (sim.as_path(), "libnvml_sim.so"),
    ] {
        let to = bin_dir.join(name);
        if std::fs::hard_link(from, &to).is_err() {
            std::fs::copy(from, &to).expect("copy into the scratch bin");
        }
    }
    let mut shell = Shell {
        cwd: root.clone(),
        root,
        path: format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
        last_status: 0,
        jobs: Vec::new(),
    };

    for (k, step) in steps.iter().enumerate() {
        match step {
            Step::Save { name, text, line } => {
                std::fs::write(shell.cwd.join(name), text)
                    .unwrap_or_else(|e| panic!("{}: cannot save {name}: {e}", here(*line)));
            }
            Step::Run {
                command,
                background: true,
                expected,
                line,
            } => {
                shell.start(command);
                let job = shell.jobs.last().expect("just started");
                let mut want = expected.clone().unwrap_or_default();
                want.push("…".into()); // it goes on writing
                let at = here(*line);
                wait_for(
                    &format!("{at}: `{command}` to print\n{}", want.join("\n")),
                    Duration::from_secs(60),
                    || {
                        let out = std::fs::read_to_string(&job.log).unwrap_or_default();
                        matches(&want, &out).then_some(())
                    },
                );
            }
            Step::Run {
                command,
                expected,
                line,
                ..
            } => {
                let at = here(*line);
                if shell.kill_job(command).is_some() {
                    continue;
                }
                let (status, out) = shell.run(command);
                // A status that is not 0 must be shown by the next command (`echo $?`).
                let shown = matches!(steps.get(k + 1), Some(Step::Run { command, .. }) if command.contains("$?"));
                assert!(
                    status == 0 || shown,
                    "{at}: `{command}` exited {status} and the page does not say so:\n{out}"
                );
                if let Some(expected) = expected {
                    expect_output(&at, command, expected, &out);
                }
            }
            Step::More { expected, line } => {
                let job = shell.jobs.last().unwrap_or_else(|| {
                    panic!("{}: output with no background command", here(*line))
                });
                let mut want = expected.clone();
                want.push("…".into());
                let mut last = String::new();
                let deadline = std::time::Instant::now() + Duration::from_secs(90);
                loop {
                    last = std::fs::read_to_string(&job.log).unwrap_or(last);
                    if matches(&want, &last) {
                        break;
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "{}: `{}` did not print what the page shows within 90 s\n--- page:\n{}\n--- real run:\n{last}",
                        here(*line),
                        job.command,
                        want.join("\n")
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}
