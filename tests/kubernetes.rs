//! Pod labels from a fake kubelet: a tonic server on a Unix socket in a temporary directory
//! answering `/v1.PodResourcesLister/List` with the agent's own hand-written messages.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{fake_grpc, wait_for, Agent};
use gpu_steward::kubernetes::proto::{
    CdiDevice, ClaimResource, ContainerDevices, ContainerResources, DynamicResource,
    ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};

const GPU0: &str = "GPU-00000000-1111-2222-3333-444444444444";
const GPU1: &str = "GPU-00000001-1111-2222-3333-444444444444";

fn scenario() -> String {
    format!(
        "version = 1\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"{GPU0}\"\ngpu_util_percent = 50\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"{GPU1}\"\ngpu_util_percent = 60\n"
    )
}

fn pod(ns: &str, name: &str, container: &str, ids: &[&str]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![ContainerResources {
            name: container.into(),
            devices: vec![ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
            dynamic_resources: vec![],
        }],
    }
}

/// GPU 0 to one container; GPU 1 time-sliced between two pods (replicas 0 and 1).
fn reply(padding_pods: usize) -> ListPodResourcesResponse {
    let mut pods = vec![
        pod("ml", "train-0", "trainer", &[GPU0]),
        pod("ml", "infer-a", "server", &[&format!("{GPU1}::0")]),
        pod("web", "infer-b", "server", &[&format!("{GPU1}::1")]),
    ];
    for i in 0..padding_pods {
        let mut p = pod(
            "batch",
            &format!("cpu-only-{i:06}-{}", "x".repeat(120)),
            "c",
            &[],
        );
        p.containers[0].devices[0].resource_name = "example.com/nic".into();
        pods.push(p);
    }
    ListPodResourcesResponse {
        pod_resources: pods,
    }
}

/// The kubelet's pod-resources API, as far as the agent uses it.
struct PodResourcesLister;

impl fake_grpc::Unary for PodResourcesLister {
    const SERVICE: &'static str = "v1.PodResourcesLister";
    type Request = ListPodResourcesRequest;
    type Response = ListPodResourcesResponse;
}

/// Serves `reply` on `socket` until the test ends.
fn fake_kubelet(socket: &Path, reply: ListPodResourcesResponse) {
    fake_grpc::serve::<PodResourcesLister>(socket, reply);
}

fn config(socket: &Path, extra: &str) -> String {
    format!(
        "[kubernetes]\nenabled = true\nrefresh = \"1s\"\npod_resources_socket = \"{}\"\n{extra}",
        socket.display()
    )
}

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("kubelet.sock")
}

#[test]
fn a_gpu_of_one_container_gets_its_pod_labels_and_a_shared_one_does_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = socket_in(&dir);
    fake_kubelet(&socket, reply(0));
    let agent = Agent::with_scenario(&scenario())
        .config(&config(&socket, ""))
        .start();
    let m = wait_for("pod labels", Duration::from_secs(20), || {
        let m = agent.metrics();
        (m.value("gpu_steward_kubelet_up", &[]) == Some(1.0)
            && !m
                .find("DCGM_FI_DEV_GPU_UTIL", &[("pod", "train-0")])
                .is_empty())
        .then_some(m)
    });
    let gpu0 = m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")]);
    assert_eq!(gpu0[0].labels["namespace"], "ml");
    assert_eq!(gpu0[0].labels["container"], "trainer");
    let gpu1 = m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "1")]);
    assert_eq!(gpu1.len(), 1, "a shared GPU keeps one series");
    assert!(!gpu1[0].labels.contains_key("pod"), "{:?}", gpu1[0].labels);
    let shared = m.find("gpu_steward_gpu_pod_info", &[("gpu", "1")]);
    assert_eq!(shared.len(), 2);
    assert_eq!(
        m.find(
            "gpu_steward_gpu_pod_info",
            &[("pod", "infer-b"), ("replica", "1")]
        )
        .len(),
        1
    );
    assert_eq!(m.get("gpu_steward_kubelet_refresh_errors_total", &[]), 0.0);
    assert!(m.get("gpu_steward_kubelet_last_refresh_timestamp_seconds", &[]) > 1.7e9);
}

