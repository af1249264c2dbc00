//! `[otlp]` end to end: the real agent on the simulated NVML pushes to receivers built from
//! the OpenTelemetry project's own protos (crate `opentelemetry-proto`: tonic's generated
//! `MetricsService` server for gRPC; an HTTP server decoding `ExportMetricsServiceRequest`
//! with prost for http/protobuf). Every value is the scenario's; a lost GPU is
//! `hw.status{hw.state="failed"} = 1`; a collector that answers 503 / UNAVAILABLE first gets
//! the data once it is up; one killed mid-run leaves the polls going and the queue bounded.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{first, scenario, scenario_gpus, wait_for, with_gpu, Agent};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use prost::Message;

const MIB: f64 = 1024.0 * 1024.0;
/// `hw.gpu.memory.limit` of an H100 SXM5 80GB: NVML's total (tests/metrics.rs has the same).
const H100_TOTAL_MIB: f64 = 81559.0;
/// `[otlp]`'s queue bound (src/config/otlp.rs).
const QUEUE_CAPACITY: f64 = 16.0;

/// What a receiver got: each request and the headers (gRPC metadata) it came with.
#[derive(Default)]
struct Got {
    requests: Vec<ExportMetricsServiceRequest>,
    headers: Vec<BTreeMap<String, String>>,
}

/// A receiver on loopback, stopped when dropped (its runtime with it).
struct Receiver {
    port: u16,
    got: Arc<Mutex<Got>>,
    calls: Arc<AtomicUsize>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Receiver {
    fn requests(&self) -> Vec<ExportMetricsServiceRequest> {
        self.got.lock().expect("lock").requests.clone()
    }
    /// Stops it at once, as a collector that is killed.
    fn kill(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.kill();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// http/protobuf on `/v1/metrics`: the first `fail_first` requests get 503 with
/// `Retry-After: 1`.
fn http_receiver(fail_first: usize) -> Receiver {
    let rt = runtime();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let got = Arc::new(Mutex::new(Got::default()));
    let calls = Arc::new(AtomicUsize::new(0));
    let (g, c) = (got.clone(), calls.clone());
    let app = axum::Router::new().route(
        "/v1/metrics",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| async move {
                use axum::http::StatusCode;
                if c.fetch_add(1, Ordering::SeqCst) < fail_first {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [("retry-after", "1")],
                        Vec::new(),
                    );
                }
                let ok = headers
                    .get("content-type")
                    .is_some_and(|v| v == "application/x-protobuf");
                let Ok(req) = ExportMetricsServiceRequest::decode(body).map_err(drop) else {
                    return (StatusCode::BAD_REQUEST, [("x-why", "decode")], Vec::new());
                };
                if !ok {
                    return (
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        [("x-why", "type")],
                        Vec::new(),
                    );
                }
                let mut got = g.lock().expect("lock");
                got.requests.push(req);
                got.headers.push(
                    headers
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                        .collect(),
                );
                let reply = ExportMetricsServiceResponse::default().encode_to_vec();
                (
                    StatusCode::OK,
                    [("content-type", "application/x-protobuf")],
                    reply,
                )
            },
        ),
    );
    rt.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Receiver {
        port,
        got,
        calls,
        rt: Some(rt),
    }
}

struct Grpc {
    got: Arc<Mutex<Got>>,
    calls: Arc<AtomicUsize>,
    fail_first: usize,
}

#[tonic::async_trait]
impl MetricsService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.fail_first {
            return Err(tonic::Status::unavailable("starting up"));
        }
        let headers = request
            .metadata()
            .clone()
            .into_headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let mut got = self.got.lock().expect("lock");
        got.requests.push(request.into_inner());
        got.headers.push(headers);
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// gRPC `MetricsService`: the first `fail_first` calls get `UNAVAILABLE`.
fn grpc_receiver(fail_first: usize) -> Receiver {
    let rt = runtime();
    let got = Arc::new(Mutex::new(Got::default()));
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = Grpc {
        got: got.clone(),
        calls: calls.clone(),
        fail_first,
    };
    let incoming = rt
        .block_on(async {
            tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().expect("addr"))
        })
        .expect("bind");
    let port = incoming.local_addr().expect("addr").port();
    rt.spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(MetricsServiceServer::new(svc))
            .serve_with_incoming(incoming)
            .await;
    });
    Receiver {
        port,
        got,
        calls,
        rt: Some(rt),
    }
}

