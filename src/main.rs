//! `gpu-steward`: parse the command line, set up logging, run, and turn the outcome into an exit
//! status (0 clean shutdown, 1 runtime failure, 2 bad configuration or usage).

use std::process::ExitCode;

use clap::Parser;

use gpu_steward::cli::{self, Cli, Command, RunArgs, SharingAction};
use gpu_steward::config;
use gpu_steward::{app, demo, logging};

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::CheckConfig { file } => ExitCode::from(cli::check_config::run(&file)),
        Command::Run(args) => run(args),
        Command::Mig(args) => ExitCode::from(cli::mig::run(&args)),
        Command::Sharing { action } => ExitCode::from(match action {
            SharingAction::Show(args) => cli::sharing::run(&args, true),
            SharingAction::Apply { dry_run, args } => cli::sharing::run(&args, dry_run),
        }),
        Command::Demo(mut args) => {
            if args.run.listen.is_none() {
                args.run.listen = config::parse_listen("127.0.0.1:9400").ok();
            }
            if args.run.nvml_lib.is_none() {
                match demo::find_sim() {
                    Ok(p) => args.run.nvml_lib = Some(p.display().to_string()),
                    Err(e) => {
                        eprintln!("gpu-steward: {e}");
                        return ExitCode::from(2);
                    }
                }
            }
            let _guard;
            let scenario = match args.scenario {
                Some(path) if !path.is_file() => {
                    eprintln!("gpu-steward: scenario '{}' does not exist", path.display());
                    return ExitCode::from(2);
                }
                Some(path) => path,
                None => match demo::bundled_scenario() {
                    Ok(g) => {
                        let p = g.path.clone();
                        _guard = g;
                        p
                    }
                    Err(e) => {
                        eprintln!("gpu-steward: {e}");
                        return ExitCode::from(1);
                    }
                },
            };
            // Set before any thread starts: the simulator reads it at nvmlInit_v2.
            std::env::set_var("NVML_SIM_SCENARIO", &scenario);
            run(args.run)
        }
    }
}

fn run(args: RunArgs) -> ExitCode {
    let (path, required) = args.config_path();
    let overrides = args.overrides();
    let config = match config::load(&path, required, &overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let log = logging::init(
        overrides.log_level.clone(),
        config.log_level.as_deref(),
        config.log_format,
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("gpu-steward")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::from(1);
        }
    };
    let source = app::ConfigSource {
        path,
        required,
        overrides,
    };
    match runtime.block_on(app::run(config, source, log)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "gpu-steward stopped");
            ExitCode::from(1)
        }
    }
}
