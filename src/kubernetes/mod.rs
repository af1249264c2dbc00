//! Which Kubernetes pod and container each GPU belongs to, from the kubelet's pod-resources
//! API (`List` over `/var/lib/kubelet/pod-resources/kubelet.sock`).
//!
//! A tokio task refreshes the mapping in the background (every `refresh`, with backoff while
//! the kubelet is down) and publishes it through a `watch` channel; the poller only reads the
//! latest value. The kubelet is never called per scrape nor on the poller's path, so a slow or
//! absent kubelet costs pod labels, never metrics. Off unless `[kubernetes] enabled = true`.

pub use crate::snapshot::{KubeletStatus, LabelNames, PodMapping, PodRef};
pub mod proto;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::config::KubernetesConfig;

/// The receiving end of the client's channel, comparable so that `PollerConfig` stays `Eq`.
#[derive(Debug, Clone)]
pub struct KubeletFeed(pub watch::Receiver<KubeletStatus>);

impl PartialEq for KubeletFeed {
    fn eq(&self, other: &Self) -> bool {
        self.0.same_channel(&other.0)
    }
}

impl KubeletFeed {
    pub fn latest(&self) -> KubeletStatus {
        self.0.borrow().clone()
    }
}

/// Splits a device id as the NVIDIA device plugin advertises it: `GPU-<uuid>`, `GPU-<uuid>::N`
/// (time-slicing replica N), `MIG-<uuid>` (AWS appends `::N` to those too).
pub fn parse_device_id(id: &str) -> (&str, Option<&str>) {
    match id.split_once("::") {
        Some((device, replica)) => (device, Some(replica)),
        None => (id, None),
    }
}

/// The GPU a DRA claim's CDI device names, when its name is `<kind>=GPU-…` or `<kind>=MIG-…`
/// (what `nvidia-ctk` writes with `--device-name-strategy=uuid`).
pub fn cdi_gpu(cdi_name: &str) -> Option<&str> {
    let (_, id) = cdi_name.split_once('=')?;
    let (device, _) = parse_device_id(id);
    ((device.starts_with("GPU-") || device.starts_with("MIG-")) && device.len() > 4)
        .then_some(device)
}

/// The DRA claims of a `List` reply whose CDI devices name no GPU UUID, so their processes
/// cannot be attributed to the pod: one line each, for the log.
pub fn unattributed_claims(reply: &proto::ListPodResourcesResponse) -> Vec<String> {
    let mut out = Vec::new();
    for pod in &reply.pod_resources {
        for c in &pod.containers {
            for claim in &c.dynamic_resources {
                for r in &claim.claim_resources {
                    let names: Vec<&str> = r.cdi_devices.iter().map(|d| d.name.as_str()).collect();
                    if names.iter().any(|n| cdi_gpu(n).is_some()) {
                        continue;
                    }
                    out.push(format!(
                        "claim {}/{} of pod {}/{} (driver '{}', pool '{}', device '{}'): CDI devices [{}] name no GPU-/MIG- UUID",
                        claim.claim_namespace,
                        claim.claim_name,
                        pod.namespace,
                        pod.name,
                        r.driver_name,
                        r.pool_name,
                        r.device_name,
                        names.join(", ")
                    ));
                }
            }
        }
    }
    out
}

/// Builds the device → containers map from a `List` reply: `nvidia.com/*` device-plugin
/// resources, and DRA claims whose CDI devices name a GPU or MIG UUID.
pub fn mapping(reply: &proto::ListPodResourcesResponse) -> PodMapping {
    let mut map: PodMapping = HashMap::new();
    for pod in &reply.pod_resources {
        for c in &pod.containers {
            let claimed = c
                .dynamic_resources
                .iter()
                .flat_map(|claim| claim.claim_resources.iter())
                .flat_map(|r| r.cdi_devices.iter())
                .filter_map(|d| cdi_gpu(&d.name));
            for device in claimed {
                map.entry(device.to_string()).or_default().push(PodRef {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: c.name.clone(),
                    replica: None,
                });
            }
            for d in c
                .devices
                .iter()
                .filter(|d| d.resource_name.starts_with("nvidia.com/"))
            {
                for id in &d.device_ids {
                    let (device, replica) = parse_device_id(id);
                    map.entry(device.to_string()).or_default().push(PodRef {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: c.name.clone(),
                        replica: replica.map(str::to_string),
                    });
                }
            }
        }
    }
    for refs in map.values_mut() {
        refs.sort();
        refs.dedup();
    }
    map
}

/// Backoff while the kubelet is down: the refresh interval doubling up to 8 times it, at most
/// 2 minutes.
fn backoff(refresh: Duration, failures: u32) -> Duration {
    let factor = 1u32 << failures.min(3);
    (refresh * factor).min(Duration::from_secs(120).max(refresh))
}

