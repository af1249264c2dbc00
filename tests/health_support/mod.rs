//! A harness for the health integration tests: the real `gpu-steward` binary against
//! `libnvml_sim.so`, a scenario file the test can rewrite, and a tiny blocking HTTP client.
//! (Kept apart from the shared `tests/common` harness on purpose, to avoid merge conflicts.)

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub struct Agent {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
    scenario: PathBuf,
}

fn sim_library() -> PathBuf {
    // target/debug/deps/health-xxxx → target/debug/libnvml_sim.so
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target directory");
    let lib = dir.join("libnvml_sim.so");
    assert!(
        lib.exists(),
        "{} is missing: run cargo test --workspace",
        lib.display()
    );
    lib
}

impl Agent {
    /// Starts the agent with `scenario` and `config` (TOML texts) and waits for its port.
    pub fn start(scenario: &str, config: &str) -> Agent {
        let dir = tempfile::tempdir().expect("temp dir");
        let scenario_path = dir.path().join("scenario.toml");
        std::fs::write(&scenario_path, scenario).expect("write scenario");
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, config).expect("write config");
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-steward"))
            .args([
                "run",
                "--listen",
                "127.0.0.1:0",
                "--interval",
                "200ms",
                "--nvml-lib",
            ])
            .arg(sim_library())
            .arg("--config")
            .arg(&config_path)
            .env("NVML_SIM_SCENARIO", &scenario_path)
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpu-steward");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on 127.0.0.1:").nth(1) {
                    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
                    let _ = tx.send(digits.parse::<u16>().ok());
                }
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(20))
            .ok()
            .flatten()
            .expect("the agent logs 'listening on 127.0.0.1:PORT'");
        let agent = Agent {
            child,
            port,
            dir,
            scenario: scenario_path,
        };
        agent.wait_for("the first poll", |a| a.get("/readyz").0 == 200);
        agent
    }

    /// Rewrites the scenario the way the simulator expects: a temp file renamed over it.
    pub fn rewrite(&self, scenario: &str) {
        let tmp = self.dir.path().join("scenario.toml.tmp");
        std::fs::write(&tmp, scenario).expect("write scenario");
        std::fs::rename(&tmp, &self.scenario).expect("rename scenario");
    }

    /// GET `path`: (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .expect("send request");
        let mut raw = String::new();
        s.read_to_string(&mut raw).expect("read response");
        let status = raw
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("status line");
        let body = raw
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_string();
        (status, body)
    }

    pub fn json(&self, path: &str) -> (u16, serde_json::Value) {
        let (code, body) = self.get(path);
        let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        (code, v)
    }

    /// Names of the active conditions of GPU `index`, from `/health/gpus`.
    pub fn conditions(&self, index: u32) -> Vec<String> {
        let (_, v) = self.json("/health/gpus");
        v["checks"][format!("gpu:{index}")][0]["conditions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The value of the first `/metrics` series whose line starts with `prefix`.
    pub fn metric(&self, prefix: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics");
        body.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// Polls `cond` every 50 ms until it holds, failing after 15 s.
    pub fn wait_for(&self, what: &str, cond: impl Fn(&Agent) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if cond(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out waiting for {what}");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