/// One data point, flattened: metric name, unit, kind, attributes, value.
#[derive(Debug, Clone)]
struct Point {
    name: String,
    unit: String,
    /// `gauge`, `counter` (monotonic cumulative sum) or `updown` (non-monotonic).
    kind: &'static str,
    attrs: BTreeMap<String, String>,
    value: f64,
    start: u64,
    time: u64,
}

fn text(kv: &[KeyValue]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|a| {
            let v = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Any::StringValue(s)) => s.clone(),
                Some(Any::IntValue(i)) => i.to_string(),
                other => format!("{other:?}"),
            };
            (a.key.clone(), v)
        })
        .collect()
}

fn flatten(r: &ExportMetricsServiceRequest) -> Vec<Point> {
    let mut out = Vec::new();
    for rm in &r.resource_metrics {
        for sm in &rm.scope_metrics {
            for m in &sm.metrics {
                let (kind, dps) = match &m.data {
                    Some(metric::Data::Gauge(g)) => ("gauge", &g.data_points),
                    Some(metric::Data::Sum(s)) => {
                        // Every sum the agent sends is cumulative (temporality 2).
                        assert_eq!(s.aggregation_temporality, 2, "{}", m.name);
                        (
                            if s.is_monotonic { "counter" } else { "updown" },
                            &s.data_points,
                        )
                    }
                    other => panic!("{}: unexpected data {other:?}", m.name),
                };
                for p in dps {
                    let value = match p.value {
                        Some(number_data_point::Value::AsDouble(d)) => d,
                        Some(number_data_point::Value::AsInt(i)) => i as f64,
                        None => panic!("{}: a point without a value", m.name),
                    };
                    out.push(Point {
                        name: m.name.clone(),
                        unit: m.unit.clone(),
                        kind,
                        attrs: text(&p.attributes),
                        value,
                        start: p.start_time_unix_nano,
                        time: p.time_unix_nano,
                    });
                }
            }
        }
    }
    out
}

fn resource(r: &ExportMetricsServiceRequest) -> BTreeMap<String, String> {
    text(
        &r.resource_metrics[0]
            .resource
            .as_ref()
            .expect("a resource")
            .attributes,
    )
}

