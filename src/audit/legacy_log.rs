//! An audit log as the agent wrote it before records were typed (commit c501906, where every
//! record was a `serde_json::json!` map: keys sorted at every depth, after `ts`, `component`
//! and `event`). One line of every component and event, written out from those writers'
//! shapes; the `//` line above each names the writer (file and function at that commit).
//! Values are invented; shapes are not.
//!
//! Read by the ledger's tests (every line is a known event, written back the same) and by the
//! replays' tests (the rails and the hourly count are rebuilt from it).

/// The log, with a `//` line naming the writer of each record.
pub(crate) const LOG: &str = r#"
// http/api.rs audit_request
{"ts":"2026-11-27T10:00:00.000Z","component":"api","event":"request","auth":"unix socket","method":"POST","path":"/api/v1/mig/apply","peer":"unix socket, uid 0","trigger":"api"}
// mig/apply.rs apply (refused)
{"ts":"2026-11-27T10:00:01.000Z","component":"mig","event":"apply.refused","layout":"all-3g","reason":"processes 4242 run in instances the plan destroys; force to go on","trigger":"cli"}
// mig/apply.rs apply (apply.start; Run::audit adds trigger)
{"ts":"2026-11-27T10:00:02.000Z","component":"mig","event":"apply.start","force":false,"layout":"all-3g","plan":{"gpus":[{"blocking_pids":[],"index":0,"kept":[],"selected":true,"steps":[{"enable":true,"op":"set_mig_mode"},{"compute_instance_id":0,"gpu_instance_id":1,"op":"destroy_compute_instance","profile_id":0,"size":1,"start":0},{"gpu_instance_id":1,"op":"destroy_gpu_instance","profile":"1g.18gb","profile_id":19,"size":1,"start":0},{"gpu_instance_id":2,"op":"create_compute_instance","profile_id":0,"size":1,"start":0},{"ci_profile_id":2,"ci_size":3,"op":"create_instance","profile":"3g.71gb","profile_id":9,"size":4,"start":4}],"uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}]},"trigger":"cli"}
// mig/apply.rs Run::hook
{"ts":"2026-11-27T10:00:03.000Z","component":"mig","event":"hook","argv":["/usr/local/bin/drain-mig"],"duration_ms":12,"exit_code":0,"hook":"pre-apply","outcome":"exit 0","result":"success","stderr":"","stdout":"ok\n","trigger":"cli"}
// mig/apply.rs Run::step
{"ts":"2026-11-27T10:00:04.000Z","component":"mig","event":"step","gpu":0,"layout":"all-3g","result":"success","step":{"enable":true,"op":"set_mig_mode"},"trigger":"cli","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// mig/apply.rs Run::step (a create)
{"ts":"2026-11-27T10:00:05.000Z","component":"mig","event":"step","gpu":0,"layout":"all-3g","result":"NVML_ERROR_INSUFFICIENT_RESOURCES","step":{"ci_profile_id":2,"ci_size":3,"op":"create_instance","profile":"3g.71gb","profile_id":9,"size":4,"start":4},"trigger":"cli","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// mig/apply.rs Run::rollback
{"ts":"2026-11-27T10:00:06.000Z","component":"mig","event":"rollback","gpu":0,"result":"success","trigger":"cli","undo":"disable MIG mode","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// mig/apply.rs Run::execute (mode.pending: json!(&p) + trigger)
{"ts":"2026-11-27T10:00:07.000Z","component":"mig","event":"mode.pending","blocking_pids":[4242],"enable":true,"index":1,"status":"reset_required","trigger":"start","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000001"}
// mig/apply.rs apply (apply.aborted)
{"ts":"2026-11-27T10:00:08.000Z","component":"mig","event":"apply.aborted","layout":"all-3g","reason":"pre-apply hook failed: exit 1","trigger":"api"}
// mig/apply.rs apply (apply.failed)
{"ts":"2026-11-27T10:00:09.000Z","component":"mig","event":"apply.failed","layout":"all-3g","problems":[],"reason":"GPU 0: create 3g.71gb at 4:4","restored":true,"trigger":"sighup"}
// mig/apply.rs apply (apply.done)
{"ts":"2026-11-27T10:00:00.000Z","component":"mig","event":"apply.done","layout":"all-3g","pending":[{"blocking_pids":[4242],"enable":true,"index":1,"status":"reset_required","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000001"}],"steps":5,"trigger":"start"}
// sharing/apply.rs apply (apply.start: plan.steps, Step{gpu,uuid,flatten Change})
{"ts":"2026-11-27T10:00:01.000Z","component":"sharing","event":"apply.start","steps":[{"from":"default","gpu":0,"setting":"compute_mode","to":"exclusive_process","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"},{"from":"default","gpu":1,"setting":"timeslice","to":"long","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000001"}],"trigger":"cli"}
// sharing/apply.rs apply (apply.step: json!(StepResult) + trigger)
{"ts":"2026-11-27T10:00:02.000Z","component":"sharing","event":"apply.step","from":"default","gpu":0,"outcome":"applied","setting":"compute_mode","to":"exclusive_process","trigger":"cli","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// sharing/apply.rs apply (apply.step with error)
{"ts":"2026-11-27T10:00:03.000Z","component":"sharing","event":"apply.step","error":"NVML_ERROR_NOT_SUPPORTED","from":"default","gpu":1,"outcome":"failed","setting":"timeslice","to":"long","trigger":"cli","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000001"}
// sharing/apply.rs apply (apply.end)
{"ts":"2026-11-27T10:00:04.000Z","component":"sharing","event":"apply.end","applied":0,"consistent":true,"error":null,"not_read":0,"ok":false,"result":"failed: 1 change rolled back","rollback_failed":0,"rolled_back":1,"trigger":"cli"}
// sharing/guard.rs act (memory_guard.decision)
{"ts":"2026-11-27T10:00:05.000Z","component":"sharing","event":"memory_guard.decision","gpu":0,"limit_bytes":20000000000,"pid":4242,"process":"python3","signal":"SIGTERM","used_bytes":30000000000,"uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// sharing/guard.rs act (memory_guard.signal)
{"ts":"2026-11-27T10:00:06.000Z","component":"sharing","event":"memory_guard.signal","detail":"","dry_run":false,"gpu":0,"limit_bytes":20000000000,"over_since":"2026-11-27T09:59:00.000Z","pid":4242,"process":"python3","result":"sent","signal":"SIGTERM","used_bytes":30000000000,"uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// reclaim/stage.rs (idle_detected: act::describe + with_trigger)
{"ts":"2026-11-27T10:00:07.000Z","component":"reclaim","event":"idle_detected","dry_run":false,"gpu":0,"gpu_instance":null,"held_memory_bytes":1048576,"idle_since":"2026-11-27T09:00:00.000Z","pods":[{"container":"main","namespace":"ml","pod":"train-0","replica":null}],"processes":[{"memory_bytes":1048576,"name":"python3","pid":4242,"pod_uid":null,"slurm_job":"77","start_time":123456,"systemd_unit":"job.service","user":"alice"}],"step":"report","trigger":"reclaim","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// reclaim/stage.rs (allocated_unused)
{"ts":"2026-11-27T10:00:08.000Z","component":"reclaim","event":"allocated_unused","dry_run":false,"gpu":0,"gpu_instance":null,"held_memory_bytes":1048576,"idle_since":"2026-11-27T09:00:00.000Z","pods":[{"container":"main","namespace":"ml","pod":"train-0","replica":null}],"processes":[],"step":"report","trigger":"reclaim","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// reclaim/stage.rs (idle_cleared)
{"ts":"2026-11-27T10:00:09.000Z","component":"reclaim","event":"idle_cleared","gpu":0,"gpu_instance":null,"reason":"busy again","trigger":"reclaim","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// reclaim/stage.rs (rate_limited)
{"ts":"2026-11-27T10:00:00.000Z","component":"reclaim","event":"rate_limited","gpu":0,"gpu_instance":3,"max_reclaims_per_hour":10,"trigger":"reclaim","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// reclaim/act.rs Actor::warn
{"ts":"2026-11-27T10:00:01.000Z","component":"reclaim","event":"warn","dry_run":false,"gpu":0,"gpu_instance":null,"held_memory_bytes":1048576,"idle_since":"2026-11-27T09:00:00.000Z","pods":[{"container":"main","namespace":"ml","pod":"train-0","replica":null}],"processes":[{"memory_bytes":1048576,"name":"python3","pid":4242,"pod_uid":null,"slurm_job":"77","start_time":123456,"systemd_unit":"job.service","user":"alice"}],"step":"warn","trigger":"reclaim","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// reclaim/act.rs Actor::run_hook (warn.result)
{"ts":"2026-11-27T10:00:02.000Z","component":"reclaim","event":"warn.result","action":"warn","duration_ms":5,"gpu":0,"outcome":"exit 0","result":"success","stderr":"","stdout":"","trigger":"reclaim","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// reclaim/act.rs Actor::reclaim (live)
{"ts":"2026-11-27T10:00:03.000Z","component":"reclaim","event":"reclaim","dry_run":false,"gpu":0,"gpu_instance":null,"held_memory_bytes":1048576,"idle_since":"2026-11-27T09:00:00.000Z","pods":[{"container":"main","namespace":"ml","pod":"train-0","replica":null}],"processes":[{"memory_bytes":1048576,"name":"python3","pid":4242,"pod_uid":null,"slurm_job":"77","start_time":123456,"systemd_unit":"job.service","user":"alice"}],"step":"reclaim","trigger":"reclaim","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// reclaim/act.rs Actor::reclaim (dry run)
{"ts":"2026-11-27T10:00:04.000Z","component":"reclaim","event":"reclaim","dry_run":true,"gpu":0,"gpu_instance":null,"held_memory_bytes":1048576,"idle_since":"2026-11-27T09:00:00.000Z","pods":[{"container":"main","namespace":"ml","pod":"train-0","replica":null}],"processes":[{"memory_bytes":1048576,"name":"python3","pid":4242,"pod_uid":null,"slurm_job":"77","start_time":123456,"systemd_unit":"job.service","user":"alice"}],"step":"reclaim","trigger":"reclaim","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// reclaim/act.rs Actor::reclaim (signal: reclaim.result, PidReport::json)
{"ts":"2026-11-27T10:00:05.000Z","component":"reclaim","event":"reclaim.result","action":"signal","gpu":0,"processes":[{"gone":true,"pid":4242,"sigkill":null,"sigterm":"sent","start_time":123456}],"result":"success","trigger":"reclaim","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// reclaim/act.rs Actor::run_hook (hook.result)
{"ts":"2026-11-27T10:00:06.000Z","component":"reclaim","event":"hook.result","action":"hook","duration_ms":40,"gpu":0,"outcome":"exit 3","result":"failure","stderr":"no\n","stdout":"","trigger":"reclaim","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// remediation/dispatch.rs Handle::submit (webhook.received)
{"ts":"2026-11-27T10:00:07.000Z","component":"remediation","event":"webhook.received","alerts":2,"firing":1,"resolved":1,"source":"alertmanager","trigger":"alertmanager"}
// remediation/dispatch.rs Runner::dispatch (no_route)
{"ts":"2026-11-27T10:00:08.000Z","component":"remediation","event":"decision","alertname":"GpuXidError","decision":"no_route","fingerprint":"abc123","gpu":"0","gpu_key":"GPU-1f6b3c5e-0000-4000-8000-000000000000","gpu_uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000","labels":{"UUID":"GPU-1f6b3c5e-0000-4000-8000-000000000000","alertname":"GpuXidError","gpu":"0","instance":"node1:9400"},"source":"alertmanager","startsAt":"2026-11-27T09:58:00Z","status":"firing","trigger":"alertmanager"}
// remediation/dispatch.rs Runner::dispatch (run)
{"ts":"2026-11-27T10:00:09.000Z","component":"remediation","event":"decision","alertname":"GpuXidError","decision":"run","fingerprint":"abc123","gpu":"0","gpu_key":"GPU-1f6b3c5e-0000-4000-8000-000000000000","gpu_uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000","hooks":["drain","fence"],"labels":{"UUID":"GPU-1f6b3c5e-0000-4000-8000-000000000000","alertname":"GpuXidError","gpu":"0","instance":"node1:9400"},"reason":null,"route":0,"route_id":"xid -> drain","source":"alertmanager","startsAt":"2026-11-27T09:58:00Z","status":"firing","trigger":"alertmanager"}
// remediation/dispatch.rs Runner::dispatch (skip)
{"ts":"2026-11-27T10:00:00.000Z","component":"remediation","event":"decision","alertname":"GpuXidError","decision":"skip","fingerprint":"abc123","gpu":"0","gpu_key":"GPU-1f6b3c5e-0000-4000-8000-000000000000","gpu_uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000","hooks":["drain"],"labels":{"UUID":"GPU-1f6b3c5e-0000-4000-8000-000000000000","alertname":"GpuXidError","gpu":"0","instance":"node1:9400"},"reason":"cooldown","route":0,"route_id":"xid -> drain","source":"alertmanager","startsAt":"2026-11-27T09:58:00Z","status":"firing","trigger":"alertmanager"}
// remediation/dispatch.rs Runner::dispatch (dry_run)
{"ts":"2026-11-27T10:00:01.000Z","component":"remediation","event":"decision","alertname":"GpuXidError","decision":"dry_run","fingerprint":"def456","gpu":"0","gpu_key":"GPU-1f6b3c5e-0000-4000-8000-000000000000","gpu_uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000","hooks":["fence"],"labels":{"UUID":"GPU-1f6b3c5e-0000-4000-8000-000000000000","alertname":"GpuXidError","gpu":"0","instance":"node1:9400"},"reason":null,"route":1,"route_id":"xid -> fence","source":"alertmanager","startsAt":"2026-11-27T09:58:00Z","status":"firing","trigger":"alertmanager"}
// remediation/dispatch.rs Runner::run_steps (hook.dry_run, Step::describe of a hook)
{"ts":"2026-11-27T10:00:02.000Z","component":"remediation","event":"hook.dry_run","alertname":"GpuXidError","argv":["/usr/local/bin/drain","--gpu"],"fingerprint":"abc123","gpu":"0","hook":"drain","route":0,"status":"firing","trigger":"alertmanager"}
// remediation/dispatch.rs Runner::run_steps (hook.start of a hook)
{"ts":"2026-11-27T10:00:03.000Z","component":"remediation","event":"hook.start","alertname":"GpuXidError","argv":["/usr/local/bin/drain","--gpu"],"fingerprint":"abc123","gpu":"0","hook":"drain","route":0,"status":"firing","trigger":"alertmanager"}
// remediation/dispatch.rs Runner::run_steps (hook.end of a hook: run_hook details)
{"ts":"2026-11-27T10:00:04.000Z","component":"remediation","event":"hook.end","alertname":"GpuXidError","duration_ms":31,"fingerprint":"abc123","gpu":"0","hook":"drain","outcome":"exit 0","result":"success","route":0,"status":"firing","stderr":"","stdout":"drained\n","trigger":"alertmanager"}
// remediation/dispatch.rs (hook.start of signal_processes)
{"ts":"2026-11-27T10:00:05.000Z","component":"remediation","event":"hook.start","action":"signal_processes","alertname":"GpuXidError","fingerprint":"abc123","gpu":"0","hook":"kill","route":0,"signal":"SIGTERM","status":"firing","trigger":"alertmanager"}
// remediation/actions.rs signal_processes (hook.end: gpu is the index)
{"ts":"2026-11-27T10:00:06.000Z","component":"remediation","event":"hook.end","alertname":"GpuXidError","duration_ms":2,"fingerprint":"abc123","gpu":0,"hook":"kill","processes":[{"outcome":"sent","pid":4242},{"outcome":"gone","pid":4243}],"result":"success","route":0,"signal":"SIGTERM","status":"firing","trigger":"alertmanager","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// remediation/dispatch.rs (hook.start of power_limit)
{"ts":"2026-11-27T10:00:07.000Z","component":"remediation","event":"hook.start","action":"power_limit","alertname":"GpuXidError","fingerprint":"abc123","gpu":"0","hook":"cap","route":0,"status":"firing","trigger":"alertmanager","watts":300}
// remediation/actions.rs power_limit (hook.end)
{"ts":"2026-11-27T10:00:08.000Z","component":"remediation","event":"hook.end","alertname":"GpuXidError","duration_ms":3,"fingerprint":"abc123","gpu":"0","hook":"cap","power_limit_watts":300.0,"requested_watts":300,"result":"success","route":0,"status":"firing","trigger":"alertmanager","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// remediation/actions.rs power_limit resolved (hook.end: requested_watts null)
{"ts":"2026-11-27T10:00:09.000Z","component":"remediation","event":"hook.end","alertname":"GpuXidError","duration_ms":3,"fingerprint":"abc123","gpu":"0","hook":"cap","power_limit_watts":700.0,"requested_watts":null,"result":"success","route":0,"status":"resolved","trigger":"alertmanager","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// remediation/dispatch.rs (hook.start of fence)
{"ts":"2026-11-27T10:00:00.000Z","component":"remediation","event":"hook.start","action":"fence","alertname":"GpuXidError","fingerprint":"abc123","gpu":"0","hook":"fence","route":0,"status":"firing","trigger":"alertmanager"}
// remediation/actions.rs fence (hook.end)
{"ts":"2026-11-27T10:00:01.000Z","component":"remediation","event":"hook.end","alertname":"GpuXidError","compute_mode":"prohibited","duration_ms":1,"fingerprint":"abc123","gpu":"0","hook":"fence","result":"success","route":0,"status":"firing","trigger":"alertmanager","uuid":"GPU-1f6b3c5e-0000-4000-8000-000000000000"}
// remediation/actions.rs resolved signal_processes (hook.end: skipped)
{"ts":"2026-11-27T10:00:02.000Z","component":"remediation","event":"hook.end","alertname":"GpuXidError","duration_ms":0,"fingerprint":"abc123","gpu":"0","hook":"kill","result":"success","route":0,"skipped":"resolved","status":"resolved","trigger":"alertmanager"}
// remediation/actions.rs no GPU (hook.end: error)
{"ts":"2026-11-27T10:00:03.000Z","component":"remediation","event":"hook.end","alertname":"GpuXidError","duration_ms":0,"error":"the alert names no GPU of this node (labels uuid/UUID or gpu)","fingerprint":"abc123","gpu":null,"hook":"kill","result":"error","route":0,"status":"firing","trigger":"alertmanager"}
// remediation/dispatch.rs run_action without node state (hook.end: no duration)
{"ts":"2026-11-27T10:00:04.000Z","component":"remediation","event":"hook.end","alertname":"GpuXidError","duration_ms":null,"error":"no node state to act on","fingerprint":"abc123","gpu":"0","hook":"fence","result":"error","route":0,"status":"firing","trigger":"alertmanager"}
// slurm/drain.rs Drainer::audit (drain)
{"ts":"2026-11-27T10:00:05.000Z","component":"slurm","event":"drain","node":"node1","reason":"gpu-steward: GPU 0 (GPU-1f6b…) failed: Xid 79","reason_before":"","state_before":"MIXED","trigger":"gpu verdict"}
// slurm/drain.rs Drainer::audit (resume)
{"ts":"2026-11-27T10:00:06.000Z","component":"slurm","event":"resume","node":"node1","reason":null,"reason_before":"gpu-steward: GPU 0 failed","state_before":"IDLE+DRAIN","trigger":"gpu verdict"}
"#;

/// The records of [`LOG`], oldest first.
pub(crate) fn records() -> impl Iterator<Item = &'static str> {
    LOG.lines()
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
}

/// [`LOG`] as a file (the records only), in `dir`.
pub(crate) fn write(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("audit.jsonl");
    let mut text = String::new();
    for r in records() {
        text.push_str(r);
        text.push('\n');
    }
    std::fs::write(&path, text).expect("write the legacy log");
    path
}
