//! Test harness: starts the real `gpu-steward` binary against the simulated NVML
//! (`libnvml_sim.so`) with a scenario file, and talks HTTP to it over loopback.
//!
//! Nothing here sleeps for a fixed time where a condition can be polled: `wait_for` polls with a
//! deadline.

#![allow(dead_code)]

mod exposition;
pub mod fake_grpc;
pub mod fullfs;
mod scenarios;

#[allow(unused_imports)] // each test binary uses a different part
pub use exposition::{Metrics, Sample};
#[allow(unused_imports)]
pub use scenarios::{first, with_event, with_gpu};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The repository's copy of the shared scenarios.
pub fn scenario(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The simulator built by `cargo test --workspace`: `cargo build` leaves it in
/// `target/<profile>/`, `cargo test` only refreshes `target/<profile>/deps/`; take the newer.
pub fn sim_lib() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_BIN_EXE_gpu-steward"))
        .parent()
        .expect("binary has a parent dir")
        .to_path_buf();
    let candidates = [dir.join("libnvml_sim.so"), dir.join("deps/libnvml_sim.so")];
    let (built, lib) = candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p.clone())))
        .max()
        .unwrap_or_else(|| {
            panic!(
                "libnvml_sim.so is missing from {}: run the tests with `cargo test --workspace` \
                 so the simulator is built",
                dir.display()
            )
        });
    // `cargo test --workspace --test X` builds no cdylib: a simulator older than its sources
    // would make the tests pass or fail for the wrong reasons.
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("nvml-sim/src");
    if let Some(newest) = newest_mtime(&sources) {
        assert!(
            newest <= built,
            "{} is older than nvml-sim/src: run `cargo build --workspace` (or the whole \
             `cargo test --workspace`) first",
            lib.display()
        );
    }
    lib
}

fn newest_mtime(dir: &Path) -> Option<std::time::SystemTime> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            if meta.is_dir() {
                newest_mtime(&e.path())
            } else {
                meta.modified().ok()
            }
        })
        .max()
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_gpu-steward")
}

/// Polls `f` until it returns `Some`, or panics with `what` after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A running agent. Killed on drop.
pub struct Agent {
    pub child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub scenario_path: PathBuf,
    pub config_path: PathBuf,
    pub stderr: Arc<Mutex<String>>,
}

pub struct AgentBuilder {
    scenario: String,
    config: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    wait_ready: bool,
    /// `--interval` (200ms unless [`AgentBuilder::interval`] says otherwise).
    interval: String,
    nvml_lib: Option<String>,
    prefix: Vec<String>,
    /// `gpu-steward demo` with the config file as given (no test defaults added).
    demo: bool,
}

impl AgentBuilder {
    /// Loads this library instead of the simulator.
    pub fn nvml_lib(mut self, path: &str) -> Self {
        self.nvml_lib = Some(path.to_string());
        self
    }
    /// Polls every `interval` instead of 200ms.
    pub fn interval(mut self, interval: &str) -> Self {
        self.interval = interval.into();
        self
    }

