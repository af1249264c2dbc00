//! The device plugin against a fake kubelet in a temporary directory: a Registration server on
//! `kubelet.sock` that records what registers, then a client of the plugin's own socket.
//! Registration, the advertised replicas, a health change reaching ListAndWatch (the scenario
//! rewritten so that a GPU is lost, then back), Allocate, GetPreferredAllocation, and
//! registration again after the kubelet socket is recreated.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::{wait_for, Agent};
use gpu_steward::grpc;
use gpu_steward::sharing::plugin::proto::*;
use tonic::codegen::tokio_stream::wrappers::UnixListenerStream;
use tonic::codegen::tokio_stream::StreamExt;
use tonic::codegen::{http, BoxFuture, Service};

const GPU0: &str = "GPU-d0000000-1111-2222-3333-444444444444";
const GPU1: &str = "GPU-d0000001-1111-2222-3333-444444444444";

fn scenario(gpu1_lost: bool) -> String {
    format!(
        "version = 1\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"{GPU0}\"\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"{GPU1}\"\nlost = {gpu1_lost}\n"
    )
}

/// A fake kubelet's Registration service: records every request.
#[derive(Clone)]
struct Registration(Arc<Mutex<Vec<RegisterRequest>>>);

impl Service<http::Request<tonic::body::Body>> for Registration {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let seen = self.0.clone();
        Box::pin(async move {
            let codec: tonic::codec::ProstCodec<Empty, RegisterRequest> = Default::default();
            let mut grpc = tonic::server::Grpc::new(codec);
            let svc = tower::service_fn(move |r: tonic::Request<RegisterRequest>| {
                seen.lock().expect("lock").push(r.into_inner());
                async { Ok::<_, tonic::Status>(tonic::Response::new(Empty {})) }
            });
            Ok(grpc.unary(svc, req).await)
        })
    }
}

impl tonic::server::NamedService for Registration {
    const NAME: &'static str = "v1beta1.Registration";
}

/// A fake kubelet serving on `socket` until dropped.
struct Kubelet {
    requests: Arc<Mutex<Vec<RegisterRequest>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Kubelet {
    fn start(rt: &tokio::runtime::Runtime, socket: &Path) -> Kubelet {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let _guard = rt.enter();
        let listener = tokio::net::UnixListener::bind(socket).expect("bind kubelet.sock");
        let svc = Registration(requests.clone());
        rt.spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .expect("serve");
        });
        Kubelet {
            requests,
            stop: Some(stop),
        }
    }

    fn registered(&self) -> Vec<RegisterRequest> {
        self.requests.lock().expect("lock").clone()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn config(dir: &Path) -> String {
    format!(
        "[sharing.device_plugin]\nenabled = true\ndirectory = \"{}\"\n\
         [sharing.time_slicing]\nfail_requests_greater_than_one = true\n\
         [[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpu\"\nreplicas = 2\n",
        dir.display()
    )
}

type Devices = Vec<(String, String)>;

/// Reads ListAndWatch messages until one satisfies `want`.
async fn watch_until(
    stream: &mut tonic::codec::Streaming<ListAndWatchResponse>,
    what: &str,
    mut want: impl FnMut(&Devices) -> bool,
) -> Devices {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = tokio::time::timeout(left, stream.next())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .expect("stream open")
            .expect("message");
        let mut devices: Devices = msg.devices.into_iter().map(|d| (d.id, d.health)).collect();
        devices.sort();
        if want(&devices) {
            return devices;
        }
    }
}

async fn list_and_watch(socket: &Path) -> tonic::codec::Streaming<ListAndWatchResponse> {
    let channel = grpc::connect(socket, Some(Duration::from_secs(5)))
        .await
        .expect("connect to the plugin");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let codec: tonic::codec::ProstCodec<Empty, ListAndWatchResponse> = Default::default();
    grpc.server_streaming(
        tonic::Request::new(Empty {}),
        http::uri::PathAndQuery::from_static(LIST_AND_WATCH_PATH),
        codec,
    )
    .await
    .expect("ListAndWatch")
    .into_inner()
}

fn replica(uuid: &str, n: u32, health: &str) -> (String, String) {
    (format!("{uuid}::{n}"), health.to_string())
}

