//! GPM profiling metrics of the real binary against the simulated NVML: values on an H100,
//! absence (not zero) on a T4, and support asked once per GPU.

mod common;

use std::time::Duration;

use common::{wait_for, Agent};

const SCENARIO: &str = r#"version = 1
[[gpu]]
model = "H100-SXM5-80GB"
gpu_util_percent = 90
gpm = { gr_engine_active = 0.91, sm_active = 0.85, sm_occupancy = 0.4, tensor_active = 0.6, dram_active = 0.5, fp64_active = 0.0, fp32_active = 0.3, fp16_active = 0.5, pcie_tx_bytes_per_s = 1.0e9, pcie_rx_bytes_per_s = 2.0e9 }
[[gpu]]
model = "T4"
gpu_util_percent = 90
"#;

const PAIRS: &[(&str, &str, f64)] = &[
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gpu_steward_graphics_engine_active_ratio",
        0.91,
    ),
    (
        "DCGM_FI_PROF_SM_ACTIVE",
        "gpu_steward_sm_active_ratio",
        0.85,
    ),
    (
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gpu_steward_sm_occupancy_ratio",
        0.4,
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gpu_steward_tensor_pipe_active_ratio",
        0.6,
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gpu_steward_dram_active_ratio",
        0.5,
    ),
    (
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "gpu_steward_fp64_pipe_active_ratio",
        0.0,
    ),
    (
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "gpu_steward_fp32_pipe_active_ratio",
        0.3,
    ),
    (
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "gpu_steward_fp16_pipe_active_ratio",
        0.5,
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gpu_steward_pcie_gpm_transmit_bytes_per_second",
        1.0e9,
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gpu_steward_pcie_gpm_receive_bytes_per_second",
        2.0e9,
    ),
];

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

#[test]
fn gpm_values_on_an_h100_and_absence_on_a_t4() {
    let agent = Agent::with_scenario(SCENARIO).start();
    let m = wait_for("GPM metrics (two samples)", Duration::from_secs(20), || {
        let m = agent.metrics();
        m.value("DCGM_FI_PROF_SM_ACTIVE", &[("gpu", "0")])
            .map(|_| m)
    });
    for (dcgm, native, want) in PAIRS {
        let d = m.get(dcgm, &[("gpu", "0")]);
        assert!(close(d, *want), "{dcgm} = {d}, want {want}");
        let n = m.get(native, &[("gpu", "0")]);
        assert!(close(n, *want), "{native} = {n}, want {want}");
        assert!(m.value(dcgm, &[("gpu", "1")]).is_none(), "{dcgm} on a T4");
        assert!(
            m.value(native, &[("gpu", "1")]).is_none(),
            "{native} on a T4"
        );
    }
    let s = m.find("DCGM_FI_PROF_SM_ACTIVE", &[("gpu", "0")]);
    assert_eq!(s[0].labels["modelName"], "NVIDIA H100 80GB HBM3");
    assert_eq!(
        m.get("gpu_steward_poll_source_success", &[("source", "gpm")]),
        1.0
    );
}

#[test]
fn defaults_follow_utilization_and_support_is_asked_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stats = dir.path().join("stats.json");
    let text =
        "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\ncount = 2\ngpu_util_percent = 40\n";
    let agent = Agent::with_scenario(text)
        .env("NVML_SIM_STATS", &stats.display().to_string())
        .start();
    let m = wait_for("GPM metrics", Duration::from_secs(20), || {
        let m = agent.metrics();
        m.value("gpu_steward_graphics_engine_active_ratio", &[("gpu", "1")])
            .map(|_| m)
    });
    assert!(close(
        m.get("gpu_steward_graphics_engine_active_ratio", &[("gpu", "1")]),
        0.4
    ));
    let counts = wait_for(
        "a few polls of call counts",
        Duration::from_secs(20),
        || {
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&stats).ok()?).ok()?;
            let get = |f: &str| v.get(f).and_then(serde_json::Value::as_u64).unwrap_or(0);
            (get("nvmlGpmSampleGet") >= 10).then(|| {
                (
                    get("nvmlGpmQueryDeviceSupport"),
                    get("nvmlGpmSampleAlloc"),
                    get("nvmlGpmSampleGet"),
                    get("nvmlGpmMetricsGet"),
                )
            })
        },
    );
    let (support, alloc, sample, metrics) = counts;
    assert_eq!(support, 2, "support is asked once per GPU");
    assert_eq!(alloc, 4, "two sample buffers per GPU, kept");
    // Each GPU's first sample has no comparison (2), and the simulator writes its counts from
    // its own thread at any moment, so each GPU may have one more sample whose comparison is
    // still in flight (2 more).
    assert!(
        metrics + 4 >= sample && metrics + 2 <= sample,
        "{metrics} vs {sample}"
    );
}