    pub fn config(mut self, text: &str) -> Self {
        self.config = Some(text.to_string());
        self
    }
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.to_string());
        self
    }
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_string(), v.to_string()));
        self
    }
    /// Runs the agent under this argv prefix (e.g. `nsenter` into a namespace).
    pub fn prefix(mut self, argv: Vec<String>) -> Self {
        self.prefix = argv;
        self
    }
    /// Runs `gpu-steward demo` (its bundled 8×H100 node) with exactly the given config: the
    /// default configuration when none is given.
    pub fn demo(mut self) -> Self {
        self.demo = true;
        self
    }

    /// Do not wait for `/readyz` to answer 200 (for agents that must not become ready).
    pub fn no_wait_ready(mut self) -> Self {
        self.wait_ready = false;
        self
    }

    pub fn start(self) -> Agent {
        let dir = tempfile::tempdir().expect("tempdir");
        let scenario_path = dir.path().join("scenario.toml");
        std::fs::write(&scenario_path, &self.scenario).expect("write scenario");
        let config_path = dir.path().join("config.toml");
        let config = match self.demo {
            true => self.config.clone().unwrap_or_default(),
            false => with_profiling_every_poll(
                &with_test_defaults(self.config.as_deref().unwrap_or("")),
                &self.interval,
            ),
        };
        std::fs::write(&config_path, config).expect("write config");
        let mut cmd = match self.prefix.split_first() {
            None => Command::new(bin()),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin());
                c
            }
        };
        let subcommand = if self.demo { "demo" } else { "run" };
        cmd.args([
            subcommand,
            "--listen",
            "127.0.0.1:0",
            "--interval",
            &self.interval,
        ])
        .arg("--nvml-lib")
        .arg(
            self.nvml_lib
                .clone()
                .unwrap_or_else(|| sim_lib().display().to_string()),
        )
        .arg("--config")
        .arg(&config_path)
        .args(&self.args)
        .env("NVML_SIM_SCENARIO", &scenario_path)
        .env("RUST_LOG", "info")
        .env_remove("GPU_STEWARD_LISTEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if self.demo {
            // The demo writes and uses its bundled scenario.
            cmd.env_remove("NVML_SIM_SCENARIO");
        }
        let mut child = cmd.spawn().expect("spawn gpu-steward");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("stderr piped");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut s = sink.lock().expect("stderr lock");
                s.push_str(&line);
                s.push('\n');
            }
        });
        let port = wait_for(
            "the 'listening on' log line",
            Duration::from_secs(20),
            || {
                let log = stderr.lock().expect("stderr lock").clone();
                log.lines().find_map(|l| {
                    let rest = l.split("listening on 127.0.0.1:").nth(1)?;
                    rest.split(|c: char| !c.is_ascii_digit())
                        .next()?
                        .parse::<u16>()
                        .ok()
                })
            },
        );
        let agent = Agent {
            child,
            port,
            dir,
            scenario_path,
            config_path,
            stderr,
        };
        if self.wait_ready {
            agent.wait_ready();
        }
        agent
    }
}

/// What the harness adds to a test's config: the timed tiers every poll (below), and the full
/// metric profile unless the test names a profile. Most tests check series that only the full
/// page has (the lean default leaves out values the dcgm family carries too); the tests of the
/// lean page itself (tests/metrics.rs, the series budget) say `profile = "lean"` or run `demo`.
pub fn with_test_defaults(config: &str) -> String {
    let config = if config
        .lines()
        .any(|l| l.trim_start().starts_with("profile"))
    {
        config.to_string()
    } else {
        match config.find("[metrics]\n") {
            Some(at) => {
                let end = at + "[metrics]\n".len();
                format!("{}profile = \"full\"\n{}", &config[..end], &config[end..])
            }
            None => format!("{config}\n[metrics]\nprofile = \"full\"\n"),
        }
    };
    with_timed_tiers_every_poll(&config)
}

/// Tests poll every 200 ms and expect a scenario change at the next poll, whatever tier reads
/// it: unless a test sets a tier's interval itself, the slow and expensive tiers run every poll
/// too.
pub fn with_timed_tiers_every_poll(config: &str) -> String {
    let missing: String = ["slow_interval", "expensive_interval"]
        .iter()
        .filter(|k| !config.contains(*k))
        .map(|k| format!("{k} = \"100ms\"\n"))
        .collect();
    if missing.is_empty() {
        return config.to_string();
    }
    match config.find("[poller]\n") {
        Some(at) => {
            let end = at + "[poller]\n".len();
            format!("{}{missing}{}", &config[..end], &config[end..])
        }
        None => format!("{config}\n[poller]\n{missing}"),
    }
}

