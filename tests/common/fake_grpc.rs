//! A fake gRPC service on a Unix socket: tonic's own server answering one unary method with a
//! reply the test chose, as the kubelet's pod-resources API and a container runtime's CRI do.
//!
//! Shared by the integration tests (through `common`) and the CRI client's unit tests (which
//! include this file with `#[path]`), so it uses nothing but tonic, tokio and prost.

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::codegen::{http, BoxFuture, Service};

/// The service a fake stands in for: its full name and its method's messages. Every method of
/// the service gets the one reply.
pub trait Unary: Send + Sync + 'static {
    /// `package.Service`, as in the request path `/package.Service/Method`.
    const SERVICE: &'static str;
    type Request: prost::Message + Default + Send + 'static;
    type Response: prost::Message + Clone + Send + Sync + 'static;
}

struct Fake<U: Unary>(Arc<U::Response>);

impl<U: Unary> Clone for Fake<U> {
    fn clone(&self) -> Self {
        Fake(self.0.clone())
    }
}

struct Call<U: Unary>(Arc<U::Response>);

impl<U: Unary> tonic::server::UnaryService<U::Request> for Call<U> {
    type Response = U::Response;
    type Future = BoxFuture<tonic::Response<U::Response>, tonic::Status>;
    fn call(&mut self, _: tonic::Request<U::Request>) -> Self::Future {
        let reply = U::Response::clone(&self.0);
        Box::pin(async move { Ok(tonic::Response::new(reply)) })
    }
}

impl<U: Unary> Service<http::Request<tonic::body::Body>> for Fake<U> {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let reply = self.0.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic::codec::ProstCodec::default());
            Ok(grpc.unary(Call::<U>(reply), req).await)
        })
    }
}

impl<U: Unary> tonic::server::NamedService for Fake<U> {
    const NAME: &'static str = U::SERVICE;
}

/// Accepted connections of a Unix listener, as the stream tonic's server takes.
struct Incoming(tokio::net::UnixListener);

impl tonic::codegen::tokio_stream::Stream for Incoming {
    type Item = std::io::Result<tokio::net::UnixStream>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_accept(cx).map(|r| Some(r.map(|(s, _)| s)))
    }
}

/// Serves `reply` on `socket` as a task of the calling (async) test's runtime; it listens
/// when this returns.
pub fn spawn<U: Unary>(socket: &Path, reply: U::Response) {
    let listener = tokio::net::UnixListener::bind(socket).expect("bind socket");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(Fake::<U>(Arc::new(reply)))
            .serve_with_incoming(Incoming(listener)),
    );
}

/// Serves `reply` on `socket` from a runtime of its own on a background thread until the test
/// ends (for tests that are not async); it listens when this returns.
pub fn serve<U: Unary>(socket: &Path, reply: U::Response) {
    let socket = socket.to_path_buf();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::UnixListener::bind(&socket).expect("bind socket");
            let _ = ready_tx.send(());
            tonic::transport::Server::builder()
                .add_service(Fake::<U>(Arc::new(reply)))
                .serve_with_incoming(Incoming(listener))
                .await
                .expect("serve");
        });
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("fake gRPC service listening");
}
