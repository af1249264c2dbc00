//! Per-process series of the real binary: processes the test really starts (`sleep`) are put
//! in the scenario by pid, and the agent finds their name and user in /proc.

mod common;

use std::process::{Child, Command};
use std::time::Duration;

use common::{wait_for, Agent};

/// Children killed on drop.
struct Sleepers(Vec<Child>);

impl Sleepers {
    fn start(n: usize) -> Sleepers {
        Sleepers(
            (0..n)
                .map(|_| {
                    Command::new("sleep")
                        .arg("300")
                        .spawn()
                        .expect("spawn sleep")
                })
                .collect(),
        )
    }
    fn pid(&self, i: usize) -> u32 {
        self.0[i].id()
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn me() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map_or_else(|| nix::unistd::getuid().to_string(), |u| u.name)
}

fn scenario(s: &Sleepers) -> String {
    format!(
        "version = 1\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\ngpu_util_percent = 80\nmemory_used_mib = 30000\n\
         [[gpu.process]]\npid = {}\nused_memory_mib = 20000\nsm_util_percent = 70\nmem_util_percent = 20\n\
         [[gpu.process]]\npid = {}\nkind = \"graphics\"\nused_memory_mib = 10000\nsm_util_percent = 5\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\n",
        s.pid(0),
        s.pid(1)
    )
}

#[test]
fn real_processes_appear_with_their_name_and_user() {
    let sleepers = Sleepers::start(2);
    let agent = Agent::with_scenario(&scenario(&sleepers)).start();
    let pid0 = sleepers.pid(0).to_string();
    let m = wait_for("process utilization", Duration::from_secs(20), || {
        let m = agent.metrics();
        m.value(
            "gpu_steward_process_sm_utilization_ratio",
            &[("pid", &pid0)],
        )
        .map(|_| m)
    });
    let user = me();
    let mem = m.find("gpu_steward_process_memory_used_bytes", &[("gpu", "0")]);
    assert_eq!(mem.len(), 2);
    for s in &mem {
        assert_eq!(s.labels["process"], "sleep", "{:?}", s.labels);
        assert_eq!(s.labels["user"], user);
        assert!(s.labels["uuid"].starts_with("GPU-"));
    }
    let l = [("pid", pid0.as_str())];
    assert_eq!(
        m.get("gpu_steward_process_memory_used_bytes", &l),
        20000.0 * 1024.0 * 1024.0
    );
    assert_eq!(
        m.find("gpu_steward_process_memory_used_bytes", &l)[0].labels["type"],
        "C"
    );
    assert!((m.get("gpu_steward_process_sm_utilization_ratio", &l) - 0.7).abs() < 1e-9);
    assert!((m.get("gpu_steward_process_memory_utilization_ratio", &l) - 0.2).abs() < 1e-9);
    let pid1 = sleepers.pid(1).to_string();
    let g = m.find("gpu_steward_process_memory_used_bytes", &[("pid", &pid1)]);
    assert_eq!(g[0].labels["type"], "G");
    assert_eq!(m.get("gpu_steward_gpu_processes", &[("gpu", "0")]), 2.0);
    assert_eq!(
        m.get("gpu_steward_gpu_processes", &[("gpu", "1")]),
        0.0,
        "idle GPU: 0"
    );
    assert_eq!(
        m.get("gpu_steward_processes_dropped_total", &[("gpu", "0")]),
        0.0
    );
}

#[test]
fn the_cap_keeps_the_largest_process_and_counts_the_rest() {
    let sleepers = Sleepers::start(2);
    let agent = Agent::with_scenario(&scenario(&sleepers))
        .config("[processes]\nmax_per_gpu = 1\n")
        .start();
    let m = wait_for("dropped processes", Duration::from_secs(20), || {
        let m = agent.metrics();
        (m.value("gpu_steward_processes_dropped_total", &[("gpu", "0")]) >= Some(2.0)).then_some(m)
    });
    let mem = m.find("gpu_steward_process_memory_used_bytes", &[("gpu", "0")]);
    assert_eq!(mem.len(), 1);
    assert_eq!(mem[0].labels["pid"], sleepers.pid(0).to_string());
    assert_eq!(m.get("gpu_steward_gpu_processes", &[("gpu", "0")]), 2.0);
}

#[test]
fn a_process_outside_our_procfs_is_exported_without_a_name() {
    let sleepers = Sleepers::start(2);
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = Agent::with_scenario(&scenario(&sleepers))
        .config(&format!(
            "[processes]\nprocfs = \"{}\"\n",
            dir.path().display()
        ))
        .start();
    let m = agent.metrics();
    let mem = m.find("gpu_steward_process_memory_used_bytes", &[("gpu", "0")]);
    assert_eq!(mem.len(), 2);
    assert_eq!(mem[0].labels["process"], "");
}

#[test]
fn a_process_that_goes_idle_reads_zero_not_its_last_busy_value() {
    let sleepers = Sleepers::start(2);
    let busy = scenario(&sleepers);
    let agent = Agent::with_scenario(&busy).start();
    let pid = sleepers.pid(0).to_string();
    let sm = |m: &common::Metrics| {
        m.value(
            "gpu_steward_process_sm_utilization_ratio",
            &[("gpu", "0"), ("pid", pid.as_str())],
        )
    };
    wait_for("the busy value", Duration::from_secs(5), || {
        (sm(&agent.metrics()) == Some(0.7)).then_some(())
    });
    // The process keeps running but stops using the GPU: NVML stops producing samples for it.
    agent.rewrite_scenario(&busy.replacen(
        "sm_util_percent = 70\nmem_util_percent = 20",
        "sm_util_percent = 0\nmem_util_percent = 0",
        1,
    ));
    // Samples stay current for 10 s after the last one; then the value must drop to 0 (present,
    // not absent: the utilization call answers, it just has nothing for this process).
    let m = wait_for("the idle value", Duration::from_secs(20), || {
        let m = agent.metrics();
        (sm(&m) == Some(0.0)).then_some(m)
    });
    assert_eq!(
        m.value(
            "gpu_steward_process_memory_utilization_ratio",
            &[("gpu", "0"), ("pid", pid.as_str())]
        ),
        Some(0.0)
    );
}
