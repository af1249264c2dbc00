//! A stand-in for NVSentinel's platform connector: tonic's server on a Unix socket answering
//! `datamodels.PlatformConnector/HealthEventOccurredV1` with `google.protobuf.Empty` and
//! keeping every `HealthEvents` it received. It can be stopped and started again on the same
//! path (the connector down and up).
//!
//! The messages are written here from NVSentinel's main-line `health_event.proto` (commit
//! d87e98588030e23f81a64d3f747bd46dd3efd7a2, vendored in src/nvsentinel/health_event.proto),
//! apart from the agent's own, so that a field number the agent got wrong shows here as a
//! missing value. A batch holding an enum value the main line does not define is refused
//! (`INVALID_ARGUMENT`) and kept apart in `rejected`.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::codegen::{http, BoxFuture, Service};

#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthEvents {
    #[prost(uint32, tag = "1")]
    pub version: u32,
    #[prost(message, repeated, tag = "2")]
    pub events: Vec<HealthEvent>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Entity {
    #[prost(string, tag = "1")]
    pub entity_type: String,
    #[prost(string, tag = "2")]
    pub entity_value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `enum RecommendedAction` at d87e985.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum RecommendedAction {
    None = 0,
    ComponentReset = 2,
    ContactSupport = 5,
    RunFielddiag = 6,
    RestartVm = 15,
    RestartBm = 24,
    ReplaceVm = 25,
    RunDcgmeud = 26,
    Custom = 27,
    Remediate = 28,
    Unknown = 99,
}

/// `enum ProcessingStrategy` at d87e985.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum ProcessingStrategy {
    Unspecified = 0,
    ExecuteRemediation = 1,
    StoreOnly = 2,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthEvent {
    #[prost(uint32, tag = "1")]
    pub version: u32,
    #[prost(string, tag = "2")]
    pub agent: String,
    #[prost(string, tag = "3")]
    pub component_class: String,
    #[prost(string, tag = "4")]
    pub check_name: String,
    #[prost(bool, tag = "5")]
    pub is_fatal: bool,
    #[prost(bool, tag = "6")]
    pub is_healthy: bool,
    #[prost(string, tag = "7")]
    pub message: String,
    #[prost(enumeration = "RecommendedAction", tag = "8")]
    pub recommended_action: i32,
    #[prost(string, repeated, tag = "9")]
    pub error_code: Vec<String>,
    #[prost(message, repeated, tag = "10")]
    pub entities_impacted: Vec<Entity>,
    #[prost(message, optional, tag = "12")]
    pub generated_timestamp: Option<Timestamp>,
    #[prost(string, tag = "13")]
    pub node_name: String,
    #[prost(enumeration = "ProcessingStrategy", tag = "16")]
    pub processing_strategy: i32,
    #[prost(string, tag = "17")]
    pub id: String,
    #[prost(string, tag = "18")]
    pub custom_recommended_action: String,
}

impl HealthEvent {
    /// Why the main line's enums do not hold this event's values, if they do not.
    fn undefined(&self) -> Option<String> {
        if RecommendedAction::try_from(self.recommended_action).is_err() {
            return Some(format!(
                "{}: recommendedAction {} is not defined",
                self.check_name, self.recommended_action
            ));
        }
        if ProcessingStrategy::try_from(self.processing_strategy).is_err() {
            return Some(format!(
                "{}: processingStrategy {} is not defined",
                self.check_name, self.processing_strategy
            ));
        }
        None
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

type Received = Arc<Mutex<Vec<HealthEvents>>>;
type Rejected = Arc<Mutex<Vec<String>>>;

#[derive(Clone)]
struct Svc(Received, Rejected);

struct Call(Received, Rejected);

impl tonic::server::UnaryService<HealthEvents> for Call {
    type Response = Empty;
    type Future = BoxFuture<tonic::Response<Empty>, tonic::Status>;
    fn call(&mut self, req: tonic::Request<HealthEvents>) -> Self::Future {
        let batch = req.into_inner();
        if let Some(why) = batch.events.iter().find_map(HealthEvent::undefined) {
            self.1.lock().expect("lock").push(why.clone());
            return Box::pin(async move { Err(tonic::Status::invalid_argument(why)) });
        }
        self.0.lock().expect("lock").push(batch);
        Box::pin(async { Ok(tonic::Response::new(Empty {})) })
    }
}

impl Service<http::Request<tonic::body::Body>> for Svc {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let (received, rejected) = (self.0.clone(), self.1.clone());
        Box::pin(async move {
            if req.uri().path() != "/datamodels.PlatformConnector/HealthEventOccurredV1" {
                let mut r = http::Response::new(tonic::body::Body::default());
                *r.status_mut() = http::StatusCode::NOT_FOUND;
                return Ok(r);
            }
            let mut grpc = tonic::server::Grpc::new(tonic::codec::ProstCodec::default());
            Ok(grpc.unary(Call(received, rejected), req).await)
        })
    }
}

impl tonic::server::NamedService for Svc {
    const NAME: &'static str = "datamodels.PlatformConnector";
}

struct Incoming(tokio::net::UnixListener);

impl tonic::codegen::tokio_stream::Stream for Incoming {
    type Item = std::io::Result<tokio::net::UnixStream>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_accept(cx).map(|r| Some(r.map(|(s, _)| s)))
    }
}

/// The connector; what it received is kept across stops and starts.
pub struct Connector {
    pub socket: PathBuf,
    pub received: Received,
    /// Why each refused batch was refused.
    pub rejected: Rejected,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Connector {
    pub fn new(socket: &Path) -> Connector {
        Connector {
            socket: socket.to_path_buf(),
            received: Arc::default(),
            rejected: Arc::default(),
            stop: None,
            thread: None,
        }
    }

    /// Listens on the socket (again); returns once it does.
    pub fn start(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let socket = self.socket.clone();
        let svc = Svc(self.received.clone(), self.rejected.clone());
        self.thread = Some(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
                let _ = ready_tx.send(());
                let _ = tonic::transport::Server::builder()
                    .add_service(svc)
                    .serve_with_incoming_shutdown(Incoming(listener), async {
                        let _ = stop_rx.await;
                    })
                    .await;
            });
        }));
        self.stop = Some(stop_tx);
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("connector listening");
    }

    /// Stops listening and removes the socket: the connector is down.
    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Every event received so far, in order.
    pub fn events(&self) -> Vec<HealthEvent> {
        self.received
            .lock()
            .expect("lock")
            .iter()
            .flat_map(|b| b.events.clone())
            .collect()
    }
}

impl Connector {
    /// Why each refused batch was refused (an enum value the main line lacks).
    pub fn rejected(&self) -> Vec<String> {
        self.rejected.lock().expect("lock").clone()
    }
}

impl Drop for Connector {
    fn drop(&mut self) {
        self.stop();
    }
}