#[test]
fn registers_advertises_replicas_follows_health_allocates_and_registers_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dp: PathBuf = dir.path().join("device-plugins");
    std::fs::create_dir(&dp).expect("mkdir");
    let kubelet_sock = dp.join("kubelet.sock");
    let plugin_sock = dp.join("gpu-steward-gpu.sock");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let kubelet = Kubelet::start(&rt, &kubelet_sock);
    let agent = Agent::with_scenario(&scenario(false))
        .config(&config(&dp))
        .start();

    // Registration.
    let first = wait_for("registration", Duration::from_secs(20), || {
        kubelet.registered().first().cloned()
    });
    assert_eq!(first.version, "v1beta1");
    assert_eq!(first.endpoint, "gpu-steward-gpu.sock");
    assert_eq!(first.resource_name, "nvidia.com/gpu");
    let options = first.options.expect("options");
    assert!(options.get_preferred_allocation_available && !options.pre_start_required);

    rt.block_on(async {
        let channel = grpc::connect(&plugin_sock, Some(Duration::from_secs(5)))
            .await
            .expect("connect");
        let o: DevicePluginOptions = grpc::unary(channel, OPTIONS_PATH, Empty {})
            .await
            .expect("options");
        assert!(o.get_preferred_allocation_available);

        // The devices: two replicas per GPU, healthy.
        let mut stream = list_and_watch(&plugin_sock).await;
        let healthy = vec![
            replica(GPU0, 0, "Healthy"),
            replica(GPU0, 1, "Healthy"),
            replica(GPU1, 0, "Healthy"),
            replica(GPU1, 1, "Healthy"),
        ];
        watch_until(&mut stream, "4 healthy replicas", |d| *d == healthy).await;

        // A GPU fails: its replicas turn Unhealthy on the open stream; then it recovers.
        agent.rewrite_scenario(&scenario(true));
        let failed = watch_until(&mut stream, "GPU 1 unhealthy", |d| {
            d.iter().any(|(_, h)| h == "Unhealthy")
        })
        .await;
        assert_eq!(
            failed,
            vec![
                replica(GPU0, 0, "Healthy"),
                replica(GPU0, 1, "Healthy"),
                replica(GPU1, 0, "Unhealthy"),
                replica(GPU1, 1, "Unhealthy"),
            ]
        );
        agent.rewrite_scenario(&scenario(false));
        watch_until(&mut stream, "GPU 1 healthy again", |d| *d == healthy).await;

        // Allocate.
        let allocate = |ids: &[String]| {
            let req = AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids.to_vec(),
                }],
            };
            let sock = plugin_sock.clone();
            async move {
                let channel = grpc::connect(&sock, Some(Duration::from_secs(5)))
                    .await
                    .expect("connect");
                grpc::unary::<AllocateRequest, AllocateResponse>(channel, ALLOCATE_PATH, req).await
            }
        };
        let ok = allocate(&[format!("{GPU1}::1")])
            .await
            .expect("one replica");
        assert_eq!(
            ok.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"],
            GPU1
        );
        let refused = allocate(&[format!("{GPU0}::0"), format!("{GPU0}::1")])
            .await
            .expect_err("failRequestsGreaterThanOne");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(refused
            .message()
            .contains("maximum request size for shared resources is 1"));
        let unknown = allocate(&["GPU-nope::0".into()])
            .await
            .expect_err("unknown");
        assert!(unknown.message().contains("unknown device"), "{unknown:?}");

        // Preferred allocation: distinct physical GPUs.
        let channel = grpc::connect(&plugin_sock, Some(Duration::from_secs(5)))
            .await
            .expect("connect");
        let pref: PreferredAllocationResponse = grpc::unary(
            channel,
            PREFERRED_PATH,
            PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_ids: healthy.iter().map(|(i, _)| i.clone()).collect(),
                    must_include_device_ids: vec![],
                    allocation_size: 2,
                }],
            },
        )
        .await
        .expect("preferred");
        assert_eq!(
            pref.container_responses[0].device_ids,
            [format!("{GPU0}::0"), format!("{GPU1}::0")]
        );
    });

    // The kubelet restarts: its socket is recreated and the plugin sockets are wiped.
    drop(kubelet);
    std::fs::remove_file(&kubelet_sock).expect("remove kubelet.sock");
    std::fs::remove_file(&plugin_sock).expect("remove plugin socket");
    let kubelet = Kubelet::start(&rt, &kubelet_sock);
    let again = wait_for(
        "registration after the restart",
        Duration::from_secs(20),
        || kubelet.registered().first().cloned(),
    );
    assert_eq!(again.resource_name, "nvidia.com/gpu");
    rt.block_on(async {
        let mut stream = list_and_watch(&plugin_sock).await;
        watch_until(&mut stream, "devices after re-registration", |d| {
            d.len() == 4
        })
        .await;
    });

    // Metrics: registration state, registrations, allocations and replicas.
    wait_for("device plugin metrics", Duration::from_secs(20), || {
        let m = agent.metrics();
        let r = [("resource", "nvidia.com/gpu")];
        (m.value("gpu_steward_device_plugin_registered", &r) == Some(1.0)
            && m.value("gpu_steward_device_plugin_registrations_total", &r) == Some(2.0)
            && m.value("gpu_steward_device_plugin_allocations_total", &r) == Some(1.0)
            && m.value("gpu_steward_device_plugin_allocations_rejected_total", &r) == Some(2.0)
            && m.value(
                "gpu_steward_sharing_replicas",
                &[("uuid", GPU1), ("resource", "nvidia.com/gpu")],
            ) == Some(2.0))
        .then_some(())
    });
    assert!(agent
        .log()
        .contains("device plugin: GPU advertised Unhealthy"));
}

