//! Stamps the build with its source revision for `gpu_steward_build_info{revision}`:
//! `GPU_STEWARD_REVISION` from the environment (for builds without a git checkout, e.g. a
//! container build with `--build-arg`), else `git rev-parse --short=12 HEAD`, else "unknown"
//! (decided in src/metrics/agent.rs).
//!
//! Release builds on Linux also link with `link/hot-text.ld`, which gathers the functions the
//! daemon runs into one contiguous `.text.hot` section, so that the kernel maps 2 MiB of the
//! executable instead of 7 (BENCHMARKS.md, "Memory against the NVML floor"; regenerate the file
//! with `benches/hot_text.py`). `GPU_STEWARD_HOT_TEXT=0` links without it;
//! `GPU_STEWARD_LINK_MAP=FILE` writes the linker's map (the generator reads it);
//! `GPU_STEWARD_RELR=1` packs relative relocations (needs glibc 2.36 at run time).

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    link_layout();
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

/// The release link: the hot-text script and, on request, the linker's map. Only the `bin`
/// target links with them (`cargo:rustc-link-arg-bins`); tests and benches are debug builds.
fn link_layout() {
    println!("cargo:rerun-if-env-changed=GPU_STEWARD_HOT_TEXT");
    println!("cargo:rerun-if-env-changed=GPU_STEWARD_LINK_MAP");
    println!("cargo:rerun-if-env-changed=GPU_STEWARD_RELR");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    if env("PROFILE") != "release" || env("CARGO_CFG_TARGET_OS") != "linux" {
        return;
    }
    // The script is an `INSERT BEFORE .text` fragment: GNU ld and lld (Rust's default linker on
    // x86_64 Linux since 1.90) both add it to their built-in layout (checked with both).
    let script = Path::new(&env("CARGO_MANIFEST_DIR")).join("link/hot-text.ld");
    println!("cargo:rerun-if-changed={}", script.display());
    // gold and mold do not take `INSERT`: a build that asks for them links without the layout.
    let flags = env("CARGO_ENCODED_RUSTFLAGS");
    let other_linker = ["fuse-ld=gold", "fuse-ld=mold", "ld.gold", "mold"]
        .iter()
        .any(|l| flags.contains(l));
    if env("GPU_STEWARD_HOT_TEXT") != "0" && !other_linker && script.exists() {
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{}", script.display());
    }
    // Packed relative relocations (DT_RELR): the dynamic loader reads a few KiB instead of the
    // ~640 KiB `.rela.dyn` at start, and those pages leave the RSS. The binary then needs glibc
    // 2.36 or newer (Debian 12, Ubuntu 24.04, RHEL 10), so it is for builds that ship their own
    // runtime (the container image) or run where they are built; off by default.
    if env("GPU_STEWARD_RELR") == "1" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    let map = env("GPU_STEWARD_LINK_MAP");
    if !map.is_empty() {
        // Mangled names in the map: the generator matches them against valgrind's.
        println!("cargo:rustc-link-arg-bins=-Wl,-Map,{map}");
        println!("cargo:rustc-link-arg-bins=-Wl,--no-demangle");
    }
}
