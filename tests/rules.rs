//! Alert rules on the node and remediation hooks, end to end: the real binary against the
//! simulated NVML, rule files and hook scripts written by the test, the audit log read back,
//! the webhook called over real HTTP.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::fullfs::SmallFs;
use common::{wait_for, Agent, Response};
use serde_json::Value;

const SCENARIO: &str = "version = 1\n[[gpu]]\nmodel = \"H100-SXM5-80GB\"\nuuid = \"GPU-11111111-2222-3333-4444-555555555555\"\ntemperature_c = 60\n";

fn scenario_at(temp: u32) -> String {
    SCENARIO.replace("temperature_c = 60", &format!("temperature_c = {temp}"))
}

/// A directory with the rule file, the recording hook, and where the hook and the audit log
/// write.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new(rules: &str) -> Setup {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("rules.yml"), rules).expect("write rules");
        // The hook appends one JSON line per call: its environment and its stdin. It quotes
        // every expansion, so nothing it receives is ever run.
        let hook = format!(
            "#!/bin/sh\n\
             input=$(cat)\n\
             printf '{{\"name\":\"%s\",\"status\":\"%s\",\"gpu\":\"%s\",\"uuid\":\"%s\",\"fp\":\"%s\",\"argv\":\"%s\",\"stdin\":%s}}\\n' \
             \"$GPU_STEWARD_ALERT_NAME\" \"$GPU_STEWARD_ALERT_STATUS\" \"$(printf %s \"$GPU_STEWARD_GPU\" | base64 -w0)\" \
             \"$GPU_STEWARD_GPU_UUID\" \"$GPU_STEWARD_ALERT_FINGERPRINT\" \"$1\" \"$input\" >> '{}'\n\
             echo hook ran for \"$GPU_STEWARD_ALERT_NAME\"\n",
            dir.path().join("calls.jsonl").display()
        );
        write_script(&dir.path().join("record.sh"), &hook);
        Setup { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `[rules]`, `[audit]` and a `[remediation]` with the hook `record` and `extra` TOML.
    fn config(&self, extra: &str) -> String {
        format!(
            "[rules]\nfiles = [\"{rules}\"]\n[audit]\nfile = \"{audit}\"\n\
             [[remediation.hooks]]\nname = \"record\"\ncommand = [\"{hook}\", \"an argument\"]\ntimeout = \"10s\"\n{extra}",
            rules = self.path("rules.yml").display(),
            audit = self.path("audit.jsonl").display(),
            hook = self.path("record.sh").display(),
        )
    }

    fn calls(&self) -> Vec<Value> {
        read_lines(&self.path("calls.jsonl"))
    }

    fn audit(&self) -> Vec<Value> {
        read_lines(&self.path("audit.jsonl"))
    }

    fn audit_events(&self, event: &str) -> Vec<Value> {
        self.audit()
            .into_iter()
            .filter(|r| r["event"] == event)
            .collect()
    }
}

fn write_script(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l}: {e}")))
        .collect()
}

fn alerts(agent: &Agent, name: &str, state: &str) -> Option<f64> {
    agent.metrics().value(
        "gpu_steward_alerts",
        &[("alertname", name), ("state", state)],
    )
}

/// Waits until the agent has published `n` more snapshots (to show that something did *not*
/// happen over several evaluations).
fn wait_polls(agent: &Agent, n: u32) {
    let ts = |a: &Agent| {
        a.metrics()
            .get("gpu_steward_snapshot_timestamp_seconds", &[])
    };
    let start = ts(agent);
    wait_for("more polls", Duration::from_secs(20), || {
        (ts(agent) >= start + 0.2 * f64::from(n)).then_some(())
    });
}

fn post(agent: &Agent, path: &str, auth: Option<&str>, body: &str) -> Response {
    let auth = auth.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    agent.request(&format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ))
}

fn b64decode(s: &str) -> String {
    let out = Command::new("base64")
        .arg("-d")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().expect("stdin").write_all(s.as_bytes())?;
            c.wait_with_output()
        })
        .expect("base64 -d");
    String::from_utf8(out.stdout).expect("utf-8")
}

const HOT_RULE: &str = "groups:\n  - name: node\n    rules:\n      - alert: GpuHot\n        expr: gpu_steward_temperature_celsius > 85\n        for: 1s\n        labels:\n          severity: critical\n        annotations:\n          summary: \"GPU {{ $labels.gpu }} at {{ $value }} C\"\n";

