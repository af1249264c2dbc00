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
//!
//! The sockets are served by tonic and h2 as they are, with h2's limits ([`server::limited`]);
//! the kubelet sends `:authority` `localhost` (docs/sharing.md: since when, who else is refused).

pub mod cdi;
pub mod devices;
pub mod proto;
pub mod server;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tonic::codegen::tokio_stream::wrappers::UnixListenerStream;

use self::devices::{AllocateOptions, GpuState, MigDevice};
use self::proto::Device;
use self::server::{Counters, PluginService, ResourceState};
use super::status::StatusSink;
use crate::config::sharing::{DevicePluginConfig, SharingConfig};
use crate::health::Status;
use crate::publication::Published;
use crate::snapshot::{CdiReport, GpuStatus, NvmlStatus, PluginResource};

/// How often the sockets are looked at.
const CHECK: Duration = Duration::from_secs(1);

/// The socket file name of `resource` (`nvidia.com/gpu.shared` → `gpu-steward-gpu.shared.sock`).
pub fn socket_name(resource: &str) -> String {
    let short = resource.rsplit('/').next().unwrap_or(resource);
    format!("gpu-steward-{short}.sock")
}

/// What every resource's task shares: where to serve, how to allocate, the index names.
#[derive(Clone)]
struct Shared {
    directory: PathBuf,
    allocate: Arc<AllocateOptions>,
    index_names: watch::Receiver<Arc<BTreeMap<String, String>>>,
    status: StatusSink,
    stop: watch::Receiver<bool>,
    /// The latest publication, for the topology GetPreferredAllocation ranks sets by.
    published: watch::Receiver<Arc<Published>>,
}

impl Shared {
    /// Starts serving and registering `resource`; returns the sender of its device list.
    fn start(&self, resource: &str) -> watch::Sender<Arc<Vec<Device>>> {
        let (tx, rx) = watch::channel(Arc::new(Vec::<Device>::new()));
        let task = Registrar {
            resource: resource.to_string(),
            directory: self.directory.clone(),
            devices: rx,
            allocate: self.allocate.clone(),
            index_names: self.index_names.clone(),
            counters: Arc::new(Counters::default()),
            status: self.status.clone(),
            stop: self.stop.clone(),
            published: self.published.clone(),
        };
        tokio::spawn(task.run());
        tx
    }
}

/// Starts the plugin: the inventory task and one serve-and-register task per resource (more
/// join when the MIG layout brings new ones). They end when `stop` turns true. Must run inside
/// a tokio runtime.
pub fn spawn(
    config: &SharingConfig,
    published: watch::Receiver<Arc<Published>>,
    status: StatusSink,
    stop: watch::Receiver<bool>,
) {
    let ts = config.time_slicing.clone();
    let fail_gt_one = ts
        .as_ref()
        .is_some_and(|t| t.fail_requests_greater_than_one);
    let (names_tx, names_rx) = watch::channel(Arc::new(BTreeMap::new()));
    let shared = Shared {
        directory: config.device_plugin.directory.clone(),
        allocate: Arc::new(AllocateOptions::new(&config.device_plugin, fail_gt_one)),
        index_names: names_rx,
        status,
        stop,
        published: published.clone(),
    };
    let senders = devices::resource_names(ts.as_ref())
        .iter()
        .map(|name| (name.clone(), shared.start(name)))
        .collect();
    let task = Inventory {
        ts,
        config: config.device_plugin.clone(),
        senders,
        index_names: names_tx,
        shared,
    };
    tokio::spawn(task.run(published));
}

/// GPUs from a publication: healthy unless failing, lost or gone; `known` remembers every
/// GPU seen (UUID → index, MIG, MIG devices) so that one that disappears is advertised
/// unhealthy with its MIG devices.
fn gpu_states(p: &Published, known: &mut BTreeMap<String, GpuState>) -> Vec<GpuState> {
    let up = p.snapshot.nvml == NvmlStatus::Up;
    let mut out = Vec::new();
    if up {
        for g in p.snapshot.gpus.iter().filter(|g| g.identity.is_some()) {
            let failing = p
                .health
                .gpu(g.index)
                .is_some_and(|h| h.verdict.status == Status::Fail);
            let state = GpuState {
                index: g.index,
                uuid: g.uuid().to_string(),
                mig_enabled: g.reading.mig_mode_current == Some(true),
                healthy: g.status == GpuStatus::Up && !failing,
                present: true,
                mig_devices: mig_devices(g),
            };
            // A lost GPU's MIG layout reads empty: remember the last one it had.
            let keep_mig = state.mig_devices.is_empty()
                && g.status != GpuStatus::Up
                && known
                    .get(&state.uuid)
                    .is_some_and(|k| !k.mig_devices.is_empty());
            if keep_mig {
                let mut s = state;
                s.mig_devices = known[&s.uuid].mig_devices.clone();
                out.push(s);
            } else {
                known.insert(state.uuid.clone(), state.clone());
                out.push(state);
            }
        }
    }
    for (uuid, k) in known.iter() {
        if !out.iter().any(|g| &g.uuid == uuid) {
            out.push(GpuState {
                healthy: false,
                present: false,
                ..k.clone()
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
                index: ci.mig_index,
            })
        })
        .collect()
}

