//! `gpu-steward`: parse the command line, set up logging, run, and turn the outcome into an exit
//! status (0 clean shutdown, 1 runtime failure, 2 bad configuration or usage).

use std::process::ExitCode;

use clap::Parser;

use gpu_steward::cli::{self, Cli, Command, JobAction, RunArgs, SharingAction};
use gpu_steward::{app, logging, rules};

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if let Some(message) = cli::habits::foreign_listen_flag(&argv) {
        eprintln!("{message}");
        return ExitCode::from(2);
    }
    match Cli::parse().command {
        Command::CheckConfig { file } => ExitCode::from(cli::check_config::run(&file)),
        Command::CheckHealth {
            url,
            socket,
            gpu,
            timeout,
        } => ExitCode::from(cli::check_health::run(
            url.as_deref(),
            socket,
            gpu.as_deref(),
            timeout,
        )),
        Command::Run(args) => run(args),
        Command::Mig(args) => ExitCode::from(cli::mig::run(&args)),
        Command::Status(args) => ExitCode::from(cli::status::run(&args)),
        Command::Job {
            action: JobAction::Report(args),
        } => ExitCode::from(cli::job::run(&args)),
        Command::Sharing { action } => ExitCode::from(match action {
            SharingAction::Show(args) => cli::sharing::run(&args, true),
            SharingAction::Apply { dry_run, args } => cli::sharing::run(&args, dry_run),
        }),
        Command::Demo(args) => match cli::demo::prepare(args) {
            Ok(cli::demo::Prepared {
                run: args,
                scenario: _scenario,
                state: _state,
            }) => run(args),
            Err(code) => ExitCode::from(code),
        },
    }
}

fn run(args: RunArgs) -> ExitCode {
    let (path, required) = args.config_path();
    let overrides = args.overrides();
    if let Err(e) = logging::check_rust_log(overrides.log_level.as_deref()) {
        eprintln!("gpu-steward: {e}");
        return ExitCode::from(2);
    }
    let loaded = match rules::served::load(&path, required, &overrides) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Some(state) = &args.demo_state {
        eprintln!("{}", cli::demo::where_it_writes(state, &loaded.config));
    }
    let log = logging::init(
        overrides.log_level.clone(),
        loaded.config.log_level.as_deref(),
        loaded.config.log_format,
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
    let ran = runtime.block_on(app::run(loaded, source, log));
    // Blocking work still running (a hook in its grace, a hung NVML call) is not waited for past
    // the hook grace, nor past the stop budget counted from SIGTERM (the MIG apply's wait may
    // have used most of it): the stop must fit systemd's TimeoutStopSec (gpu_steward::shutdown).
    runtime.shutdown_timeout(gpu_steward::shutdown::last_wait(
        gpu_steward::shutdown::HOOK_GRACE + std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(1),
    ));
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "gpu-steward stopped");
            ExitCode::from(e.exit_code())
        }
    }
}
