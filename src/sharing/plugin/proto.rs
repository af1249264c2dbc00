//! The kubelet device plugin API v1beta1 (`k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1`,
//! `api.proto`), its messages written by hand with field numbers as in the proto, like the
//! pod-resources client ([`crate::kubernetes::proto`]): no `protoc` or build script needed.

// `tonic::Status` is the error of every gRPC call; boxing it would only convert it back.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// `Version` the plugin was built against.
pub const VERSION: &str = "v1beta1";
/// The kubelet's registration socket, in the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

pub const REGISTER_PATH: &str = "/v1beta1.Registration/Register";
pub const OPTIONS_PATH: &str = "/v1beta1.DevicePlugin/GetDevicePluginOptions";
pub const LIST_AND_WATCH_PATH: &str = "/v1beta1.DevicePlugin/ListAndWatch";
pub const PREFERRED_PATH: &str = "/v1beta1.DevicePlugin/GetPreferredAllocation";
pub const ALLOCATE_PATH: &str = "/v1beta1.DevicePlugin/Allocate";
pub const PRE_START_PATH: &str = "/v1beta1.DevicePlugin/PreStartContainer";

#[derive(Clone, PartialEq, prost::Message)]
pub struct DevicePluginOptions {
    #[prost(bool, tag = "1")]
    pub pre_start_required: bool,
    #[prost(bool, tag = "2")]
    pub get_preferred_allocation_available: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegisterRequest {
    #[prost(string, tag = "1")]
    pub version: String,
    /// The socket's file name in the device-plugin directory (not a path).
    #[prost(string, tag = "2")]
    pub endpoint: String,
    #[prost(string, tag = "3")]
    pub resource_name: String,
    #[prost(message, optional, tag = "4")]
    pub options: Option<DevicePluginOptions>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListAndWatchResponse {
    #[prost(message, repeated, tag = "1")]
    pub devices: Vec<Device>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TopologyInfo {
    #[prost(message, repeated, tag = "1")]
    pub nodes: Vec<NumaNode>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NumaNode {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Device {
    /// `ID` in the proto.
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub health: String,
    #[prost(message, optional, tag = "3")]
    pub topology: Option<TopologyInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreStartContainerRequest {
    #[prost(string, repeated, tag = "1")]
    pub devices_ids: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreStartContainerResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreferredAllocationRequest {
    #[prost(message, repeated, tag = "1")]
    pub container_requests: Vec<ContainerPreferredAllocationRequest>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerPreferredAllocationRequest {
    #[prost(string, repeated, tag = "1")]
    pub available_device_ids: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub must_include_device_ids: Vec<String>,
    #[prost(int32, tag = "3")]
    pub allocation_size: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreferredAllocationResponse {
    #[prost(message, repeated, tag = "1")]
    pub container_responses: Vec<ContainerPreferredAllocationResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerPreferredAllocationResponse {
    #[prost(string, repeated, tag = "1")]
    pub device_ids: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocateRequest {
    #[prost(message, repeated, tag = "1")]
    pub container_requests: Vec<ContainerAllocateRequest>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerAllocateRequest {
    #[prost(string, repeated, tag = "1")]
    pub devices_ids: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocateResponse {
    #[prost(message, repeated, tag = "1")]
    pub container_responses: Vec<ContainerAllocateResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerAllocateResponse {
    #[prost(map = "string, string", tag = "1")]
    pub envs: HashMap<String, String>,
    #[prost(message, repeated, tag = "2")]
    pub mounts: Vec<Mount>,
    #[prost(message, repeated, tag = "3")]
    pub devices: Vec<DeviceSpec>,
    #[prost(map = "string, string", tag = "4")]
    pub annotations: HashMap<String, String>,
    #[prost(message, repeated, tag = "5")]
    pub cdi_devices: Vec<CdiDevice>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(bool, tag = "3")]
    pub read_only: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeviceSpec {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(string, tag = "3")]
    pub permissions: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CdiDevice {
    #[prost(string, tag = "1")]
    pub name: String,
}

/// `Register` with the kubelet listening on `kubelet_socket`.
pub async fn register(
    kubelet_socket: &Path,
    request: RegisterRequest,
    timeout: Duration,
) -> Result<(), String> {
    let call = async {
        let channel = crate::grpc::connect(kubelet_socket, Some(Duration::from_secs(5)))
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        crate::grpc::unary::<RegisterRequest, Empty>(channel, REGISTER_PATH, request)
            .await
            .map(|_| ())
            .map_err(|s| format!("Register answered {}: {}", s.code(), s.message()))
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn field_numbers_match_api_proto() {
        // RegisterRequest{version=1 "v1beta1", endpoint=2 "a.sock", resource_name=3 "r",
        // options=4 {get_preferred_allocation_available=2 true}}
        let r = RegisterRequest {
            version: VERSION.into(),
            endpoint: "a.sock".into(),
            resource_name: "r".into(),
            options: Some(DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        };
        let mut want = vec![0x0a, 7];
        want.extend_from_slice(b"v1beta1");
        want.extend_from_slice(&[0x12, 6]);
        want.extend_from_slice(b"a.sock");
        want.extend_from_slice(&[0x1a, 1, b'r', 0x22, 2, 0x10, 1]);
        assert_eq!(r.encode_to_vec(), want);
        // ContainerAllocateResponse.cdi_devices is field 5 (tag 0x2a).
        let a = ContainerAllocateResponse {
            cdi_devices: vec![CdiDevice { name: "x".into() }],
            ..Default::default()
        };
        assert_eq!(a.encode_to_vec(), [0x2a, 3, 0x0a, 1, b'x']);
        // ContainerPreferredAllocationRequest.allocation_size is field 3, varint.
        let p = ContainerPreferredAllocationRequest {
            allocation_size: 2,
            ..Default::default()
        };
        assert_eq!(p.encode_to_vec(), [0x18, 2]);
    }
}
