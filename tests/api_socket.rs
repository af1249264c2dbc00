//! The API on a Unix socket (`[api] socket`): served with the same routes, with the configured
//! mode, a stale socket from a crash replaced, a live one refused, the file removed at exit.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{scenario, Agent};
use nix::sys::signal::Signal;

fn curl_unix(socket: &Path, path: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-w",
            "\n%{http_code}",
            "--unix-socket",
        ])
        .arg(socket)
        .arg(format!("http://localhost{path}"))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn config(dir: &Path) -> String {
    let token = dir.join("token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    format!(
        "[api]\nenabled = true\ntoken_file = \"{}\"\nsocket = \"{}\"\nsocket_mode = \"0600\"\n",
        token.display(),
        dir.join("run/api.sock").display()
    )
}

#[test]
fn the_api_socket_serves_replaces_stale_files_and_is_removed_at_exit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("run/api.sock");
    // A socket file left by a crash: nobody listens on it.
    std::fs::create_dir_all(socket.parent().expect("parent")).expect("mkdir");
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("stale socket"));
    assert!(socket.exists());

    let mut agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .config(&config(dir.path()))
        .start();
    let mode = std::fs::metadata(&socket)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let (code, body) = curl_unix(&socket, "/health/gpus");
    assert_eq!(code, 200, "{body}");
    let (code, body) = curl_unix(&socket, "/metrics");
    assert_eq!(code, 200);
    assert!(body.contains("DCGM_FI_DEV_GPU_UTIL{"));
    let (code, _) = curl_unix(&socket, "/no/such/path");
    assert_eq!(code, 404);

    // A second agent on the same socket is refused, naming it; the first keeps serving.
    let second = Command::new(common::bin())
        .args(["run", "--listen", "127.0.0.1:0", "--config"])
        .arg(&agent.config_path)
        .arg("--nvml-lib")
        .arg(common::sim_lib())
        .env("NVML_SIM_SCENARIO", &agent.scenario_path)
        .output()
        .expect("second agent");
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("api.sock") && err.contains("second agent"),
        "{err}"
    );
    assert_eq!(curl_unix(&socket, "/livez").0, 200);

    agent.signal(Signal::SIGTERM);
    let status = agent.wait_exit(Duration::from_secs(5));
    assert!(status.success(), "{}", agent.log());
    assert!(!socket.exists(), "the socket file outlived the agent");
}

#[test]
fn another_users_idle_connections_do_not_lock_root_out() {
    use std::os::unix::process::CommandExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to connect as another user");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let text = config(dir.path()).replace("socket_mode = \"0600\"", "socket_mode = \"0660\"");
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .config(&text)
        .start();
    let socket = dir.path().join("run/api.sock");
    // nobody (in the socket's group) opens 80 connections and sends nothing on them.
    let mut holder = Command::new("perl")
        .args([
            "-MIO::Socket::UNIX",
            "-e",
            "my @s; for (1..80) { my $c = IO::Socket::UNIX->new(Peer => $ARGV[0]) or last; \
             push @s, $c } print scalar(@s), \"\\n\"; STDOUT->flush; sleep 60",
        ])
        .arg(&socket)
        .uid(65534)
        .gid(0)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("perl");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("read");
    assert!(line.trim().parse::<u32>().unwrap_or(0) >= 64, "{line}");
    // Accepted in order: root's connection comes after all of them.
    let started = std::time::Instant::now();
    let (code, body) = curl_unix(&socket, "/livez");
    assert_eq!(code, 200, "{body}\n{}", agent.log());
    assert!(started.elapsed() < Duration::from_secs(2));
    let _ = holder.kill();
    let _ = holder.wait();
}
