//! `gpu-steward check-health`: a node-problem-detector custom plugin. It asks the running agent
//! (`GET /health/gpus`, or `/health/gpus/{gpu}`) over HTTP or the API's Unix socket, so the
//! node keeps one health evaluation and one NVML reader; it never opens NVML itself.
//!
//! NPD's contract (`config/plugin/...`, `pkg/custompluginmonitor/types`): exit 0 when the
//! condition is fine (every GPU passes or warns), 1 when it is not (a GPU fails), 2 when it
//! cannot tell (the agent cannot be reached, times out, or answers garbage); one line on
//! stdout, which NPD puts in the condition's message, kept under 256 characters and naming the
//! GPU, the condition and the recommended action.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::agent_client::{self, Target};
use crate::terminal::escape;

/// NPD's exit statuses.
pub const OK: u8 = 0;
pub const NON_OK: u8 = 1;
pub const UNKNOWN: u8 = 2;

/// The longest line printed (NPD's `max_output_length` in the shipped config is 255).
pub const MAX_LINE: usize = 255;

/// Runs the check; prints its one line and returns the exit status.
pub fn run(
    target: Option<&str>,
    socket: Option<PathBuf>,
    gpu: Option<&str>,
    timeout: Duration,
) -> u8 {
    let (code, line) = check(target, socket, gpu, timeout);
    println!("{}", clip(&line));
    code
}

/// The line cut to [`MAX_LINE`] bytes at a character boundary, on one line.
pub fn clip(line: &str) -> String {
    let one: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one.len() <= MAX_LINE {
        return one;
    }
    let mut end = MAX_LINE - '…'.len_utf8();
    while !one.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &one[..end])
}

fn check(
    url: Option<&str>,
    socket: Option<PathBuf>,
    gpu: Option<&str>,
    timeout: Duration,
) -> (u8, String) {
    let target = match (url, socket) {
        (Some(_), Some(_)) => {
            return (UNKNOWN, "give --url or --socket, not both".into());
        }
        (url, socket) => match url
            .map_or(Ok(()), agent_address_only)
            .and(Target::new(url, socket))
        {
            Ok(t) => t,
            Err(e) => return (UNKNOWN, e),
        },
    };
    let path = match gpu {
        None => "/health/gpus".to_string(),
        Some(id) if valid_gpu(id) => format!("/health/gpus/{id}"),
        Some(id) => {
            return (
                UNKNOWN,
                format!("invalid --gpu '{id}'; give an index (0, 1, ...) or a UUID (GPU-...)"),
            )
        }
    };
    let where_ = target.describe();
    let (status, body) = match agent_client::get(&target, &path, timeout) {
        Ok(a) => (a.status, a.body),
        Err(e) => return (UNKNOWN, cannot_ask(&target, &path, &e)),
    };
    if status == 404 && gpu.is_some() {
        let why = String::from_utf8_lossy(&body);
        return (UNKNOWN, format!("agent: {}", why.trim()));
    }
    if status != 200 && status != 503 {
        return (
            UNKNOWN,
            format!("the agent at {where_} answered HTTP {status} to {path}"),
        );
    }
    let Ok(json) = serde_json::from_slice::<Value>(&body) else {
        return (
            UNKNOWN,
            format!("the agent at {where_} answered {path} with no JSON"),
        );
    };
    match verdict(&json, gpu) {
        Some(v) => v,
        None => (
            UNKNOWN,
            format!("the agent at {where_} answered {path} with JSON of another shape"),
        ),
    }
}