#[test]
fn a_scenario_change_fires_after_for_runs_the_hook_once_and_resolves() {
    let s = Setup::new(HOT_RULE);
    let config = s.config(
        "[[remediation.routes]]\nmatchers = ['alertname=\"GpuHot\"', 'severity=\"critical\"']\n\
         hooks = [\"record\"]\ncooldown = \"1h\"\non_resolved = true\n",
    );
    let agent = Agent::with_scenario(SCENARIO).config(&config).start();
    wait_for("the rule's series", Duration::from_secs(10), || {
        (alerts(&agent, "GpuHot", "firing") == Some(0.0)).then_some(())
    });
    assert_eq!(alerts(&agent, "GpuHot", "pending"), Some(0.0));

    agent.rewrite_scenario(&scenario_at(90));
    // Pending first: `for: 1s` is five polls at 200 ms.
    wait_for("GpuHot pending", Duration::from_secs(10), || {
        (alerts(&agent, "GpuHot", "pending") == Some(1.0)).then_some(())
    });
    assert!(
        s.calls().is_empty(),
        "the hook ran while the alert was pending"
    );
    wait_for("GpuHot firing", Duration::from_secs(10), || {
        (alerts(&agent, "GpuHot", "firing") == Some(1.0)).then_some(())
    });
    let calls = wait_for("the hook's call", Duration::from_secs(10), || {
        let c = s.calls();
        (!c.is_empty()).then_some(c)
    });
    let call = &calls[0];
    assert_eq!(call["name"], "GpuHot");
    assert_eq!(call["status"], "firing");
    assert_eq!(b64decode(call["gpu"].as_str().expect("gpu")), "0");
    assert_eq!(call["uuid"], "GPU-11111111-2222-3333-4444-555555555555");
    assert_eq!(call["argv"], "an argument");
    let stdin = &call["stdin"];
    assert_eq!(stdin["status"], "firing");
    assert_eq!(stdin["labels"]["alertname"], "GpuHot");
    assert_eq!(stdin["labels"]["gpu"], "0");
    assert_eq!(stdin["labels"]["severity"], "critical");
    assert_eq!(stdin["annotations"]["summary"], "GPU 0 at 90 C");
    assert_eq!(stdin["endsAt"], "0001-01-01T00:00:00Z");
    assert_eq!(stdin["fingerprint"], call["fp"]);
    assert_eq!(stdin["fingerprint"].as_str().map(str::len), Some(16));

    // Still firing over many more evaluations: the hook ran once.
    wait_polls(&agent, 8);
    assert_eq!(s.calls().len(), 1, "the hook ran again for the same alert");

    let decisions = s.audit_events("decision");
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    assert_eq!(decisions[0]["decision"], "run");
    assert_eq!(decisions[0]["alertname"], "GpuHot");
    assert_eq!(decisions[0]["source"], "rules");
    let ends = s.audit_events("hook.end");
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0]["result"], "success");
    assert_eq!(ends[0]["stdout"], "hook ran for GpuHot\n");
    assert!(ends[0]["ts"].as_str().is_some_and(|t| t.ends_with('Z')));

    // Resolution: the route asks for it, so the hook runs once more with "resolved".
    agent.rewrite_scenario(&scenario_at(60));
    let calls = wait_for("the resolved call", Duration::from_secs(10), || {
        let c = s.calls();
        (c.len() == 2).then_some(c)
    });
    assert_eq!(calls[1]["status"], "resolved");
    assert_eq!(calls[1]["stdin"]["status"], "resolved");
    assert_eq!(calls[1]["fp"], calls[0]["fp"]);
    assert_ne!(calls[1]["stdin"]["endsAt"], "0001-01-01T00:00:00Z");
    // The rules' and hooks' series are collected into the page at each poll: the next
    // publication shows them.
    wait_polls(&agent, 2);
    assert_eq!(alerts(&agent, "GpuHot", "firing"), Some(0.0));
    let m = agent.metrics();
    assert_eq!(
        m.value(
            "gpu_steward_hook_runs_total",
            &[("hook", "record"), ("result", "success")]
        ),
        Some(2.0)
    );
    assert_eq!(
        m.value(
            "gpu_steward_hook_duration_seconds_count",
            &[("hook", "record")]
        ),
        Some(2.0)
    );
    assert_eq!(
        m.value("gpu_steward_rule_evaluation_failures_total", &[]),
        Some(0.0)
    );
    assert!(agent.log().contains("alert firing"), "{}", agent.log());
}

fn pid_alive(pid: i32) -> bool {
    // A zombie has exited; only its parent's wait is missing.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| r.trim().to_string()))
        .is_some_and(|r| !r.starts_with('Z') && !r.starts_with('X'))
}

const UP_RULE: &str = "groups:\n  - name: node\n    rules:\n      - alert: GpuUp\n        expr: gpu_steward_gpu_up == 1\n";

#[test]
fn a_hanging_hook_is_killed_with_its_children() {
    let s = Setup::new(UP_RULE);
    let hang = format!(
        "#!/bin/sh\nsleep 300 &\necho $! > '{child}'\necho $$ > '{me}'\nwait\n",
        child = s.path("child.pid").display(),
        me = s.path("hook.pid").display()
    );
    write_script(&s.path("hang.sh"), &hang);
    let config = s.config(&format!(
        "[[remediation.hooks]]\nname = \"hang\"\ncommand = [\"{}\"]\ntimeout = \"1s\"\n\
         [[remediation.routes]]\nmatchers = ['alertname=\"GpuUp\"']\nhooks = [\"hang\"]\n",
        s.path("hang.sh").display()
    ));
    let agent = Agent::with_scenario(SCENARIO).config(&config).start();
    let read_pid = |name: &str| {
        std::fs::read_to_string(s.path(name))
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
    };
    let (hook, child) = wait_for("the hook to start", Duration::from_secs(10), || {
        Some((read_pid("hook.pid")?, read_pid("child.pid")?))
    });
    let end = wait_for("the hook's timeout", Duration::from_secs(10), || {
        s.audit_events("hook.end").into_iter().next()
    });
    assert_eq!(end["result"], "timeout", "{end}");
    assert_eq!(end["hook"], "hang");
    wait_for(
        "the hook and its child to be gone",
        Duration::from_secs(5),
        || (!pid_alive(hook) && !pid_alive(child)).then_some(()),
    );
    // The hooks' series are collected into the page at each poll: the next one shows the run.
    wait_polls(&agent, 2);
    assert_eq!(
        agent.metrics().value(
            "gpu_steward_hook_runs_total",
            &[("hook", "hang"), ("result", "timeout")]
        ),
        Some(1.0)
    );
}

#[test]
fn dry_run_decides_and_audits_but_runs_nothing() {
    let s = Setup::new(UP_RULE);
    let config = s.config(
        "[remediation]\ndry_run = true\n\
         [[remediation.routes]]\nmatchers = ['alertname=\"GpuUp\"']\nhooks = [\"record\"]\n",
    );
    let agent = Agent::with_scenario(SCENARIO).config(&config).start();
    let dry = wait_for("the dry run record", Duration::from_secs(10), || {
        s.audit_events("hook.dry_run").into_iter().next()
    });
    assert_eq!(dry["hook"], "record");
    assert_eq!(s.audit_events("decision")[0]["decision"], "dry_run");
    wait_polls(&agent, 3);
    assert!(s.calls().is_empty(), "a dry run ran the hook");
    assert!(s.audit_events("hook.start").is_empty());
    assert_eq!(
        agent.metrics().value(
            "gpu_steward_hook_runs_total",
            &[("hook", "record"), ("result", "dry_run")]
        ),
        Some(1.0)
    );
}