/// Starts the refresh task; it ends when `stop` turns true. Must run inside a tokio runtime.
pub fn spawn(config: &KubernetesConfig, mut stop: watch::Receiver<bool>) -> KubeletFeed {
    let initial = KubeletStatus {
        up: false,
        refresh_errors: 0,
        last_refresh: None,
        labels: config.labels.clone(),
        mapping: Arc::new(PodMapping::new()),
    };
    let (tx, rx) = watch::channel(initial);
    let socket = config.pod_resources_socket.clone();
    let refresh = config.refresh;
    tokio::spawn(async move {
        let mut failures = 0u32;
        // Each unattributable claim is said once.
        let mut said = std::collections::HashSet::new();
        loop {
            let timeout = refresh.min(Duration::from_secs(10));
            let wait = match proto::list(&socket, timeout).await {
                Ok(reply) => {
                    let map = mapping(&reply);
                    let lines: std::collections::HashSet<String> =
                        unattributed_claims(&reply).into_iter().collect();
                    for line in lines.difference(&said) {
                        tracing::info!("kubelet pod-resources: DRA {line}; its processes are not attributed to the pod");
                    }
                    // Only claims still allocated are remembered.
                    said = lines;
                    if failures > 0 || !tx.borrow().up {
                        tracing::info!(socket = %socket.display(), devices = map.len(), "kubelet pod-resources available");
                    }
                    failures = 0;
                    tx.send_modify(|s| {
                        s.up = true;
                        s.last_refresh = Some(SystemTime::now());
                        s.mapping = Arc::new(map);
                    });
                    refresh
                }
                Err(e) => {
                    if failures == 0 {
                        tracing::warn!(error = %e, "kubelet pod-resources unavailable; GPUs keep their last pod labels until it answers");
                    }
                    failures += 1;
                    tx.send_modify(|s| {
                        s.up = false;
                        s.refresh_errors += 1;
                    });
                    backoff(refresh, failures)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    });
    KubeletFeed(rx)
}

#[cfg(test)]
mod tests {
    use super::proto::*;
    use super::*;

    fn pod(ns: &str, name: &str, container: &str, resource: &str, ids: &[&str]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: vec![ContainerResources {
                name: container.into(),
                devices: vec![ContainerDevices {
                    resource_name: resource.into(),
                    device_ids: ids.iter().map(|s| s.to_string()).collect(),
                }],
                dynamic_resources: vec![],
            }],
        }
    }

    #[test]
    fn maps_whole_gpus_replicas_and_mig_devices() {
        let reply = ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "ml",
                    "train-0",
                    "main",
                    "nvidia.com/gpu",
                    &["GPU-a", "GPU-b"],
                ),
                pod(
                    "ml",
                    "infer-1",
                    "srv",
                    "nvidia.com/gpu.shared",
                    &["GPU-c::0"],
                ),
                pod(
                    "ml",
                    "infer-2",
                    "srv",
                    "nvidia.com/gpu.shared",
                    &["GPU-c::3"],
                ),
                pod("ml", "small", "x", "nvidia.com/mig-1g.10gb", &["MIG-d"]),
                pod("ml", "cpu", "x", "cpu", &["0"]),
            ],
        };
        let m = mapping(&reply);
        assert_eq!(m["GPU-a"].len(), 1);
        assert_eq!(m["GPU-a"][0].pod, "train-0");
        assert_eq!(m["GPU-c"].len(), 2);
        assert_eq!(m["GPU-c"][1].replica.as_deref(), Some("3"));
        assert_eq!(m["MIG-d"][0].container, "x");
        assert!(!m.contains_key("0"));
    }

    #[test]
    fn a_cdi_name_names_a_gpu_only_by_its_uuid() {
        assert_eq!(super::cdi_gpu("nvidia.com/gpu=GPU-abc"), Some("GPU-abc"));
        assert_eq!(super::cdi_gpu("nvidia.com/gpu=MIG-abc"), Some("MIG-abc"));
        assert_eq!(super::cdi_gpu("nvidia.com/gpu=0"), None);
        assert_eq!(super::cdi_gpu("nvidia.com/gpu=all"), None);
        assert_eq!(super::cdi_gpu("k8s.gpu.nvidia.com/device=x-gpu-0"), None);
        assert_eq!(super::cdi_gpu("GPU-abc"), None, "not a CDI name");
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let r = Duration::from_secs(10);
        assert_eq!(backoff(r, 1), Duration::from_secs(20));
        assert_eq!(backoff(r, 3), Duration::from_secs(80));
        assert_eq!(backoff(r, 9), Duration::from_secs(80));
        assert_eq!(
            backoff(Duration::from_secs(60), 9),
            Duration::from_secs(120)
        );
    }

    #[test]
    fn unknown_fields_of_newer_kubelets_are_skipped() {
        use prost::Message;
        let mut buf = pod("ns", "p", "c", "nvidia.com/gpu", &["GPU-x"]).encode_to_vec();
        // Field 4 (cpu_ids in newer forks), varint 7.
        buf.extend_from_slice(&[0x20, 0x07]);
        let decoded = PodResources::decode(buf.as_slice()).expect("decodes");
        assert_eq!(decoded.containers[0].devices[0].device_ids, vec!["GPU-x"]);
    }
}
