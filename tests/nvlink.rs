//! NVLink and the GPU fabric end to end: the real binary against the simulated NVML. A healthy
//! HGX node raises nothing and exports its links; the VM answer and a PCIe board export no
//! NVLink series; a link down, a recovery storm, an NVLink XID, a fabric that is not ready and
//! each fabric health bit raise their condition and clear when fixed.

mod common;
mod health_support;

use std::time::{Duration, Instant};

use common::fake_grpc::{self, Unary};
use common::Metrics;
use gpu_steward::grpc;
use gpu_steward::sharing::plugin::proto::*;
use health_support::Agent;
use tonic::codegen::http;
use tonic::codegen::tokio_stream::StreamExt;

/// Two bare-metal H100 SXM GPUs with NVLink and a fabric; `gpu0` goes into the first.
fn pair(gpu0: &str) -> String {
    format!(
        "version = 1\n[driver]\nversion = \"580.95.05\"\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\n{gpu0}\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nnvlink = {{}}\nfabric = {{}}\n"
    )
}

fn metrics(a: &Agent) -> Metrics {
    Metrics::parse(&a.get("/metrics").1)
}

#[test]
fn a_healthy_hgx_node_raises_nothing_and_exports_its_links_and_fabric() {
    let a = Agent::start(&common::scenario("hgx-h100.toml"), "");
    a.wait_for("NVLink counters of all eight GPUs", |a| {
        metrics(a)
            .find(
                "gpu_steward_nvlink_data_bytes_total",
                &[("direction", "transmit")],
            )
            .len()
            == 8
    });
    let m = metrics(&a);
    for gpu in 0..8 {
        let g = gpu.to_string();
        let l = [("gpu", g.as_str())];
        assert_eq!(m.get("gpu_steward_nvlinks", &l), 18.0, "gpu {gpu}");
        assert_eq!(m.get("gpu_steward_nvlinks_active", &l), 18.0, "gpu {gpu}");
        assert_eq!(m.get("gpu_steward_fabric_state", &l), 3.0, "gpu {gpu}");
        assert_eq!(m.get("gpu_steward_fabric_health_summary", &l), 1.0);
        for t in ["replay", "recovery", "crc_flit", "crc_data"] {
            let e = [("gpu", g.as_str()), ("type", t)];
            assert_eq!(m.get("gpu_steward_nvlink_errors_total", &e), 0.0);
        }
        assert!(
            a.conditions(gpu).is_empty(),
            "gpu {gpu}: {:?}",
            a.conditions(gpu)
        );
    }
    let info = m.find(
        "gpu_steward_fabric_info",
        &[("gpu", "0"), ("status", "success")],
    );
    assert_eq!(info.len(), 1);
    // The lean profile has no per-link series.
    assert!(m.find("gpu_steward_nvlink_link_active", &[]).is_empty());
    // GPU 0 moves 50 GB/s each way: its counter grows; idle GPU 4's stays.
    let tx = |a: &Agent, gpu: &str| {
        metrics(a).get(
            "gpu_steward_nvlink_data_bytes_total",
            &[("gpu", gpu), ("direction", "transmit")],
        )
    };
    let (busy, idle) = (tx(&a, "0"), tx(&a, "4"));
    a.wait_for("GPU 0's NVLink bytes to grow", |a| tx(a, "0") > busy);
    assert_eq!(tx(&a, "4"), idle);
    // dcgm-exporter's field 449 is DCGM's rate between two polls, in its "MB/s" (KiB/s / 1000):
    // the scenario's 50,000,000 KiB/s each way on GPU 0 is 100,000; idle GPU 4 reads 0.
    a.wait_for("field 449 on all eight GPUs (from the second poll)", |a| {
        metrics(a)
            .find("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", &[])
            .len()
            == 8
    });
    let m = metrics(&a);
    let rate = |gpu: &str| m.get("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", &[("gpu", gpu)]);
    let expected = (50_000_000.0 + 50_000_000.0) / 1000.0;
    assert!(
        (rate("0") - expected).abs() <= expected * 0.05,
        "GPU 0 reads {} MB/s, the scenario says {expected}",
        rate("0")
    );
    assert_eq!(rate("4"), 0.0);
}