fn webhook_body(labels: &Value, status: &str) -> String {
    serde_json::json!({
        "version": "4", "groupKey": "{}:{alertname=\"Inject\"}", "truncatedAlerts": 0,
        "status": status, "receiver": "gpu-steward", "groupLabels": {}, "commonLabels": {},
        "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
        "alerts": [{
            "status": status, "labels": labels, "annotations": {"summary": "x"},
            "startsAt": "2026-11-22T22:00:00.000Z", "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus/graph", "fingerprint": "0123456789abcdef"
        }]
    })
    .to_string()
}

#[test]
fn the_webhook_needs_the_token_and_labels_reach_the_hook_only_as_data() {
    let s = Setup::new("groups: []\n");
    let token = s.path("token");
    std::fs::write(&token, "s3cret-token\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let pwned = s.path("pwned");
    let config = format!(
        "[api]\nenabled = true\ntoken_file = \"{}\"\n{}",
        token.display(),
        s.config(
            "[[remediation.routes]]\nmatchers = ['alertname=\"Inject\"']\nhooks = [\"record\"]\n"
        )
    );
    let agent = Agent::with_scenario(SCENARIO).config(&config).start();
    let labels = serde_json::json!({
        "alertname": "Inject",
        "gpu": format!("$(touch {})", pwned.display()),
        "uuid": format!("GPU-1; touch {} #", pwned.display()),
        "note": format!("a\nb`touch {}`", pwned.display()),
    });
    let body = webhook_body(&labels, "firing");

    let r = post(&agent, "/api/v1/alertmanager", None, &body);
    assert_eq!(r.status, 401, "{}", r.text());
    let r = post(&agent, "/api/v1/alertmanager", Some("wrong"), &body);
    assert_eq!(r.status, 401, "{}", r.text());
    let r = post(
        &agent,
        "/api/v1/alertmanager",
        Some("s3cret-token"),
        "{\"version\":\"4\"",
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("invalid webhook payload"), "{}", r.text());
    let r = post(
        &agent,
        "/api/v1/alertmanager",
        Some("s3cret-token"),
        &body.replace("\"version\":\"4\"", "\"version\":\"3\""),
    );
    assert_eq!(r.status, 400);
    assert!(r.text().contains("version '3'"), "{}", r.text());
    // The API records each admitted request with its peer; nothing reached remediation.
    assert!(
        s.audit().iter().all(|r| r["component"] == "api"),
        "rejected payloads reached the routes"
    );

    let r = post(&agent, "/api/v1/alertmanager", Some("s3cret-token"), &body);
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["accepted"], 1);
    let calls = wait_for("the hook's call", Duration::from_secs(10), || {
        let c = s.calls();
        (!c.is_empty()).then_some(c)
    });
    let call = &calls[0];
    assert_eq!(b64decode(call["gpu"].as_str().expect("gpu")), labels["gpu"]);
    assert_eq!(call["uuid"], labels["uuid"]);
    assert_eq!(call["fp"], "0123456789abcdef");
    assert_eq!(call["stdin"]["labels"], labels);
    assert!(!pwned.exists(), "a label was executed");

    // Alertmanager re-sends the same alert every repeat_interval: decided once, run once.
    let r = post(&agent, "/api/v1/alertmanager", Some("s3cret-token"), &body);
    assert_eq!(r.status, 202);
    let dup = wait_for("the duplicate decision", Duration::from_secs(10), || {
        let d = s.audit_events("decision");
        (d.len() == 2).then_some(d)
    });
    assert_eq!(dup[0]["source"], "webhook");
    assert_eq!(dup[1]["decision"], "skip");
    assert!(dup[1]["reason"]
        .as_str()
        .is_some_and(|r| r.contains("duplicate")));
    assert_eq!(s.calls().len(), 1);
    assert!(!pwned.exists(), "a label was executed");
}

#[test]
fn the_shipped_alert_rules_load_unchanged() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("alerts/gpu-steward.rules.yml");
    let count = std::fs::read_to_string(&rules)
        .expect("rules")
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!("[rules]\nfiles = [\"{}\"]\n", rules.display()),
    )
    .expect("config");
    let out = Command::new(common::bin())
        .arg("check-config")
        .arg(&config)
        .output()
        .expect("check-config");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("alert rules: {count} rule(s) from 1 file(s)")),
        "{stdout}"
    );
    // And the daemon evaluates them without a failure on a healthy node: nothing fires.
    let agent = Agent::with_scenario(SCENARIO)
        .config(&format!("[rules]\nfiles = [\"{}\"]\n", rules.display()))
        .start();
    wait_polls(&agent, 5);
    let m = agent.metrics();
    assert_eq!(
        m.value("gpu_steward_rule_evaluation_failures_total", &[]),
        Some(0.0)
    );
    let names = m.find("gpu_steward_alerts", &[("state", "firing")]);
    assert_eq!(names.len(), count, "one series per alert name");
    assert!(names.iter().all(|s| s.value == 0.0), "{names:?}");
}

#[test]
fn unsupported_rules_and_bad_routes_are_refused_with_positions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("r.yml");
    std::fs::write(
        &rules,
        "groups:\n  - name: g\n    rules:\n      - alert: Fine\n        expr: up == 0\n      - alert: Top\n        expr: topk(1, gpu_steward_temperature_celsius)\n",
    )
    .expect("rules");
    let config = dir.path().join("c.toml");
    let check = |text: &str| {
        std::fs::write(&config, text).expect("config");
        let out = Command::new(common::bin())
            .arg("check-config")
            .arg(&config)
            .output()
            .expect("check-config");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = check("[rules]\nfiles = [\"r.yml\"]\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{}:7:9: rule 'Top': the aggregation 'topk'",
            rules.display()
        )),
        "{err}"
    );
    let (code, err) = check(
        "[[remediation.hooks]]\nname = \"a\"\ncommand = [\"/bin/true\"]\n\
         [[remediation.routes]]\nmatchers = ['alertname=\"X\"']\nhooks = [\"a\", \"b\"]\n",
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("c.toml:6:15: route hook 'b' is not defined"),
        "{err}"
    );
    let (code, err) = check("[[remediation.routes]]\nmatchers = ['alertname']\nhooks = []\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("c.toml:2:12: invalid matcher 'alertname'"),
        "{err}"
    );
}

