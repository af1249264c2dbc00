//! Stamps the build with its source revision for `gpu_steward_build_info{revision}`:
//! `GPU_STEWARD_REVISION` from the environment (for builds without a git checkout, e.g. a
//! container build with `--build-arg`), else `git rev-parse --short=12 HEAD`, else "unknown"
//! (decided in src/metrics/agent.rs).

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=GPU_STEWARD_REVISION");
    let revision = std::env::var("GPU_STEWARD_REVISION")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    if let Some(r) = revision {
        println!("cargo:rustc-env=GPU_STEWARD_REVISION={r}");
    }
    // Rebuild the stamp when HEAD moves; only name paths that exist (a missing one would make
    // cargo rerun this script on every build).
    for rel in ["HEAD", "refs/heads", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", rel]) {
            if Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
}