#[test]
fn the_vm_answer_and_a_pcie_board_raise_nothing_and_export_no_nvlink_series() {
    let vm = common::scenario("real-h100.toml");
    let node = format!("{vm}\n[[gpu]]\nmodel = \"L4\"\n");
    let a = Agent::start(&node, "");
    a.wait_for("two polls", |a| {
        a.metric("gpu_steward_polls_total").unwrap_or(0.0) >= 2.0
    });
    let (_, body) = a.get("/metrics");
    // No series of either family names NVLink or the fabric (the agent's own call counts may
    // name the NVML functions it asked).
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let name = line
            .split(['{', ' '])
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        assert!(
            !name.contains("nvlink") && !name.contains("fabric"),
            "{line}"
        );
    }
    assert!(a.conditions(0).is_empty() && a.conditions(1).is_empty());
}

#[test]
fn a_link_down_a_recovery_storm_and_an_nvlink_xid_raise_their_conditions_and_clear() {
    let config = "[health]\nnvlink_error_window = \"1s\"\n[metrics]\nnvlink_links = true\n";
    let healthy = pair("nvlink = {}\nfabric = {}");
    let a = Agent::start(&healthy, config);
    a.wait_for("per-link series", |a| {
        metrics(a)
            .find("gpu_steward_nvlink_link_active", &[("gpu", "0")])
            .len()
            == 18
    });
    a.rewrite(&pair("nvlink = { down = [3] }\nfabric = {}"));
    a.wait_for("nvlink_down", |a| a.conditions(0) == ["nvlink_down"]);
    let m = metrics(&a);
    assert_eq!(m.get("gpu_steward_nvlinks_active", &[("gpu", "0")]), 17.0);
    assert_eq!(
        m.get(
            "gpu_steward_nvlink_link_active",
            &[("gpu", "0"), ("link", "3")]
        ),
        0.0
    );
    let (code, v) = a.json("/health/gpus/0");
    assert_eq!((code, v["action"].as_str()), (503, Some("reset_gpu")));
    assert!(a.conditions(1).is_empty());
    a.rewrite(&healthy);
    a.wait_for("nvlink_down to clear", |a| a.conditions(0).is_empty());

    // A recovery storm: thousands of recoveries at once; the rate is over the limit while the
    // 1 s window covers the jump.
    a.rewrite(&pair("nvlink = { recovery_errors = 5000 }\nfabric = {}"));
    a.wait_for("nvlink_errors", |a| a.conditions(0) == ["nvlink_errors"]);
    assert_eq!(
        metrics(&a).get(
            "gpu_steward_nvlink_errors_total",
            &[("gpu", "0"), ("type", "recovery")]
        ),
        5000.0
    );
    assert_eq!(
        metrics(&a).get(
            "gpu_steward_nvlink_link_errors_total",
            &[("gpu", "0"), ("link", "0"), ("type", "recovery")]
        ),
        5000.0
    );
    a.wait_for("the storm to pass", |a| a.conditions(0).is_empty());

    // XID 74 (NVLINK_ERROR) raises nvlink_errors with the catalog's verdict, beside xid_74.
    a.rewrite(&common::with_event(
        &healthy,
        1,
        "[[gpu.event]]\nid = 1\nxid = 74",
    ));
    a.wait_for("XID 74", |a| {
        let c = a.conditions(1);
        c.contains(&"nvlink_errors".to_string()) && c.contains(&"xid_74".to_string())
    });
}