#[test]
fn actions_on_one_gpu_run_one_at_a_time() {
    let s = Setup::new("groups: []\n");
    let token = s.path("token");
    std::fs::write(&token, "t0k3n\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    // Each run appends "start <fp>", sleeps, then "end <fp>": overlapping runs interleave.
    let slow = format!(
        "#!/bin/sh\necho \"start $GPU_STEWARD_ALERT_FINGERPRINT\" >> '{log}'\nsleep 0.4\n\
         echo \"end $GPU_STEWARD_ALERT_FINGERPRINT\" >> '{log}'\n",
        log = s.path("runs.log").display()
    );
    write_script(&s.path("slow.sh"), &slow);
    let config = format!(
        "[api]\nenabled = true\ntoken_file = \"{}\"\n{}",
        token.display(),
        s.config(&format!(
            "[[remediation.hooks]]\nname = \"slow\"\ncommand = [\"{}\"]\n\
             [[remediation.routes]]\nmatchers = ['alertname=~\"Slow.*\"']\nhooks = [\"slow\"]\ncooldown = \"0s\"\n",
            s.path("slow.sh").display()
        ))
    );
    let agent = Agent::with_scenario(SCENARIO).config(&config).start();
    // Three different alerts about GPU 3, sent at once.
    for (i, name) in ["SlowA", "SlowB", "SlowC"].iter().enumerate() {
        let body = webhook_body(
            &serde_json::json!({"alertname": name, "gpu": "3"}),
            "firing",
        )
        .replace("0123456789abcdef", &format!("{i:016x}"));
        assert_eq!(
            post(&agent, "/api/v1/alertmanager", Some("t0k3n"), &body).status,
            202
        );
    }
    let log = wait_for("three runs", Duration::from_secs(20), || {
        let t = std::fs::read_to_string(s.path("runs.log")).unwrap_or_default();
        (t.lines().count() == 6).then_some(t)
    });
    let lines: Vec<&str> = log.lines().collect();
    for pair in lines.chunks(2) {
        let (start, end) = (pair[0], pair[1]);
        assert!(
            start.starts_with("start ") && end == start.replacen("start", "end", 1),
            "runs on one GPU overlapped:\n{log}"
        );
    }
}

#[test]
fn the_built_in_action_signals_the_processes_on_the_gpu() {
    use std::os::unix::process::ExitStatusExt;
    let mut victim = Command::new("sleep").arg("300").spawn().expect("sleep");
    let mut bystander = Command::new("sleep").arg("300").spawn().expect("sleep");
    let scenario = format!(
        "{SCENARIO}[[gpu.process]]\npid = {}\nkind = \"compute\"\nused_memory_mib = 1024\n\
         [[gpu]]\nmodel = \"H100-SXM5-80GB\"\n[[gpu.process]]\npid = {}\nkind = \"compute\"\nused_memory_mib = 512\n",
        victim.id(),
        bystander.id()
    );
    let s = Setup::new(
        "groups:\n  - name: node\n    rules:\n      - alert: GpuBusy\n        expr: gpu_steward_gpu_processes{gpu=\"0\"} > 0\n",
    );
    let config = s.config(
        "[[remediation.actions]]\nname = \"stop-jobs\"\nkind = \"signal_processes\"\nsignal = \"SIGTERM\"\n\
         [[remediation.routes]]\nmatchers = ['alertname=\"GpuBusy\"']\nhooks = [\"stop-jobs\"]\n",
    );
    let _agent = Agent::with_scenario(&scenario).config(&config).start();
    let status = wait_for(
        "the victim to be signalled",
        Duration::from_secs(15),
        || victim.try_wait().expect("try_wait"),
    );
    assert_eq!(status.signal(), Some(15), "{status:?}");
    let end = wait_for("the action's record", Duration::from_secs(10), || {
        s.audit_events("hook.end").into_iter().next()
    });
    assert_eq!(end["hook"], "stop-jobs");
    assert_eq!(end["result"], "success", "{end}");
    assert_eq!(end["processes"][0]["pid"], victim.id());
    assert_eq!(end["processes"][0]["outcome"], "sent");
    // The action is recorded as the config names it, not as the Rust enum.
    let start = &s.audit_events("hook.start")[0];
    assert_eq!(start["action"], "signal_processes", "{start}");
    assert_eq!(start["signal"], "SIGTERM", "{start}");
    // The process on the other GPU is untouched.
    assert!(
        pid_alive(bystander.id() as i32),
        "the other GPU's process was signalled"
    );
    let _ = bystander.kill();
    let _ = bystander.wait();
}

#[test]
fn a_hook_running_at_sigterm_finishes_and_is_recorded() {
    let s = Setup::new(UP_RULE);
    let slow = format!(
        "#!/bin/sh\ntouch '{started}'\nsleep 1\necho done\n",
        started = s.path("started").display()
    );
    write_script(&s.path("slow.sh"), &slow);
    let config = s.config(&format!(
        "[[remediation.hooks]]\nname = \"slow\"\ncommand = [\"{}\"]\n\
         [[remediation.routes]]\nmatchers = ['alertname=\"GpuUp\"']\nhooks = [\"slow\"]\n",
        s.path("slow.sh").display()
    ));
    let mut agent = Agent::with_scenario(SCENARIO).config(&config).start();
    wait_for("the hook to start", Duration::from_secs(10), || {
        s.path("started").exists().then_some(())
    });
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    let status = agent.wait_exit(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "{}", agent.log());
    let end = s.audit_events("hook.end");
    assert_eq!(end.len(), 1, "{:?}", s.audit());
    assert_eq!(end[0]["result"], "success");
    assert_eq!(end[0]["stdout"], "done\n");
}

/// Deliver 5: a hook's output is outside text. One that prints `ESC ] 0 ; … BEL`, `ESC [ 31 m`
/// and a newline followed by a forged log line reaches the agent's text log escaped: no raw
/// control character, no second line.
#[test]
fn a_hooks_terminal_escapes_and_forged_lines_reach_the_log_escaped() {
    let s = Setup::new(UP_RULE);
    write_script(
        &s.path("hostile.sh"),
        "#!/bin/sh\nprintf '\\033]0;owned\\007\\033[31mred\\nFORGED ERROR gpu_steward: fake line\\n'\n",
    );
    let config = s.config(&format!(
        "[[remediation.hooks]]\nname = \"hostile\"\ncommand = [\"{}\"]\n\
         [[remediation.routes]]\nmatchers = ['alertname=\"GpuUp\"']\nhooks = [\"hostile\"]\n",
        s.path("hostile.sh").display()
    ));
    let agent = Agent::with_scenario(SCENARIO).config(&config).start();
    let end = wait_for("the hook's record", Duration::from_secs(15), || {
        s.audit_events("hook.end").into_iter().next()
    });
    // The answer, known before asking: what the script prints.
    assert_eq!(
        end["stdout"],
        "\u{1b}]0;owned\u{7}\u{1b}[31mred\nFORGED ERROR gpu_steward: fake line\n"
    );
    let log = wait_for("the hook's log line", Duration::from_secs(10), || {
        let log = agent.log();
        log.contains("hook succeeded").then_some(log)
    });
    let line = log
        .lines()
        .find(|l| l.contains("hook succeeded"))
        .expect("the line");
    assert!(
        line.contains(
            r"stdout=\u{1b}]0;owned\u{7}\u{1b}[31mred\nFORGED ERROR gpu_steward: fake line\n"
        ),
        "{line}"
    );
    assert!(!log.contains('\u{1b}') && !log.contains('\u{7}'), "{log:?}");
    assert!(
        !log.lines().any(|l| l.starts_with("FORGED")),
        "a forged line: {log}"
    );
}

#[test]
fn power_limit_and_fence_are_written_to_the_gpu_and_undone_on_resolution() {
    let s = Setup::new(HOT_RULE);
    let config = s.config(
        "[[remediation.actions]]\nname = \"cap\"\nkind = \"power_limit\"\nwatts = 400\n\
         [[remediation.actions]]\nname = \"fence\"\nkind = \"fence\"\n\
         [[remediation.routes]]\nmatchers = ['alertname=\"GpuHot\"']\nhooks = [\"cap\", \"fence\"]\non_resolved = true\n",
    );
    let agent = Agent::with_scenario(SCENARIO).config(&config).start();
    let limit = |a: &Agent| {
        a.metrics()
            .value("gpu_steward_power_limit_watts", &[("gpu", "0")])
    };
    assert_eq!(limit(&agent), Some(700.0));
    agent.rewrite_scenario(&scenario_at(90));
    wait_for("the capped limit", Duration::from_secs(15), || {
        (limit(&agent) == Some(400.0)).then_some(())
    });
    let ends = wait_for("both actions", Duration::from_secs(10), || {
        let e = s.audit_events("hook.end");
        (e.len() == 2).then_some(e)
    });
    assert_eq!(ends[0]["hook"], "cap");
    assert_eq!(ends[0]["power_limit_watts"], 400.0);
    assert_eq!(ends[1]["hook"], "fence");
    // In the configuration's words, not the NVML wrapper's Rust name `Prohibited`.
    assert_eq!(ends[1]["compute_mode"], "prohibited", "{}", ends[1]);
    agent.rewrite_scenario(&scenario_at(60));
    wait_for("the default limit again", Duration::from_secs(15), || {
        (limit(&agent) == Some(700.0)).then_some(())
    });
    let ends = wait_for("both undone", Duration::from_secs(10), || {
        let e = s.audit_events("hook.end");
        (e.len() == 4).then_some(e)
    });
    assert_eq!(ends[2]["status"], "resolved");
    assert_eq!(ends[3]["compute_mode"], "default", "{}", ends[3]);
    assert!(ends.iter().all(|e| e["result"] == "success"), "{ends:?}");
}

#[test]
fn a_rule_too_deep_to_evaluate_is_refused_by_check_config_and_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("r.yml");
    let chain = vec!["a"; 4000].join(" + ");
    std::fs::write(
        &rules,
        format!(
            "groups:\n  - name: g\n    rules:\n      - alert: Deep\n        expr: {chain} > 0\n"
        ),
    )
    .expect("rules");
    let config = dir.path().join("c.toml");
    std::fs::write(&config, "[rules]\nfiles = [\"r.yml\"]\n").expect("config");
    let want = format!("{}:5:9: rule 'Deep': the expression", rules.display());
    let out = Command::new(common::bin())
        .arg("check-config")
        .arg(&config)
        .output()
        .expect("check-config");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&want) && err.contains("limit"), "{err}");
    let out = Command::new(common::bin())
        .args(["run", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&want), "{err}");
}

