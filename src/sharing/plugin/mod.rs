//! The Kubernetes device plugin (kubelet API v1beta1 over Unix sockets): one socket and one
//! registration per resource, devices from the published snapshot and its health verdicts.
//!
//! - [`proto`]: the API's messages and the kubelet client calls;
//! - [`devices`]: what is advertised and answered (pure);
//! - [`server`]: the `DevicePlugin` gRPC service.
//!
//! Health comes from the agent's own verdicts: a GPU whose verdict is `fail`, or that is lost
//! or gone, is advertised `Unhealthy`, and `Healthy` again as soon as its verdict recovers
//! (NVIDIA's plugin keeps a GPU unhealthy until it restarts: NVIDIA/k8s-device-plugin#234).
//! A GPU once seen stays in the list while it is gone, so the kubelet sees it unhealthy
//! instead of vanished.
//!
//! The kubelet wipes the plugin sockets when it restarts and recreates `kubelet.sock`: every
//! second each resource looks at `kubelet.sock` (its inode) and at its own socket, and serves
//! and registers again when either changed. A stat a second instead of inotify: no extra
//! dependency, and a kubelet restart takes seconds anyway.

pub mod devices;
pub mod proto;
pub mod server;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tonic::codegen::tokio_stream::wrappers::UnixListenerStream;

use self::devices::{GpuState, MigDevice};
use self::proto::Device;
use self::server::{Counters, PluginService, ResourceState};
use super::settings::SharingConfig;
use super::status::StatusSink;
use crate::health::Status;
use crate::publication::Published;
use crate::snapshot::{GpuStatus, NvmlStatus, PluginResource};

/// How often the sockets are looked at.
const CHECK: Duration = Duration::from_secs(1);

/// The socket file name of `resource` (`nvidia.com/gpu.shared` → `gpu-steward-gpu.shared.sock`).
pub fn socket_name(resource: &str) -> String {
    let short = resource.rsplit('/').next().unwrap_or(resource);
    format!("gpu-steward-{short}.sock")
}

/// Starts the plugin: the inventory task and one serve-and-register task per resource. They
/// end when `stop` turns true. Must run inside a tokio runtime.
pub fn spawn(
    config: &SharingConfig,
    published: watch::Receiver<Arc<Published>>,
    status: StatusSink,
    stop: watch::Receiver<bool>,
) {
    let ts = config.time_slicing.clone();
    let names = devices::resource_names(ts.as_ref());
    let fail_gt_one = ts
        .as_ref()
        .is_some_and(|t| t.fail_requests_greater_than_one);
    let mut senders = BTreeMap::new();
    for name in &names {
        let (tx, rx) = watch::channel(Arc::new(Vec::<Device>::new()));
        senders.insert(name.clone(), tx);
        let task = Registrar {
            resource: name.clone(),
            directory: config.device_plugin.directory.clone(),
            devices: rx,
            fail_gt_one,
            counters: Arc::new(Counters::default()),
            status: status.clone(),
            stop: stop.clone(),
            published: published.clone(),
        };
        tokio::spawn(task.run());
    }
    tokio::spawn(inventory_task(ts, published, senders, status, stop));
}

/// GPUs from a publication: healthy unless failing, lost or gone; `known` remembers every
/// GPU seen (UUID → index, MIG) so that one that disappears is advertised unhealthy.
fn gpu_states(p: &Published, known: &mut BTreeMap<String, (u32, bool)>) -> Vec<GpuState> {
    let up = p.snapshot.nvml == NvmlStatus::Up;
    let mut out = Vec::new();
    if up {
        for g in p.snapshot.gpus.iter().filter(|g| g.identity.is_some()) {
            let failing = p
                .health
                .gpu(g.index)
                .is_some_and(|h| h.verdict.status == Status::Fail);
            let mig = g.reading.mig_mode_current == Some(true);
            known.insert(g.uuid().to_string(), (g.index, mig));
            out.push(GpuState {
                index: g.index,
                uuid: g.uuid().to_string(),
                mig_enabled: mig,
                healthy: g.status == GpuStatus::Up && !failing,
                mig_devices: mig_devices(g),
            });
        }
    }
    for (uuid, (index, mig)) in known.iter() {
        if !out.iter().any(|g| &g.uuid == uuid) {
            out.push(GpuState {
                index: *index,
                uuid: uuid.clone(),
                mig_enabled: *mig,
                healthy: false,
                mig_devices: Vec::new(),
            });
        }
    }
    out
}

