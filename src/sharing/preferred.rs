//! The device plugin's `GetPreferredAllocation` for whole GPUs: of the sets of the requested
//! size, the one whose GPUs are best connected (NVLink over a shared PCIe switch over a host
//! bridge over the system interconnect), as NVIDIA's plugin does with its aligned allocation.
//! Pure: the topology comes in as an argument. Replicas of time-sliced GPUs (`<id>::<n>`) and
//! GPUs the topology does not know keep the spreading choice of `plugin::devices::preferred`.

use super::plugin::devices;
use crate::snapshot::Topology;

/// At most this many candidate sets are scored; beyond, the spreading choice is taken (C(16,8)
/// = 12870 fits: a 16-GPU node is scored exhaustively).
const MAX_SETS: usize = 20_000;

/// The preferred `size` devices of `available`, `must_include` among them.
pub fn preferred(
    topology: Option<&Topology>,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let spread = || devices::preferred(available, must_include, size);
    let Some(t) = topology else { return spread() };
    let whole = |id: &String| !id.contains("::") && t.index_of(id).is_some();
    if size < 2 || !available.iter().chain(must_include).all(whole) {
        return spread();
    }
    let mut fixed: Vec<&String> = Vec::new();
    for id in must_include {
        if !fixed.contains(&id) {
            fixed.push(id);
        }
    }
    if fixed.len() >= size {
        return spread();
    }
    let mut rest: Vec<&String> = available.iter().filter(|i| !fixed.contains(i)).collect();
    rest.sort();
    rest.dedup();
    let need = size - fixed.len();
    if need > rest.len() || combinations(rest.len(), need) > MAX_SETS {
        return spread();
    }
    let index = |id: &String| t.index_of(id).unwrap_or(u32::MAX);
    let score = |set: &[&String]| -> u32 {
        let mut s = 0;
        for (i, a) in set.iter().enumerate() {
            for b in &set[i + 1..] {
                s += t.link(index(a), index(b)).map_or(0, |l| l.rank());
            }
        }
        s
    };
    let mut best: Option<(u32, Vec<&String>)> = None;
    let mut pick = Vec::with_capacity(need);
    each_subset(&rest, need, 0, &mut pick, &mut |subset| {
        let set: Vec<&String> = fixed
            .iter()
            .copied()
            .chain(subset.iter().copied())
            .collect();
        let s = score(&set);
        // Sets come in lexicographic order: on a tie the first (lowest ids) stays.
        if best.as_ref().is_none_or(|(b, _)| s > *b) {
            best = Some((s, set));
        }
    });
    best.map_or_else(spread, |(_, set)| set.into_iter().cloned().collect())
}

fn combinations(n: usize, k: usize) -> usize {
    let mut c: usize = 1;
    for i in 0..k {
        c = c.saturating_mul(n - i) / (i + 1);
    }
    c
}

/// Calls `f` with every `k`-subset of `items[from..]` appended to `pick`, in lexicographic order.
fn each_subset<'a>(
    items: &[&'a String],
    k: usize,
    from: usize,
    pick: &mut Vec<&'a String>,
    f: &mut impl FnMut(&[&'a String]),
) {
    if pick.len() == k {
        f(pick);
        return;
    }
    for i in from..items.len() {
        if items.len() - i < k - pick.len() {
            break;
        }
        pick.push(items[i]);
        each_subset(items, k, i + 1, pick, f);
        pick.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{Link, Pair, TopologyGpu};

    /// GPUs 0-7 by uuid `GPU-<i>`, with `link(a, b)` between each pair.
    fn topology(n: u32, link: impl Fn(u32, u32) -> Link) -> Topology {
        let mut t = Topology::default();
        for i in 0..n {
            t.gpus.push(TopologyGpu {
                index: i,
                uuid: format!("GPU-{i}"),
            });
            for j in 0..i {
                t.pairs.push(Pair {
                    a: j,
                    b: i,
                    link: link(j, i),
                });
            }
        }
        t
    }

    fn ids(v: &[u32]) -> Vec<String> {
        v.iter().map(|i| format!("GPU-{i}")).collect()
    }

    /// A PCIe tree of two CPUs with two switches each: {0,1} {2,3} under CPU 0, {4,5} {6,7}
    /// under CPU 1; and an NVLink bridge between 1 and 6 (a mixed tree).
    fn mixed(a: u32, b: u32) -> Link {
        match (a, b) {
            (1, 6) => Link::Nvlink,
            _ if a / 2 == b / 2 => Link::PcieSwitch,
            _ if a / 4 == b / 4 => Link::HostBridge,
            _ => Link::System,
        }
    }

    #[test]
    fn two_gpus_on_a_mixed_tree_take_the_nvlink_pair() {
        let t = topology(8, mixed);
        assert_eq!(
            preferred(Some(&t), &ids(&[0, 1, 2, 3, 4, 5, 6, 7]), &[], 2),
            ids(&[1, 6])
        );
    }

    #[test]
    fn without_nvlink_a_shared_switch_beats_the_host_bridge_and_the_system() {
        let t = topology(8, mixed);
        // 1 and 6 are taken: the best pair left shares a switch.
        assert_eq!(
            preferred(Some(&t), &ids(&[0, 2, 3, 4, 7]), &[], 2),
            ids(&[2, 3])
        );
        // Only GPUs on different switches: the same CPU beats crossing the CPUs.
        assert_eq!(preferred(Some(&t), &ids(&[0, 2, 5]), &[], 2), ids(&[0, 2]));
        // must_include pulls the choice to its neighbours.
        assert_eq!(
            preferred(Some(&t), &ids(&[0, 2, 4, 5, 7]), &ids(&[4]), 2),
            ids(&[4, 5])
        );
    }

    #[test]
    fn four_gpus_stay_under_one_cpu() {
        let t = topology(8, mixed);
        // {0,1,2,3}: two switches of CPU 0 (2 + 2 + 4 × 1); {4,5,7} + one more crosses CPUs.
        assert_eq!(
            preferred(Some(&t), &ids(&[7, 5, 4, 3, 2, 1, 0]), &[], 4),
            ids(&[0, 1, 2, 3])
        );
    }

    #[test]
    fn an_hgx_node_is_all_nvlink_so_the_lowest_ids_win() {
        let t = topology(8, |_, _| Link::Nvlink);
        assert_eq!(
            preferred(Some(&t), &ids(&[7, 3, 5, 1]), &[], 2),
            ids(&[1, 3])
        );
    }

    #[test]
    fn replicas_unknown_gpus_and_no_topology_keep_spreading() {
        let t = topology(2, |_, _| Link::Nvlink);
        let replicas: Vec<String> = ["GPU-0::0", "GPU-0::1", "GPU-1::0"]
            .map(String::from)
            .into();
        assert_eq!(
            preferred(Some(&t), &replicas, &[], 2),
            devices::preferred(&replicas, &[], 2)
        );
        assert_eq!(
            preferred(Some(&t), &replicas, &[], 2),
            ["GPU-0::0", "GPU-1::0"]
        );
        let unknown = ids(&[0, 9]);
        assert_eq!(
            preferred(Some(&t), &unknown, &[], 2),
            devices::preferred(&unknown, &[], 2)
        );
        assert_eq!(preferred(None, &ids(&[0, 1]), &[], 2), ids(&[0, 1]));
    }

    #[test]
    fn device_ids_may_be_indices() {
        let t = topology(8, mixed);
        let by_index: Vec<String> = (0..8).map(|i: u32| i.to_string()).collect();
        assert_eq!(preferred(Some(&t), &by_index, &[], 2), ["1", "6"]);
    }
}
