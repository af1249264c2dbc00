//! TLS and basic auth from an exporter-toolkit web config, against the real binary, with curl
//! as the client (what operators and Prometheus-compatible tools speak).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{scenario, wait_for, Agent};

struct Pki {
    ca_pem: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca = CertificateParams::new(Vec::new()).expect("ca params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "gpu-steward test CA");
    let ca = ca.self_signed(&ca_key).expect("ca cert");
    let server_key = KeyPair::generate().expect("server key");
    let server = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("server params")
        .signed_by(&server_key, &ca, &ca_key)
        .expect("server cert");
    let client_key = KeyPair::generate().expect("client key");
    let mut client = CertificateParams::new(vec!["prometheus".into()]).expect("client params");
    client.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let client = client
        .signed_by(&client_key, &ca, &ca_key)
        .expect("client cert");
    Pki {
        ca_pem: ca.pem(),
        server_cert: server.pem(),
        server_key: server_key.serialize_pem(),
        client_cert: client.pem(),
        client_key: client_key.serialize_pem(),
    }
}

/// curl's status code for `url` (0 when the connection or handshake failed), and the body.
fn curl(dir: &Path, url: &str, extra: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(dir.join("ca.pem"))
        .args(["-w", "\n%{http_code}"])
        .args(extra)
        .arg(url)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn start(web_config: &str) -> (Agent, tempfile::TempDir) {
    let pki = pki();
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text) in [
        ("ca.pem", &pki.ca_pem),
        ("server.pem", &pki.server_cert),
        ("server.key", &pki.server_key),
        ("client.pem", &pki.client_cert),
        ("client.key", &pki.client_key),
    ] {
        std::fs::write(dir.path().join(name), text).expect("write pki");
    }
    let web = dir.path().join("web.yml");
    std::fs::write(&web, web_config).expect("write web config");
    let agent = Agent::with_scenario(&scenario("dgx-h100.toml"))
        .arg("--web-config-file")
        .arg(&web.display().to_string())
        .no_wait_ready()
        .start();
    (agent, dir)
}

fn bcrypt_line(user: &str, password: &str) -> String {
    let hash = bcrypt::hash(password, 8).expect("bcrypt");
    format!("basic_auth_users:\n  {user}: \"{hash}\"\n")
}

#[test]
fn tls_with_basic_auth_leaves_the_probes_open() {
    let web = format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n\
         http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000\n{}",
        bcrypt_line("prometheus", "s3cret")
    );
    let (agent, dir) = start(&web);
    let base = format!("https://localhost:{}", agent.port);
    wait_for("/readyz over TLS", Duration::from_secs(20), || {
        (curl(dir.path(), &format!("{base}/readyz"), &[]).0 == 200).then_some(())
    });
    for open in [
        "/livez",
        "/readyz",
        "/health",
        "/health/gpus",
        "/health/gpus/0",
    ] {
        let (code, body) = curl(dir.path(), &format!("{base}{open}"), &[]);
        assert_eq!(code, 200, "{open} must stay open for probes: {body}");
    }
    for closed in ["/metrics", "/", "/api/v1/events"] {
        let (code, _) = curl(dir.path(), &format!("{base}{closed}"), &[]);
        assert_eq!(code, 401, "{closed} without credentials");
        let (code, _) = curl(
            dir.path(),
            &format!("{base}{closed}"),
            &["-u", "prometheus:wrong"],
        );
        assert_eq!(code, 401, "{closed} with a wrong password");
    }
    let (code, body) = curl(
        dir.path(),
        &format!("{base}/metrics"),
        &["-u", "prometheus:s3cret"],
    );
    assert_eq!(code, 200);
    assert!(body.contains("DCGM_FI_DEV_GPU_UTIL{"), "{body}");
    let (code, headers) = curl(
        dir.path(),
        &format!("{base}/livez"),
        &["-o", "/dev/null", "-D", "-"],
    );
    assert_eq!(code, 200);
    assert!(
        headers
            .to_ascii_lowercase()
            .contains("strict-transport-security: max-age=31536000"),
        "{headers}"
    );
    // Plain HTTP to the TLS port gets told, in plain HTTP, rather than a reset.
    let plain = agent.get("/livez");
    assert_eq!(plain.status, 400);
    assert!(plain.text().contains("speaks HTTPS"), "{}", plain.text());
    // TLS 1.3 and 1.2 both answer (the defaults), and ALPN says HTTP/1.1.
    let (code, _) = curl(
        dir.path(),
        &format!("{base}/livez"),
        &["--tlsv1.2", "--tls-max", "1.2"],
    );
    assert_eq!(code, 200);
}

