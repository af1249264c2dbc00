//! The pairwise topology of the node's GPUs: NVLink peer-to-peer status, else the PCIe common
//! ancestor. Asked by the observer when the set of GPUs changes (N×(N-1)/2 pairs, two calls
//! each at most), never on every poll: topology does not move while the GPUs stay.

use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};

use super::{CallLog, Session};
use crate::snapshot::{Link, Pair, Topology, TopologyGpu};

impl Session {
    /// The topology of `gpus` (index, UUID); pairs NVML cannot answer are left out.
    pub fn topology(&self, gpus: &[(u32, String)], log: &mut CallLog) -> Topology {
        let nvml = &self.nvml;
        let mut t = Topology {
            gpus: gpus
                .iter()
                .map(|(index, uuid)| TopologyGpu {
                    index: *index,
                    uuid: uuid.clone(),
                })
                .collect(),
            pairs: Vec::new(),
        };
        for (i, (a, _)) in gpus.iter().enumerate() {
            for (b, _) in &gpus[i + 1..] {
                let handles = || Ok((nvml.device_by_index(*a)?, nvml.device_by_index(*b)?));
                let Some((da, db)) = log.read("nvmlDeviceGetHandleByIndex_v2", handles) else {
                    continue;
                };
                let nvlink = log.read("nvmlDeviceGetP2PStatus", || {
                    da.p2p_status(&db, P2pCapabilitiesIndex::NvLink)
                });
                let link = if nvlink == Some(P2pStatus::Ok) {
                    Some(Link::Nvlink)
                } else {
                    log.read("nvmlDeviceGetTopologyCommonAncestor", || {
                        da.topology_common_ancestor(db)
                    })
                    .map(|level| match level {
                        TopologyLevel::Internal
                        | TopologyLevel::Single
                        | TopologyLevel::Multiple => Link::PcieSwitch,
                        TopologyLevel::HostBridge | TopologyLevel::Node => Link::HostBridge,
                        TopologyLevel::System => Link::System,
                    })
                };
                if let Some(link) = link {
                    t.pairs.push(Pair {
                        a: (*a).min(*b),
                        b: (*a).max(*b),
                        link,
                    });
                }
            }
        }
        t
    }
}