#[test]
fn runs_of_unary_operators_are_refused_by_check_config_and_at_start_and_the_limit_evaluates() {
    // The defect: 3,000 unary minus signs counted as one operator, passed check-config and
    // overflowed the daemon's stack. Each form nests once per operator or bracket.
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("r.yml");
    let config = dir.path().join("c.toml");
    std::fs::write(&config, "[rules]\nfiles = [\"r.yml\"]\n").expect("config");
    let deep = [
        format!("{}up", "-".repeat(3000)),
        format!("{}up{}", "-(".repeat(3000), ")".repeat(3000)),
        format!("{}up{}", "abs(".repeat(3000), ")".repeat(3000)),
        format!("{}up{}", "(".repeat(3000), ")".repeat(3000)),
    ];
    let want = format!("{}:5:9: rule 'Deep': the expression", rules.display());
    for (i, expr) in deep.iter().enumerate() {
        std::fs::write(
            &rules,
            format!("groups:\n  - name: g\n    rules:\n      - alert: Deep\n        expr: '{expr} > 0'\n"),
        )
        .expect("rules");
        let out = Command::new(common::bin())
            .arg("check-config")
            .arg(&config)
            .output()
            .expect("check-config");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "form {i}: {err}");
        assert!(
            err.contains(&want) && err.contains("nesting limit of 128"),
            "form {i}: {err}"
        );
        if i == 0 {
            let out = Command::new(common::bin())
                .args(["run", "--listen", "127.0.0.1:0", "--config"])
                .arg(&config)
                .output()
                .expect("run");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{err}");
            assert!(err.contains(&want), "{err}");
        }
    }
    // At the limit the daemon parses and evaluates it on its own threads: 126 minus signs (an
    // even count, so the value keeps its sign) and one comparison. The scenario's 60 °C is
    // over 50, so the alert fires.
    let expr = format!("{}gpu_steward_temperature_celsius > 50", "-".repeat(126));
    let text = format!(
        "groups:\n  - name: g\n    rules:\n      - alert: AtLimit\n        expr: '{expr}'\n"
    );
    std::fs::write(&rules, &text).expect("rules");
    let agent = Agent::with_scenario(SCENARIO)
        .config(&format!("[rules]\nfiles = [\"{}\"]\n", rules.display()))
        .start();
    wait_for(
        "the alert at the limit fires",
        Duration::from_secs(20),
        || (alerts(&agent, "AtLimit", "firing") == Some(1.0)).then_some(()),
    );
}

