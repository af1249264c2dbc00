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
/// simulator or a missing scenario file, 1 when the bundled scenario cannot be written.
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
    // [sharing] runs the stand-in nvidia-smi (compute-policy) of the simulated node, its state
    // beside the scenario. Without it the demo still runs; the time-slice is then unreadable.
    let mut dir = scenario.clone().into_os_string();
    dir.push(".nvidia-smi");
    let lib = args.run.nvml_lib.clone().unwrap_or_default();
    match demo::stand_in(&lib, std::path::Path::new(&dir)) {
        Ok(p) => args.run.nvidia_smi = Some(p),
        Err(e) => eprintln!("gpu-steward: no stand-in nvidia-smi for the demo: {e}"),
    }
    Ok(Prepared {
        run: args.run,
        scenario: guard,
    })
}