#[test]
fn a_reply_over_four_mebibytes_is_read_and_label_names_are_configurable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = socket_in(&dir);
    let big = reply(30_000);
    let size = prost::Message::encoded_len(&big);
    assert!(size > 4 * 1024 * 1024, "reply is {size} bytes");
    fake_kubelet(&socket, big);
    let agent = Agent::with_scenario(&scenario())
        .config(&config(
            &socket,
            "pod_label = \"k8s_pod\"\nnamespace_label = \"k8s_namespace\"\n",
        ))
        .start();
    let m = wait_for(
        "pod labels from a big reply",
        Duration::from_secs(30),
        || {
            let m = agent.metrics();
            (!m.find("DCGM_FI_DEV_GPU_UTIL", &[("k8s_pod", "train-0")])
                .is_empty())
            .then_some(m)
        },
    );
    assert_eq!(m.get("gpu_steward_kubelet_up", &[]), 1.0);
    let s = m.find("DCGM_FI_DEV_GPU_UTIL", &[("k8s_pod", "train-0")]);
    assert_eq!(s[0].labels["k8s_namespace"], "ml");
    assert!(!s[0].labels.contains_key("pod"));
}

#[test]
fn a_kubelet_that_is_down_then_comes_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = socket_in(&dir);
    let agent = Agent::with_scenario(&scenario())
        .config(&config(&socket, ""))
        .start();
    wait_for("refresh errors", Duration::from_secs(20), || {
        let m = agent.metrics();
        (m.value("gpu_steward_kubelet_refresh_errors_total", &[]) >= Some(1.0)).then_some(())
    });
    let m = agent.metrics();
    assert_eq!(m.get("gpu_steward_kubelet_up", &[]), 0.0);
    assert!(m
        .value("gpu_steward_kubelet_last_refresh_timestamp_seconds", &[])
        .is_none());
    assert_eq!(
        m.get("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")]),
        50.0,
        "metrics go on"
    );
    fake_kubelet(&socket, reply(0));
    wait_for("the kubelet to be seen up", Duration::from_secs(30), || {
        let m = agent.metrics();
        (m.value("gpu_steward_kubelet_up", &[]) == Some(1.0)
            && !m
                .find("DCGM_FI_DEV_GPU_UTIL", &[("pod", "train-0")])
                .is_empty())
        .then_some(())
    });
}

#[test]
fn a_container_on_a_mig_device_is_joined_to_its_instance() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = socket_in(&dir);
    let scenario = format!(
        "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"{GPU0}\"\nmig_mode = true\n\
         mig_devices = [\"3g.40gb\", \"2g.20gb\"]\n"
    );
    // The MIG UUIDs the simulated driver gives this layout, as `mig show` reads them.
    let path = dir.path().join("probe.toml");
    std::fs::write(&path, &scenario).expect("scenario");
    let out = std::process::Command::new(common::bin())
        .args(["mig", "show", "--json", "--nvml-lib"])
        .arg(common::sim_lib())
        .env("NVML_SIM_SCENARIO", &path)
        .env_remove("NVML_SIM_STATE")
        .output()
        .expect("mig show");
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let gi = shown["gpus"][0]["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .find(|gi| gi["profile"] == "3g.40gb")
        .expect("the 3g instance")
        .clone();
    let mig_uuid = gi["compute_instances"][0]["uuid"]
        .as_str()
        .expect("MIG UUID");
    fake_kubelet(
        &socket,
        ListPodResourcesResponse {
            pod_resources: vec![pod("ml", "mig-0", "worker", &[mig_uuid])],
        },
    );
    let agent = Agent::with_scenario(&scenario)
        .config(&config(&socket, ""))
        .start();
    let m = wait_for("MIG pod labels", Duration::from_secs(20), || {
        let m = agent.metrics();
        (!m.find("gpu_steward_mig_pod_info", &[("pod", "mig-0")])
            .is_empty())
        .then_some(m)
    });
    let s = &m.find("gpu_steward_mig_pod_info", &[("pod", "mig-0")])[0];
    assert_eq!(s.labels["mig_uuid"], mig_uuid);
    assert_eq!(s.labels["gpu_instance"], gi["gpu_instance_id"].to_string());
    assert_eq!(s.labels["namespace"], "ml");
    assert_eq!(s.labels["container"], "worker");
    assert!(
        m.find("gpu_steward_gpu_pod_info", &[]).is_empty(),
        "not the whole GPU"
    );
}