/// NVIDIA's plugin marks a GPU unhealthy on a fixed XID list (including XID 94, which only asks
/// for an application restart: k8s-device-plugin#1974) and keeps it so until restarted (#234).
/// Here the verdict decides: XID 94 is a warning (Healthy), XID 48 a failure (Unhealthy), and
/// the GPU is Healthy again once the XID window has passed.
#[test]
fn xid_verdicts_decide_health_and_a_gpu_recovers_without_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dp: PathBuf = dir.path().join("device-plugins");
    std::fs::create_dir(&dp).expect("mkdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let kubelet = Kubelet::start(&rt, &dp.join("kubelet.sock"));
    let config = format!(
        "[health]\nxid_window = \"2s\"\n[sharing.device_plugin]\nenabled = true\ndirectory = \"{}\"\n",
        dp.display()
    );
    let agent = Agent::with_scenario(&scenario(false))
        .config(&config)
        .start();
    wait_for("registration", Duration::from_secs(20), || {
        kubelet.registered().first().cloned()
    });
    let whole = |h0: &str, h1: &str| {
        vec![
            (GPU0.to_string(), h0.to_string()),
            (GPU1.to_string(), h1.to_string()),
        ]
    };
    rt.block_on(async {
        let mut stream = list_and_watch(&dp.join("gpu-steward-gpu.sock")).await;
        watch_until(&mut stream, "whole GPUs, healthy", |d| {
            *d == whole("Healthy", "Healthy")
        })
        .await;
        let events = common::with_event(
            &common::with_event(&scenario(false), 0, "[[gpu.event]]\nid = 1\nxid = 94\n"),
            1,
            "[[gpu.event]]\nid = 2\nxid = 48\n",
        );
        agent.rewrite_scenario(&events);
        let mut seen = Vec::new();
        watch_until(&mut stream, "GPU 1 unhealthy", |d| {
            seen.push(d.clone());
            *d == whole("Healthy", "Unhealthy")
        })
        .await;
        let warn = agent.get("/health/gpus/0").json();
        assert_eq!(warn["status"], "warn", "XID 94 is a warning: {warn}");
        watch_until(&mut stream, "GPU 1 healthy again", |d| {
            seen.push(d.clone());
            *d == whole("Healthy", "Healthy")
        })
        .await;
        assert!(
            seen.iter()
                .all(|d| d[0] == (GPU0.to_string(), "Healthy".to_string())),
            "GPU 0 (XID 94) never turned Unhealthy: {seen:?}"
        );
    });
}