/// The one point of `name` for `hw_id` with the extra attributes `with`.
fn point<'a>(ps: &'a [Point], name: &str, hw_id: &str, with: &[(&str, &str)]) -> &'a Point {
    let found: Vec<&Point> = ps
        .iter()
        .filter(|p| {
            p.name == name
                && p.attrs.get("hw.id").map(String::as_str) == Some(hw_id)
                && with
                    .iter()
                    .all(|(k, v)| p.attrs.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {hw_id} {with:?}: {found:?}");
    found[0]
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

/// The UUID of each GPU, by index, from `/metrics` (the agent's own page).
fn uuids(agent: &Agent, n: usize) -> Vec<String> {
    let m = agent.metrics();
    (0..n)
        .map(|i| {
            let idx = i.to_string();
            let s = m.find("gpu_steward_gpu_info", &[("gpu", idx.as_str())]);
            s[0].labels["uuid"].clone()
        })
        .collect()
}

fn metric(agent: &Agent, name: &str) -> f64 {
    agent.metrics().get(name, &[])
}

/// Every value of the first two GPUs of the DGX scenario, as the hardware conventions name it.
fn check_values(agent: &Agent, text_: &str, r: &ExportMetricsServiceRequest) {
    let ps = flatten(r);
    let gpus = scenario_gpus(text_);
    let ids = uuids(agent, gpus.len());
    let res = resource(r);
    assert_eq!(res["service.name"], "gpu-steward");
    assert_eq!(res["service.version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        res["host.name"],
        nix::unistd::gethostname()
            .expect("hostname")
            .to_string_lossy()
    );
    for (i, g) in gpus.iter().enumerate() {
        let id = ids[i].as_str();
        assert!(id.starts_with("GPU-"), "{id}");
        let int = |k: &str| g[k].as_integer().expect(k) as f64;
        let float = |k: &str| g[k].as_float().expect(k);
        let util = point(&ps, "hw.gpu.utilization", id, &[("hw.gpu.task", "general")]);
        assert_eq!((util.unit.as_str(), util.kind), ("1", "gauge"));
        assert!(
            close(util.value, int("gpu_util_percent") / 100.0),
            "{util:?}"
        );
        // Identity on every point.
        assert_eq!(util.attrs["hw.type"], "gpu");
        assert_eq!(util.attrs["hw.vendor"], "NVIDIA");
        assert_eq!(util.attrs["hw.model"], "NVIDIA H100 80GB HBM3");
        assert_eq!(util.attrs["hw.name"], format!("GPU {i}"));
        assert_eq!(util.attrs["hw.driver_version"], "580.95.05");
        let used = point(&ps, "hw.gpu.memory.usage", id, &[]);
        assert_eq!((used.unit.as_str(), used.kind), ("By", "updown"));
        assert_eq!(used.value, int("memory_used_mib") * MIB);
        let limit = point(&ps, "hw.gpu.memory.limit", id, &[]);
        assert_eq!((limit.unit.as_str(), limit.kind), ("By", "updown"));
        assert_eq!(limit.value, H100_TOTAL_MIB * MIB);
        let frac = point(&ps, "hw.gpu.memory.utilization", id, &[]);
        assert!(
            close(frac.value, int("memory_used_mib") / H100_TOTAL_MIB),
            "{frac:?}"
        );
        let bw = point(&ps, "gpu_steward.gpu.memory.bandwidth.utilization", id, &[]);
        assert!(close(bw.value, int("mem_util_percent") / 100.0), "{bw:?}");
        let power = point(&ps, "hw.power", id, &[]);
        assert_eq!((power.unit.as_str(), power.kind), ("W", "gauge"));
        assert!(close(power.value, float("power_w")), "{power:?}");
        let energy = point(&ps, "hw.energy", id, &[]);
        assert_eq!((energy.unit.as_str(), energy.kind), ("J", "counter"));
        assert!(energy.start > 0 && energy.start < energy.time, "{energy:?}");
        let temp = point(&ps, "gpu_steward.gpu.temperature", id, &[]);
        assert_eq!(
            (temp.unit.as_str(), temp.value),
            ("Cel", int("temperature_c"))
        );
        let mtemp = point(&ps, "gpu_steward.gpu.memory.temperature", id, &[]);
        assert_eq!(mtemp.value, int("memory_temperature_c"));
        let sm = point(
            &ps,
            "gpu_steward.gpu.clock",
            id,
            &[("gpu_steward.clock.domain", "sm")],
        );
        assert_eq!(
            (sm.unit.as_str(), sm.value),
            ("Hz", int("sm_clock_mhz") * 1e6)
        );
        let memclk = point(
            &ps,
            "gpu_steward.gpu.clock",
            id,
            &[("gpu_steward.clock.domain", "memory")],
        );
        assert_eq!(memclk.value, int("mem_clock_mhz") * 1e6);
        for kind in ["corrected", "uncorrected"] {
            let e = point(&ps, "hw.errors", id, &[("error.type", kind)]);
            assert_eq!(
                (e.unit.as_str(), e.kind, e.value),
                ("{error}", "counter", 0.0)
            );
        }
        for (state, v) in [("ok", 1.0), ("degraded", 0.0), ("failed", 0.0)] {
            let s = point(&ps, "hw.status", id, &[("hw.state", state)]);
            assert_eq!(
                (s.unit.as_str(), s.kind, s.value),
                ("1", "updown", v),
                "{state}"
            );
        }
    }
}

#[test]
fn http_protobuf_from_the_environment_sends_the_scenarios_values() {
    let rx = http_receiver(0);
    let text = first(&scenario("dgx-h100.toml"), 2).to_string();
    let endpoint = format!("http://127.0.0.1:{}", rx.port);
    let agent = Agent::with_scenario(&text)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_METRIC_EXPORT_INTERVAL", "1000")
        .env("OTEL_EXPORTER_OTLP_HEADERS", "x-team=gpu%20fleet")
        .env("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
        .env("NODE_NAME", "node-a")
        .start();
    let r = wait_for("an export", Duration::from_secs(20), || {
        rx.requests().into_iter().next()
    });
    check_values(&agent, &text, &r);
    let res = resource(&r);
    assert_eq!(res["deployment.environment"], "test");
    assert_eq!(res["k8s.node.name"], "node-a");
    let headers = rx.got.lock().expect("lock").headers[0].clone();
    assert_eq!(headers["x-team"], "gpu fleet");
    wait_for("two exports counted", Duration::from_secs(10), || {
        (metric(&agent, "gpu_steward_otlp_exports_total") >= 2.0).then_some(())
    });
    let m = agent.metrics();
    assert_eq!(m.get("gpu_steward_otlp_failures_total", &[]), 0.0);
    assert_eq!(m.get("gpu_steward_otlp_points_dropped_total", &[]), 0.0);
    assert!(m.get("gpu_steward_otlp_last_success_timestamp_seconds", &[]) > 1.7e9);
    // The exporter's series are documented, and the page still passes promtool's lint.
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md"))
        .expect("docs/metrics.md");
    let ours: Vec<&str> = m
        .samples
        .iter()
        .map(|s| s.name.as_str())
        .filter(|n| n.starts_with("gpu_steward_otlp_"))
        .collect();
    assert_eq!(ours.len(), 5, "{ours:?}");
    for n in ours {
        assert!(
            doc.contains(&format!("| `{n}` |")),
            "{n} is not in docs/metrics.md"
        );
    }
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian package 'prometheus')");
    std::io::Write::write_all(promtool.stdin.as_mut().expect("stdin"), m.text.as_bytes())
        .expect("write");
    let out = promtool.wait_with_output().expect("promtool runs");
    let report =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = report.lines().filter(|l| l.contains("otlp")).collect();
    assert!(ours.is_empty(), "promtool on the otlp series: {ours:?}");
}

#[test]
fn grpc_sends_the_scenarios_values_and_a_lost_gpu_is_failed() {
    let rx = grpc_receiver(0);
    let text = first(&scenario("dgx-h100.toml"), 2).to_string();
    let config = format!(
        "[otlp]\nendpoint = \"http://127.0.0.1:{}\"\nprotocol = \"grpc\"\ninterval = \"1s\"\n\
         [otlp.headers]\nx-team = \"gpu\"\n",
        rx.port
    );
    let agent = Agent::with_scenario(&text).config(&config).start();
    let r = wait_for("an export", Duration::from_secs(20), || {
        rx.requests().into_iter().next()
    });
    check_values(&agent, &text, &r);
    assert_eq!(rx.got.lock().expect("lock").headers[0]["x-team"], "gpu");
    let ids = uuids(&agent, 2);
    // GPU 1 falls off the bus.
    agent.rewrite_scenario(&with_gpu(&text, 1, "lost = true"));
    let seen = rx.requests().len();
    let lost = wait_for("GPU 1 failed in an export", Duration::from_secs(20), || {
        rx.requests().into_iter().skip(seen).find(|r| {
            let ps = flatten(r);
            ps.iter().any(|p| {
                p.name == "hw.status"
                    && p.attrs["hw.id"] == ids[1]
                    && p.attrs["hw.state"] == "failed"
                    && p.value == 1.0
            })
        })
    });
    let ps = flatten(&lost);
    assert_eq!(
        point(&ps, "hw.status", &ids[1], &[("hw.state", "ok")]).value,
        0.0
    );
    assert_eq!(
        point(&ps, "hw.status", &ids[1], &[("hw.state", "degraded")]).value,
        0.0
    );
    assert_eq!(
        point(&ps, "hw.status", &ids[0], &[("hw.state", "ok")]).value,
        1.0
    );
    // What the lost GPU cannot answer is left out, not sent as 0.
    assert!(
        !ps.iter()
            .any(|p| p.name == "hw.gpu.utilization" && p.attrs["hw.id"] == ids[1]),
        "no utilization from a lost GPU"
    );
}

/// A collector that answers 503 (http) or UNAVAILABLE (gRPC) at first gets the data once it
/// is up; the failures are counted.
fn retried_until_up(rx: &Receiver, protocol: &str) {
    let text = first(&scenario("dgx-h100.toml"), 1).to_string();
    let config = format!(
        "[otlp]\nendpoint = \"http://127.0.0.1:{}\"\nprotocol = \"{protocol}\"\ninterval = \"1s\"\n",
        rx.port
    );
    let agent = Agent::with_scenario(&text).config(&config).start();
    let r = wait_for(
        "an export after the failures",
        Duration::from_secs(30),
        || rx.requests().into_iter().next(),
    );
    assert!(
        rx.calls.load(Ordering::SeqCst) >= 3,
        "two refused, then one accepted"
    );
    let ids = uuids(&agent, 1);
    let ps = flatten(&r);
    let g = &scenario_gpus(&text)[0];
    let util = point(
        &ps,
        "hw.gpu.utilization",
        &ids[0],
        &[("hw.gpu.task", "general")],
    );
    assert!(close(
        util.value,
        g["gpu_util_percent"].as_integer().expect("util") as f64 / 100.0
    ));
    // The page shows the count from the poll after the answer.
    wait_for("the export counted", Duration::from_secs(10), || {
        (metric(&agent, "gpu_steward_otlp_exports_total") >= 1.0).then_some(())
    });
    let m = agent.metrics();
    assert!(m.get("gpu_steward_otlp_failures_total", &[]) >= 2.0);
    assert_eq!(m.get("gpu_steward_otlp_points_dropped_total", &[]), 0.0);
}

#[test]
fn http_503_then_ok_gets_the_data() {
    retried_until_up(&http_receiver(2), "http/protobuf");
}

#[test]
fn grpc_unavailable_then_ok_gets_the_data() {
    retried_until_up(&grpc_receiver(2), "grpc");
}

#[test]
fn a_collector_killed_mid_run_leaves_polls_going_and_the_queue_bounded() {
    let mut rx = http_receiver(0);
    let text = first(&scenario("dgx-h100.toml"), 2).to_string();
    let config = format!(
        "[otlp]\nendpoint = \"http://127.0.0.1:{}\"\ninterval = \"1s\"\n",
        rx.port
    );
    let agent = Agent::with_scenario(&text).config(&config).start();
    wait_for("an export", Duration::from_secs(20), || {
        (!rx.requests().is_empty()).then_some(())
    });
    let per_export = flatten(&rx.requests()[0]).len() as f64;
    rx.kill();
    let polls = metric(&agent, "gpu_steward_polls_total");
    // One export queued a second; the queue holds 16, then the oldest go, counted.
    wait_for(
        "points dropped from the full queue",
        Duration::from_secs(40),
        || (metric(&agent, "gpu_steward_otlp_points_dropped_total") > 0.0).then_some(()),
    );
    let m = agent.metrics();
    assert_eq!(
        m.get("gpu_steward_otlp_queued_exports", &[]),
        QUEUE_CAPACITY
    );
    let dropped = m.get("gpu_steward_otlp_points_dropped_total", &[]);
    assert_eq!(
        dropped % per_export,
        0.0,
        "whole exports dropped: {dropped} / {per_export}"
    );
    assert!(m.get("gpu_steward_otlp_failures_total", &[]) >= 1.0);
    // The poller never waited on the collector: a poll every 200 ms all along.
    assert!(
        m.get("gpu_steward_polls_total", &[]) >= polls + 50.0,
        "polls went on: {polls} then {}",
        m.get("gpu_steward_polls_total", &[])
    );
    let health = agent.get("/health");
    assert!(
        health.text().contains("otlp:"),
        "an agent warning on /health: {}",
        health.text()
    );
    // Still bounded a few intervals later, and so is the process.
    let before = rss_kib(&agent);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        metric(&agent, "gpu_steward_otlp_queued_exports"),
        QUEUE_CAPACITY
    );
    let after = rss_kib(&agent);
    eprintln!("agent RSS with the queue full: {before} KiB, 3 intervals later {after} KiB");
    assert!(
        after < before + 16 * 1024,
        "RSS grew from {before} to {after} KiB"
    );
}

/// The agent's resident set (`VmRSS`), KiB.
fn rss_kib(agent: &Agent) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.child.id()))
        .expect("/proc/<pid>/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

/// A test CA, the receiver's certificate (localhost) and a client certificate, as PEM.
struct Pki {
    ca: String,
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
        .push(rcgen::DnType::CommonName, "otlp test CA");
    let ca = ca.self_signed(&ca_key).expect("ca cert");
    let server_key = KeyPair::generate().expect("server key");
    let server = CertificateParams::new(vec!["localhost".into()])
        .expect("server params")
        .signed_by(&server_key, &ca, &ca_key)
        .expect("server cert");
    let client_key = KeyPair::generate().expect("client key");
    let mut client = CertificateParams::new(vec!["gpu-steward".into()]).expect("client params");
    client.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let client = client
        .signed_by(&client_key, &ca, &ca_key)
        .expect("client cert");
    Pki {
        ca: ca.pem(),
        server_cert: server.pem(),
        server_key: server_key.serialize_pem(),
        client_cert: client.pem(),
        client_key: client_key.serialize_pem(),
    }
}

/// The receiver's TLS: its certificate, and a client certificate signed by the test CA
/// required; `alpn` as the protocol wants it.
fn server_tls(p: &Pki, alpn: &[u8]) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(p.ca.as_bytes()).expect("ca"))
        .expect("add ca");
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("verifier");
    let chain = vec![CertificateDer::from_pem_slice(p.server_cert.as_bytes()).expect("cert")];
    let key = PrivateKeyDer::from_pem_slice(p.server_key.as_bytes()).expect("key");
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("server config");
    config.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// http/protobuf over TLS that requires a client certificate signed by the test CA.
fn https_receiver(p: &Pki) -> Receiver {
    let acceptor = server_tls(p, b"http/1.1");
    let rt = runtime();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let got = Arc::new(Mutex::new(Got::default()));
    let calls = Arc::new(AtomicUsize::new(0));
    let (g, c) = (got.clone(), calls.clone());
    rt.spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, g, c) = (acceptor.clone(), g.clone(), c.clone());
            tokio::spawn(async move {
                c.fetch_add(1, Ordering::SeqCst);
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let g = g.clone();
                        async move {
                            use http_body_util::BodyExt;
                            let path = req.uri().path().to_string();
                            let body = req.into_body().collect().await.map(|b| b.to_bytes());
                            let status = match (path.as_str(), body) {
                                ("/v1/metrics", Ok(b)) => {
                                    match ExportMetricsServiceRequest::decode(b) {
                                        Ok(r) => {
                                            g.lock().expect("lock").requests.push(r);
                                            200
                                        }
                                        Err(_) => 400,
                                    }
                                }
                                _ => 404,
                            };
                            let reply = ExportMetricsServiceResponse::default().encode_to_vec();
                            hyper::Response::builder()
                                .status(status)
                                .body(http_body_util::Full::new(bytes::Bytes::from(reply)))
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Receiver {
        port,
        got,
        calls,
        rt: Some(rt),
    }
}

/// A TLS connection as tonic's server takes it (`Connected`; tonic is built without TLS).
struct Tls(tokio_rustls::server::TlsStream<tokio::net::TcpStream>);

impl tonic::transport::server::Connected for Tls {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl tokio::io::AsyncRead for Tls {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Tls {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// gRPC `MetricsService` over TLS (h2) that requires the client certificate.
fn grpcs_receiver(p: &Pki) -> Receiver {
    let acceptor = server_tls(p, b"h2");
    let rt = runtime();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let got = Arc::new(Mutex::new(Got::default()));
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = Grpc {
        got: got.clone(),
        calls: calls.clone(),
        fail_first: 0,
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Tls>>(4);
    rt.spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    let _ = tx.send(Ok(Tls(tls))).await;
                }
            });
        }
    });
    rt.spawn(async move {
        let incoming = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx);
        let _ = tonic::transport::Server::builder()
            .add_service(MetricsServiceServer::new(svc))
            .serve_with_incoming(incoming)
            .await;
    });
    Receiver {
        port,
        got,
        calls,
        rt: Some(rt),
    }
}