#[test]
fn a_hook_still_running_at_sigterm_is_killed_with_its_group_within_the_grace() {
    let s = Setup::new(UP_RULE);
    let slow = format!(
        "#!/bin/sh\nsleep 120 &\necho $! > '{child}'\ntouch '{started}'\nwait\n",
        child = s.path("child").display(),
        started = s.path("started").display()
    );
    write_script(&s.path("slow.sh"), &slow);
    let config = s.config(&format!(
        "[[remediation.hooks]]\nname = \"slow\"\ncommand = [\"{}\"]\ntimeout = \"60s\"\n\
         [[remediation.routes]]\nmatchers = ['alertname=\"GpuUp\"']\nhooks = [\"slow\"]\n",
        s.path("slow.sh").display()
    ));
    let mut agent = Agent::with_scenario(SCENARIO).config(&config).start();
    wait_for("the hook to start", Duration::from_secs(10), || {
        s.path("started").exists().then_some(())
    });
    let child: i32 = std::fs::read_to_string(s.path("child"))
        .expect("child pid")
        .trim()
        .parse()
        .expect("pid");
    let stopped = std::time::Instant::now();
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    let status = agent.wait_exit(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "{}", agent.log());
    // The unit's TimeoutStopSec is 20 s; the hook grace is 3 s.
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopped.elapsed()
    );
    assert!(
        !pid_alive(child),
        "the hook's child {child} outlived the stop"
    );
    let end = s.audit_events("hook.end");
    assert_eq!(end.len(), 1, "{:?}", s.audit());
    assert_eq!(end[0]["result"], "timeout");
}

/// Zombie children of `pid`, from /proc.
fn zombie_children(pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let rest: Vec<&str> = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            rest.first() == Some(&"Z") && rest.get(1) == Some(&pid.to_string().as_str())
        })
        .count()
}

