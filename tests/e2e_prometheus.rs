//! End to end with a real Prometheus: four agents (the faults scenario, the 8×H100 node, the
//! 8×H100 HGX NVLink node, and an A100 MIG node with every operation on: reclaim, accounting,
//! node rules with a failing remediation hook, time-slicing and the device plugin) on the
//! simulated NVML, scraped every second by `/usr/bin/prometheus` (Debian package `prometheus`)
//! with the shipped alert rules loaded. Every query of every shipped dashboard must
//! return data through `/api/v1/query` (for `X or vector(0)`, X itself must), the alerts the
//! faults scenario implies must fire, and no alert may fire or be pending for the healthy node.
//! And every panel of the node, fleet and NVLink dashboards, and the MIG memory panel, must show
//! the value the scenario implies, on every name set (`truth_*` below).

mod common;
mod e2e_support;

use std::time::{Duration, Instant};

use e2e_support::truth::{alerts_of, check_table, firing};
use e2e_support::{dashboards, expected, has_data, repo, wait_for, Agent, Prometheus};

/// The shipped rules (the main file, with the NVLink and operations files' groups appended)
/// with every `for:` set to 0s, so that the test sees them fire within seconds while the
/// expressions stay exactly those users get.
fn rules_without_for() -> String {
    let read = |f: &str| {
        std::fs::read_to_string(repo().join(f)).unwrap_or_else(|e| panic!("read {f}: {e}"))
    };
    // One file: the other files' groups appended under the main file's `groups:`.
    let groups = |f: &str| -> String {
        read(f)
            .lines()
            .skip_while(|l| !l.starts_with("groups:"))
            .skip(1)
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let text = format!(
        "{}\n{}{}",
        read("alerts/gpu-steward.rules.yml"),
        groups("alerts/gpu-steward-nvlink.rules.yml"),
        groups("alerts/gpu-steward-operations.rules.yml")
    );
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

/// Left-hand sides of `X or vector(0)` dashboard queries that are empty on both test nodes by
/// design, each with the reason (as `substitute`d). Keep this list empty where a scenario can
/// exercise the panel instead. Empty today: the faults node has a lost GPU and failing health,
/// the 8×H100 node busy, idle and held-but-idle GPUs, so all six fleet-dashboard counts have data.
const EMPTY_LHS_ALLOWED: &[(&str, &str)] = &[];

fn scalar(prom: &Prometheus, q: &str) -> Option<f64> {
    let r = prom.query(q).ok()?;
    r.get(0)?["value"][1].as_str()?.parse().ok()
}

/// The A100 MIG node with every operation on, so that the operations dashboard's panels have
/// data: reclaim (dry run) and accounting, a node rule that always fires routed to a hook that
/// always fails, time-slicing with the device plugin (no kubelet: registration fails, counted).
/// The node rule holds 10 s first, so that the hook fails after Prometheus's first scrapes:
/// the failures are an increase, as on a node where a hook starts failing.
fn ops_config(dir: &std::path::Path) -> String {
    std::fs::write(
        dir.join("rules.yml"),
        "groups:\n- name: ops\n  rules:\n  - alert: OpsGpuUp\n    expr: gpu_steward_gpu_up == 1\n    for: 10s\n",
    )
    .expect("write the node rules");
    std::fs::create_dir_all(dir.join("device-plugins")).expect("mkdir");
    format!(
        "[audit]\nfile = \"{d}/audit.jsonl\"\n\
         [rules]\nfiles = [\"{d}/rules.yml\"]\n\
         [[remediation.hooks]]\nname = \"page\"\ncommand = [\"/bin/false\"]\n\
         [[remediation.routes]]\nmatchers = ['alertname=\"OpsGpuUp\"']\nhooks = [\"page\"]\ncooldown = \"1s\"\n\
         [reclaim]\nenabled = true\ndry_run = true\nidle_after = \"1s\"\nmin_memory_mib = 1\n\
         [accounting]\nenabled = true\n\
         [sharing.device_plugin]\nenabled = true\ndirectory = \"{d}/device-plugins\"\n\
         [sharing.time_slicing]\n[[sharing.time_slicing.resources]]\nname = \"nvidia.com/gpu\"\nreplicas = 4\n",
        d = dir.display()
    )
}

/// The default page (lean profile, dcgm-exporter 4.8 names).
#[test]
fn dashboards_and_alerts_work_against_a_real_prometheus() {
    dashboards_and_alerts_work_with("[metrics]\nprofile = \"lean\"\n");
}

/// The lean page with dcgm-exporter 4.9's names and units.
#[test]
fn dashboards_and_alerts_work_with_the_4_9_names() {
    dashboards_and_alerts_work_with("[metrics]\nprofile = \"lean\"\ndcgm_names = \"4.9\"\n");
}

/// The full page, where the native family carries every value too.
#[test]
fn dashboards_and_alerts_work_on_the_full_page() {
    dashboards_and_alerts_work_with("[metrics]\nprofile = \"full\"\ndcgm_names = \"both\"\n");
}

fn dashboards_and_alerts_work_with(config: &str) {
    let faults = Agent::start_with_config("faults.toml", config);
    let dgx = Agent::start_with_config("dgx-h100.toml", config);
    let hgx = Agent::start_with_config("hgx-h100.toml", config);
    let ops_dir = tempfile::tempdir().expect("tempdir");
    let ops = Agent::start_with_config(
        "a100-mig.toml",
        &format!("{config}{}", ops_config(ops_dir.path())),
    );
    // A GPU that degrades while it answers (issue [23/28]): a link trained to x8 and a
    // correctable ECC storm, for the node dashboard's "Degrading while it answers" panel.
    let degrading = Agent::start_on(
        "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\npcie = { width = 8 }\n\
         ecc = { correctable_per_s = 100 }\n",
        config,
    );
    let prom = Prometheus::start(
        &[
            faults.target(),
            dgx.target(),
            hgx.target(),
            ops.target(),
            degrading.target(),
        ],
        &rules_without_for(),
    );

    // Enough scrapes of every agent for rate() and increase() over 10 s windows.
    wait_for("8 scrapes of every agent", Duration::from_secs(60), || {
        let n = scalar(
            &prom,
            r#"count(count_over_time(gpu_steward_build_info{job="gpu-steward"}[1m]) >= 8)"#,
        )?;
        (n == 5.0).then_some(())
    });

    let queries = dashboards::queries(&repo().join("dashboards"));
    assert!(
        queries.len() > 20,
        "only {} dashboard queries found",
        queries.len()
    );
    let mut failures = Vec::new();
    let mut fallbacks = 0;
    for q in &queries {
        match prom.query(&q.expr) {
            Err(e) => failures.push(format!("{}: {e}\n    {}", q.origin, q.expr)),
            Ok(r) if has_data(&r) => {}
            Ok(_) => failures.push(format!("{}: no data\n    {}", q.origin, q.expr)),
        }
        // `X or vector(0)` answers even when X names no series at all: check X.
        let Some(lhs) = dashboards::without_vector0_fallback(&q.expr) else {
            continue;
        };
        fallbacks += 1;
        if EMPTY_LHS_ALLOWED
            .iter()
            .any(|(allowed, _why)| *allowed == lhs)
        {
            continue;
        }
        match prom.query(lhs) {
            Err(e) => failures.push(format!(
                "{} (without 'or vector(0)'): {e}\n    {lhs}",
                q.origin
            )),
            Ok(r) if has_data(&r) => {}
            Ok(_) => failures.push(format!(
                "{}: no data without 'or vector(0)' (exercise it in a scenario or list it in \
                 EMPTY_LHS_ALLOWED with the reason)\n    {lhs}",
                q.origin
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} dashboard queries failed:\n  {}\nfaults agent log:\n{}\nops agent log:\n{}",
        failures.len(),
        queries.len(),
        failures.join("\n  "),
        faults.log(),
        ops.log()
    );
    eprintln!(
        "{} dashboard queries answered, {fallbacks} of them also without 'or vector(0)'",
        queries.len()
    );

    // Alerts the faults scenario implies: GPU 0 is lost, GPU 1 saw XID 48 and its driver asks
    // for a GPU reset. Nothing may fire for the healthy node.
    let expected = [
        ("GpuStewardGpuLost", "gpu", "0", faults.target()),
        ("GpuStewardXidCritical", "xid", "48", faults.target()),
        ("GpuStewardRecoveryAction", "gpu", "1", faults.target()),
        // The operations rules: the ops node's hook fails at every run.
        ("GpuStewardHookFailing", "hook", "page", ops.target()),
        // The degrading node's GPU 0: a link narrower than its maximum warns at once.
        ("GpuStewardPcieLinkDegraded", "gpu", "0", degrading.target()),
    ];
    let alerts = wait_for(
        "the faults scenario's alerts to fire",
        Duration::from_secs(30),
        || {
            let alerts = prom.alerts();
            let all_fire = expected.iter().all(|(name, label, value, target)| {
                alerts.iter().any(|a| {
                    a["labels"]["alertname"] == *name
                        && a["labels"][*label] == *value
                        && a["labels"]["instance"] == target.as_str()
                        && a["state"] == "firing"
                })
            });
            all_fire.then_some(alerts)
        },
    );
    // The healthy 8×H100 nodes (with and without NVLink): no alert at all, pending or firing. Every `for:` is 0s here, so a
    // false positive (e.g. on the critical-XID series the agent creates at 0 when it starts)
    // shows as soon as the rules have data, which the faults alerts above prove they have.
    let wrong: Vec<String> = alerts
        .iter()
        .filter(|a| {
            a["labels"]["instance"] == dgx.target().as_str()
                || a["labels"]["instance"] == hgx.target().as_str()
        })
        .map(|a| {
            format!(
                "{} ({}): {}",
                a["labels"]["alertname"], a["state"], a["labels"]
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} alerts are active for the healthy node:\n  {}",
        wrong.len(),
        wrong.join("\n  ")
    );
    assert!(
        prom.proc.log().lines().all(|l| !l.contains("level=ERROR")),
        "prometheus logged errors:\n{}",
        prom.proc.log()
    );
}

#[test]
fn the_vector0_fallback_is_stripped_only_at_the_end() {
    use dashboards::without_vector0_fallback as lhs;
    assert_eq!(lhs("count(up == 0) or vector(0)"), Some("count(up == 0)"));
    assert_eq!(
        lhs("count(up == 0) or on() vector(0)"),
        Some("count(up == 0)")
    );
    assert_eq!(lhs("count(x)or on ( ) vector( 0 ) "), Some("count(x)"));
    assert_eq!(lhs("sum(x or vector(0))"), None);
    assert_eq!(lhs("count(x) or vector(1)"), None);
    assert_eq!(lhs("color vector(0)"), None);
    assert_eq!(lhs("up"), None);
}

/// One agent of the value test, polling every 500 ms.
fn agent(scenario: &str, config: &str) -> common::Agent {
    common::Agent::with_scenario(scenario)
        .interval("500ms")
        .config(config)
        .start()
}

/// The three name sets on the default (lean) profile. The harness turns a config without a
/// profile into the full one, so lean is named.
const NAME_SETS: [(&str, &str); 3] = [
    ("4.8", "[metrics]\nprofile = \"lean\"\n"),
    (
        "4.9",
        "[metrics]\nprofile = \"lean\"\ndcgm_names = \"4.9\"\n",
    ),
    (
        "both",
        "[metrics]\nprofile = \"lean\"\ndcgm_names = \"both\"\n",
    ),
];

/// Every panel shows what the scenario says, on each name set: utilization, memory, power,
/// clocks, PCIe, health and states of a node with a busy, an idle-but-held and a lost GPU; XIDs
/// that arrive after start counted from their first occurrence; NVLink at a known rate; a MIG
/// instance's memory. And the shipped alerts fire exactly as the scenarios imply.
#[test]
fn truth_every_panel_reads_what_the_scenario_says_on_every_name_set() {
    let mig_text = std::fs::read_to_string(repo().join("tests/scenarios/a100-mig.toml"))
        .expect("the MIG scenario");
    let truth_agents: Vec<_> = NAME_SETS
        .iter()
        .map(|(n, c)| (*n, agent(&expected::truth_scenario(&[]), c)))
        .collect();
    let nvlink_agents: Vec<_> = NAME_SETS
        .iter()
        .map(|(n, c)| (*n, agent(&expected::nvlink_scenario(), c)))
        .collect();
    let mig_agents: Vec<_> = NAME_SETS
        .iter()
        .map(|(n, c)| (*n, agent(&mig_text, c)))
        .collect();
    let target = |a: &common::Agent| format!("127.0.0.1:{}", a.port);
    let all: Vec<String> = truth_agents
        .iter()
        .chain(&nvlink_agents)
        .chain(&mig_agents)
        .map(|(_, a)| target(a))
        .collect();
    let prom = Prometheus::start(&all, &rules_without_for());
    // 12 scrapes of every agent: two GPM samples and full 10 s windows for rate().
    wait_for("12 scrapes of every agent", Duration::from_secs(90), || {
        let n = scalar(
            &prom,
            r#"count(count_over_time(gpu_steward_build_info{job="gpu-steward"}[1m]) >= 12)"#,
        )?;
        (n == all.len() as f64).then_some(())
    });
    // A scalar answer is [time, "value"].
    let now = || -> f64 {
        let r = prom.query("time()").expect("prometheus answers time()");
        r[1].as_str()
            .and_then(|v| v.parse().ok())
            .expect("time() is a number")
    };
    let queries = dashboards::queries(&repo().join("dashboards"));
    let mut failures = Vec::new();
    let t1 = now();
    let node_dashboards = ["gpu-steward-fleet.json", "gpu-steward-node.json"];
    for (name, a) in &truth_agents {
        let table = expected::truth_node(false, (0.0, 0.0));
        let who = (*name, target(a));
        let who = (who.0, who.1.as_str());
        check_table(
            &prom,
            &queries,
            &table,
            who,
            t1,
            &node_dashboards,
            &mut failures,
        );
    }
    for (name, a) in &nvlink_agents {
        let (table, t) = (expected::nvlink_pair(), target(a));
        let dash = ["gpu-steward-nvlink.json"];
        check_table(
            &prom,
            &queries,
            &table,
            (name, &t),
            t1,
            &dash,
            &mut failures,
        );
    }
    for (name, a) in &mig_agents {
        let (table, t) = (expected::mig_node(&mig_text), target(a));
        check_table(&prom, &queries, &table, (name, &t), t1, &[], &mut failures);
    }

    // XIDs 13 and 48 arrive on GPU 0 after start; each panel must count them from 1 at the
    // first moment Prometheus has them.
    let rewritten = now();
    for (_, a) in &truth_agents {
        a.rewrite_scenario(&expected::truth_scenario(&expected::LATE_XIDS));
    }
    for (name, a) in &truth_agents {
        let t = target(a);
        let q = format!("gpu_steward_xid_errors_total{{instance=\"{t}\"}}[1m]");
        let born = wait_for(
            "the late XIDs in Prometheus",
            Duration::from_secs(30),
            || {
                let m = prom.query(&q).ok()?;
                let firsts: Vec<f64> = m
                    .as_array()?
                    .iter()
                    .filter_map(|s| s["values"][0][0].as_f64())
                    .collect();
                (firsts.len() == 2).then(|| firsts.iter().copied().fold(0.0, f64::max))
            },
        );
        let at = born + 0.5;
        wait_for("Prometheus past the XIDs", Duration::from_secs(10), || {
            (now() > at + 1.0).then_some(())
        });
        let xid_only: expected::Table =
            expected::truth_node(true, ((rewritten - 1.0) * 1e3, at * 1e3))
                .into_iter()
                .filter(|(origin, _)| origin.contains("XID"))
                .collect();
        check_table(
            &prom,
            &queries,
            &xid_only,
            (name, &t),
            at,
            &[],
            &mut failures,
        );
    }

    // The shipped alerts, exactly as the scenarios imply (every `for:` is 0s here).
    let truth_alerts = alerts_of(&[
        ("GpuStewardGpuLost", "2", ""),
        ("GpuStewardGpuHealthFail", "2", ""),
        ("GpuStewardXidCritical", "0", "48"),
        ("GpuStewardGpuHealthFail", "0", ""),
    ]);
    let nvlink_alerts = alerts_of(&[
        ("GpuStewardNvlinkDown", "1", ""),
        ("GpuStewardGpuHealthFail", "1", ""),
    ]);
    let groups = [
        (&truth_agents, &truth_alerts),
        (&nvlink_agents, &nvlink_alerts),
        (&mig_agents, &Vec::new()),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    for (agents, want) in groups {
        for (name, a) in agents.iter() {
            let t = target(a);
            // Polled until they match or the deadline passes; then the difference is reported.
            let got = loop {
                let got = firing(&prom, &t);
                if got == *want || Instant::now() > deadline {
                    break got;
                }
                std::thread::sleep(Duration::from_millis(250));
            };
            if got != *want {
                failures.push(format!(
                    "[{name}] alerts of {t}: wanted {want:?}, got {got:?}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} panel values differ from the scenario's:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

/// The power panels as users get them: the agent at its default tiers (poll every 5 s, the
/// energy counter read every 30 s: `demo`, which adds nothing to the config), Prometheus at
/// Grafana's default 15 s scrape, and `$__rate_interval` as Grafana makes it for that scrape
/// (4 × 15 s = 1m). A rate of the energy counter over that window holds one or two of its 30 s
/// steps (2/3 or 4/3 of the power); every power panel must show the scenario's watts.
#[test]
fn truth_power_panels_at_the_default_tiers_and_a_15s_scrape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = dir.path().join("truth.toml");
    std::fs::write(&scenario, expected::truth_scenario(&[])).expect("scenario");
    let agents: Vec<_> = NAME_SETS
        .iter()
        .map(|(n, c)| {
            let a = common::Agent::with_scenario("")
                .demo()
                .interval("5s")
                .config(c)
                .arg("--scenario")
                .arg(&scenario.display().to_string())
                .start();
            (*n, a)
        })
        .collect();
    let target = |a: &common::Agent| format!("127.0.0.1:{}", a.port);
    let all: Vec<String> = agents.iter().map(|(_, a)| target(a)).collect();
    let prom = e2e_support::Prometheus::start_every(&all, "groups: []\n", "15s");
    // Six scrapes of every agent: a full minute of data, the energy counter read twice or more.
    wait_for("6 scrapes of every agent", Duration::from_secs(150), || {
        let n = scalar(
            &prom,
            r#"count(count_over_time(gpu_steward_build_info{job="gpu-steward"}[2m]) >= 6)"#,
        )?;
        (n == all.len() as f64).then_some(())
    });
    let queries = dashboards::queries(&repo().join("dashboards"));
    let table: expected::Table = expected::truth_node(false, (0.0, 0.0))
        .into_iter()
        .filter(|(origin, _)| {
            origin.contains("'Power")
                || origin.contains("power")
                || origin.contains("Average power")
        })
        .collect();
    assert_eq!(table.len(), 5, "{:?}", table.keys().collect::<Vec<_>>());
    let t = prom.query("time()").expect("time()")[1]
        .as_str()
        .and_then(|v| v.parse::<f64>().ok())
        .expect("time() is a number");
    let mut failures = Vec::new();
    for (name, a) in &agents {
        let instance = target(a);
        for (origin, want) in &table {
            let q = queries
                .iter()
                .find(|q| q.origin == *origin)
                .unwrap_or_else(|| panic!("{origin}: no dashboard has it"));
            let expr = e2e_support::truth::substitute_with(&q.raw, &instance, "1m", "1m");
            if let Err(e) = e2e_support::truth::check(&prom, &expr, t, want) {
                failures.push(format!("[{name}] {origin}: {e}\n    {expr}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} power panels differ from the scenario's watts:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}
