//! The `v1beta1.DevicePlugin` gRPC service for one resource, written against tonic's server
//! primitives (no generated code): a tower service routing the five methods by path.

// `tonic::Status` is the error of every gRPC call; boxing it would only convert it back.
#![allow(clippy::result_large_err)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tonic::codec::ProstCodec;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::Status;

use super::devices;
use super::proto::{self, *};

/// The largest decoded header list h2 accepts on a plugin socket (SETTINGS_MAX_HEADER_LIST_SIZE,
/// also the cap on an unfinished header block's buffered bytes); a kubelet request carries a
/// few hundred bytes of headers. hyper's default, written out.
const MAX_HEADER_LIST: u32 = 16 << 10;
/// The largest frame accepted (SETTINGS_MAX_FRAME_SIZE): the protocol's default, written out.
const MAX_FRAME: u32 = 16 << 10;
/// Streams open at once on one connection: the kubelet keeps one ListAndWatch open and makes
/// one unary call at a time.
const MAX_STREAMS: u32 = 64;
/// Streams a client may reset before they are accepted (the "rapid reset" bound).
const MAX_PENDING_RESETS: usize = 20;
/// A PING after this much silence, and the connection dropped when it goes unanswered.
const KEEPALIVE: (Duration, Duration) = (Duration::from_secs(60), Duration::from_secs(20));

/// A tonic server with the plugin sockets' limits: h2 bounds what a local client can make the
/// agent hold (header lists, unfinished header blocks, frames, streams, silent peers).
pub fn limited() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_max_header_list_size(MAX_HEADER_LIST)
        .max_frame_size(MAX_FRAME)
        .max_concurrent_streams(MAX_STREAMS)
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_RESETS))
        .http2_keepalive_interval(Some(KEEPALIVE.0))
        .http2_keepalive_timeout(Some(KEEPALIVE.1))
}

/// The largest request message decoded: tonic's default (grpc-go's too), written out; a
/// kubelet's largest request, GetPreferredAllocation on a node of many replicas, is a few KiB.
const MAX_REQUEST: usize = 4 << 20;

/// What one resource's service reads and counts.
#[derive(Debug)]
pub struct ResourceState {
    pub name: String,
    /// The devices to advertise; every change is streamed to ListAndWatch.
    pub devices: watch::Receiver<Arc<Vec<Device>>>,
    /// How Allocate names devices to the runtime.
    pub allocate: Arc<devices::AllocateOptions>,
    /// Physical device → index name, for `device_id_strategy = "index"`.
    pub index_names: watch::Receiver<Arc<std::collections::BTreeMap<String, String>>>,
    /// Shared by every instance of the service for this resource (re-serves keep counting).
    pub counters: Arc<Counters>,
    /// Turns true when the plugin stops or re-serves: open streams end.
    pub stop: watch::Receiver<bool>,
    /// The latest publication, for the GPU topology `GetPreferredAllocation` ranks sets by.
    pub published: watch::Receiver<Arc<crate::publication::Published>>,
}

/// Allocate answers of one resource.
#[derive(Debug, Default)]
pub struct Counters {
    pub allocations: AtomicU64,
    pub rejected: AtomicU64,
}

/// The service tonic's server routes `v1beta1.DevicePlugin/*` to.
#[derive(Debug, Clone)]
pub struct PluginService(pub Arc<ResourceState>);

impl tonic::server::NamedService for PluginService {
    const NAME: &'static str = "v1beta1.DevicePlugin";
}

/// Runs one unary method with `f`.
async fn unary<Req, Resp>(
    req: http::Request<tonic::body::Body>,
    f: impl FnOnce(Req) -> Result<Resp, Status> + Send + 'static,
) -> http::Response<tonic::body::Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
{
    let codec: ProstCodec<Resp, Req> = ProstCodec::default();
    let mut grpc = tonic::server::Grpc::new(codec).max_decoding_message_size(MAX_REQUEST);
    let mut f = Some(f);
    let svc = tower::service_fn(move |r: tonic::Request<Req>| {
        let result = match f.take() {
            Some(f) => f(r.into_inner()).map(tonic::Response::new),
            None => Err(Status::internal("called twice")),
        };
        async move { result }
    });
    grpc.unary(svc, req).await
}

