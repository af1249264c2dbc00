//! The autoscaling recipes of `packaging/kubernetes/examples/autoscaling/`, run for real: an
//! agent on the simulated NVML whose pods come from a fake kubelet (the pod-resources API,
//! `tests/common/fake_grpc.rs`), scraped by a real Prometheus; prometheus-adapter's
//! `seriesQuery` and `metricsQuery` (expanded as the adapter expands them for an HPA's
//! `type: Pods` request) and KEDA's query are read from the shipped files and evaluated there.
//! Each pod's value must be what the scenario file says its GPU does.

mod common;
mod e2e_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{fake_grpc, wait_for};
use e2e_support::{repo, urlencode, Prometheus};
use gpu_steward::kubernetes::proto::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
};

/// Three GPUs: two serve the Deployment's pods, one a training pod the queries must leave out.
const SCENARIO: &str = r#"version = 1
[[gpu]]
model = "H100-SXM5-80GB"
uuid = "GPU-0a000000-1111-2222-3333-444444444444"
gpu_util_percent = 70
mem_util_percent = 35
[[gpu]]
model = "H100-SXM5-80GB"
uuid = "GPU-0b000000-1111-2222-3333-444444444444"
gpu_util_percent = 50
mem_util_percent = 45
[[gpu]]
model = "H100-SXM5-80GB"
uuid = "GPU-0c000000-1111-2222-3333-444444444444"
gpu_util_percent = 90
mem_util_percent = 80
"#;

/// Pod name → GPU index in the scenario.
const PODS: [(&str, usize); 3] = [
    ("gpu-deployment-7d9f-a", 0),
    ("gpu-deployment-7d9f-b", 1),
    ("train-0", 2),
];

/// The scenario's value of `key` for each GPU, in order (the expected answers).
fn scenario_values(key: &str) -> Vec<f64> {
    let doc: toml::Value = SCENARIO.parse().expect("scenario toml");
    doc["gpu"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| g[key].as_integer().expect("value") as f64)
        .collect()
}

fn uuids() -> Vec<String> {
    let doc: toml::Value = SCENARIO.parse().expect("scenario toml");
    doc["gpu"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| g["uuid"].as_str().expect("uuid").to_string())
        .collect()
}

struct PodResourcesLister;

impl fake_grpc::Unary for PodResourcesLister {
    const SERVICE: &'static str = "v1.PodResourcesLister";
    type Request = ListPodResourcesRequest;
    type Response = ListPodResourcesResponse;
}

fn kubelet_reply() -> ListPodResourcesResponse {
    let uuids = uuids();
    ListPodResourcesResponse {
        pod_resources: PODS
            .iter()
            .map(|(name, gpu)| PodResources {
                name: name.to_string(),
                namespace: "ml".into(),
                containers: vec![ContainerResources {
                    name: "server".into(),
                    devices: vec![ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: vec![uuids[*gpu].clone()],
                    }],
                    dynamic_resources: vec![],
                }],
            })
            .collect(),
    }
}

/// A YAML document of a shipped example.
fn example(file: &str) -> serde_yaml::Value {
    let path = repo()
        .join("packaging/kubernetes/examples/autoscaling")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// prometheus-adapter's expansion of a metricsQuery for a `type: Pods` request: the series
/// name, the label matchers of the namespace and the pods asked for, and the group-by label
/// (prometheus-adapter docs/config.md, "Querying").
fn expand(template: &str, series: &str, namespace: &str, pods: &[&str]) -> String {
    let matchers = format!("namespace=\"{namespace}\",pod=~\"{}\"", pods.join("|"));
    template
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", &matchers)
        .replace("<<.GroupBy>>", "pod")
}

/// `pod` label → value of an instant-vector result.
fn by_pod(result: &serde_json::Value) -> BTreeMap<String, f64> {
    result
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let pod = s["metric"]["pod"].as_str().unwrap_or("").to_string();
            let v: f64 = s["value"][1]
                .as_str()
                .and_then(|v| v.parse().ok())
                .expect("sample value");
            (pod, v)
        })
        .collect()
}

#[test]
fn the_adapter_rule_and_the_keda_query_give_each_pod_its_gpus_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("kubelet.sock");
    fake_grpc::serve::<PodResourcesLister>(&socket, kubelet_reply());
    let agent = common::Agent::with_scenario(SCENARIO)
        .config(&format!(
            "[metrics]\nprofile = \"lean\"\n\
             [kubernetes]\nenabled = true\nrefresh = \"1s\"\npod_resources_socket = \"{}\"\n",
            socket.display()
        ))
        .start();
    let prometheus = Prometheus::start(&[format!("127.0.0.1:{}", agent.port)], "groups: []\n");

    // prometheus-adapter: the rule as shipped.
    let cm = example("prometheus-adapter.yaml");
    let config: serde_yaml::Value =
        serde_yaml::from_str(cm["data"]["config.yaml"].as_str().expect("config.yaml"))
            .expect("adapter config");
    let rule = &config["rules"][0];
    let series_query = rule["seriesQuery"].as_str().expect("seriesQuery");
    let metrics_query = rule["metricsQuery"].as_str().expect("metricsQuery");
    assert_eq!(rule["name"]["as"].as_str(), Some("gpu_utilization"));
    let hpa = example("hpa.yaml");
    assert_eq!(
        hpa["spec"]["metrics"][0]["pods"]["metric"]["name"].as_str(),
        Some("gpu_utilization"),
        "the HPA asks for the metric the adapter serves"
    );

    // Discovery: the adapter lists series with seriesQuery; every pod's GPU must be there.
    let found = wait_for("the adapter's series", Duration::from_secs(30), || {
        let path = format!("/api/v1/series?match[]={}", urlencode(series_query));
        let (_, body) = e2e_support::http_get(prometheus.port, &path)?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let pods: Vec<String> = v["data"]
            .as_array()?
            .iter()
            .filter_map(|s| s["pod"].as_str().map(str::to_string))
            .collect();
        (pods.len() == PODS.len()).then_some(pods)
    });
    for (pod, _) in PODS {
        assert!(found.iter().any(|p| p == pod), "{pod} not in {found:?}");
    }

    // The HPA's request: the Deployment's two pods in namespace ml.
    let series = "DCGM_FI_DEV_GPU_UTIL";
    let asked = [PODS[0].0, PODS[1].0];
    let query = expand(metrics_query, series, "ml", &asked);
    let util = scenario_values("gpu_util_percent");
    let got = wait_for("gpu_utilization per pod", Duration::from_secs(30), || {
        let r = by_pod(&prometheus.query(&query).ok()?);
        (r.len() == asked.len()).then_some(r)
    });
    for (pod, gpu) in &PODS[..2] {
        assert_eq!(
            got.get(*pod).copied(),
            Some(util[*gpu]),
            "{pod} (GPU {gpu}): {query} gave {got:?}"
        );
    }

    // KEDA: the shipped ScaledObject's query, the average over the Deployment's pods only.
    let keda = example("keda-scaledobject.yaml");
    let keda_query = keda["spec"]["triggers"][0]["metadata"]["query"]
        .as_str()
        .expect("query");
    let mem = scenario_values("mem_util_percent");
    let expected = (mem[0] + mem[1]) / 2.0;
    let value = wait_for("the KEDA query", Duration::from_secs(30), || {
        let r = prometheus.query(keda_query).ok()?;
        r[0]["value"][1].as_str()?.parse::<f64>().ok()
    });
    assert_eq!(value, expected, "{keda_query}");
    assert!(Path::new(&socket).exists());
}