/// A GPU with MIG enabled is never advertised whole: its MIG devices (the `MIG-…` UUIDs the
/// poller reads from the layout) are, under the `nvidia.com/mig-<profile>` resource the
/// configuration shares, as `<MIG UUID>::<n>` replicas.
#[test]
fn mig_devices_are_advertised_under_their_profile() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dp: PathBuf = dir.path().join("device-plugins");
    std::fs::create_dir(&dp).expect("mkdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let kubelet = Kubelet::start(&rt, &dp.join("kubelet.sock"));
    let config = format!(
        "[sharing.device_plugin]\nenabled = true\ndirectory = \"{}\"\n\
         [[sharing.time_slicing.resources]]\nname = \"nvidia.com/mig-1g.10gb\"\nreplicas = 2\n",
        dp.display()
    );
    let scenario = format!(
        "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"{GPU0}\"\nmig_mode = true\n\
         mig_devices = [\"1g.10gb\", \"1g.10gb\", \"3g.40gb\"]\n"
    );
    let _agent = Agent::with_scenario(&scenario).config(&config).start();
    wait_for("registration", Duration::from_secs(20), || {
        kubelet
            .registered()
            .into_iter()
            .find(|r| r.resource_name == "nvidia.com/mig-1g.10gb")
    });
    rt.block_on(async {
        let socket = dp.join(gpu_steward::sharing::plugin::socket_name(
            "nvidia.com/mig-1g.10gb",
        ));
        let mut stream = list_and_watch(&socket).await;
        let devices = watch_until(&mut stream, "two MIG devices, two replicas each", |d| {
            d.len() == 4
        })
        .await;
        let mut uuids: Vec<&str> = devices
            .iter()
            .map(|(id, health)| {
                assert_eq!(health, "Healthy");
                let (uuid, n) = id.rsplit_once("::").expect("<uuid>::<n>");
                assert!(n == "0" || n == "1", "{id}");
                assert!(uuid.starts_with("MIG-"), "{id}");
                uuid
            })
            .collect();
        uuids.dedup();
        assert_eq!(uuids.len(), 2, "{devices:?}");
        assert!(
            !devices.iter().any(|(id, _)| id.starts_with(GPU0)),
            "a MIG GPU was advertised whole: {devices:?}"
        );
    });
}

const TOKEN: &str = "device-plugin-test-token-0123456789";

const LAYOUTS: &str = r#"
[[mig.layouts.balanced]]
devices = "all"
mig-enabled = true
mig-devices = { "1g.10gb" = 2, "2g.20gb" = 1, "3g.40gb" = 1 }

[[mig.layouts.seven]]
devices = "all"
mig-enabled = true
mig-devices = { "1g.10gb" = 7 }
"#;

/// `[api]` with a token and `[audit]` in `dir`, for `POST /api/v1/mig/apply`.
fn api_config(dir: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let token = dir.join("token");
    std::fs::write(&token, TOKEN).expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    format!(
        "[api]\nenabled = true\ntoken_file = \"{}\"\n[audit]\nfile = \"{}\"\n",
        token.display(),
        dir.join("audit.jsonl").display()
    )
}

