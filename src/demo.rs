//! `gpu-steward demo`: the daemon against the simulated NVML (`libnvml_sim.so`) with a bundled
//! 8×H100 scenario, so that anyone can see the agent work on a machine without a GPU.

use std::path::{Path, PathBuf};

/// The bundled scenario: a DGX H100-like node (same content as `tests/scenarios/dgx-h100.toml`).
pub const DGX_H100: &str = include_str!("../tests/scenarios/dgx-h100.toml");

const SIM_LIB: &str = "libnvml_sim.so";

/// Where the simulator library is looked for, in order.
pub fn sim_candidates(exe: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(dir) = exe.parent() {
        out.push(dir.join(SIM_LIB));
        // `cargo test` runs binaries from target/<profile>/deps.
        if let Some(up) = dir.parent() {
            out.push(up.join(SIM_LIB));
        }
    }
    out.push(PathBuf::from("/usr/lib/gpu-steward").join(SIM_LIB));
    out
}

/// Finds `libnvml_sim.so` beside the executable or where the package installs it.
pub fn find_sim() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate the executable: {e}"))?;
    let candidates = sim_candidates(&exe);
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
            format!(
                "cannot find the simulated NVML library (tried {}); build it with `cargo build \
             --workspace`, or pass --nvml-lib PATH",
                tried.join(", ")
            )
        })
}

pub use tempfile_guard::Guard;

/// Writes the bundled scenario to a private file and returns its path; the file is removed
/// when the returned guard drops.
pub fn bundled_scenario() -> Result<Guard, String> {
    Guard::write(DGX_H100)
}

mod tempfile_guard {
    use std::io::Write;
    use std::path::PathBuf;

    /// A scenario file that lives as long as the demo.
    pub struct Guard {
        pub path: PathBuf,
    }

    impl Guard {
        pub fn write(content: &str) -> Result<Guard, String> {
            let path =
                std::env::temp_dir().join(format!("gpu-steward-demo-{}.toml", std::process::id()));
            let mut f = std::fs::File::create(&path).map_err(|e| {
                format!("cannot write the demo scenario to {}: {e}", path.display())
            })?;
            f.write_all(content.as_bytes()).map_err(|e| {
                format!("cannot write the demo scenario to {}: {e}", path.display())
            })?;
            Ok(Guard { path })
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulator_is_looked_for_beside_the_executable_first() {
        let c = sim_candidates(Path::new("/opt/x/target/release/gpu-steward"));
        assert_eq!(
            c,
            vec![
                PathBuf::from("/opt/x/target/release/libnvml_sim.so"),
                PathBuf::from("/opt/x/target/libnvml_sim.so"),
                PathBuf::from("/usr/lib/gpu-steward/libnvml_sim.so"),
            ]
        );
    }

    #[test]
    fn the_bundled_scenario_is_the_eight_gpu_node() {
        assert_eq!(DGX_H100.matches("[[gpu]]").count(), 8);
        let g = bundled_scenario().expect("written");
        assert_eq!(std::fs::read_to_string(&g.path).expect("read"), DGX_H100);
        let path = g.path.clone();
        drop(g);
        assert!(!path.exists(), "removed when the demo ends");
    }
}