/// Turns each publication into device lists, starts the resources a new MIG profile brings,
/// and checks the CDI spec when the advertised devices change.
struct Inventory {
    ts: Option<crate::sharing::TimeSlicing>,
    config: DevicePluginConfig,
    /// One per registered resource; never removed, so a resource whose devices are gone stays
    /// registered with an empty list (the kubelet then sets its capacity to 0).
    senders: BTreeMap<String, watch::Sender<Arc<Vec<Device>>>>,
    index_names: watch::Sender<Arc<BTreeMap<String, String>>>,
    shared: Shared,
}

impl Inventory {
    async fn run(mut self, mut published: watch::Receiver<Arc<Published>>) {
        let mut known = BTreeMap::new();
        let mut last_health: BTreeMap<String, bool> = BTreeMap::new();
        let mut last_problem: Option<String> = None;
        let mut checked_cdi: Option<BTreeSet<String>> = None;
        let mut first = true;
        let mut stop = self.shared.stop.clone();
        loop {
            let p = published.borrow_and_update().clone();
            // Before the first poll there is nothing to say: an empty list would tell the
            // kubelet the node has no GPUs.
            if p.snapshot.nvml != NvmlStatus::Starting {
                let gpus = gpu_states(&p, &mut known);
                for g in gpus.iter().filter(|g| g.present) {
                    if last_health.insert(g.uuid.clone(), g.healthy) != Some(g.healthy) {
                        tracing::info!(gpu = g.index, uuid = %g.uuid, healthy = g.healthy, "device plugin: GPU advertised {}", if g.healthy { "Healthy" } else { "Unhealthy" });
                    }
                }
                let inv = devices::inventory(self.ts.as_ref(), self.config.mig_strategy, &gpus);
                if inv.problem != last_problem {
                    match &inv.problem {
                        Some(why) => tracing::error!("device plugin: {why}"),
                        None if last_problem.is_some() => tracing::info!(
                            "device plugin: the MIG layout is uniform again; advertising it"
                        ),
                        None => {}
                    }
                    last_problem = inv.problem.clone();
                }
                self.index_names.send_if_modified(|cur| {
                    let changed = **cur != inv.index_names;
                    if changed {
                        *cur = Arc::new(inv.index_names.clone());
                    }
                    changed
                });
                for name in inv.devices.keys() {
                    if !self.senders.contains_key(name) {
                        tracing::info!(resource = %name, "device plugin: new resource from the MIG layout");
                        self.senders.insert(name.clone(), self.shared.start(name));
                    }
                }
                for (name, tx) in &self.senders {
                    let list = inv.devices.get(name).cloned().unwrap_or_default();
                    // The first list is sent even when empty (`single` on a mixed node): it
                    // is what lets the resource register.
                    tx.send_if_modified(|cur| {
                        if cur.as_slice() == list.as_slice() && !first {
                            false
                        } else {
                            *cur = Arc::new(list);
                            true
                        }
                    });
                }
                first = false;
                let cdi = self.check_cdi(&inv, &mut checked_cdi);
                self.shared.status.update(|s| {
                    if s.replicas != inv.replicas {
                        s.replicas = inv.replicas.clone();
                    }
                    if s.plugin_notes.mig_problem != inv.problem {
                        s.plugin_notes.mig_problem = inv.problem.clone();
                    }
                    if let Some(c) = cdi {
                        s.plugin_notes.cdi = Some(c);
                    }
                });
            }
            tokio::select! {
                changed = published.changed() => if changed.is_err() { return },
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// With a CDI list strategy, reads the CDI specs when the set of advertised CDI names
    /// changes (at start, after a MIG change) and reports what they lack; `None` when nothing
    /// was checked this time.
    fn check_cdi(
        &self,
        inv: &devices::Inventory,
        checked: &mut Option<BTreeSet<String>>,
    ) -> Option<CdiReport> {
        if !self.config.uses_cdi() {
            return None;
        }
        let mut wanted = BTreeSet::new();
        for d in inv.devices.values().flatten() {
            let uuid = devices::physical(&d.id);
            match devices::device_name(uuid, self.config.device_id_strategy, &inv.index_names) {
                Ok(n) => wanted.insert(format!("{}={n}", self.config.cdi_kind)),
                Err(_) => wanted.insert(format!("{}=<no index for {uuid}>", self.config.cdi_kind)),
            };
        }
        if checked.as_ref() == Some(&wanted) {
            return None;
        }
        let specs = cdi::load(&self.config.cdi_spec_dirs, &self.config.cdi_kind);
        let report = cdi::report(&self.config.cdi_kind, &specs, &wanted);
        for u in &report.unreadable {
            tracing::warn!(
                "device plugin: cannot read CDI spec {}",
                crate::terminal::escape(u)
            );
        }
        match cdi::problem(&report, &self.config.cdi_spec_dirs) {
            Some(p) => tracing::error!("device plugin: {p}"),
            None => {
                tracing::info!(specs = ?report.spec_files, devices = wanted.len(), "device plugin: every advertised device is in the CDI spec")
            }
        }
        *checked = Some(wanted);
        Some(report)
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
    allocate: Arc<AllocateOptions>,
    index_names: watch::Receiver<Arc<BTreeMap<String, String>>>,
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
            allocate: self.allocate.clone(),
            index_names: self.index_names.clone(),
            counters: self.counters.clone(),
            stop: stop_rx.clone(),
            published: self.published.clone(),
        });
        let mut shutdown = stop_rx;
        let resource = self.resource.clone();
        tokio::spawn(async move {
            let result = server::limited()
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
