//! `gpu-steward job report ID`: what a job (or another owner) used of this node's GPUs, asked
//! of the running agent (`GET /api/v1/jobs/...`), as 80-column text or `--json`.
//!
//! The agent is `--url` (`GPU_STEWARD_URL`), else `--socket`, else the `[server] listen` of the
//! local configuration (`--config`, default /etc/gpu-steward/config.toml; an unspecified address
//! is asked on loopback). Exit codes: 0 the report was printed, 1 the agent has no report of
//! this owner (one line on stderr), 2 the agent cannot be asked or answered something else.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::agent_client::{self, Target};
use super::{JobKind, JobReportArgs};
use crate::config::{self, Overrides};
use crate::reclaim::jobs::Report;

/// The agent's API path of the report of `id` of `kind`.
pub fn path(kind: JobKind, id: &str) -> Result<String, String> {
    Ok(match kind {
        JobKind::Slurm => format!("/api/v1/jobs/slurm/{}", segment(id)),
        JobKind::Unit => format!("/api/v1/jobs/unit/{}", segment(id)),
        JobKind::User => format!("/api/v1/jobs/user/{}", segment(id)),
        JobKind::Pod => {
            let (ns, name) = id.split_once('/').ok_or_else(|| {
                format!("'{id}': a pod is NAMESPACE/NAME (or -/UID for a pod known by its UID)")
            })?;
            format!("/api/v1/jobs/pod/{}/{}", segment(ns), segment(name))
        }
    })
}

/// Percent-encodes everything but unreserved characters (RFC 3986 §2.3).
fn segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Where to ask: the flags, else the local config's listen address.
fn target(args: &JobReportArgs) -> Result<Target, String> {
    if args.url.is_some() || args.socket.is_some() {
        return Target::new(args.url.as_deref(), args.socket.clone());
    }
    let (path, required) = match &args.config {
        Some(p) => (p.clone(), true),
        None => (config::DEFAULT_CONFIG.into(), false),
    };
    let c = config::load(&path, required, &Overrides::default())
        .map_err(|e| format!("{e} (or say where the agent is with --url)"))?;
    let mut addr = c.listen;
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        IpAddr::V6(ip) if ip.is_unspecified() => addr.set_ip(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        _ => {}
    }
    Target::new(Some(&format!("http://{addr}")), None)
}

/// Runs the command; the exit status.
pub fn run(args: &JobReportArgs) -> u8 {
    let fail = |e: String| {
        eprintln!("gpu-steward job report: {e}");
        2
    };
    let path = match path(args.kind, &args.id) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let target = match target(args) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let answer = match agent_client::get(&target, &path, args.timeout) {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let body: serde_json::Value = match serde_json::from_slice(&answer.body) {
        Ok(v) => v,
        Err(e) => {
            return fail(format!(
                "{}{path}: answered {} with no JSON ({e}); is it gpu-steward?",
                target.describe(),
                answer.status
            ))
        }
    };
    match answer.status {
        200 => {}
        404 if body["error"].is_string() => {
            eprintln!(
                "gpu-steward job report: {}",
                body["error"].as_str().unwrap_or_default()
            );
            return 1;
        }
        s => {
            return fail(format!(
                "{}{path}: answered {s}: {}",
                target.describe(),
                body["error"].as_str().unwrap_or("(no reason given)")
            ))
        }
    }
    if args.json {
        match serde_json::to_string_pretty(&body) {
            Ok(j) => println!("{j}"),
            Err(e) => return fail(e.to_string()),
        }
        return 0;
    }
    match serde_json::from_value::<Report>(body) {
        Ok(r) => {
            print!("{}", crate::reclaim::jobs::text::render(&r));
            0
        }
        Err(e) => fail(format!(
            "{}{path}: the report is not one this version reads ({e}); try --json",
            target.describe()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_percent_encoded_and_a_pod_needs_its_namespace() {
        assert_eq!(
            path(JobKind::Slurm, "123_4").as_deref(),
            Ok("/api/v1/jobs/slurm/123_4")
        );
        assert_eq!(
            path(JobKind::Unit, "app@1 x.service").as_deref(),
            Ok("/api/v1/jobs/unit/app%401%20x.service")
        );
        assert_eq!(
            path(JobKind::Pod, "ml/trainer-0").as_deref(),
            Ok("/api/v1/jobs/pod/ml/trainer-0")
        );
        assert!(path(JobKind::Pod, "trainer-0").is_err());
        assert_eq!(
            path(JobKind::User, "../x").as_deref(),
            Ok("/api/v1/jobs/user/..%2Fx")
        );
    }
}
