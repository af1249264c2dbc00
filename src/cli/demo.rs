//! `gpu-steward demo`: fills in what the demo defaults (listen on 127.0.0.1:9400, the simulated
//! NVML beside the executable, the bundled 8×H100 scenario) and hands `main` the daemon's
//! arguments. It does not start the daemon: `main` does, as for `run`, with logging.

use super::{DemoArgs, RunArgs};
use crate::{config, demo};

/// Where the demo listens unless told otherwise.
const DEMO_LISTEN: &str = "127.0.0.1:9400";

/// What the daemon runs with.
pub struct Prepared {
    pub run: RunArgs,
    /// The bundled scenario's file, removed when this drops: keep it for the whole run.
    pub scenario: Option<demo::Guard>,
    /// The throwaway state directory (`run.demo_state`), removed when this drops.
    pub state: demo::StateDir,
}

/// The daemon's arguments, or the exit status after saying why there are none: 2 for no
/// simulator, a missing scenario file or one the simulator refuses, 1 when the bundled
/// scenario or the throwaway state directory cannot be written.
pub fn prepare(mut args: DemoArgs) -> Result<Prepared, u8> {
    // Flag > environment > the named config file's `[server] listen` > 127.0.0.1:9400. The
    // config file of the installed agent (/etc/gpu-steward/config.toml) is not read unless
    // named: it would point the demo at the node's audit log, Slurm and hooks.
    let demo_listen = config::parse_listen(DEMO_LISTEN).ok();
    if args.run.config.is_some() {
        args.run.default_listen = demo_listen;
    } else if args.run.listen.is_none() {
        args.run.listen = demo_listen;
    }
    if args.run.nvml_lib.is_none() {
        match demo::find_sim() {
            Ok(p) => args.run.nvml_lib = Some(p.display().to_string()),
            Err(e) => {
                eprintln!("gpu-steward: {e}");
                return Err(2);
            }
        }
    }
    // What the agent keeps in $STATE_DIRECTORY (the journal, accounting) and the audit log go
    // to a throwaway directory: a demo on an installed node must not write the node's.
    let state = match demo::StateDir::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpu-steward: {e}");
            return Err(1);
        }
    };
    // Set before any thread starts.
    std::env::set_var("STATE_DIRECTORY", state.path());
    args.run.demo_state = Some(state.path().to_path_buf());
    let mut guard = None;
    let scenario = match args.scenario {
        Some(path) if !path.is_file() => {
            eprintln!("gpu-steward: scenario '{}' does not exist", path.display());
            return Err(2);
        }
        Some(path) => path,
        None => match demo::bundled_scenario() {
            Ok(g) => {
                let p = g.path.clone();
                guard = Some(g);
                p
            }
            Err(e) => {
                eprintln!("gpu-steward: {e}");
                return Err(1);
            }
        },
    };
    // Set before any thread starts: the simulator reads it at nvmlInit_v2.
    std::env::set_var("NVML_SIM_SCENARIO", &scenario);
    let lib = args.run.nvml_lib.clone().unwrap_or_default();
    if let Err(e) = scenario_loads(&lib, &scenario) {
        eprintln!("gpu-steward: {e}");
        return Err(2);
    }
    // [sharing] runs the stand-in nvidia-smi (compute-policy) of the simulated node, its state
    // beside the scenario. Without it the demo still runs; the time-slice is then unreadable.
    let mut dir = scenario.clone().into_os_string();
    dir.push(".nvidia-smi");
    match demo::stand_in(&lib, std::path::Path::new(&dir)) {
        Ok(p) => args.run.nvidia_smi = Some(p),
        Err(e) => eprintln!("gpu-steward: no stand-in nvidia-smi for the demo: {e}"),
    }
    Ok(Prepared {
        run: args.run,
        scenario: guard,
        state,
    })
}

/// Whether the simulator starts on `scenario`: a scenario it refuses would otherwise leave the
/// demo serving 0 GPUs forever. The simulator has already written its reason, with the
/// scenario's `FILE:LINE:COL`, on stderr; this adds what to do. A scenario that asks for an
/// initialisation error (`[driver] init_error`, to show the agent with NVML down) is a demo too.
fn scenario_loads(lib: &str, scenario: &std::path::Path) -> Result<(), String> {
    let Err(e) = crate::gpu::Session::open(lib) else {
        return Ok(());
    };
    let asks_for_it = std::fs::read_to_string(scenario)
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .is_some_and(|t| t.get("driver").and_then(|d| d.get("init_error")).is_some());
    if asks_for_it {
        return Ok(());
    }
    Err(format!(
        "the simulated node did not start on scenario '{}' ({}): the simulator's line above \
         gives the scenario's FILE:LINE:COL; fix that and run the demo again",
        scenario.display(),
        e.reason
    ))
}

/// The line the demo prints at start: where it writes, so that nobody has to guess whether it
/// touched the node's state.
pub fn where_it_writes(state: &std::path::Path, config: &config::Config) -> String {
    let audit = if config.audit_file == demo::audit_file_in(state) {
        "its audit log there too".to_string()
    } else {
        format!(
            "its audit log '{}' (from the config's [audit] file)",
            config.audit_file.display()
        )
    };
    format!(
        "gpu-steward demo: state (health journal, accounting) in the throwaway directory '{}', \
         removed when the demo stops; {audit}",
        state.display()
    )
}