#[test]
fn a_fabric_not_ready_and_each_health_bit_raise_their_condition_and_clear() {
    let healthy = pair("nvlink = {}\nfabric = {}");
    let a = Agent::start(&healthy, "");
    a.wait_for("fabric series", |a| {
        metrics(a).value("gpu_steward_fabric_state", &[("gpu", "0")]) == Some(3.0)
    });
    let cases = [
        (r#"state = "in_progress""#, "fabric_not_ready"),
        (r#"status = "NOT_READY""#, "fabric_not_ready"),
        (r#"health = ["degraded_bw"]"#, "fabric_degraded"),
        (r#"health = ["route_recovery"]"#, "fabric_degraded"),
        (r#"health = ["access_timeout_recovery"]"#, "fabric_degraded"),
        (r#"health = ["route_unhealthy"]"#, "fabric_unhealthy"),
        (
            r#"health = ["incorrect_configuration"]"#,
            "fabric_unhealthy",
        ),
    ];
    for (fabric, condition) in cases {
        a.rewrite(&pair(&format!("nvlink = {{}}\nfabric = {{ {fabric} }}")));
        a.wait_for(condition, |a| a.conditions(0) == [condition]);
        let severity = if condition == "fabric_degraded" {
            200
        } else {
            503
        };
        assert_eq!(a.get("/health/gpus/0").0, severity, "{fabric}");
        a.rewrite(&healthy);
        a.wait_for("the fabric to recover", |a| a.conditions(0).is_empty());
    }
}

/// The kubelet's Registration service, accepting every plugin.
struct Registration;

impl Unary for Registration {
    const SERVICE: &'static str = "v1beta1.Registration";
    type Request = RegisterRequest;
    type Response = Empty;
}

/// Reads ListAndWatch until GPU `uuid` is advertised with `health`.
async fn wait_health(
    stream: &mut tonic::codec::Streaming<ListAndWatchResponse>,
    uuid: &str,
    health: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = tokio::time::timeout(left, stream.next())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {uuid} {health}"))
            .expect("stream open")
            .expect("message");
        if msg
            .devices
            .iter()
            .any(|d| d.id == uuid && d.health == health)
        {
            return;
        }
    }
}

#[test]
fn the_device_plugin_marks_a_gpu_with_an_unhealthy_fabric_unhealthy_until_it_recovers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dp = dir.path().join("device-plugins");
    std::fs::create_dir(&dp).expect("mkdir");
    fake_grpc::serve::<Registration>(&dp.join("kubelet.sock"), Empty {});
    let uuid = "GPU-f0000000-1111-2222-3333-444444444444";
    let node = |fabric: &str| {
        pair(&format!(
            "uuid = \"{uuid}\"\nnvlink = {{}}\nfabric = {{ {fabric} }}"
        ))
    };
    let config = format!(
        "[sharing.device_plugin]\nenabled = true\ndirectory = \"{}\"\n",
        dp.display()
    );
    let a = Agent::start(&node(""), &config);
    let socket = dp.join("gpu-steward-gpu.sock");
    common::wait_for("the plugin socket", Duration::from_secs(20), || {
        socket.exists().then_some(())
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let channel = grpc::connect(&socket, Some(Duration::from_secs(5)))
            .await
            .expect("connect to the plugin");
        let mut client = tonic::client::Grpc::new(channel);
        client.ready().await.expect("ready");
        let codec: tonic::codec::ProstCodec<Empty, ListAndWatchResponse> = Default::default();
        let mut stream = client
            .server_streaming(
                tonic::Request::new(Empty {}),
                http::uri::PathAndQuery::from_static(LIST_AND_WATCH_PATH),
                codec,
            )
            .await
            .expect("ListAndWatch")
            .into_inner();
        wait_health(&mut stream, uuid, "Healthy").await;
        a.rewrite(&node(r#"health = ["route_unhealthy"]"#));
        wait_health(&mut stream, uuid, "Unhealthy").await;
        a.rewrite(&node(""));
        wait_health(&mut stream, uuid, "Healthy").await;
    });
}