#[test]
fn grpc_over_tls_with_a_client_certificate_from_the_environment() {
    let p = pki();
    let rx = grpcs_receiver(&p);
    let text = first(&scenario("dgx-h100.toml"), 1).to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, pem) in [
        ("ca.pem", &p.ca),
        ("client.pem", &p.client_cert),
        ("client.key", &p.client_key),
    ] {
        std::fs::write(dir.path().join(name), pem).expect("write pem");
    }
    let at = |n: &str| dir.path().join(n).display().to_string();
    let agent = Agent::with_scenario(&text)
        .env(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            &format!("https://localhost:{}", rx.port),
        )
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "1000")
        .env("OTEL_EXPORTER_OTLP_CERTIFICATE", &at("ca.pem"))
        .env("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &at("client.pem"))
        .env("OTEL_EXPORTER_OTLP_CLIENT_KEY", &at("client.key"))
        .start();
    let r = wait_for(
        "an export over gRPC and TLS",
        Duration::from_secs(20),
        || rx.requests().into_iter().next(),
    );
    let ids = uuids(&agent, 1);
    let ps = flatten(&r);
    let g = &scenario_gpus(&text)[0];
    let power = point(&ps, "hw.power", &ids[0], &[]);
    assert!(close(power.value, g["power_w"].as_float().expect("power")));
}