/// Tests expect GPM values after two polls: unless a test sets `profiling_interval` itself, the
/// profiling window is one poll (`interval`, the shortest the agent accepts).
pub fn with_profiling_every_poll(config: &str, interval: &str) -> String {
    if config.contains("profiling_interval") {
        return config.to_string();
    }
    // The poll interval goes in the file too (the harness also passes `--interval`), so that
    // the file stands on its own: a second process run with it alone must accept it.
    let has_interval = config
        .lines()
        .any(|l| l.trim_start().starts_with("interval"));
    let line = if has_interval {
        format!("profiling_interval = \"{interval}\"\n")
    } else {
        format!("interval = \"{interval}\"\nprofiling_interval = \"{interval}\"\n")
    };
    match config.find("[poller]\n") {
        Some(at) => {
            let end = at + "[poller]\n".len();
            format!("{}{line}{}", &config[..end], &config[end..])
        }
        None => format!("{config}\n[poller]\n{line}"),
    }
}

impl Agent {
    pub fn with_scenario(scenario: &str) -> AgentBuilder {
        AgentBuilder {
            scenario: scenario.to_string(),
            config: None,
            args: Vec::new(),
            env: Vec::new(),
            wait_ready: true,
            interval: "200ms".into(),
            nvml_lib: None,
            prefix: Vec::new(),
            demo: false,
        }
    }

    pub fn wait_ready(&self) {
        wait_for("/readyz 200", Duration::from_secs(20), || {
            (self.get("/readyz").status == 200).then_some(())
        });
    }

    /// Replaces the scenario as docs/simulator.md says: write a temporary file, rename it over.
    pub fn rewrite_scenario(&self, text: &str) {
        let tmp = self.dir.path().join("scenario.toml.tmp");
        std::fs::write(&tmp, text).expect("write scenario");
        std::fs::rename(&tmp, &self.scenario_path).expect("rename scenario");
    }

    pub fn rewrite_config(&self, text: &str) {
        let tmp = self.dir.path().join("config.toml.tmp");
        std::fs::write(&tmp, with_test_defaults(text)).expect("write config");
        std::fs::rename(&tmp, &self.config_path).expect("rename config");
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig)
            .expect("send signal");
    }

    /// Waits for the process to exit and returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        wait_for("the agent to exit", timeout, || {
            self.child.try_wait().expect("try_wait")
        })
    }

    pub fn log(&self) -> String {
        self.stderr.lock().expect("stderr lock").clone()
    }

    pub fn get(&self, path: &str) -> Response {
        self.request(&format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        ))
    }

    pub fn get_with(&self, path: &str, header: &str) -> Response {
        self.request(&format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\n{header}\r\nConnection: close\r\n\r\n"
        ))
    }

    /// Sends raw bytes and parses the reply.
    pub fn request(&self, raw: &str) -> Response {
        self.request_bytes(raw.as_bytes())
    }

    pub fn request_bytes(&self, raw: &[u8]) -> Response {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        // The server may answer and close before reading everything (e.g. 431): ignore EPIPE.
        let _ = s.write_all(raw);
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        Response::parse(&buf)
    }

    pub fn metrics(&self) -> Metrics {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200, "/metrics: {}", r.text());
        Metrics::parse(&r.text())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    fn parse(raw: &[u8]) -> Response {
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or(raw.len());
        let head = String::from_utf8_lossy(&raw[..split]).to_string();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let mut body = raw.get(split + 4..).unwrap_or_default().to_vec();
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        if chunked {
            body = dechunk(&body);
        }
        Response {
            status,
            headers,
            body,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("invalid JSON ({e}): {}", self.text()))
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = data.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&data[..eol])
                .split(';')
                .next()
                .unwrap_or("0")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            return out;
        }
        let start = eol + 2;
        out.extend_from_slice(&data[start..start + size]);
        data = &data[start + size + 2..];
    }
}

/// The series an NVLink GPU adds (docs/metrics.md's count): NVLink, fabric and topology.
pub fn is_nvlink_series(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("nvlink") || n.contains("fabric") || n.contains("topology")
}

/// The scenario as TOML, to compare values against.
pub fn scenario_gpus(text: &str) -> Vec<toml::Value> {
    let v: toml::Value = toml::from_str(text).expect("scenario parses");
    v.get("gpu")
        .and_then(|g| g.as_array())
        .cloned()
        .unwrap_or_default()
}
