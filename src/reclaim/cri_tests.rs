//! The CRI client against a fake container runtime: a tonic server on a Unix socket answering
//! `/runtime.v1.RuntimeService/ListPodSandbox` with these hand-written messages.

use super::*;

#[path = "../../tests/common/fake_grpc.rs"]
#[allow(dead_code)] // `serve` is for tests that are not async
mod fake_grpc;

struct RuntimeService;

impl fake_grpc::Unary for RuntimeService {
    const SERVICE: &'static str = "runtime.v1.RuntimeService";
    type Request = ListPodSandboxRequest;
    type Response = ListPodSandboxResponse;
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
    fake_grpc::spawn::<RuntimeService>(&socket, reply);
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