fn apply_layout(agent: &Agent, layout: &str) {
    let body = format!("{{\"layout\": \"{layout}\"}}");
    let r = agent.request(&format!(
        "POST /api/v1/mig/apply HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    assert_eq!(r.status, 200, "apply {layout}: {}", r.text());
}

fn registered_names(kubelet: &Kubelet) -> Vec<String> {
    let mut n: Vec<String> = kubelet
        .registered()
        .into_iter()
        .map(|r| r.resource_name)
        .collect();
    n.sort();
    n.dedup();
    n
}

/// `mig_strategy = "mixed"`: every MIG device of the layout at start is advertised under its
/// profile; Allocate names it `<gpu>:<mig index>` in `NVIDIA_VISIBLE_DEVICES` and as a CDI
/// device; the CDI spec that lacks the MIG devices is reported; and after a `mig apply` through
/// the API the resources follow without a restart (the emptied ones stay registered, empty).
#[test]
fn mixed_follows_a_mig_apply_and_allocates_through_cdi_with_the_spec_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dp: PathBuf = dir.path().join("device-plugins");
    let cdi = dir.path().join("cdi");
    std::fs::create_dir(&dp).expect("mkdir");
    std::fs::create_dir(&cdi).expect("mkdir");
    // What `nvidia-ctk cdi generate` wrote before MIG was on: the whole GPU only.
    std::fs::write(
        cdi.join("nvidia.yaml"),
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits: {}\n\
         - name: all\n  containerEdits: {}\ncontainerEdits: {}\n",
    )
    .expect("spec");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let kubelet = Kubelet::start(&rt, &dp.join("kubelet.sock"));
    let config = format!(
        "[mig]\nlayout = \"balanced\"\n{LAYOUTS}\n{}\
         [sharing.device_plugin]\nenabled = true\ndirectory = \"{}\"\nmig_strategy = \"mixed\"\n\
         device_list_strategy = [\"envvar\", \"cdi-cri\"]\ndevice_id_strategy = \"index\"\n\
         cdi_spec_dirs = [\"{}\"]\n",
        api_config(dir.path()),
        dp.display(),
        cdi.display()
    );
    let agent = Agent::with_scenario("version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\n")
        .config(&config)
        .start();
    let want = [
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
    ];
    wait_for("four resources registered", Duration::from_secs(20), || {
        (registered_names(&kubelet) == want).then_some(())
    });
    let socket = |r: &str| dp.join(gpu_steward::sharing::plugin::socket_name(r));
    let sharing = wait_for("the CDI report", Duration::from_secs(20), || {
        let s = agent.get("/api/v1/sharing").json();
        (s["cdi"]["missing_devices"].as_array().map(Vec::len) == Some(4)).then_some(s)
    });
    let missing = sharing["cdi"]["missing_devices"].to_string();
    assert!(missing.contains("\"nvidia.com/gpu=0:"), "{missing}");
    assert!(agent.log().contains("lacks 4 advertised device(s)"));
    rt.block_on(async {
        let mut small = list_and_watch(&socket("nvidia.com/mig-1g.10gb")).await;
        let two = watch_until(&mut small, "two 1g.10gb devices", |d| d.len() == 2).await;
        assert!(
            two.iter()
                .all(|(id, h)| id.starts_with("MIG-") && h == "Healthy"),
            "{two:?}"
        );
        let whole = list_and_watch(&socket("nvidia.com/gpu"))
            .await
            .next()
            .await
            .expect("a list")
            .expect("message");
        assert!(
            whole.devices.is_empty(),
            "a MIG GPU is never whole: {whole:?}"
        );

        let channel = grpc::connect(
            &socket("nvidia.com/mig-1g.10gb"),
            Some(Duration::from_secs(5)),
        )
        .await
        .expect("connect");
        let r: AllocateResponse = grpc::unary(
            channel,
            ALLOCATE_PATH,
            AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: vec![two[0].0.clone()],
                }],
            },
        )
        .await
        .expect("allocate");
        let c = &r.container_responses[0];
        let name = &c.envs["NVIDIA_VISIBLE_DEVICES"];
        assert!(
            name.starts_with("0:") && name[2..].parse::<u32>().is_ok(),
            "{name}"
        );
        assert_eq!(c.cdi_devices.len(), 1);
        assert_eq!(c.cdi_devices[0].name, format!("nvidia.com/gpu={name}"));
        assert!(missing.contains(&c.cdi_devices[0].name), "{missing}");

        // Another layout, through the API: the resources follow without a restart.
        let mut large = list_and_watch(&socket("nvidia.com/mig-3g.40gb")).await;
        watch_until(&mut large, "one 3g.40gb device", |d| d.len() == 1).await;
        apply_layout(&agent, "seven");
        let seven = watch_until(&mut small, "seven 1g.10gb devices", |d| d.len() == 7).await;
        assert!(seven.iter().all(|(id, _)| id.starts_with("MIG-")));
        watch_until(&mut large, "3g.40gb emptied", |d| d.is_empty()).await;
    });
    // The emptied resources stay registered (each registered once: no restart).
    assert_eq!(registered_names(&kubelet), want);
    assert_eq!(kubelet.registered().len(), 4, "{:?}", kubelet.registered());
    wait_for(
        "the CDI report after the apply",
        Duration::from_secs(20),
        || {
            let s = agent.get("/api/v1/sharing").json();
            (s["cdi"]["missing_devices"].as_array().map(Vec::len) == Some(7)).then_some(())
        },
    );
}

