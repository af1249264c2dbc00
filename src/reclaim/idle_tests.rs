use std::collections::HashMap;
use std::time::Duration;

use super::*;
use crate::reclaim::testkit::{alive, at, gpu, pod, proc, snap};

const CONFIG: IdleConfig = IdleConfig {
    threshold: 0.01,
    min_memory_bytes: 256 * 1024 * 1024,
};

fn observe(t: &mut IdleTracker, s: &Snapshot) -> Vec<UnitStatus> {
    t.observe(s, &alive(s), &CONFIG)
}

fn state(t: &mut IdleTracker, s: &Snapshot) -> UnitState {
    let units = observe(t, s);
    assert_eq!(units.len(), 1, "{units:?}");
    units[0].state.clone()
}

#[test]
fn a_holder_at_zero_percent_is_idle_from_the_first_sight_and_the_clock_runs() {
    let mut t = IdleTracker::default();
    let s = snap(0, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]);
    assert_eq!(state(&mut t, &s), UnitState::Idle { since: at(0) });
    let s = snap(90, vec![gpu(0, Some(1), vec![proc(10, 4096, Some(1))])]);
    let units = observe(&mut t, &s);
    assert_eq!(units[0].state, UnitState::Idle { since: at(0) });
    assert_eq!(units[0].idle_for(at(90)), Duration::from_secs(90));
    assert_eq!(units[0].held_memory_bytes, 4096 * 1024 * 1024);
    assert_eq!(units[0].holders[0].since, at(0));
    assert_eq!(units[0].holders[0].start_time, Some(100));
}

#[test]
fn any_activity_resets_the_clock() {
    let mut t = IdleTracker::default();
    let idle = |time| snap(time, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]);
    state(&mut t, &idle(0));
    // The GPU is busy (2% > 1%): active, and the clock starts again afterwards.
    let busy = snap(10, vec![gpu(0, Some(2), vec![proc(10, 4096, Some(0))])]);
    assert!(matches!(state(&mut t, &busy), UnitState::Active { .. }));
    assert_eq!(state(&mut t, &idle(20)), UnitState::Idle { since: at(20) });
    // One holder's SM busy while the GPU reads 0 (sampling periods differ): active too.
    let sm = snap(30, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(50))])]);
    match state(&mut t, &sm) {
        UnitState::Active { reason } => assert!(reason.contains("process 10"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // A small process (below min_memory) computing is activity on the GPU as well.
    let small = snap(
        40,
        vec![gpu(
            0,
            Some(0),
            vec![proc(10, 4096, Some(0)), proc(11, 10, Some(30))],
        )],
    );
    assert!(matches!(state(&mut t, &small), UnitState::Active { .. }));
    assert_eq!(state(&mut t, &idle(50)), UnitState::Idle { since: at(50) });
}

#[test]
fn the_threshold_is_inclusive() {
    let mut t = IdleTracker::default();
    let s = snap(0, vec![gpu(0, Some(1), vec![proc(10, 4096, Some(1))])]);
    assert_eq!(state(&mut t, &s), UnitState::Idle { since: at(0) });
}

#[test]
fn unknown_utilization_is_not_idleness_and_restarts_the_window() {
    let mut t = IdleTracker::default();
    state(
        &mut t,
        &snap(0, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]),
    );
    // A new holder with no sample yet: unknown.
    let s = snap(
        10,
        vec![gpu(
            0,
            Some(0),
            vec![proc(10, 4096, Some(0)), proc(12, 1024, None)],
        )],
    );
    match state(&mut t, &s) {
        UnitState::Unknown { reason } => assert!(reason.contains("process 12"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // The GPU's utilization unread: unknown.
    let s = snap(20, vec![gpu(0, None, vec![proc(10, 4096, Some(0))])]);
    assert!(matches!(state(&mut t, &s), UnitState::Unknown { .. }));
    let s = snap(30, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]);
    assert_eq!(state(&mut t, &s), UnitState::Idle { since: at(30) });
    // A small process without a sample does not block the verdict: it holds nothing.
    let s = snap(
        40,
        vec![gpu(
            0,
            Some(0),
            vec![proc(10, 4096, Some(0)), proc(13, 1, None)],
        )],
    );
    assert_eq!(state(&mut t, &s), UnitState::Idle { since: at(30) });
}

#[test]
fn small_processes_do_not_hold_and_a_released_gpu_is_left_out() {
    let mut t = IdleTracker::default();
    let s = snap(0, vec![gpu(0, Some(0), vec![proc(10, 255, Some(0))])]);
    assert!(observe(&mut t, &s).is_empty());
    let s = snap(1, vec![gpu(0, Some(0), vec![proc(10, 256, Some(0))])]);
    assert_eq!(state(&mut t, &s), UnitState::Idle { since: at(1) });
    let s = snap(2, vec![gpu(0, Some(0), vec![])]);
    assert!(observe(&mut t, &s).is_empty());
    // Held again: a new episode.
    let s = snap(3, vec![gpu(0, Some(0), vec![proc(10, 256, Some(0))])]);
    assert_eq!(state(&mut t, &s), UnitState::Idle { since: at(3) });
}

#[test]
fn a_reused_pid_is_a_new_holder() {
    let mut t = IdleTracker::default();
    let s = snap(0, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]);
    observe(&mut t, &s);
    let s = snap(60, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]);
    let mut starts = HashMap::new();
    starts.insert(10, 999);
    let units = t.observe(&s, &starts, &CONFIG);
    assert_eq!(units[0].holders[0].since, at(60), "new (pid, start time)");
    assert_eq!(units[0].holders[0].start_time, Some(999));
    // A pid that is gone (or a zombie) still holds what NVML says, with no start time; it
    // remains the same holder.
    let units = t.observe(&s, &HashMap::new(), &CONFIG);
    assert_eq!(units[0].holders[0].start_time, None);
    assert_eq!(units[0].holders[0].since, at(60));
    // Start times read only from now on (reclaim turned on by a reload): the same holder.
    let mut t = IdleTracker::default();
    t.observe(&s, &HashMap::new(), &CONFIG);
    let later = snap(90, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]);
    let units = t.observe(&later, &starts, &CONFIG);
    assert_eq!(units[0].holders[0].since, at(60));
    assert_eq!(units[0].holders[0].start_time, Some(999));
}