#[test]
fn https_with_a_client_certificate_from_the_config_file() {
    let p = pki();
    let rx = https_receiver(&p);
    let text = first(&scenario("dgx-h100.toml"), 1).to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, pem) in [
        ("ca.pem", &p.ca),
        ("client.pem", &p.client_cert),
        ("client.key", &p.client_key),
    ] {
        std::fs::write(dir.path().join(name), pem).expect("write pem");
    }
    let at = |n: &str| dir.path().join(n).display().to_string();
    let config = format!(
        "[otlp]\nendpoint = \"https://localhost:{}\"\ninterval = \"1s\"\ncertificate = \"{}\"\n\
         client_certificate = \"{}\"\nclient_key = \"{}\"\n",
        rx.port,
        at("ca.pem"),
        at("client.pem"),
        at("client.key")
    );
    let agent = Agent::with_scenario(&text).config(&config).start();
    let r = wait_for("an export over TLS", Duration::from_secs(20), || {
        rx.requests().into_iter().next()
    });
    let ids = uuids(&agent, 1);
    let ps = flatten(&r);
    let g = &scenario_gpus(&text)[0];
    let power = point(&ps, "hw.power", &ids[0], &[]);
    assert!(close(power.value, g["power_w"].as_float().expect("power")));
    // Without the client certificate the receiver refuses the handshake: failures, no data.
    let rx2 = https_receiver(&p);
    let config = format!(
        "[otlp]\nendpoint = \"https://localhost:{}\"\ninterval = \"1s\"\ncertificate = \"{}\"\n",
        rx2.port,
        at("ca.pem"),
    );
    let agent2 = Agent::with_scenario(&text).config(&config).start();
    wait_for("failed exports counted", Duration::from_secs(20), || {
        (metric(&agent2, "gpu_steward_otlp_failures_total") >= 1.0).then_some(())
    });
    assert!(rx2.requests().is_empty());
    assert!(rx2.calls.load(Ordering::SeqCst) >= 1, "it did connect");
}