/// `mig_strategy = "single"` on a node whose GPUs have different profiles advertises nothing
/// and says why (NVIDIA's plugin refuses to start instead); once a `mig apply` makes the node
/// uniform, every MIG device is advertised as `nvidia.com/gpu`, without a restart.
#[test]
fn single_advertises_nothing_until_the_node_is_uniform() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dp: PathBuf = dir.path().join("device-plugins");
    std::fs::create_dir(&dp).expect("mkdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let kubelet = Kubelet::start(&rt, &dp.join("kubelet.sock"));
    let config = format!(
        "[mig]\n{LAYOUTS}\n{}[sharing.device_plugin]\nenabled = true\ndirectory = \"{}\"\n\
         mig_strategy = \"single\"\n",
        api_config(dir.path()),
        dp.display()
    );
    let scenario = format!(
        "version = 1\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"{GPU0}\"\nmig_mode = true\nmig_devices = [\"1g.10gb\"]\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"{GPU1}\"\nmig_mode = true\nmig_devices = [\"3g.40gb\"]\n"
    );
    let agent = Agent::with_scenario(&scenario).config(&config).start();
    wait_for("registration", Duration::from_secs(20), || {
        kubelet.registered().first().cloned()
    });
    assert_eq!(registered_names(&kubelet), ["nvidia.com/gpu"]);
    let problem = agent.get("/api/v1/sharing").json()["device_plugin_mig_problem"].clone();
    let problem = problem.as_str().expect("a reason").to_string();
    assert!(problem.contains("1g.10gb, 3g.40gb"), "{problem}");
    assert!(agent
        .log()
        .contains("needs one MIG profile on the whole node"));
    rt.block_on(async {
        let mut stream = list_and_watch(&dp.join("gpu-steward-gpu.sock")).await;
        watch_until(&mut stream, "an empty list", |d| d.is_empty()).await;
        apply_layout(&agent, "seven");
        let all = watch_until(&mut stream, "14 MIG devices as nvidia.com/gpu", |d| {
            d.len() == 14
        })
        .await;
        assert!(
            all.iter()
                .all(|(id, h)| id.starts_with("MIG-") && h == "Healthy"),
            "{all:?}"
        );
    });
    assert!(agent.get("/api/v1/sharing").json()["device_plugin_mig_problem"].is_null());
}

/// An XID publishes at once, not at the next poll: at a 60 s poll interval a failing XID reaches
/// ListAndWatch and `/health/gpus` long before the next tick (the bound is loose on purpose;
/// `benches/event_latency.py` measures the distribution).
#[test]
fn an_xid_reaches_list_and_watch_and_health_before_the_next_poll() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dp: PathBuf = dir.path().join("device-plugins");
    std::fs::create_dir(&dp).expect("mkdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let kubelet = Kubelet::start(&rt, &dp.join("kubelet.sock"));
    let config = format!(
        "[health]\nxid_window = \"1h\"\n[sharing.device_plugin]\nenabled = true\ndirectory = \"{}\"\n",
        dp.display()
    );
    let agent = Agent::with_scenario(&scenario(false))
        .interval("60s")
        .config(&config)
        .start();
    wait_for("registration", Duration::from_secs(20), || {
        kubelet.registered().first().cloned()
    });
    rt.block_on(async {
        let mut stream = list_and_watch(&dp.join("gpu-steward-gpu.sock")).await;
        watch_until(&mut stream, "two healthy GPUs", |d| {
            d.len() == 2 && d.iter().all(|(_, h)| h == "Healthy")
        })
        .await;
        let started = Instant::now();
        agent.rewrite_scenario(&common::with_event(
            &scenario(false),
            1,
            "[[gpu.event]]\nid = 1\nxid = 48\n",
        ));
        watch_until(&mut stream, "GPU 1 unhealthy", |d| {
            d.contains(&(GPU1.to_string(), "Unhealthy".to_string()))
        })
        .await;
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "waited for the next poll: {:?}",
            started.elapsed()
        );
    });
    assert_eq!(agent.get("/health/gpus").status, 503);
}