/// The GPU's MIG devices as the poller last read them: one per compute instance that has a
/// `MIG-…` UUID, named by its profile (`1g.10gb`, or `1c.3g.40gb` for a partial one) as NVIDIA's
/// device plugin names its `nvidia.com/mig-<profile>` resources.
fn mig_devices(g: &crate::snapshot::GpuSnapshot) -> Vec<MigDevice> {
    g.reading
        .mig_instances
        .iter()
        .flatten()
        .flat_map(|gi| gi.compute_instances.iter())
        .filter_map(|ci| {
            Some(MigDevice {
                uuid: ci.uuid.clone()?,
                profile: ci.profile.clone(),
            })
        })
        .collect()
}

async fn inventory_task(
    ts: Option<crate::sharing::TimeSlicing>,
    mut published: watch::Receiver<Arc<Published>>,
    senders: BTreeMap<String, watch::Sender<Arc<Vec<Device>>>>,
    status: StatusSink,
    mut stop: watch::Receiver<bool>,
) {
    let mut known = BTreeMap::new();
    let mut last_health: BTreeMap<String, bool> = BTreeMap::new();
    loop {
        let p = published.borrow_and_update().clone();
        // Before the first poll there is nothing to say: an empty list would tell the kubelet
        // the node has no GPUs.
        if p.snapshot.nvml != NvmlStatus::Starting {
            let gpus = gpu_states(&p, &mut known);
            for g in &gpus {
                if last_health.insert(g.uuid.clone(), g.healthy) != Some(g.healthy) {
                    tracing::info!(gpu = g.index, uuid = %g.uuid, healthy = g.healthy, "device plugin: GPU advertised {}", if g.healthy { "Healthy" } else { "Unhealthy" });
                }
            }
            let (inventory, replicas) = devices::inventory(ts.as_ref(), &gpus);
            for (name, tx) in &senders {
                let list = inventory.get(name).cloned().unwrap_or_default();
                tx.send_if_modified(|cur| {
                    if cur.as_slice() == list.as_slice() {
                        false
                    } else {
                        *cur = Arc::new(list);
                        true
                    }
                });
            }
            status.update(|s| {
                if s.replicas != replicas {
                    s.replicas = replicas;
                }
            });
        }
        tokio::select! {
            changed = published.changed() => if changed.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// (device, inode) of a file, to notice it being recreated.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The plugin's sockets: its own (and the server instance on it), and the kubelet's.
struct Link {
    socket: PathBuf,
    kubelet: PathBuf,
    /// The server instance now serving, and its socket's identity.
    serving: Option<(watch::Sender<bool>, (u64, u64))>,
    /// The identity of the kubelet socket registered with.
    registered_with: Option<(u64, u64)>,
}

/// Serves one resource and keeps it registered.
struct Registrar {
    resource: String,
    directory: PathBuf,
    devices: watch::Receiver<Arc<Vec<Device>>>,
    fail_gt_one: bool,
    counters: Arc<Counters>,
    status: StatusSink,
    stop: watch::Receiver<bool>,
    published: watch::Receiver<Arc<Published>>,
}

impl Registrar {
    async fn run(mut self) {
        let mut link = Link {
            socket: self.directory.join(socket_name(&self.resource)),
            kubelet: self.directory.join(proto::KUBELET_SOCKET),
            serving: None,
            registered_with: None,
        };
        let mut status = PluginResource {
            resource: self.resource.clone(),
            ..PluginResource::default()
        };
        // Register only once the first poll has said what the GPUs are: registering with an
        // empty list would tell the kubelet the node has none, and pods would fail admission.
        tokio::select! {
            changed = self.devices.changed() => if changed.is_err() { return },
            _ = self.stop.wait_for(|s| *s) => return,
        }
        loop {
            self.keep_registered(&mut link, &mut status).await;
            self.publish(&mut status, link.registered_with.is_some());
            tokio::select! {
                _ = tokio::time::sleep(CHECK) => {}
                _ = self.stop.wait_for(|s| *s) => {
                    if let Some((old, _)) = link.serving.take() {
                        let _ = old.send(true);
                    }
                    let _ = std::fs::remove_file(&link.socket);
                    return;
                }
            }
        }
    }

    /// One look at the sockets: serve again when ours is gone or replaced, register again when
    /// the kubelet's is new (or ours was re-served).
    async fn keep_registered(&self, link: &mut Link, status: &mut PluginResource) {
        let kubelet_id = identity(&link.kubelet);
        let socket_ok = link
            .serving
            .as_ref()
            .is_some_and(|(_, id)| identity(&link.socket) == Some(*id));
        if kubelet_id.is_none() && link.registered_with.is_some() {
            tracing::warn!(resource = %self.resource, "device plugin: the kubelet socket is gone; waiting for it to come back");
            link.registered_with = None;
        }
        let Some(kid) = kubelet_id else { return };
        if link.registered_with == Some(kid) && socket_ok {
            return;
        }
        if !socket_ok {
            if let Some((old, _)) = link.serving.take() {
                let _ = old.send(true);
            }
            match self.serve(&link.socket) {
                Ok(s) => link.serving = Some(s),
                Err(e) => {
                    tracing::error!(resource = %self.resource, socket = %link.socket.display(), "device plugin: cannot serve: {e}");
                    return;
                }
            }
        }
        link.registered_with = None;
        match self.register(&link.kubelet, &link.socket).await {
            Ok(()) => {
                link.registered_with = Some(kid);
                status.registrations_total += 1;
                tracing::info!(resource = %self.resource, endpoint = %link.socket.display(), "device plugin: registered with the kubelet");
            }
            Err(e) => {
                status.registration_failures_total += 1;
                tracing::warn!(resource = %self.resource, "device plugin: registration failed, retrying: {e}");
            }
        }
    }

    /// Copies this resource's state into the published status.
    fn publish(&self, status: &mut PluginResource, registered: bool) {
        status.registered = registered;
        status.allocations_total = self.counters.allocations.load(Ordering::Relaxed);
        status.allocations_rejected_total = self.counters.rejected.load(Ordering::Relaxed);
        {
            let list = self.devices.borrow();
            status.unhealthy_devices =
                list.iter().filter(|d| d.health != proto::HEALTHY).count() as u64;
            status.healthy_devices = list.len() as u64 - status.unhealthy_devices;
        }
        let snapshot = status.clone();
        self.status.update(|s| {
            match s
                .plugin
                .iter_mut()
                .find(|p| p.resource == snapshot.resource)
            {
                Some(p) if *p == snapshot => {}
                Some(p) => *p = snapshot,
                None => s.plugin.push(snapshot),
            }
        });
    }

    /// Binds the socket (replacing a stale file) and serves on it until the returned sender
    /// turns true.
    fn serve(&self, socket: &Path) -> std::io::Result<(watch::Sender<bool>, (u64, u64))> {
        match std::fs::remove_file(socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(socket)?;
        let id = identity(socket).ok_or_else(|| std::io::Error::other("socket vanished"))?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let state = Arc::new(ResourceState {
            name: self.resource.clone(),
            devices: self.devices.clone(),
            fail_requests_greater_than_one: self.fail_gt_one,
            counters: self.counters.clone(),
            stop: stop_rx.clone(),
            published: self.published.clone(),
        });
        let mut shutdown = stop_rx;
        let resource = self.resource.clone();
        tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(PluginService(state))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = shutdown.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = result {
                tracing::error!(resource = %resource, "device plugin: server stopped: {e}");
            }
        });
        Ok((stop_tx, id))
    }

    async fn register(&self, kubelet: &Path, socket: &Path) -> Result<(), String> {
        let endpoint = socket
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let request = proto::RegisterRequest {
            version: proto::VERSION.into(),
            endpoint,
            resource_name: self.resource.clone(),
            options: Some(proto::DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        };
        proto::register(kubelet, request, Duration::from_secs(10)).await
    }
}