impl Service<http::Request<tonic::body::Body>> for PluginService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            let response = match req.uri().path() {
                proto::OPTIONS_PATH => {
                    unary(req, |_: Empty| {
                        Ok(DevicePluginOptions {
                            pre_start_required: false,
                            get_preferred_allocation_available: true,
                        })
                    })
                    .await
                }
                proto::LIST_AND_WATCH_PATH => list_and_watch(state, req).await,
                proto::PREFERRED_PATH => {
                    let topology = state.published.borrow().snapshot.topology.clone();
                    unary(req, move |r: PreferredAllocationRequest| {
                        Ok(preferred(topology.as_deref(), r))
                    })
                    .await
                }
                proto::ALLOCATE_PATH => {
                    unary(req, move |r: AllocateRequest| allocate(&state, r)).await
                }
                proto::PRE_START_PATH => {
                    unary(req, |_: PreStartContainerRequest| {
                        Ok(PreStartContainerResponse {})
                    })
                    .await
                }
                other => Status::unimplemented(format!("no method '{other}'")).into_http(),
            };
            Ok(response)
        })
    }
}

fn preferred(
    topology: Option<&crate::snapshot::Topology>,
    r: PreferredAllocationRequest,
) -> PreferredAllocationResponse {
    PreferredAllocationResponse {
        container_responses: r
            .container_requests
            .iter()
            .map(|c| ContainerPreferredAllocationResponse {
                device_ids: crate::sharing::preferred::preferred(
                    topology,
                    &c.available_device_ids,
                    &c.must_include_device_ids,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                ),
            })
            .collect(),
    }
}

fn allocate(state: &ResourceState, r: AllocateRequest) -> Result<AllocateResponse, Status> {
    let advertised = state.devices.borrow().clone();
    let index_names = state.index_names.borrow().clone();
    let mut responses = Vec::with_capacity(r.container_requests.len());
    for c in &r.container_requests {
        match devices::allocate(&advertised, &c.devices_ids, &state.allocate, &index_names) {
            Ok(resp) => responses.push(resp),
            Err(e) => {
                state.counters.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(resource = %state.name, devices = ?c.devices_ids, "device plugin: Allocate refused: {e}");
                return Err(Status::invalid_argument(e));
            }
        }
    }
    state.counters.allocations.fetch_add(1, Ordering::Relaxed);
    tracing::info!(resource = %state.name, requests = ?r.container_requests.iter().map(|c| &c.devices_ids).collect::<Vec<_>>(), "device plugin: allocated");
    Ok(AllocateResponse {
        container_responses: responses,
    })
}

/// Sends the device list at once and again on every change, until the kubelet hangs up or
/// the plugin stops.
async fn list_and_watch(
    state: Arc<ResourceState>,
    req: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let codec: ProstCodec<ListAndWatchResponse, Empty> = ProstCodec::default();
    let mut grpc = tonic::server::Grpc::new(codec).max_decoding_message_size(MAX_REQUEST);
    let svc = tower::service_fn(move |_: tonic::Request<Empty>| {
        let (tx, rx) = mpsc::channel::<Result<ListAndWatchResponse, Status>>(4);
        let mut devices = state.devices.clone();
        let mut stop = state.stop.clone();
        tokio::spawn(async move {
            loop {
                let list = devices.borrow_and_update().as_ref().clone();
                if tx
                    .send(Ok(ListAndWatchResponse { devices: list }))
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::select! {
                    changed = devices.changed() => if changed.is_err() { return },
                    _ = stop.wait_for(|s| *s) => return,
                    _ = tx.closed() => return,
                }
            }
        });
        async move { Ok::<_, Status>(tonic::Response::new(ReceiverStream::new(rx))) }
    });
    grpc.server_streaming(svc, req).await
}
