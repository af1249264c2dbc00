//! `gpu-steward demo`: the daemon against the simulated NVML (`libnvml_sim.so`) with a bundled
//! 8×H100 scenario, so that anyone can see the agent work on a machine without a GPU.

use std::path::{Path, PathBuf};

/// The bundled scenario: a DGX H100-like node with NVLink (`tests/scenarios/demo.toml`: the GPUs
/// and work of `dgx-h100.toml` on an HGX baseboard).
pub const DEMO_NODE: &str = include_str!("../tests/scenarios/demo.toml");

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
    first_file(&sim_candidates(&exe)).map_err(|tried| {
        format!(
            "cannot find the simulated NVML library (tried {tried}); build it with `cargo build \
             --workspace`, or pass --nvml-lib PATH"
        )
    })
}

/// The first of `candidates` that is a file; else the list of what was tried.
fn first_file(candidates: &[PathBuf]) -> Result<PathBuf, String> {
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
            tried.join(", ")
        })
}

/// The stand-in `nvidia-smi` (compute-policy only) of the simulated node.
const STAND_IN: &str = "nvidia-smi-sim";

/// Finds the stand-in `nvidia-smi` beside the simulator, where the package installs it, or in
/// this source tree (a `cargo build`).
pub fn find_stand_in(sim: &Path) -> Result<PathBuf, String> {
    let mut candidates: Vec<PathBuf> = sim.parent().map(|d| d.join(STAND_IN)).into_iter().collect();
    candidates.push(PathBuf::from("/usr/lib/gpu-steward").join(STAND_IN));
    candidates.push(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("nvml-sim")
            .join(STAND_IN),
    );
    first_file(&candidates)
        .map_err(|tried| format!("cannot find the stand-in nvidia-smi (tried {tried})"))
}

/// A one-shot command (`mig`, `sharing`) run on the simulated node of a scenario file.
pub struct Simulated {
    /// The simulator library to load.
    pub nvml_lib: String,
    /// Where the stand-in nvidia-smi keeps its state (`<scenario>.nvidia-smi/`).
    pub stand_in_dir: PathBuf,
}

/// Points this process at the simulated node of `scenario`: the simulator (unless `nvml_lib`
/// names a library), `NVML_SIM_SCENARIO`, and an implicit state file `<scenario>.state`
/// (unless `NVML_SIM_STATE` is set), so that MIG changes persist from one command to the next as
/// on a real node. Call before any thread starts.
pub fn simulate(scenario: &Path, nvml_lib: Option<&str>) -> Result<Simulated, String> {
    if !scenario.is_file() {
        return Err(format!("scenario '{}' does not exist", scenario.display()));
    }
    let scenario = scenario
        .canonicalize()
        .map_err(|e| format!("scenario '{}': {e}", scenario.display()))?;
    let nvml_lib = match nvml_lib {
        Some(l) => l.to_string(),
        None => find_sim()?.display().to_string(),
    };
    let with = |suffix: &str| {
        let mut name = scenario.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    std::env::set_var("NVML_SIM_SCENARIO", &scenario);
    if std::env::var_os("NVML_SIM_STATE").is_none() {
        std::env::set_var("NVML_SIM_STATE", with(".state"));
    }
    let stand_in_dir = with(".nvidia-smi");
    std::env::set_var("NVIDIA_SMI_SIM_DIR", &stand_in_dir);
    Ok(Simulated {
        nvml_lib,
        stand_in_dir,
    })
}

/// Gets the stand-in nvidia-smi ready for the simulated node loaded from `nvml_lib` (the
/// scenario in `NVML_SIM_SCENARIO`): its state in `dir` (`NVIDIA_SMI_SIM_DIR`), told the node's
/// GPUs by UUID in index order for its compute-policy table. Returns the stand-in's path.
pub fn stand_in(nvml_lib: &str, dir: &Path) -> Result<PathBuf, String> {
    let path = find_stand_in(Path::new(nvml_lib))?;
    let session = crate::gpu::Session::open(nvml_lib).map_err(|e| e.reason)?;
    let gpus = session
        .compute_modes()
        .map_err(|c| format!("cannot list the simulated GPUs: NVML answered {c}"))?;
    let uuids: String = gpus.iter().map(|g| format!("{}\n", g.uuid)).collect();
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(dir.join("uuids"), uuids))
        .map_err(|e| format!("cannot prepare '{}': {e}", dir.display()))?;
    std::env::set_var("NVIDIA_SMI_SIM_DIR", dir);
    Ok(path)
}

pub use tempfile_guard::Guard;

/// The audit log in a simulated node's state directory.
pub fn audit_file_in(state: &Path) -> PathBuf {
    state.join("audit.jsonl")
}

/// The demo's throwaway state directory: private (0700), in the temporary directory, removed
/// with what is in it when this drops. The demo keeps there what the agent keeps in
/// `$STATE_DIRECTORY` (the health journal, accounting) and its audit log, never in the node's.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
}