#[test]
fn mig_instances_are_components_of_their_gpu() {
    let rx = http_receiver(0);
    let text = scenario("a100-mig.toml");
    let config = format!(
        "[otlp]\nendpoint = \"http://127.0.0.1:{}\"\ninterval = \"1s\"\n",
        rx.port
    );
    let agent = Agent::with_scenario(&text).config(&config).start();
    // The MIG layout is read by the slow tier: wait for an export that has it.
    let r = wait_for(
        "an export with the MIG instances",
        Duration::from_secs(20),
        || {
            rx.requests()
                .into_iter()
                .find(|r| flatten(r).iter().any(|p| p.attrs.contains_key("hw.parent")))
        },
    );
    let ps = flatten(&r);
    let m = agent.metrics();
    let gpu0 = uuids(&agent, 1)[0].clone();
    let instances = m.find("gpu_steward_mig_instance_info", &[("gpu", "0")]);
    // Four instances of one compute instance each (the scenario's mig_devices).
    assert_eq!(instances.len(), 4, "{instances:?}");
    for i in instances {
        let l = &i.labels;
        let id = l["mig_uuid"].as_str();
        assert!(id.starts_with("MIG-"), "{l:?}");
        let limit = point(&ps, "hw.gpu.memory.limit", id, &[]);
        assert_eq!(limit.attrs["hw.parent"], gpu0);
        assert_eq!(limit.attrs["hw.type"], "gpu");
        assert_eq!(limit.attrs["hw.model"], format!("MIG {}", l["profile"]));
        // The same memory in use as the page's dcgm-exporter series of that instance (MiB).
        let fb = m.get(
            "DCGM_FI_DEV_FB_USED",
            &[("gpu", "0"), ("GPU_I_ID", l["gpu_instance"].as_str())],
        );
        let used = point(&ps, "hw.gpu.memory.usage", id, &[]);
        assert_eq!(used.value, fb * MIB, "{id}");
        assert!(used.value <= limit.value);
    }
    assert!(
        ps.iter().any(|p| p.name == "hw.gpu.memory.usage"
            && p.attrs.contains_key("hw.parent")
            && p.value > 0.0),
        "the scenario's processes use memory in their instances"
    );
    let profiles: Vec<String> = ps
        .iter()
        .filter(|p| p.name == "hw.gpu.memory.limit" && p.attrs.contains_key("hw.parent"))
        .map(|p| p.attrs["hw.model"].clone())
        .collect();
    let mut sorted = profiles.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["MIG 1g.10gb", "MIG 1g.10gb", "MIG 2g.20gb", "MIG 3g.40gb"],
        "the scenario's mig_devices"
    );
}