/// Calls counted by the simulator so far (`NVML_SIM_STATS`, rewritten once a second).
fn counts(stats: &std::path::Path) -> Option<(u64, u64, u64)> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(stats).ok()?).ok()?;
    let get = |f: &str| v.get(f).and_then(serde_json::Value::as_u64).unwrap_or(0);
    Some((
        get("nvmlDeviceGetCount_v2"),
        get("nvmlGpmSampleGet"),
        get("nvmlGpmMetricsGet"),
    ))
}

#[test]
fn gpm_is_computed_once_per_profiling_window_not_per_poll() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stats = dir.path().join("stats.json");
    // One H100 polled every 200 ms with a 1 s window: one sample and one comparison every
    // 5 polls (one nvmlDeviceGetCount_v2 per poll).
    let agent = Agent::with_scenario(SCENARIO)
        .config("[poller]\nprofiling_interval = \"1s\"\n")
        .env("NVML_SIM_STATS", &stats.display().to_string())
        .start();
    let m = wait_for("GPM metrics", Duration::from_secs(20), || {
        let m = agent.metrics();
        m.value("DCGM_FI_PROF_SM_ACTIVE", &[("gpu", "0")])
            .map(|_| m)
    });
    // Between the windows the last window's values are served, equal to the scenario's.
    for (dcgm, native, want) in PAIRS {
        let d = m.get(dcgm, &[("gpu", "0")]);
        assert!(close(d, *want), "{dcgm} = {d}, want {want}");
        let n = m.get(native, &[("gpu", "0")]);
        assert!(close(n, *want), "{native} = {n}, want {want}");
    }
    let start = wait_for("counts", Duration::from_secs(10), || counts(&stats));
    let end = wait_for("40 more polls", Duration::from_secs(30), || {
        counts(&stats).filter(|c| c.0 >= start.0 + 40)
    });
    let polls = end.0 - start.0;
    let (samples, compared) = (end.1 - start.1, end.2 - start.2);
    // Windows of 5 polls; either end of the span may cut a window.
    let windows = polls / 5;
    assert!(
        (windows.saturating_sub(1)..=windows + 1).contains(&compared),
        "{compared} nvmlGpmMetricsGet in {polls} polls, want {windows} ± 1 (one per 1 s window)"
    );
    assert!(
        (windows.saturating_sub(1)..=windows + 1).contains(&samples),
        "{samples} nvmlGpmSampleGet in {polls} polls, want {windows} ± 1"
    );
    // Still served every poll from the last window.
    let m = agent.metrics();
    assert!(close(
        m.get("DCGM_FI_PROF_GR_ENGINE_ACTIVE", &[("gpu", "0")]),
        0.91
    ));
}

#[test]
fn a_gpu_whose_gpm_fails_keeps_its_other_series_and_gets_gpm_back() {
    let agent = Agent::with_scenario(SCENARIO).start();
    wait_for("GPM metrics", Duration::from_secs(20), || {
        agent
            .metrics()
            .value("DCGM_FI_PROF_SM_ACTIVE", &[("gpu", "0")])
    });
    let failing = SCENARIO.replacen(
        "gpu_util_percent = 90\n",
        "gpu_util_percent = 90\nerrors = { nvmlGpmSampleGet = \"UNKNOWN\" }\n",
        1,
    );
    agent.rewrite_scenario(&failing);
    let m = wait_for("GPM absent on GPU 0", Duration::from_secs(20), || {
        let m = agent.metrics();
        m.value("DCGM_FI_PROF_SM_ACTIVE", &[("gpu", "0")])
            .is_none()
            .then_some(m)
    });
    for (dcgm, native, _) in PAIRS {
        assert!(m.value(dcgm, &[("gpu", "0")]).is_none(), "{dcgm}");
        assert!(m.value(native, &[("gpu", "0")]).is_none(), "{native}");
    }
    assert_eq!(m.get("DCGM_FI_DEV_GPU_UTIL", &[("gpu", "0")]), 90.0);
    assert_eq!(m.get("gpu_steward_gpu_up", &[("gpu", "0")]), 1.0);
    assert_eq!(m.get("gpu_steward_poll_failing_sources", &[]), 1.0);
    agent.rewrite_scenario(SCENARIO);
    let m = wait_for("GPM back on GPU 0", Duration::from_secs(20), || {
        let m = agent.metrics();
        m.value("DCGM_FI_PROF_SM_ACTIVE", &[("gpu", "0")])
            .map(|_| m)
    });
    assert!(close(
        m.get("DCGM_FI_PROF_SM_ACTIVE", &[("gpu", "0")]),
        0.85
    ));
    assert_eq!(m.get("gpu_steward_poll_failing_sources", &[]), 0.0);
}
