//! Harness of the end-to-end test with a real Prometheus: starts `gpu-steward` agents against the
//! simulated NVML and a `prometheus` server scraping them, all on loopback, and kills every
//! process on drop. Owned by the packaging work; `tests/common/` is the lead's.
//!
//! Nothing sleeps for a fixed time where a condition can be polled: `wait_for` polls with a
//! deadline.

#![allow(dead_code)]

pub mod dashboards;
pub mod expected;
pub mod truth;

pub use crate::common::wait_for;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The repository root (the root package's manifest directory).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `libnvml_sim.so` as `cargo test --workspace` leaves it: `cargo build` writes
/// `target/<profile>/`, `cargo test` only refreshes `target/<profile>/deps/`; take the newer.
pub struct Proc {
    child: Child,
    pub name: String,
    pub stderr: Arc<Mutex<String>>,
}

impl Proc {
    fn spawn(name: &str, mut cmd: Command) -> Proc {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("stderr is piped");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut s = sink.lock().expect("stderr buffer lock");
                s.push_str(&line);
                s.push('\n');
            }
        });
        Proc {
            child,
            name: name.to_string(),
            stderr,
        }
    }

    pub fn log(&self) -> String {
        self.stderr.lock().expect("stderr buffer lock").clone()
    }

    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited with {status}:\n{}", self.name, self.log());
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `gpu-steward run` on a free loopback port against the simulator, with its own scenario copy.
/// An agent on a shared scenario, through the shared harness (`tests/common`).
pub struct Agent(pub crate::common::Agent);

impl Agent {
    pub fn start(scenario: &str) -> Agent {
        Agent(crate::common::Agent::with_scenario(&crate::common::scenario(scenario)).start())
    }

    /// With this config (the harness adds `profile = "full"` only where it names no profile).
    pub fn start_with_config(scenario: &str, config: &str) -> Agent {
        Agent(
            crate::common::Agent::with_scenario(&crate::common::scenario(scenario))
                .config(config)
                .start(),
        )
    }

    /// On a scenario given as text (a node no shared scenario describes), with this config.
    pub fn start_on(scenario_text: &str, config: &str) -> Agent {
        Agent(
            crate::common::Agent::with_scenario(scenario_text)
                .config(config)
                .start(),
        )
    }

    pub fn target(&self) -> String {
        format!("127.0.0.1:{}", self.0.port)
    }

    pub fn log(&self) -> String {
        self.0.log()
    }
}

/// A free loopback port (bound, read, released: a tiny race, acceptable in a test).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

/// A `prometheus` server on loopback with a temporary TSDB, scraping `targets` every second and
/// evaluating `rules` every second.
pub struct Prometheus {
    pub proc: Proc,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    pub fn start(targets: &[String], rules: &str) -> Prometheus {
        Prometheus::start_every(targets, rules, "1s")
    }

    /// Scraping every `scrape` (`15s`: Grafana's default, which its `$__rate_interval` assumes).
    pub fn start_every(targets: &[String], rules: &str, scrape: &str) -> Prometheus {
        let bin = std::env::var("PROMETHEUS").unwrap_or_else(|_| "/usr/bin/prometheus".into());
        assert!(
            Path::new(&bin).is_file(),
            "{bin} is missing: install the Debian package 'prometheus' (or set PROMETHEUS=path)"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("rules.yml"), rules).expect("write the rules");
        let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: {scrape}\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: gpu-steward\n    static_configs:\n      - targets: [{}]\n",
            dir.path().join("rules.yml").display(),
            list.join(", ")
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("write the config");
        let port = free_port();
        let mut cmd = Command::new(bin);
        cmd.arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn");
        let mut proc = Proc::spawn("prometheus", cmd);
        wait_for("prometheus /-/ready", Duration::from_secs(30), || {
            proc.assert_running();
            let (status, _) = http_get(port, "/-/ready")?;
            (status == 200).then_some(())
        });
        Prometheus {
            proc,
            port,
            _dir: dir,
        }
    }

    /// `/api/v1/query`: the result vector (or scalar), or the error Prometheus gives.
    pub fn query(&self, promql: &str) -> Result<serde_json::Value, String> {
        let path = format!("/api/v1/query?query={}", urlencode(promql));
        let (status, body) =
            http_get(self.port, &path).ok_or_else(|| "prometheus did not answer".to_string())?;
        let v: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("HTTP {status}: {e}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!("HTTP {status}: {}", v["error"]));
        }
        Ok(v["data"]["result"].clone())
    }

    /// `/api/v1/query` evaluated at `time` (Unix seconds), so that a test can ask what a panel
    /// showed at a moment it knows (just after an XID arrived) however long it takes to ask.
    pub fn query_at(&self, promql: &str, time: f64) -> Result<serde_json::Value, String> {
        let path = format!("/api/v1/query?query={}&time={time:.3}", urlencode(promql));
        let (status, body) =
            http_get(self.port, &path).ok_or_else(|| "prometheus did not answer".to_string())?;
        let v: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("HTTP {status}: {e}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!("HTTP {status}: {}", v["error"]));
        }
        Ok(v["data"]["result"].clone())
    }

    /// `/api/v1/alerts`: the active alerts (pending and firing).
    pub fn alerts(&self) -> Vec<serde_json::Value> {
        http_get(self.port, "/api/v1/alerts")
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
            .and_then(|v| v["data"]["alerts"].as_array().cloned())
            .unwrap_or_default()
    }
}

/// Whether a query result holds data: a non-empty vector/matrix, or a scalar.
pub fn has_data(result: &serde_json::Value) -> bool {
    match result {
        serde_json::Value::Array(a) => !a.is_empty(),
        serde_json::Value::Null => false,
        _ => true,
    }
}

/// Percent-encodes a query-string value (RFC 3986 unreserved characters pass through).
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A plain HTTP/1.0 GET on loopback: (status, body), or None when nothing answers.
/// HTTP/1.0 keeps the answer unchunked and the connection closed after it.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}
