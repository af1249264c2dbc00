//! The CRI client against a fake container runtime: a tonic server on a Unix socket answering
//! `/runtime.v1.RuntimeService/ListPodSandbox` with these hand-written messages.

use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::{http, BoxFuture, Service};

use super::*;

#[derive(Clone)]
struct Runtime(ListPodSandboxResponse);

struct ListCall(ListPodSandboxResponse);

impl tonic::server::UnaryService<ListPodSandboxRequest> for ListCall {
    type Response = ListPodSandboxResponse;
    type Future = BoxFuture<tonic::Response<Self::Response>, tonic::Status>;
    fn call(&mut self, _: tonic::Request<ListPodSandboxRequest>) -> Self::Future {
        let reply = self.0.clone();
        Box::pin(async move { Ok(tonic::Response::new(reply)) })
    }
}

impl Service<http::Request<tonic::body::Body>> for Runtime {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let reply = self.0.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
            Ok(grpc.unary(ListCall(reply), req).await)
        })
    }
}

impl tonic::server::NamedService for Runtime {
    const NAME: &'static str = "runtime.v1.RuntimeService";
}

struct Incoming(tokio::net::UnixListener);

impl tonic::codegen::tokio_stream::Stream for Incoming {
    type Item = std::io::Result<tokio::net::UnixStream>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_accept(cx).map(|r| Some(r.map(|(s, _)| s)))
    }
}

fn sandbox(uid: &str, labels: &[(&str, &str)]) -> PodSandbox {
    PodSandbox {
        id: format!("sb-{uid}"),
        metadata: Some(PodSandboxMetadata {
            name: format!("pod-{uid}"),
            uid: uid.into(),
            namespace: "ml".into(),
        }),
        state: 0,
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[tokio::test]
async fn labels_come_from_list_pod_sandbox_over_the_unix_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("containerd.sock");
    let reply = ListPodSandboxResponse {
        items: vec![
            sandbox("uid-a", &[("app", "jupyter"), ("team", "a")]),
            sandbox("uid-b", &[]),
        ],
    };
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(Runtime(reply))
            .serve_with_incoming(Incoming(listener)),
    );
    let (_stop_tx, stop) = watch::channel(false);
    let mut feed = spawn(socket.clone(), Duration::from_secs(1), stop);
    let got = tokio::time::timeout(Duration::from_secs(10), feed.0.wait_for(|l| l.up))
        .await
        .expect("in time")
        .expect("feed")
        .clone();
    assert_eq!(got.by_uid["uid-a"]["app"], "jupyter");
    assert!(got.by_uid["uid-b"].is_empty());
    assert_eq!(got.errors, 0);
}

#[tokio::test]
async fn an_absent_runtime_is_reported_not_fatal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("absent.sock");
    let e = list(&socket, Duration::from_secs(2))
        .await
        .expect_err("no runtime");
    assert!(e.contains("cannot connect to the container runtime"), "{e}");
    let (_stop_tx, stop) = watch::channel(false);
    let mut feed = spawn(socket, Duration::from_secs(1), stop);
    let got = tokio::time::timeout(Duration::from_secs(10), feed.0.wait_for(|l| l.errors > 0))
        .await
        .expect("in time")
        .expect("feed")
        .clone();
    assert!(!got.up);
}
