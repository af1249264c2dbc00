//! Pod labels for `[reclaim] exempt_pod_labels`, from the container runtime's CRI socket
//! (`runtime.v1.RuntimeService/ListPodSandbox`, what `crictl pods --label` reads): each pod
//! sandbox carries its pod's UID and labels, and a GPU process's pod UID comes from its cgroup.
//! The kubelet's pod-resources API names pods but not their labels, and the agent does not talk
//! to the API server.
//!
//! A background task refreshes the UID → labels map and publishes it on a `watch` channel; the
//! poll path only reads it. The few CRI messages are written by hand like the kubelet's
//! (`kubernetes::proto`): field numbers follow `k8s.io/cri-api/pkg/apis/runtime/v1/api.proto`;
//! fields not declared here are skipped by prost.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    /// 0 `SANDBOX_READY`, 1 `SANDBOX_NOTREADY`.
    #[prost(int32, tag = "3")]
    pub state: i32,
    #[prost(map = "string, string", tag = "5")]
    pub labels: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
}

/// `package runtime.v1; service RuntimeService { rpc ListPodSandbox(...) }`.
pub const LIST_PATH: &str = "/runtime.v1.RuntimeService/ListPodSandbox";
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// How often the labels are read: a new pod's labels are known within this.
pub const REFRESH: Duration = Duration::from_secs(15);

/// Pod UID → labels, as last read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodLabels {
    /// Whether the last `ListPodSandbox` succeeded.
    pub up: bool,
    pub errors: u64,
    pub socket: PathBuf,
    pub by_uid: Arc<HashMap<String, BTreeMap<String, String>>>,
}

/// The latest pod labels; cheap to clone.
#[derive(Debug, Clone)]
pub struct PodLabelFeed(pub watch::Receiver<PodLabels>);

impl PartialEq for PodLabelFeed {
    fn eq(&self, other: &Self) -> bool {
        self.0.same_channel(&other.0)
    }
}

impl PodLabelFeed {
    pub fn latest(&self) -> PodLabels {
        self.0.borrow().clone()
    }
}

/// The UID → labels map of a reply (sandboxes of any state: a pod's processes may outlive
/// a sandbox that is being torn down, and its labels are still its labels).
pub fn labels(reply: &ListPodSandboxResponse) -> HashMap<String, BTreeMap<String, String>> {
    reply
        .items
        .iter()
        .filter_map(|s| {
            let uid = s.metadata.as_ref()?.uid.clone();
            Some((
                uid,
                s.labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ))
        })
        .collect()
}

/// Calls `ListPodSandbox` once on `socket`.
pub async fn list(socket: &Path, timeout: Duration) -> Result<ListPodSandboxResponse, String> {
    let path = socket.display().to_string();
    let call = async {
        let channel = crate::grpc::connect(socket, None)
            .await
            .map_err(|e| format!("cannot connect to the container runtime at '{path}': {e}"))?;
        crate::grpc::call(
            channel,
            LIST_PATH,
            ListPodSandboxRequest {},
            Some(MAX_MESSAGE_BYTES),
        )
        .await
        .map_err(|e| match e {
            crate::grpc::CallError::NotReady(e) => {
                format!("the container runtime at '{path}' is not ready: {e}")
            }
            crate::grpc::CallError::Status(s) => {
                format!("the container runtime at '{path}' answered ListPodSandbox with {s}")
            }
        })
    };
    tokio::time::timeout(timeout, call).await.map_err(|_| {
        format!("the container runtime at '{path}' did not answer within {timeout:?}")
    })?
}

/// Starts the refresh task; it ends when `stop` turns true. Must run inside a tokio runtime.
pub fn spawn(socket: PathBuf, refresh: Duration, mut stop: watch::Receiver<bool>) -> PodLabelFeed {
    let (tx, rx) = watch::channel(PodLabels {
        socket: socket.clone(),
        ..PodLabels::default()
    });
    tokio::spawn(async move {
        let mut failing = false;
        loop {
            match list(&socket, refresh.min(Duration::from_secs(10))).await {
                Ok(reply) => {
                    if failing || !tx.borrow().up {
                        tracing::info!(socket = %socket.display(), pods = reply.items.len(), "pod labels from the container runtime available");
                    }
                    failing = false;
                    let map = labels(&reply);
                    tx.send_modify(|s| {
                        s.up = true;
                        s.by_uid = Arc::new(map);
                    });
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "pod labels unavailable; processes in pods are exempt from reclaim until they are known");
                    }
                    failing = true;
                    tx.send_modify(|s| {
                        s.up = false;
                        s.errors += 1;
                    });
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(refresh) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    });
    PodLabelFeed(rx)
}

#[cfg(test)]
#[path = "cri_tests.rs"]
mod tests;
