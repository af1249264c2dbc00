//! The kubelet pod-resources API v1 (`k8s.io/kubelet/pkg/apis/podresources/v1`), the few
//! messages of `List` written by hand, and a client for it over the kubelet's Unix socket.
//!
//! Hand-written on purpose: generating them needs `protoc` and a build script on every build
//! machine for a few small messages. Field numbers follow `api.proto`; fields not declared here
//! (cpu_ids, memory, topology, fields of newer kubelets) are skipped by prost, as proto3
//! requires.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// `ListPodResourcesRequest {}`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
    /// DRA allocations (Kubernetes 1.27+; `ResourceClaim`s prepared by a DRA driver).
    #[prost(message, repeated, tag = "5")]
    pub dynamic_resources: Vec<DynamicResource>,
}

/// A resource claim allocated to the container.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DynamicResource {
    #[prost(string, tag = "2")]
    pub claim_name: String,
    #[prost(string, tag = "3")]
    pub claim_namespace: String,
    #[prost(message, repeated, tag = "4")]
    pub claim_resources: Vec<ClaimResource>,
}

/// One device of a claim: the CDI devices the driver prepared and where it came from.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ClaimResource {
    #[prost(message, repeated, tag = "1")]
    pub cdi_devices: Vec<CdiDevice>,
    #[prost(string, tag = "2")]
    pub driver_name: String,
    #[prost(string, tag = "3")]
    pub pool_name: String,
    #[prost(string, tag = "4")]
    pub device_name: String,
}

/// A fully qualified CDI device name, `vendor/class=name`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CdiDevice {
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    #[prost(string, tag = "1")]
    pub resource_name: String,
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
}

/// The gRPC method path: `package v1; service PodResourcesLister { rpc List(...) }`.
pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";

/// Largest reply accepted. tonic's default is 4 MiB, which a node with many pods exceeds
/// (dcgm-exporter failed every scrape there: NVIDIA/dcgm-exporter#509).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Why a `List` failed, in words for the log.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("cannot connect to the kubelet at '{path}': {source}")]
    Connect {
        path: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("the kubelet at '{path}' answered List with {status}")]
    Call { path: String, status: tonic::Status },
    #[error("the kubelet at '{path}' did not answer within {timeout:?}")]
    Timeout { path: String, timeout: Duration },
}

/// Connects to `socket`, calls `List` once and closes the connection.
pub async fn list(
    socket: &Path,
    timeout: Duration,
) -> Result<ListPodResourcesResponse, KubeletError> {
    let path = socket.display().to_string();
    tokio::time::timeout(timeout, list_inner(socket.to_path_buf(), &path))
        .await
        .map_err(|_| KubeletError::Timeout {
            path: path.clone(),
            timeout,
        })?
}

async fn list_inner(socket: PathBuf, path: &str) -> Result<ListPodResourcesResponse, KubeletError> {
    let channel = crate::grpc::connect(&socket, None)
        .await
        .map_err(|source| KubeletError::Connect {
            path: path.to_string(),
            source,
        })?;
    crate::grpc::call(
        channel,
        LIST_PATH,
        ListPodResourcesRequest {},
        Some(MAX_MESSAGE_BYTES),
    )
    .await
    .map_err(|e| KubeletError::Call {
        path: path.to_string(),
        status: e.into_status(),
    })
}
