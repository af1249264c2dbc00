//! A gRPC client over a Unix socket: the one connector the kubelet pod-resources client
//! (`kubernetes/proto.rs`), the container runtime client (`reclaim/cri.rs`) and the device
//! plugin's registration (`sharing/plugin/proto.rs`) share, and one unary call with a prost
//! codec (the messages are written by hand, so there is no generated client).
//!
//! Transport only: it knows no service, message or socket path, and must not log; each caller
//! words its own errors.

// `tonic::Status` is the error of every gRPC call; boxing it would only convert it back.
#![allow(clippy::result_large_err)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::codec::ProstCodec;
use tonic::transport::{Channel, Endpoint};

/// A gRPC channel over the Unix socket at `socket`, giving up on the connection after
/// `connect_timeout` when one is given (callers that bound the whole call pass `None`).
pub async fn connect(
    socket: &Path,
    connect_timeout: Option<Duration>,
) -> Result<Channel, tonic::transport::Error> {
    let socket: PathBuf = socket.to_path_buf();
    // The URI is required by tonic but unused: the connector below dials the Unix socket.
    let mut endpoint = Endpoint::from_static("http://[::]:50051");
    if let Some(t) = connect_timeout {
        endpoint = endpoint.connect_timeout(t);
    }
    endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
}

/// Why a unary call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The channel did not become ready: the request was never sent.
    #[error("not ready: {0}")]
    NotReady(tonic::transport::Error),
    /// The server (or tonic on its behalf) answered with a status.
    #[error("{0}")]
    Status(tonic::Status),
}

impl CallError {
    /// As a status, a channel that never became ready being `UNAVAILABLE`.
    pub fn into_status(self) -> tonic::Status {
        match self {
            CallError::NotReady(e) => tonic::Status::unavailable(e.to_string()),
            CallError::Status(s) => s,
        }
    }
}

/// One unary call of the method at `path` on `channel`; replies larger than
/// `max_reply_bytes` are refused (`None`: tonic's default of 4 MiB).
pub async fn call<Req, Resp>(
    channel: Channel,
    path: &'static str,
    request: Req,
    max_reply_bytes: Option<usize>,
) -> Result<Resp, CallError>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel);
    if let Some(n) = max_reply_bytes {
        grpc = grpc.max_decoding_message_size(n);
    }
    grpc.ready().await.map_err(CallError::NotReady)?;
    let codec: ProstCodec<Req, Resp> = ProstCodec::default();
    let method = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    grpc.unary(tonic::Request::new(request), method, codec)
        .await
        .map(tonic::Response::into_inner)
        .map_err(CallError::Status)
}

/// One unary call with tonic's default reply limit, a channel that never became ready
/// answering `UNAVAILABLE` (what the device plugin's tests and registration expect).
pub async fn unary<Req, Resp>(
    channel: Channel,
    path: &'static str,
    request: Req,
) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    call(channel, path, request, None)
        .await
        .map_err(CallError::into_status)
}
