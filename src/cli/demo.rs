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
}

/// The daemon's arguments, or the exit status after saying why there are none: 2 for no
/// simulator, a missing scenario file or one the simulator refuses, 1 when the bundled
/// scenario cannot be written.
pub fn prepare(mut args: DemoArgs) -> Result<Prepared, u8> {
    // Flag > environment > the named config file's `[server] listen` > 127.0.0.1:9400. The
    // config file read without being named (/etc/gpu-steward/config.toml, the installed agent's)
    // does not move the demo off loopback.
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
