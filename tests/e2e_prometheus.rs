//! End to end with a real Prometheus: two agents (the faults scenario and the 8×H100 node) on
//! the simulated NVML, scraped every second by `/usr/bin/prometheus` (Debian package
//! `prometheus`) with the shipped alert rules loaded. Every query of every shipped dashboard must
//! return data through `/api/v1/query`, and the alerts the faults scenario implies must fire.

mod e2e_support;

use std::time::Duration;

use e2e_support::{dashboards, has_data, repo, wait_for, Agent, Prometheus};

/// The shipped rules with every `for:` set to 0s, so that the test sees them fire within seconds
/// while the expressions stay exactly those users get.
fn rules_without_for() -> String {
    let text = std::fs::read_to_string(repo().join("alerts/gpu-steward.rules.yml"))
        .expect("read alerts/gpu-steward.rules.yml");
    text.lines()
        .map(|line| {
            let indent = line.len() - line.trim_start().len();
            if line.trim_start().starts_with("for:") {
                format!("{}for: 0s", " ".repeat(indent))
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn scalar(prom: &Prometheus, q: &str) -> Option<f64> {
    let r = prom.query(q).ok()?;
    r.get(0)?["value"][1].as_str()?.parse().ok()
}

#[test]
fn dashboards_and_alerts_work_against_a_real_prometheus() {
    let faults = Agent::start("faults.toml");
    let dgx = Agent::start("dgx-h100.toml");
    let prom = Prometheus::start(&[faults.target(), dgx.target()], &rules_without_for());

    // Enough scrapes of both agents for rate() and increase() over 10 s windows.
    wait_for("8 scrapes of both agents", Duration::from_secs(60), || {
        let n = scalar(
            &prom,
            r#"count(count_over_time(gpu_steward_build_info{job="gpu-steward"}[1m]) >= 8)"#,
        )?;
        (n == 2.0).then_some(())
    });

    let queries = dashboards::queries(&repo().join("dashboards"));
    assert!(
        queries.len() > 20,
        "only {} dashboard queries found",
        queries.len()
    );
    let mut failures = Vec::new();
    for q in &queries {
        match prom.query(&q.expr) {
            Err(e) => failures.push(format!("{}: {e}\n    {}", q.origin, q.expr)),
            Ok(r) if has_data(&r) => {}
            Ok(_) => failures.push(format!("{}: no data\n    {}", q.origin, q.expr)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} dashboard queries failed:\n  {}\nfaults agent log:\n{}",
        failures.len(),
        queries.len(),
        failures.join("\n  "),
        faults.proc.log()
    );
    eprintln!("{} dashboard queries answered", queries.len());

    // Alerts the faults scenario implies: GPU 0 is lost, GPU 1 saw XID 48 and its driver asks
    // for a GPU reset. Nothing may fire for a lost GPU on the healthy node.
    let expected = [
        ("GpuStewardGpuLost", "gpu", "0"),
        ("GpuStewardXidCritical", "xid", "48"),
        ("GpuStewardRecoveryAction", "gpu", "1"),
    ];
    let alerts = wait_for(
        "the faults scenario's alerts to fire",
        Duration::from_secs(30),
        || {
            let alerts = prom.alerts();
            let all_fire = expected.iter().all(|(name, label, value)| {
                alerts.iter().any(|a| {
                    a["labels"]["alertname"] == *name
                        && a["labels"][*label] == *value
                        && a["labels"]["instance"] == faults.target().as_str()
                        && a["state"] == "firing"
                })
            });
            all_fire.then_some(alerts)
        },
    );
    let wrong: Vec<_> = alerts
        .iter()
        .filter(|a| {
            a["labels"]["alertname"] == "GpuStewardGpuLost"
                && a["labels"]["instance"] == dgx.target().as_str()
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "GpuStewardGpuLost fired on the healthy node: {wrong:?}"
    );
    assert!(
        prom.proc.log().lines().all(|l| !l.contains("level=ERROR")),
        "prometheus logged errors:\n{}",
        prom.proc.log()
    );
}
