//! Joins one poll's NVML process lists with procfs: caps the exported processes per GPU
//! (largest memory first) and fills in name, user and owner of those that remain.

use std::collections::HashSet;

use super::ProcTable;
use crate::config::ProcessesConfig;
use crate::snapshot::GpuReading;

/// Applies `config` to `reading.processes` in place; returns how many processes the cap left
/// out. Every pid kept is added to `seen` (for `ProcTable::retain` once all GPUs are done).
pub fn attach(
    reading: &mut GpuReading,
    table: &mut ProcTable,
    config: &ProcessesConfig,
    seen: &mut HashSet<u32>,
) -> u64 {
    let Some(list) = reading.processes.as_mut() else {
        reading.process_count = None;
        return 0;
    };
    reading.process_count = Some(list.len() as u32);
    if !config.enabled {
        list.clear();
        return 0;
    }
    let cap = config.max_per_gpu as usize;
    let mut dropped = 0;
    if list.len() > cap {
        // Keep the largest users of memory; ties by pid so the choice is stable across polls.
        list.sort_by(|a, b| {
            b.used_memory_bytes
                .cmp(&a.used_memory_bytes)
                .then(a.pid.cmp(&b.pid))
        });
        dropped = (list.len() - cap) as u64;
        list.truncate(cap);
        list.sort_by_key(|p| p.pid);
    }
    for p in list.iter_mut() {
        p.info = table.lookup(p.pid);
        seen.insert(p.pid);
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{GpuProcess, ProcessKind};

    fn proc(pid: u32, mib: u64) -> GpuProcess {
        GpuProcess {
            pid,
            kind: ProcessKind::Compute,
            used_memory_bytes: Some(mib << 20),
            sm_util_percent: None,
            mem_util_percent: None,
            gpu_instance_id: None,
            compute_instance_id: None,
            info: None,
        }
    }

    #[test]
    fn the_cap_keeps_the_largest_and_counts_the_rest() {
        let mut r = GpuReading {
            processes: Some(vec![proc(1, 10), proc(2, 30), proc(3, 20), proc(4, 5)]),
            ..GpuReading::default()
        };
        let config = ProcessesConfig {
            max_per_gpu: 2,
            ..ProcessesConfig::default()
        };
        let mut table = ProcTable::new("/nonexistent");
        let mut seen = HashSet::new();
        assert_eq!(attach(&mut r, &mut table, &config, &mut seen), 2);
        let pids: Vec<u32> = r.processes.iter().flatten().map(|p| p.pid).collect();
        assert_eq!(pids, vec![2, 3]);
        assert_eq!(r.process_count, Some(4));
        assert_eq!(seen, HashSet::from([2, 3]));
    }

    #[test]
    fn disabled_keeps_only_the_count_and_failure_stays_absent() {
        let mut r = GpuReading {
            processes: Some(vec![proc(1, 10)]),
            ..GpuReading::default()
        };
        let config = ProcessesConfig {
            enabled: false,
            ..ProcessesConfig::default()
        };
        let mut table = ProcTable::new("/nonexistent");
        attach(&mut r, &mut table, &config, &mut HashSet::new());
        assert_eq!(r.process_count, Some(1));
        assert_eq!(r.processes.as_ref().map(Vec::len), Some(0));
        let mut failed = GpuReading::default();
        attach(&mut failed, &mut table, &config, &mut HashSet::new());
        assert_eq!(failed.process_count, None);
    }
}