/// Only what `/health/gpus/{gpu}` takes, so nothing else reaches the request line.
fn valid_gpu(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// `--url` names the agent, not a page: a path other than the health one would be silently
/// replaced by `/health/gpus`, so it is refused with what to write instead. `status` uses it too.
pub(crate) fn agent_address_only(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or(url);
    let path = rest.find(['/', '?']).map_or("", |i| &rest[i..]);
    if matches!(path, "" | "/" | "/health/gpus" | "/health/gpus/") {
        return Ok(());
    }
    let base = &url[..url.len() - path.len()];
    Err(format!(
        "--url '{}' names the path '{}'; give the agent's address only, like '{}' \
         (the commands ask their own paths)",
        escape(url),
        escape(path),
        escape(base)
    ))
}

/// Why the agent could not be asked, always with the URL that was tried (some errors, such as
/// a host that does not resolve, do not carry it).
fn cannot_ask(target: &Target, path: &str, e: &str) -> String {
    let tried = format!("{}{path}", target.describe());
    let why = e
        .strip_prefix(&tried)
        .map_or(e, |r| r.trim_start_matches(':').trim_start());
    format!("cannot ask the agent at {tried}: {why}")
}

/// One GPU's check, as `/health/gpus` writes it.
struct Check<'a> {
    gpu: String,
    uuid: &'a str,
    /// The model without `NVIDIA `, when the agent has read it.
    model: Option<&'a str>,
    status: &'a str,
    action: &'a str,
    conditions: Vec<(&'a str, &'a str, &'a str)>,
}

fn read_check<'a>(key: &str, c: &'a Value) -> Option<Check<'a>> {
    let conditions = c
        .get("conditions")?
        .as_array()?
        .iter()
        .map(|x| {
            Some((
                x.get("name")?.as_str()?,
                x.get("severity")?.as_str()?,
                x.get("reason")?.as_str()?,
            ))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Check {
        gpu: key.strip_prefix("gpu:").unwrap_or(key).to_string(),
        uuid: c.get("componentId")?.as_str()?,
        model: c
            .get("name")
            .and_then(Value::as_str)
            .map(|m| m.trim_start_matches("NVIDIA "))
            .filter(|m| !m.is_empty()),
        status: c.get("status")?.as_str()?,
        action: c.get("action")?.as_str()?,
        conditions,
    })
}