#[test]
fn as_pid_1_the_agent_reaps_what_hooks_leave_behind() {
    if !nix::unistd::geteuid().is_root() || Command::new("unshare").arg("--help").output().is_err()
    {
        eprintln!("skipped: needs root and unshare(1) for a PID namespace");
        return;
    }
    let s = Setup::new(UP_RULE);
    // Twenty orphans that exit on their own after the hook is gone.
    let hook = format!(
        "#!/bin/sh\nfor i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do \
         (setsid sleep 0.3 &); done\ntouch '{}'\n",
        s.path("ran").display()
    );
    write_script(&s.path("orphans.sh"), &hook);
    let config = s.path("config.toml");
    std::fs::write(
        &config,
        s.config(&format!(
            "[[remediation.hooks]]\nname = \"orphans\"\ncommand = [\"{}\"]\n\
             [[remediation.routes]]\nmatchers = ['alertname=\"GpuUp\"']\nhooks = [\"orphans\"]\n",
            s.path("orphans.sh").display()
        )),
    )
    .expect("config");
    std::fs::write(s.path("scenario.toml"), SCENARIO).expect("scenario");
    let mut unshare = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(common::bin())
        .args([
            "run",
            "--listen",
            "127.0.0.1:0",
            "--interval",
            "200ms",
            "--nvml-lib",
        ])
        .arg(common::sim_lib())
        .arg("--config")
        .arg(&config)
        .env("NVML_SIM_SCENARIO", s.path("scenario.toml"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("unshare");
    let agent: u32 = wait_for("the agent as PID 1", Duration::from_secs(10), || {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", unshare.id())).ok()?;
        children.split_whitespace().next()?.parse().ok()
    });
    wait_for("the hook to run", Duration::from_secs(20), || {
        s.path("ran").exists().then_some(())
    });
    let ran = std::time::Instant::now();
    let reaped = (|| {
        while ran.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(100));
            if ran.elapsed() > Duration::from_secs(2) && zombie_children(agent) == 0 {
                return true;
            }
        }
        false
    })();
    let left = zombie_children(agent);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(unshare.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = unshare.wait();
    assert!(reaped, "{left} zombies left under the agent (PID 1)");
}

/// A webhook body with one alert per `(fingerprint, gpu)`.
fn webhook_batch(alerts: &[(String, String)]) -> String {
    let alerts: Vec<Value> = alerts
        .iter()
        .map(|(fp, gpu)| {
            serde_json::json!({
                "status": "firing", "labels": {"alertname": "Batch", "gpu": gpu},
                "annotations": {}, "startsAt": "2026-11-22T22:00:00.000Z",
                "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": fp
            })
        })
        .collect();
    serde_json::json!({
        "version": "4", "groupKey": "{}", "truncatedAlerts": 0, "status": "firing",
        "receiver": "gpu-steward", "groupLabels": {}, "commonLabels": {},
        "commonAnnotations": {}, "externalURL": "http://alertmanager:9093", "alerts": alerts
    })
    .to_string()
}

const TOKEN: &str = "remediation-test-token-0123456789";

/// `[api]` with a token file in `s`'s directory, then `s.config(extra)`.
fn api_config(s: &Setup, extra: &str) -> String {
    let token = s.path("token");
    std::fs::write(&token, TOKEN).expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    format!(
        "[api]\nenabled = true\ntoken_file = \"{}\"\n{}",
        token.display(),
        s.config(extra)
    )
}

const BATCH_ROUTE: &str = "[remediation]\nmax_actions_per_hour = 3\n\
     [[remediation.routes]]\nmatchers = ['alertname=\"Batch\"']\nhooks = [\"record\"]\ncooldown = \"1h\"\n";

#[test]
fn the_rails_survive_restarts_so_a_crash_loop_cannot_repeat_actions() {
    let s = Setup::new("groups: []\n");
    let config = api_config(&s, BATCH_ROUTE);
    let fp = |i: usize| (format!("fp-{i}"), format!("{i}"));
    for start in 0..6 {
        // Killed at the end of each turn (SIGKILL on drop), as in a crash loop.
        let agent = Agent::with_scenario(SCENARIO).config(&config).start();
        // The same alert every time; a new alert on GPU 0 (cooldown); a new alert on a new GPU
        // each time (the hourly limit of 3).
        let batch = [
            fp(0),
            (format!("again-{start}"), "0".to_string()),
            fp(start + 1),
        ];
        let r = post(
            &agent,
            "/api/v1/alertmanager",
            Some(TOKEN),
            &webhook_batch(&batch),
        );
        assert_eq!(r.status, 202, "{}", r.text());
        wait_for("this start's decisions", Duration::from_secs(20), || {
            (s.audit_events("decision").len() == 3 * (start + 1)).then_some(())
        });
        // Hooks run after their decision: wait for every decided run to end before the kill.
        let runs = s
            .audit_events("decision")
            .iter()
            .filter(|d| d["decision"] == "run")
            .count();
        wait_for("the hooks to end", Duration::from_secs(20), || {
            (s.audit_events("hook.end").len() >= runs).then_some(())
        });
    }
    let decisions = s.audit_events("decision");
    let words: Vec<(String, String)> = decisions
        .iter()
        .map(|d| {
            (
                d["fingerprint"].as_str().unwrap_or_default().to_string(),
                d["reason"].as_str().map_or("run".to_string(), |r| {
                    r.split(':').next().unwrap_or(r).to_string()
                }),
            )
        })
        .collect();
    let ran: Vec<&str> = words
        .iter()
        .filter(|(_, w)| w == "run")
        .map(|(fp, _)| fp.as_str())
        .collect();
    assert_eq!(ran, ["fp-0", "fp-1", "fp-2"], "{words:?}");
    assert_eq!(s.calls().len(), 3, "{words:?}");
    let skipped = |fp: &str| -> Vec<&str> {
        words
            .iter()
            .filter(|(f, w)| f == fp && w != "run")
            .map(|(_, w)| w.as_str())
            .collect()
    };
    assert_eq!(skipped("fp-0"), ["duplicate"; 5], "{words:?}");
    assert_eq!(skipped("again-3"), ["route in cooldown for this GPU"]);
    assert_eq!(skipped("fp-6"), ["node-wide max_actions_per_hour reached"]);
}

#[test]
fn a_webhook_batch_is_accepted_whole_or_refused_whole_with_413_beyond_the_queue() {
    let s = Setup::new("groups: []\n");
    let config = api_config(&s, BATCH_ROUTE);
    let agent = Agent::with_scenario(SCENARIO).config(&config).start();
    let many = |n: usize| -> Vec<(String, String)> {
        (0..n)
            .map(|i| (format!("b-{i}"), "7".to_string()))
            .collect()
    };
    let r = post(
        &agent,
        "/api/v1/alertmanager",
        Some(TOKEN),
        &webhook_batch(&many(2000)),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(
        r.text().contains("2000") && r.text().contains("1024") && r.text().contains("max_alerts"),
        "{}",
        r.text()
    );
    wait_polls(&agent, 2);
    assert!(
        s.audit_events("decision").is_empty(),
        "part of a refused batch was decided"
    );
    let r = post(
        &agent,
        "/api/v1/alertmanager",
        Some(TOKEN),
        &webhook_batch(&many(1024)),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["accepted"], 1024);
    let d = wait_for("every alert decided", Duration::from_secs(60), || {
        let d = s.audit_events("decision");
        (d.len() >= 1024).then_some(d)
    });
    wait_polls(&agent, 2);
    assert_eq!(s.audit_events("decision").len(), 1024, "decided twice");
    let mut fps: Vec<&str> = d.iter().filter_map(|r| r["fingerprint"].as_str()).collect();
    fps.sort_unstable();
    fps.dedup();
    assert_eq!(fps.len(), 1024);
}

#[test]
fn a_webhook_batch_that_cannot_be_recorded_is_refused_at_once_and_runs_when_resent() {
    let Some(fs) = SmallFs::new(
        "a_webhook_batch_that_cannot_be_recorded_is_refused_at_once_and_runs_when_resent",
        256,
    ) else {
        return;
    };
    let s = Setup::new("groups: []\n");
    let audit = fs.inside().join("audit.jsonl");
    let config = api_config(&s, BATCH_ROUTE).replace(
        &s.path("audit.jsonl").display().to_string(),
        &audit.display().to_string(),
    );
    let agent = Agent::with_scenario(SCENARIO)
        .config(&config)
        .prefix(fs.prefix())
        .start();
    let body = webhook_batch(&[("fp-full".to_string(), "0".to_string())]);
    fs.fill();
    // Refused up front, with a status Alertmanager retries and the reason, not a 202 for a
    // batch whose every decision would then be refused unrecorded.
    let r = post(&agent, "/api/v1/alertmanager", Some(TOKEN), &body);
    assert_eq!(r.status, 503, "{}", r.text());
    // The API's record of the request is the first write, and it refuses the batch whole.
    assert_eq!(r.json()["outcome"], "audit_failed", "{}", r.text());
    assert!(
        r.text().contains("cannot write the audit log") && r.text().contains("nothing was done"),
        "{}",
        r.text()
    );
    wait_for("the refusal counted", Duration::from_secs(10), || {
        let m = agent.metrics();
        (m.get(
            "gpu_steward_audit_write_errors_total",
            &[("component", "api")],
        ) >= 1.0)
            .then_some(())
    });
    assert_eq!(agent.get("/health").json()["status"], "warn");
    assert!(s.calls().is_empty(), "a hook ran unrecorded");

    // The disk recovers; Alertmanager sends the alert again: it is new, and runs once.
    fs.free();
    let r = post(&agent, "/api/v1/alertmanager", Some(TOKEN), &body);
    assert_eq!(r.status, 202, "{}", r.text());
    wait_for("the hook's call", Duration::from_secs(10), || {
        (s.calls().len() == 1).then_some(())
    });
    let r = post(&agent, "/api/v1/alertmanager", Some(TOKEN), &body);
    assert_eq!(r.status, 202, "{}", r.text());
    let lines = wait_for("the duplicate decision", Duration::from_secs(10), || {
        let l = fs.json_lines("audit.jsonl");
        (l.iter().filter(|r| r["event"] == "decision").count() == 2).then_some(l)
    });
    let decisions: Vec<&Value> = lines.iter().filter(|r| r["event"] == "decision").collect();
    assert_eq!(decisions[0]["decision"], "run");
    assert_eq!(decisions[1]["decision"], "skip");
    let receipts: Vec<&Value> = lines
        .iter()
        .filter(|r| r["event"] == "webhook.received")
        .collect();
    assert_eq!(receipts.len(), 2, "one receipt per accepted batch");
    assert!(receipts.iter().all(|r| r["trigger"] == "webhook"));
    assert!(decisions.iter().all(|r| r["trigger"] == "webhook"));
    assert!(lines
        .iter()
        .filter(|r| r["component"] == "remediation")
        .all(|r| r["trigger"] == "webhook"));
    assert_eq!(receipts[0]["alerts"], 1);
    assert_eq!(receipts[0]["firing"], 1);
    assert_eq!(s.calls().len(), 1);
    assert_eq!(
        agent.get("/health").json()["agent"]["audit"]["status"],
        "ok"
    );
}

#[test]
fn a_rule_on_a_series_the_profile_leaves_out_is_refused_with_its_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("r.yml");
    std::fs::write(
        &rules,
        "groups:\n  - name: node\n    rules:\n      - alert: Hot\n        expr: gpu_steward_temperature_celsius > 85\n      - alert: HotDcgm\n        expr: DCGM_FI_DEV_GPU_TEMP > 85\n",
    )
    .expect("rules");
    let config = dir.path().join("c.toml");
    let check = |text: &str| {
        std::fs::write(&config, text).expect("config");
        let out = Command::new(common::bin())
            .arg("check-config")
            .arg(&config)
            .output()
            .expect("check-config");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // The default (lean) page has the dcgm family's temperature, not the native copy.
    let (code, err) = check("[rules]\nfiles = [\"r.yml\"]\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{}:4:9: rule 'Hot' reads 'gpu_steward_temperature_celsius', which this configuration does not serve",
            rules.display()
        )),
        "{err}"
    );
    assert!(err.contains("profile = \"full\""), "{err}");
    let (code, err) = check("[rules]\nfiles = [\"r.yml\"]\n[metrics]\nprofile = \"full\"\n");
    assert_eq!(code, Some(0), "{err}");
    // With 4.9's names only, the 4.8 name is not served either.
    let (code, err) = check(
        "[rules]\nfiles = [\"r.yml\"]\n[metrics]\nprofile = \"full\"\ndcgm_names = \"4.9\"\n",
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("rule 'HotDcgm' reads 'DCGM_FI_DEV_GPU_TEMP'"),
        "{err}"
    );
}