/// A pod whose container holds one DRA claim with the CDI devices `cdi`.
fn dra_pod(name: &str, claim: &str, cdi: &[&str]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: "dra".into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: vec![],
            dynamic_resources: vec![DynamicResource {
                claim_name: claim.into(),
                claim_namespace: "dra".into(),
                claim_resources: vec![ClaimResource {
                    cdi_devices: cdi
                        .iter()
                        .map(|n| CdiDevice {
                            name: n.to_string(),
                        })
                        .collect(),
                    driver_name: "gpu.nvidia.com".into(),
                    pool_name: "node-1".into(),
                    device_name: "gpu-1".into(),
                }],
            }],
        }],
    }
}

/// DRA allocations from the pod-resources API: a claim whose CDI device names a GPU UUID is
/// attributed like a device-plugin allocation; one whose CDI device does not is said once in
/// the log and attributed to nothing.
#[test]
fn a_dra_claim_naming_a_gpu_is_attributed_and_one_that_does_not_is_said_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = socket_in(&dir);
    fake_kubelet(
        &socket,
        ListPodResourcesResponse {
            pod_resources: vec![
                dra_pod("dra-0", "gpu-claim", &[&format!("nvidia.com/gpu={GPU0}")]),
                dra_pod(
                    "dra-1",
                    "opaque-claim",
                    &["k8s.gpu.nvidia.com/device=claim-7f3a-gpu-1"],
                ),
            ],
        },
    );
    let agent = Agent::with_scenario(&scenario())
        .config(&config(&socket, ""))
        .start();
    let m = wait_for("DRA pod labels", Duration::from_secs(20), || {
        let m = agent.metrics();
        (!m.find("DCGM_FI_DEV_GPU_UTIL", &[("pod", "dra-0")])
            .is_empty())
        .then_some(m)
    });
    let gpu0 = m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")]);
    assert_eq!(gpu0[0].labels["namespace"], "dra");
    assert_eq!(gpu0[0].labels["container"], "main");
    let gpu1 = m.find("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "1")]);
    assert!(!gpu1[0].labels.contains_key("pod"), "{:?}", gpu1[0].labels);
    // Several refreshes (every 1 s) later, the opaque claim is still said once.
    let refreshed = agent
        .metrics()
        .get("gpu_steward_kubelet_last_refresh_timestamp_seconds", &[]);
    wait_for("two more refreshes", Duration::from_secs(20), || {
        (agent
            .metrics()
            .get("gpu_steward_kubelet_last_refresh_timestamp_seconds", &[])
            >= refreshed + 2.0)
            .then_some(())
    });
    let log = agent.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("claim dra/opaque-claim"))
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("k8s.gpu.nvidia.com/device=claim-7f3a-gpu-1")
            && said[0].contains("name no GPU-/MIG- UUID"),
        "{}",
        said[0]
    );
    assert!(!log.contains("claim dra/gpu-claim"), "{log}");
}

/// A kubelet socket that accepts and never answers, and one that answers bytes that are not
/// HTTP/2: the refresh fails and is counted, and the agent keeps polling and serving.
#[test]
fn a_kubelet_that_hangs_or_answers_garbage_blocks_nothing() {
    use std::io::{Read, Write};
    for garbage in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = socket_in(&dir);
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for mut conn in listener.incoming().map_while(Result::ok) {
                if garbage {
                    let mut buf = [0u8; 256];
                    let _ = conn.read(&mut buf);
                    let _ = conn.write_all(b"\x00\x00\x04\xffgarbage that is not a frame\r\n");
                }
                held.push(conn);
            }
        });
        let agent = Agent::with_scenario(&scenario())
            .config(&config(&socket, ""))
            .start();
        let before = agent.metrics().get("gpu_steward_polls_total", &[]);
        // Two failed refreshes (1 s timeout each for the hung one) while polls go on.
        let m = wait_for(
            "refresh errors and more polls",
            Duration::from_secs(30),
            || {
                let m = agent.metrics();
                (m.get("gpu_steward_kubelet_refresh_errors_total", &[]) >= 2.0
                    && m.get("gpu_steward_polls_total", &[]) >= before + 5.0)
                    .then_some(m)
            },
        );
        assert_eq!(m.value("gpu_steward_kubelet_up", &[]), Some(0.0));
        assert_eq!(agent.get("/readyz").status, 200, "garbage = {garbage}");
    }
}
