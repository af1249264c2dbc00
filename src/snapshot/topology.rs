//! How the node's GPUs are connected to each other, as plain data: for each pair, the best path
//! NVML reports (`nvmlDeviceGetP2PStatus` over NVLink, else `nvmlDeviceGetTopologyCommonAncestor`).
//! Read when the set of GPUs changes (at start, after a GPU comes or goes), not every poll.

use serde::Serialize;

/// The path between two GPUs, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Link {
    /// Peer-to-peer over NVLink (directly or through NVSwitches).
    Nvlink,
    /// Behind the same PCIe switch(es), without crossing the CPU (`nvidia-smi topo` PIX/PXB).
    PcieSwitch,
    /// Through a CPU's PCIe host bridge, or host bridges of one NUMA node (PHB/NODE).
    HostBridge,
    /// Across the CPUs' interconnect (SYS), or unknown.
    System,
}

impl Link {
    pub fn as_str(self) -> &'static str {
        match self {
            Link::Nvlink => "nvlink",
            Link::PcieSwitch => "pcie_switch",
            Link::HostBridge => "host_bridge",
            Link::System => "system",
        }
    }

    /// How good the path is for collectives: NVLink 3, a shared PCIe switch 2, a host bridge 1,
    /// the system interconnect 0.
    pub fn rank(self) -> u32 {
        match self {
            Link::Nvlink => 3,
            Link::PcieSwitch => 2,
            Link::HostBridge => 1,
            Link::System => 0,
        }
    }
}

/// One GPU of the topology.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopologyGpu {
    pub index: u32,
    pub uuid: String,
}

/// One pair of GPUs (by position in [`Topology::gpus`], `a < b`) and their path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pair {
    pub a: u32,
    pub b: u32,
    pub link: Link,
}

/// The GPUs read and the path between each pair (pairs NVML could not answer are left out).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Topology {
    pub gpus: Vec<TopologyGpu>,
    pub pairs: Vec<Pair>,
}

impl Topology {
    /// The path between the GPUs with indices `a` and `b`, if known.
    pub fn link(&self, a: u32, b: u32) -> Option<Link> {
        let (a, b) = (a.min(b), a.max(b));
        self.pairs
            .iter()
            .find(|p| p.a == a && p.b == b)
            .map(|p| p.link)
    }

    /// The index of the GPU a device-plugin id names: its UUID or its index.
    pub fn index_of(&self, id: &str) -> Option<u32> {
        self.gpus
            .iter()
            .find(|g| g.uuid == id || g.index.to_string() == id)
            .map(|g| g.index)
    }

    /// The GPUs `gpu` reaches over NVLink.
    pub fn nvlink_peers(&self, gpu: u32) -> Vec<u32> {
        self.gpus
            .iter()
            .map(|g| g.index)
            .filter(|p| *p != gpu && self.link(gpu, *p) == Some(Link::Nvlink))
            .collect()
    }
}
