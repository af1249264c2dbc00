//! The enrich stage: turns an observation into a snapshot by adding what NVML does not say.
//!
//! - XIDs, counted per board (UUID) so that counts follow the board across re-enumeration;
//! - process names, users and owners from procfs, with the per-GPU cap and its dropped count;
//! - the kubelet's pods of each GPU (read from the client's latest mapping, never called here).

use std::collections::{BTreeSet, HashSet};

use super::boards::Boards;
use super::observe::Observation;
use super::PollerConfig;
use crate::attribution::{self, ProcTable};
use crate::gpu::XidEvent;
use crate::kubernetes::KubeletFeed;
use crate::snapshot::{GpuSnapshot, Snapshot};

pub(super) struct Enricher {
    /// Process names and owners, cached by (pid, start time) across polls.
    procs: ProcTable,
    boards: Boards,
}

impl Enricher {
    pub fn new(config: &PollerConfig) -> Self {
        Enricher {
            procs: ProcTable::new(config.processes.procfs.clone())
                .trusting_slurm_job_env(config.processes.trust_slurm_job_env),
            boards: Boards::default(),
        }
    }

    /// Follows a reload: a new procfs root, or a change of what is believed of environments,
    /// starts an empty cache.
    pub fn reconfigure(&mut self, config: &PollerConfig) {
        let p = &config.processes;
        if p.procfs != self.procs.root()
            || p.trust_slurm_job_env != self.procs.trusts_slurm_job_env()
        {
            self.procs =
                ProcTable::new(p.procfs.clone()).trusting_slurm_job_env(p.trust_slurm_job_env);
        }
    }

    pub fn enrich(&mut self, obs: Observation, config: &PollerConfig, polls: u64) -> Snapshot {
        self.count_xids(obs.xids);
        let kubelet = config.kubelet.as_ref().map(KubeletFeed::latest);
        let mut seen = HashSet::new();
        let mut gpus = Vec::with_capacity(obs.gpus.len());
        for (index, o) in obs.gpus {
            let mut g = GpuSnapshot {
                index,
                identity: o.identity,
                status: o.status,
                reading: o.reading,
                failed_calls: o.failed_calls,
                failing_runs: o.failing_runs,
                xids: Default::default(),
                last_xid: None,
            };
            let dropped = attribution::attach(
                &mut g.reading,
                &mut self.procs,
                &config.processes,
                &mut seen,
            );
            // Keyed by UUID: a GPU without identity has no readable processes nor XIDs.
            if let Some(id) = &g.identity {
                let board = self.boards.board(&id.uuid);
                board.processes_dropped += dropped;
                g.reading.processes_dropped_total = board.processes_dropped;
                g.xids = board.xids.clone();
                g.last_xid = board.last_xid;
            }
            if let Some(k) = &kubelet {
                g.reading.pods = k.mapping.get(g.uuid()).cloned().unwrap_or_default();
                g.reading.mig_pods = mig_pods(&g.reading, &k.mapping);
            }
            gpus.push(g);
        }
        self.procs.retain(&seen);
        if obs.nvml == crate::snapshot::NvmlStatus::Up {
            let present: BTreeSet<&str> = gpus
                .iter()
                .filter_map(|g| g.identity.as_ref())
                .map(|i| i.uuid.as_str())
                .collect();
            self.boards.end_poll(&present);
        }
        Snapshot {
            taken_at: obs.taken_at,
            nvml: obs.nvml,
            driver: obs.driver,
            gpus,
            gpu_count: obs.gpu_count,
            sources: obs.sources,
            poll_duration: obs.duration,
            nvml_errors: obs.nvml_errors,
            nvml_init_errors: obs.nvml_init_errors,
            nvml_calls: obs.nvml_calls,
            polls,
            kubernetes: kubelet,
            sharing: config.sharing.as_ref().map(crate::snapshot::Feed::latest),
            topology: obs.topology,
        }
    }

    /// Counts each XID into the board whose UUID it carries (not an index: a queued event may
    /// predate a re-enumeration or a new session).
    fn count_xids(&mut self, events: Vec<XidEvent>) {
        for event in events {
            match event {
                XidEvent::Xid {
                    uuid: Some(uuid),
                    index,
                    xid,
                    at,
                } => {
                    tracing::warn!(gpu = index, %uuid, xid, "XID event");
                    self.boards.record_xid(&uuid, xid, at);
                }
                XidEvent::Xid {
                    uuid: None, xid, ..
                } => {
                    tracing::warn!(
                        xid,
                        "XID event from a GPU that cannot be identified; not counted"
                    );
                }
                XidEvent::Error { .. } => {}
            }
        }
    }
}

/// The containers allocated each MIG device of a GPU (kubelet ids are `MIG-…` UUIDs).
fn mig_pods(
    r: &crate::snapshot::GpuReading,
    mapping: &crate::snapshot::PodMapping,
) -> Vec<crate::snapshot::mig::MigPod> {
    let mut out = Vec::new();
    for gi in r.mig_instances.iter().flatten() {
        for ci in &gi.compute_instances {
            let Some(uuid) = &ci.uuid else { continue };
            for pod in mapping.get(uuid).into_iter().flatten() {
                out.push(crate::snapshot::mig::MigPod {
                    gpu_instance_id: gi.gpu_instance_id,
                    compute_instance_id: ci.compute_instance_id,
                    mig_uuid: uuid.clone(),
                    pod: pod.clone(),
                });
            }
        }
    }
    out
}