impl StateDir {
    /// Makes a new directory (`gpu-steward-demo-PID-N`; never one that exists).
    pub fn new() -> Result<StateDir, String> {
        use std::os::unix::fs::DirBuilderExt as _;
        let (path, ()) = first_free("", "make the demo's state directory", |p| {
            std::fs::DirBuilder::new().mode(0o700).create(p)
        })?;
        Ok(StateDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Makes the first of `gpu-steward-demo-PID-N<suffix>` (N from 0) in the temporary directory
/// that does not exist yet with `make`, which must refuse an existing name (`AlreadyExists`);
/// `what` says in an error what could not be done.
fn first_free<T>(
    suffix: &str,
    what: &str,
    mut make: impl FnMut(&Path) -> std::io::Result<T>,
) -> Result<(PathBuf, T), String> {
    let tmp = std::env::temp_dir();
    for n in 0..100u32 {
        let path = tmp.join(format!(
            "gpu-steward-demo-{}-{n}{suffix}",
            std::process::id()
        ));
        match make(&path) {
            Ok(made) => return Ok((path, made)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot {what} '{}': {e}", path.display())),
        }
    }
    Err(format!(
        "cannot {what} in '{}': 100 names taken",
        tmp.display()
    ))
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Where a one-shot command on the simulated node of `scenario` keeps its audit log (and the
/// MIG lock and intent beside it) when the config names none: `<scenario>.steward/`, beside
/// the simulated driver's `<scenario>.state`, never the node's `/var/lib/gpu-steward`.
/// Returns the audit log's path, the directory made (0700) if missing.
pub fn scenario_audit_file(scenario: &Path) -> Result<PathBuf, String> {
    let mut dir = scenario.as_os_str().to_owned();
    dir.push(".steward");
    let dir = PathBuf::from(dir);
    if !dir.is_dir() {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot make '{}': {e}", dir.display()))?;
    }
    Ok(audit_file_in(&dir))
}

/// The audit log a one-shot command on the simulated node of `scenario` uses: the named
/// config's `[audit] file` when it sets one, else [`scenario_audit_file`]. `named`: whether the
/// config was given (`--config`); the installed agent's, read unnamed, never points a simulated
/// command at the node's audit log.
pub fn simulated_audit_file(
    scenario: &Path,
    named: bool,
    configured: &Path,
) -> Result<Option<PathBuf>, String> {
    if named && configured != Path::new(crate::config::DEFAULT_AUDIT_FILE) {
        return Ok(None);
    }
    scenario_audit_file(scenario).map(Some)
}

/// Writes the bundled scenario to a private file and returns its path; the file is removed
/// when the returned guard drops.
pub fn bundled_scenario() -> Result<Guard, String> {
    Guard::write(DEMO_NODE)
}

mod tempfile_guard {
    use std::io::Write;
    use std::path::PathBuf;

    /// A scenario file that lives as long as the demo.
    pub struct Guard {
        pub path: PathBuf,
    }

    impl Guard {
        /// Writes `content` to a new file, `gpu-steward-demo-PID-N.toml` in the temporary
        /// directory: never one that exists (a killed demo's, or a link another user planted
        /// there: `O_EXCL` does not follow it), readable by this user only.
        pub fn write(content: &str) -> Result<Guard, String> {
            use std::os::unix::fs::OpenOptionsExt as _;
            let what = "write the demo scenario";
            let (path, mut f) = super::first_free(".toml", what, |p| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(p)
            })?;
            if let Err(e) = f.write_all(content.as_bytes()) {
                let _ = std::fs::remove_file(&path);
                return Err(format!("cannot {what} '{}': {e}", path.display()));
            }
            Ok(Guard { path })
        }
    }

    impl Drop for Guard {
        /// Removes the scenario and the stand-in nvidia-smi's state beside it.
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
            let mut dir = self.path.clone().into_os_string();
            dir.push(".nvidia-smi");
            let _ = std::fs::remove_dir_all(dir);
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
        assert_eq!(DEMO_NODE.matches("[[gpu]]").count(), 8);
        // A file left at the first name (a killed demo's, another user's) is passed over.
        let taken =
            std::env::temp_dir().join(format!("gpu-steward-demo-{}-0.toml", std::process::id()));
        let _ = std::fs::write(&taken, "not ours");
        let g = bundled_scenario().expect("written");
        assert_ne!(g.path, taken);
        assert_eq!(
            std::fs::read_to_string(&taken).expect("left alone"),
            "not ours"
        );
        let _ = std::fs::remove_file(&taken);
        assert_eq!(std::fs::read_to_string(&g.path).expect("read"), DEMO_NODE);
        let path = g.path.clone();
        drop(g);
        assert!(!path.exists(), "removed when the demo ends");
    }
}
