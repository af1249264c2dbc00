//! The GPU topology end to end: the real binary against the simulated NVML. `/api/v1/topology`
//! on an HGX node (every pair NVLink through NVSwitches), a PCIe tree and a mixed tree, the
//! topology info series, and the device plugin's GetPreferredAllocation choosing the
//! best-connected whole GPUs on the mixed tree (through a fake kubelet).

mod common;

use std::path::Path;
use std::time::Duration;

use common::fake_grpc::{self, Unary};
use common::{wait_for, Agent};
use gpu_steward::grpc;
use gpu_steward::sharing::plugin::proto::*;

fn topology(a: &Agent) -> serde_json::Value {
    wait_for("the topology", Duration::from_secs(20), || {
        let r = a.get("/api/v1/topology");
        (r.status == 200).then(|| r.json())
    })
}

/// The link of each pair, as (a, b, link).
fn pairs(t: &serde_json::Value) -> Vec<(u64, u64, String)> {
    t["pairs"]
        .as_array()
        .map(|v| {
            v.iter()
                .map(|p| {
                    (
                        p["gpus"][0].as_u64().unwrap_or(99),
                        p["gpus"][1].as_u64().unwrap_or(99),
                        p["link"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn an_hgx_node_is_nvlink_between_every_pair_and_says_so_per_gpu() {
    let a = Agent::with_scenario(&common::scenario("hgx-h100.toml")).start();
    let t = topology(&a);
    let p = pairs(&t);
    assert_eq!(p.len(), 28, "{p:?}");
    assert!(p.iter().all(|(_, _, l)| l == "nvlink"), "{p:?}");
    assert_eq!(
        t["gpus"][0]["nvlink_peers"],
        serde_json::json!([1, 2, 3, 4, 5, 6, 7])
    );
    let m = a.metrics();
    let info = m.find("gpu_steward_gpu_topology_info", &[("gpu", "3")]);
    assert_eq!(info.len(), 1);
    assert!(
        m.find(
            "gpu_steward_gpu_topology_info",
            &[("gpu", "3"), ("nvlink_peers", "0,1,2,4,5,6,7")]
        )
        .len()
            == 1
    );
}

/// Four GPUs on two PCIe switches ({0,2} and {1,3}); with `nvlink`, GPUs 0 and 1 also talk
/// over NVLink (a mixed tree). The UUIDs sort 2, 3, 0, 1: the spreading choice (lowest ids)
/// would take other GPUs than the topology-aware one.
fn tree(model: &str, nvlink: bool) -> String {
    let mut s = String::from("version = 1\n");
    for (i, switch) in [1, 2, 1, 2].iter().enumerate() {
        let first = ['c', 'd', 'a', 'b'][i];
        s.push_str(&format!(
            "[[gpu]]\nmodel = \"{model}\"\npcie_switch = {switch}\n\
             uuid = \"GPU-{first}0000000-1111-2222-3333-444444444444\"\n"
        ));
        if nvlink && i < 2 {
            s.push_str("nvlink = {}\n");
        }
    }
    s
}

#[test]
fn a_pcie_tree_has_switch_and_system_paths_and_no_nvlink_series() {
    let a = Agent::with_scenario(&tree("L4", false)).start();
    let p = pairs(&topology(&a));
    let expected: Vec<(u64, u64, String)> = [
        (0, 1, "system"),
        (0, 2, "pcie_switch"),
        (0, 3, "system"),
        (1, 2, "system"),
        (1, 3, "pcie_switch"),
        (2, 3, "system"),
    ]
    .into_iter()
    .map(|(a, b, l)| (a, b, l.to_string()))
    .collect();
    assert_eq!(p, expected);
    assert!(a
        .metrics()
        .find("gpu_steward_gpu_topology_info", &[])
        .is_empty());
}

/// The kubelet's Registration service, accepting every plugin.
struct Registration;

impl Unary for Registration {
    const SERVICE: &'static str = "v1beta1.Registration";
    type Request = RegisterRequest;
    type Response = Empty;
}

async fn preferred(socket: &Path, available: &[&str], must: &[&str], size: i32) -> Vec<String> {
    let channel = grpc::connect(socket, Some(Duration::from_secs(5)))
        .await
        .expect("connect");
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    let r: PreferredAllocationResponse = grpc::unary(
        channel,
        PREFERRED_PATH,
        PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_ids: owned(available),
                must_include_device_ids: owned(must),
                allocation_size: size,
            }],
        },
    )
    .await
    .expect("preferred");
    r.container_responses[0].device_ids.clone()
}

#[test]
fn the_device_plugin_prefers_nvlink_then_a_shared_switch_on_a_mixed_tree() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dp = dir.path().join("device-plugins");
    std::fs::create_dir(&dp).expect("mkdir");
    fake_grpc::serve::<Registration>(&dp.join("kubelet.sock"), Empty {});
    let config = format!(
        "[sharing.device_plugin]\nenabled = true\ndirectory = \"{}\"\n",
        dp.display()
    );
    let a = Agent::with_scenario(&tree("H100-SXM5-80GB", true))
        .config(&config)
        .start();
    let t = topology(&a);
    assert!(pairs(&t).contains(&(0, 1, "nvlink".to_string())));
    let uuid = |i: usize| t["gpus"][i]["uuid"].as_str().unwrap_or("").to_string();
    let (g0, g1, g2, g3) = (uuid(0), uuid(1), uuid(2), uuid(3));
    let socket = dp.join("gpu-steward-gpu.sock");
    wait_for("the plugin socket", Duration::from_secs(20), || {
        socket.exists().then_some(())
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let all = [g3.as_str(), g2.as_str(), g1.as_str(), g0.as_str()];
        let mut got = preferred(&socket, &all, &[], 2).await;
        got.sort();
        let mut want = vec![g0.clone(), g1.clone()];
        want.sort();
        assert_eq!(got, want, "NVLink pair");
        // GPU 3 must be in: it shares no switch with 0 or 2 (both system paths), so the
        // lowest id of the two joins it.
        let got = preferred(&socket, &[&g0, &g2, &g3], &[&g3], 2).await;
        assert_eq!(got, [g3.clone(), g0.clone().min(g2.clone())]);
        let got = preferred(&socket, &[&g0, &g2, &g3], &[], 2).await;
        let mut sorted = got.clone();
        sorted.sort();
        let mut want = vec![g0.clone(), g2.clone()];
        want.sort();
        assert_eq!(
            sorted, want,
            "a shared switch beats the system interconnect"
        );
    });
}

#[test]
fn the_topology_is_read_again_when_the_set_of_gpus_changes() {
    let three = "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nnvlink = {}\n\
                 [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nnvlink = {}\n\
                 [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nnvlink = {}\n";
    let a = Agent::with_scenario(three).start();
    assert_eq!(pairs(&topology(&a)).len(), 3);
    // GPU 2 falls off the bus: the topology is of the two GPUs left.
    a.rewrite_scenario(&three.replacen(
        "[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nnvlink = {}\n",
        "",
        1,
    ));
    wait_for("the topology of two GPUs", Duration::from_secs(20), || {
        let t = a.get("/api/v1/topology").json();
        (pairs(&t) == [(0, 1, "nvlink".to_string())]).then_some(())
    });
}