/// A route runs once per alert (fingerprint, startsAt), a replay after its resolution included,
/// and across a restart (the rails are rebuilt from the audit log): firing, resolved, the same
/// firing again, then the same firing to a restarted agent → the hook ran exactly twice.
#[test]
fn a_firing_replayed_after_its_resolution_does_not_run_the_route_again() {
    let s = Setup::new("groups: []\n");
    let config = api_config(
        &s,
        "[[remediation.routes]]\nmatchers = ['alertname=\"Inject\"']\nhooks = [\"record\"]\n\
         cooldown = \"0s\"\non_resolved = true\n",
    );
    let labels = serde_json::json!({"alertname": "Inject", "gpu": "0"});
    let send = |agent: &Agent, status: &str, decisions: usize| {
        let r = post(
            agent,
            "/api/v1/alertmanager",
            Some(TOKEN),
            &webhook_body(&labels, status),
        );
        assert_eq!(r.status, 202, "{}", r.text());
        wait_for("the decision", Duration::from_secs(10), || {
            (s.audit_events("decision").len() == decisions).then_some(())
        });
    };
    let statuses = |s: &Setup| -> Vec<String> {
        s.calls()
            .iter()
            .map(|c| c["status"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    {
        let agent = Agent::with_scenario(SCENARIO).config(&config).start();
        send(&agent, "firing", 1);
        wait_for("the firing call", Duration::from_secs(10), || {
            (s.calls().len() == 1).then_some(())
        });
        send(&agent, "resolved", 2);
        wait_for("the resolved call", Duration::from_secs(10), || {
            (s.calls().len() == 2).then_some(())
        });
        send(&agent, "firing", 3);
        // A hook the rails let through runs after its decision record: wait for the agent to
        // have ended every run it started before counting.
        let runs = |s: &Setup| {
            s.audit_events("decision")
                .iter()
                .filter(|d| d["decision"] == "run")
                .count()
        };
        wait_for("the hooks to end", Duration::from_secs(10), || {
            (s.audit_events("hook.end").len() >= runs(&s)).then_some(())
        });
        assert_eq!(statuses(&s), ["firing", "resolved"], "{:?}", s.audit());
    }
    // Restarted: the rails come back from the audit log.
    let agent = Agent::with_scenario(SCENARIO).config(&config).start();
    send(&agent, "firing", 4);
    let decisions = s.audit_events("decision");
    let words: Vec<&str> = decisions
        .iter()
        .map(|d| d["decision"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(words, ["run", "run", "skip", "skip"], "{decisions:?}");
    assert_eq!(statuses(&s), ["firing", "resolved"]);
}