/// The exit status and line for the agent's answer; `None` when it is not of the expected shape.
fn verdict(json: &Value, gpu: Option<&str>) -> Option<(u8, String)> {
    let one = gpu.is_some();
    let mut checks = Vec::new();
    if let Some(asked) = gpu {
        let key = json.get("componentId")?.as_str()?;
        checks.push(read_check(key, json)?);
        // The single GPU answer has no index: the one asked for when it was one, else the UUID.
        checks[0].gpu = if asked.parse::<u32>().is_ok() {
            asked.to_string()
        } else {
            String::new()
        };
    } else {
        let status = json.get("status")?.as_str()?;
        let map = json.get("checks")?.as_object()?;
        if map.is_empty() {
            // NVML down, or no GPU: the agent says so in `output`.
            let why = json.get("output")?.as_str()?;
            return Some(if status == "fail" {
                (
                    NON_OK,
                    format!("node: {why}; action: check the NVIDIA driver (nvidia-smi)"),
                )
            } else {
                (UNKNOWN, format!("agent: {why}"))
            });
        }
        for (key, list) in map {
            checks.push(read_check(key, list.as_array()?.first()?)?);
        }
    }
    // `GPU 3 (GPU-…, H100 80GB HBM3)`; a GPU lost before it was ever read has no UUID.
    let name = |c: &Check| {
        let uuid = if c.uuid.is_empty() {
            "uuid unknown"
        } else {
            c.uuid
        };
        let about = match c.model {
            Some(m) => format!("{uuid}, {m}"),
            None => uuid.to_string(),
        };
        if c.gpu.is_empty() {
            format!("GPU {about}")
        } else {
            format!("GPU {} ({about})", c.gpu)
        }
    };
    let describe = |c: &Check, severity: &str| {
        let conds: Vec<String> = c
            .conditions
            .iter()
            .filter(|(_, s, _)| *s == severity)
            .map(|(n, _, r)| format!("{n} ({r})"))
            .collect();
        conds.join(", ")
    };
    let failing: Vec<&Check> = checks.iter().filter(|c| c.status == "fail").collect();
    if let Some(first) = failing.first() {
        let more = match failing.len() - 1 {
            0 => String::new(),
            n => format!(" [+{n} more GPU(s) failing]"),
        };
        // Action first so that clipping never cuts it off.
        return Some((
            NON_OK,
            format!(
                "{} fails, action {}{more}: {}",
                name(first),
                first.action,
                describe(first, "fail")
            ),
        ));
    }
    let warning: Vec<&Check> = checks.iter().filter(|c| c.status == "warn").collect();
    Some((
        OK,
        match warning.first() {
            None if one => format!("{} passes", name(&checks[0])),
            None => format!("all {} GPUs pass", checks.len()),
            Some(w) => format!(
                "no GPU fails; {} warns, action {}: {}{}",
                name(w),
                w.action,
                describe(w, "warn"),
                match warning.len() - 1 {
                    0 => String::new(),
                    n => format!(" [+{n} more warning]"),
                }
            ),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gpu(status: &str, action: &str, conds: &[(&str, &str, &str)]) -> Value {
        json!([{
            "componentId": "GPU-x", "componentType": "gpu", "status": status, "action": action,
            "conditions": conds.iter().map(|(n, s, r)| json!({"name": n, "severity": s, "reason": r, "action": action, "since": "t"})).collect::<Vec<_>>(),
        }])
    }

    #[test]
    fn a_failing_gpu_is_named_with_its_condition_and_action() {
        let body = json!({"status": "fail", "checks": {
            "gpu:0": gpu("pass", "none", &[]),
            "gpu:3": gpu("fail", "reset_gpu", &[("xid_48", "fail", "XID 48: double-bit ECC"), ("thermal_slowdown", "warn", "hot")]),
        }});
        let (code, line) = verdict(&body, None).expect("shape");
        assert_eq!(code, NON_OK);
        assert_eq!(
            line,
            "GPU 3 (GPU-x) fails, action reset_gpu: xid_48 (XID 48: double-bit ECC)"
        );
        let body = json!({"status": "warn", "checks": {
            "gpu:0": gpu("warn", "none", &[("thermal_slowdown", "warn", "HW slowdown")]),
            "gpu:1": gpu("pass", "none", &[]),
        }});
        let (code, line) = verdict(&body, None).expect("shape");
        assert_eq!(
            (code, line.as_str()),
            (
                OK,
                "no GPU fails; GPU 0 (GPU-x) warns, action none: thermal_slowdown (HW slowdown)"
            )
        );
        let body = json!({"status": "fail", "checks": {}, "output": "NVML is not initialised"});
        assert_eq!(verdict(&body, None).expect("shape").0, NON_OK);
        assert_eq!(verdict(&json!({"status": "pass"}), None), None);
        assert_eq!(verdict(&json!([1, 2]), None), None);
    }

    #[test]
    fn a_gpu_is_named_by_index_uuid_and_model_and_never_by_an_empty_name() {
        let mut lost = gpu("fail", "reboot_node", &[("gpu_lost", "fail", "lost")]);
        lost[0]["componentId"] = json!("");
        let body = json!({"status": "fail", "checks": {"gpu:0": lost}});
        let (_, line) = verdict(&body, None).expect("shape");
        assert_eq!(
            line,
            "GPU 0 (uuid unknown) fails, action reboot_node: gpu_lost (lost)"
        );
        let mut one = gpu("fail", "reset_gpu", &[("ecc_dbe", "fail", "1 DBE")])[0].clone();
        one["name"] = json!("NVIDIA H200");
        let (_, line) = verdict(&one, Some("0")).expect("shape");
        assert_eq!(
            line,
            "GPU 0 (GPU-x, H200) fails, action reset_gpu: ecc_dbe (1 DBE)"
        );
        let (_, line) = verdict(&one, Some("GPU-x")).expect("shape");
        assert!(line.starts_with("GPU GPU-x, H200 fails"), "{line}");
    }

    #[test]
    fn a_url_with_a_page_path_is_refused_and_an_unreachable_one_is_named() {
        assert_eq!(agent_address_only("http://127.0.0.1:9400"), Ok(()));
        assert_eq!(agent_address_only("http://127.0.0.1:9400/"), Ok(()));
        assert_eq!(agent_address_only("http://h:1/health/gpus"), Ok(()));
        let e = agent_address_only("http://127.0.0.1:9400/metrics").expect_err("refused");
        assert!(
            e.contains("'/metrics'") && e.contains("like 'http://127.0.0.1:9400'"),
            "{e}"
        );
        let (code, line) = check(
            Some("http://no-such-host.invalid:9400"),
            None,
            None,
            Duration::from_secs(2),
        );
        assert_eq!(code, UNKNOWN);
        assert!(
            line.starts_with(
                "cannot ask the agent at http://no-such-host.invalid:9400/health/gpus: "
            ),
            "{line}"
        );
    }

    #[test]
    fn lines_are_clipped_to_one_short_line() {
        let long = format!("GPU 0 fails, action reset_gpu: {}\nsecond", "é".repeat(300));
        let c = clip(&long);
        assert!(
            c.len() <= MAX_LINE && !c.contains('\n') && c.ends_with('…'),
            "{c}"
        );
        assert_eq!(clip("short"), "short");
    }

    #[test]
    fn only_a_gpu_id_reaches_the_request_line() {
        assert!(!valid_gpu("0 HTTP/1.1\r\n") && valid_gpu("GPU-1234-ab") && valid_gpu("3"));
    }
}