#[test]
fn allocated_but_unused_has_its_own_clock() {
    let mut t = IdleTracker::default();
    let mut g = gpu(0, Some(0), vec![]);
    g.reading.pods = vec![pod("team-a", "notebook-0")];
    let s = snap(0, vec![g.clone()]);
    assert_eq!(
        state(&mut t, &s),
        UnitState::AllocatedUnused { since: at(0) }
    );
    let s = snap(50, vec![g.clone()]);
    let units = observe(&mut t, &s);
    assert_eq!(units[0].state, UnitState::AllocatedUnused { since: at(0) });
    assert_eq!(units[0].pods[0].pod, "notebook-0");
    // A process starts: no longer unused (held and idle, a fresh clock).
    g.reading.processes = Some(vec![proc(10, 4096, Some(0))]);
    assert_eq!(
        state(&mut t, &snap(60, vec![g.clone()])),
        UnitState::Idle { since: at(60) }
    );
}

#[test]
fn mig_instances_are_units_of_their_own_and_never_idle() {
    let mut t = IdleTracker::default();
    let mut a = proc(10, 4096, None);
    a.gpu_instance_id = Some(1);
    let mut b = proc(11, 4096, None);
    b.gpu_instance_id = Some(2);
    let mut g = gpu(0, None, vec![a, b]);
    g.reading.mig_mode_current = Some(true);
    let units = observe(&mut t, &snap(0, vec![g]));
    assert_eq!(units.len(), 2);
    assert_eq!(units[0].key.gpu_instance, Some(1));
    assert_eq!(units[1].key.gpu_instance, Some(2));
    assert_eq!(units[1].key.to_string(), "GPU-0/gi2");
    for u in &units {
        assert!(matches!(u.state, UnitState::Unknown { .. }), "{u:?}");
        assert_eq!(u.held_memory_bytes, 4096 * 1024 * 1024);
    }
}

#[test]
fn an_unreadable_gpu_or_process_list_stops_the_clock() {
    let mut t = IdleTracker::default();
    let s = snap(0, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]);
    observe(&mut t, &s);
    let mut g = gpu(0, Some(0), vec![]);
    g.reading.processes = None;
    assert!(observe(&mut t, &snap(10, vec![g])).is_empty());
    let mut g = gpu(0, Some(0), vec![proc(10, 4096, Some(0))]);
    g.status = GpuStatus::Lost;
    assert!(observe(&mut t, &snap(20, vec![g])).is_empty());
    let s = snap(30, vec![gpu(0, Some(0), vec![proc(10, 4096, Some(0))])]);
    assert_eq!(state(&mut t, &s), UnitState::Idle { since: at(30) });
}

#[test]
fn gpus_are_judged_apart() {
    let mut t = IdleTracker::default();
    let s = snap(
        0,
        vec![
            gpu(0, Some(0), vec![proc(10, 4096, Some(0))]),
            gpu(1, Some(90), vec![proc(11, 4096, Some(90))]),
        ],
    );
    let units = observe(&mut t, &s);
    assert_eq!(units.len(), 2);
    assert!(matches!(units[0].state, UnitState::Idle { .. }));
    assert!(matches!(units[1].state, UnitState::Active { .. }));
    assert_eq!(units[1].gpu, 1);
}