#[test]
fn client_certificates_are_required_and_verified_when_asked() {
    let web = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
               client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n  \
               min_version: TLS13\n";
    let (agent, dir) = start(web);
    let base = format!("https://localhost:{}", agent.port);
    let client = [
        "--cert",
        &dir.path().join("client.pem").display().to_string(),
        "--key",
        &dir.path().join("client.key").display().to_string(),
    ]
    .map(String::from);
    let client: Vec<&str> = client.iter().map(String::as_str).collect();
    wait_for(
        "/readyz with a client certificate",
        Duration::from_secs(20),
        || (curl(dir.path(), &format!("{base}/readyz"), &client).0 == 200).then_some(()),
    );
    let (code, _) = curl(dir.path(), &format!("{base}/metrics"), &client);
    assert_eq!(code, 200);
    let (code, _) = curl(dir.path(), &format!("{base}/metrics"), &[]);
    assert_eq!(
        code, 0,
        "a client without a certificate must fail the handshake"
    );
    let (code, _) = curl(
        dir.path(),
        &format!("{base}/livez"),
        &[&client[..], &["--tls-max", "1.2"]].concat(),
    );
    assert_eq!(code, 0, "min_version TLS13 must refuse TLS 1.2");
}

#[test]
fn a_broken_web_config_stops_the_start_and_says_where() {
    let dir = tempfile::tempdir().expect("tempdir");
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        "tls_server_config:\n  cert_file: missing.pem\n  key_file: missing.key\n",
    )
    .expect("write");
    let out = Command::new(common::bin())
        .args(["run", "--listen", "127.0.0.1:0", "--web-config-file"])
        .arg(&web)
        .arg("--nvml-lib")
        .arg(common::sim_lib())
        .env(
            "NVML_SIM_SCENARIO",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios/dgx-h100.toml"),
        )
        .output()
        .expect("run");
    // 2, a configuration error: the unit's RestartPreventExitStatus=2 stops instead of looping.
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cert_file missing.pem") && err.contains("does not start"),
        "{err}"
    );
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!("[server]\nweb_config_file = \"{}\"\n", web.display()),
    )
    .expect("write");
    let out = Command::new(common::bin())
        .arg("check-config")
        .arg(&config)
        .output()
        .expect("check-config");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.pem"));
}

#[test]
fn a_relative_web_config_file_is_found_beside_the_config_file() {
    // Run from `/`, as systemd does: the web config must be read from the config's directory.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[server]\nweb_config_file = \"web.yml\"\n").expect("write");

    std::fs::write(
        dir.path().join("web.yml"),
        bcrypt_line("prometheus", "secret"),
    )
    .expect("write");
    let out = Command::new(common::bin())
        .arg("check-config")
        .arg(&config)
        .current_dir("/")
        .output()
        .expect("check-config");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");

    // An unusable one (its certificate is missing) stops `run` with exit 2, naming the problem
    // inside the file that was found.
    std::fs::write(
        dir.path().join("web.yml"),
        "tls_server_config:\n  cert_file: missing.pem\n  key_file: missing.key\n",
    )
    .expect("write");
    let out = Command::new(common::bin())
        .args(["run", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--nvml-lib")
        .arg(common::sim_lib())
        .env(
            "NVML_SIM_SCENARIO",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios/dgx-h100.toml"),
        )
        .current_dir("/")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cert_file missing.pem"), "{err}");
}