/// The stop sends the last interval: an export interval of a minute, the scenario's power
/// changed after the first export, SIGTERM: the collector gets the new power before the agent
/// exits (the OpenTelemetry SDKs flush at shutdown too).
#[test]
fn the_stop_flushes_what_the_last_interval_saw() {
    let rx = http_receiver(0);
    let text = first(&scenario("dgx-h100.toml"), 1).to_string();
    let endpoint = format!("http://127.0.0.1:{}", rx.port);
    let mut agent = Agent::with_scenario(&text)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_METRIC_EXPORT_INTERVAL", "60000")
        .start();
    wait_for("the first export", Duration::from_secs(20), || {
        rx.requests().into_iter().next()
    });
    let before = scenario_gpus(&text)[0]["power_w"]
        .as_float()
        .expect("the scenario's power");
    let after = 123.0;
    assert!((before - after).abs() > 1.0);
    agent.rewrite_scenario(&text.replace(&format!("power_w = {before}"), "power_w = 123.0"));
    wait_for("the new power on the page", Duration::from_secs(10), || {
        (agent
            .metrics()
            .get("DCGM_FI_DEV_POWER_USAGE", &[("gpu", "0")])
            == after)
            .then_some(())
    });
    assert_eq!(rx.requests().len(), 1, "the next interval is a minute away");
    let id = uuids(&agent, 1)[0].clone();
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    let status = agent.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    let got = rx.requests();
    assert_eq!(got.len(), 2, "the flush at the stop");
    let ps = flatten(&got[1]);
    let power = point(&ps, "hw.power", &id, &[]);
    assert!(close(power.value, after), "{} W sent", power.value);
    assert!(
        agent.log().contains("otlp: flushed at the stop"),
        "{}",
        agent.log()
    );
}

/// A collector that takes the connection and never answers holds the stop for the flush's
/// budget at most, and the log says what was not sent.
#[test]
fn a_silent_collector_holds_the_stop_for_the_flush_budget_at_most() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    // Accepts every connection and keeps it open, silent.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().map_while(Result::ok) {
            held.push(s);
        }
    });
    let config = format!(
        "[otlp]\nendpoint = \"http://127.0.0.1:{port}\"\ninterval = \"1s\"\ntimeout = \"30s\"\n"
    );
    let mut agent = Agent::with_scenario(first(&scenario("dgx-h100.toml"), 1))
        .config(&config)
        .start();
    std::thread::sleep(Duration::from_millis(1500));
    let at = std::time::Instant::now();
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    let status = agent.wait_exit(Duration::from_secs(15));
    let took = at.elapsed();
    assert!(status.success(), "{status:?}");
    // The flush's 3 s, and the rest of the stop beside it.
    assert!(took < Duration::from_secs(6), "the stop took {took:?}");
    assert!(
        agent
            .log()
            .contains("otlp: not everything was sent by the stop"),
        "{}",
        agent.log()
    );
}
