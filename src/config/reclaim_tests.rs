use std::time::Duration;

use super::*;
use crate::config::{from_text, Overrides};

fn parse(text: &str) -> Result<crate::config::Config, String> {
    from_text("c.toml", text, &Overrides::default()).map_err(|e| e.to_string())
}

fn err(text: &str) -> String {
    parse(text).expect_err("must be rejected")
}

#[test]
fn off_and_dry_run_by_default() {
    let c = parse("").expect("valid");
    assert_eq!(c.reclaim, ReclaimConfig::default());
    assert!(!c.reclaim.enabled && c.reclaim.dry_run);
    assert_eq!(c.reclaim.idle_after, Duration::from_secs(1800));
    assert_eq!(
        c.reclaim.exempt.process_names.matches("nvidia-smi"),
        Some("^nvidia-")
    );
    assert_eq!(
        c.reclaim.exempt.process_names.matches("dcgmi"),
        Some("^dcgm")
    );
    assert!(c.accounting.enabled && c.accounting.state_dir.is_none());
    assert!(
        c.describe("").contains("reclaim: off"),
        "{}",
        c.describe("")
    );
}

#[test]
fn the_issue_keys_parse_as_written() {
    let text = r#"
[reclaim]
enabled = true
dry_run = false
idle_after = "30m"
utilization_threshold = 0.01
min_memory_mib = 256
action = "signal"
grace = "30s"
exempt_process_names = ["^nvidia-", "^dcgm"]
max_reclaims_per_hour = 10
exempt_users = ["root"]
exempt_namespaces = ["kube-system"]
exempt_gpus = ["0", "GPU-abc"]
exempt_pod_labels = ["app=jupyter", "gpu-steward.io/exempt"]
cri_socket = "/var/run/crio/crio.sock"

[reclaim.warn]
command = ["/usr/local/bin/notify", "--idle"]
timeout = "10s"
grace = "5m"

[accounting]
state_dir = "/var/lib/gpu-steward"
persist_every = "1m"
"#;
    let c = parse(text).expect("valid");
    let r = &c.reclaim;
    assert!(r.enabled && !r.dry_run);
    assert_eq!(r.action, ActionKind::Signal);
    assert_eq!(r.grace, Duration::from_secs(30));
    assert_eq!(r.max_reclaims_per_hour, 10);
    assert_eq!(r.exempt.users, ["root"]);
    assert_eq!(r.exempt.gpus, ["0", "GPU-abc"]);
    let labels: Vec<String> = r.exempt.pod_labels.iter().map(|l| l.to_string()).collect();
    assert_eq!(labels, ["app=jupyter", "gpu-steward.io/exempt"]);
    assert_eq!(
        r.cri_socket,
        std::path::Path::new("/var/run/crio/crio.sock")
    );
    let w = r.warn.as_ref().expect("warn");
    assert_eq!(w.grace, Duration::from_secs(300));
    assert_eq!(
        w.hook.as_ref().map(|h| (h.command.len(), h.timeout)),
        Some((2, Duration::from_secs(10)))
    );
    assert_eq!(
        c.accounting.state_dir.as_deref(),
        Some(std::path::Path::new("/var/lib/gpu-steward"))
    );
    let d = c.describe("");
    assert!(
        d.contains("ACTING") && d.contains("SIGKILL after 30s"),
        "{d}"
    );
    assert!(d.contains("/var/lib/gpu-steward/accounting.json"), "{d}");
}

#[test]
fn bad_values_have_positions_and_say_what_to_do() {
    let e = err("[reclaim]\nidle_after = \"soon\"\n");
    assert!(e.starts_with("c.toml:2:14: invalid duration 'soon'"), "{e}");
    let e = err("[reclaim]\nidle_after = \"100ms\"\n");
    assert!(e.contains("shorter than 1s"), "{e}");
    let e = err("[reclaim]\nutilization_threshold = 5\n");
    assert!(e.starts_with("c.toml:2:25:"), "{e}");
    let e = err("[reclaim]\nutilization_threshold = 5.0\n");
    assert!(e.contains("not a ratio; write it from 0 to 1"), "{e}");
    let e = err("[reclaim]\naction = \"kill\"\n");
    assert!(e.starts_with("c.toml:2:10:"), "{e}");
    assert!(e.contains("signal") && e.contains("hook"), "{e}");
    let e = err("[reclaim]\nenabled = true\naction = \"hook\"\n");
    assert!(
        e.starts_with("c.toml:3:10: action 'hook' needs a [reclaim.hook]"),
        "{e}"
    );
    let e = err("[reclaim]\nexempt_process_names = [\"^ok\", \"(unclosed\"]\n");
    assert!(
        e.starts_with("c.toml:2:24: invalid pattern '(unclosed'"),
        "{e}"
    );
    let e = err("[reclaim]\nmin_memory_mib = 0\n");
    assert!(e.starts_with("c.toml:2:18: must be 1 or more"), "{e}");
    let e = err("[reclaim]\ngrace = \"2d\"\n");
    assert!(e.contains("longer than a day"), "{e}");
    let e = err("[reclaim.hook]\ncommand = []\n");
    assert!(e.starts_with("c.toml:2:11: command is empty"), "{e}");
    let e = err("[reclaim.warn]\ncommand = [\"/bin/true\"]\n");
    assert!(e.contains("missing field `grace`"), "{e}");
    let e = err("[reclaim]\nexempt_pods = []\n");
    assert!(
        e.starts_with("c.toml:2:1: unknown field `exempt_pods`"),
        "{e}"
    );
    let e = err("[reclaim]\nexempt_pod_labels = [\"=x\"]\n");
    assert!(
        e.starts_with("c.toml:2:21: invalid pod label selector '=x'"),
        "{e}"
    );
    let e = err("[reclaim]\ncri_socket = \"containerd.sock\"\n");
    assert!(
        e.starts_with("c.toml:2:14: path 'containerd.sock' is not absolute"),
        "{e}"
    );
    let e = err("[accounting]\nstate_dir = \"state\"\n");
    assert!(
        e.starts_with("c.toml:2:13: path 'state' is not absolute"),
        "{e}"
    );
}

#[test]
fn the_hook_action_takes_its_command() {
    let c = parse(
        "[reclaim]\nenabled = true\naction = \"hook\"\n[reclaim.hook]\ncommand = [\"/usr/bin/evict\"]\n",
    )
    .expect("valid");
    assert_eq!(c.reclaim.action, ActionKind::Hook);
    assert_eq!(
        c.reclaim.hook,
        Some(HookCommand {
            command: vec!["/usr/bin/evict".into()],
            timeout: Duration::from_secs(30)
        })
    );
}
