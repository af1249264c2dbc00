//! `gpu-steward`: parse the command line, set up logging, run, and turn the outcome into an exit
//! status (0 clean shutdown, 1 runtime failure, 2 bad configuration or usage).

use std::process::ExitCode;

use clap::Parser;

use gpu_steward::cli::{Cli, Command, RunArgs, SharingAction, SharingArgs};
use gpu_steward::config::{self, Overrides};
use gpu_steward::{app, demo, logging};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => match config::load(&file, true, &Overrides::default()) {
            Ok(c) => {
                let web = c
                    .web_config_file
                    .as_ref()
                    .map(|f| gpu_steward::http::web_config::load(f));
                if let Some(Err(e)) = web {
                    eprintln!("{e}");
                    return ExitCode::from(2);
                }
                print!("{}: valid\n{}", file.display(), c.describe());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        },
        Command::Run(args) => run(args),
        Command::Mig(args) => ExitCode::from(gpu_steward::mig::cli::run(&args)),
        Command::Sharing { action } => match action {
            SharingAction::Show(args) => sharing(args, true),
            SharingAction::Apply { dry_run, args } => sharing(args, dry_run),
        },
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

/// `gpu-steward sharing show|apply`: 0 when the node matches (or the plan was made), 1 when it
/// does not, 2 for a bad configuration.
fn sharing(args: SharingArgs, dry_run: bool) -> ExitCode {
    let (path, required) = match &args.config {
        Some(p) => (p.clone(), true),
        None => (std::path::PathBuf::from(config::DEFAULT_CONFIG), false),
    };
    let overrides = Overrides {
        nvml_lib: args.nvml_lib.clone(),
        ..Overrides::default()
    };
    let config = match config::load(&path, required, &overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let audit = if dry_run {
        None
    } else {
        match gpu_steward::audit::AuditLog::open(&config.audit_file) {
            Ok(a) => Some(a),
            Err(e) => {
                eprintln!(
                    "gpu-steward: cannot open the audit log: {e}; nothing was changed (set [audit] \
                     file to a writable path)"
                );
                return ExitCode::from(1);
            }
        }
    };
    let report = gpu_steward::sharing::apply::run(
        &config.sharing,
        &config.nvml_lib,
        audit.as_ref(),
        dry_run,
        "cli",
    );
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(j) => println!("{j}"),
            Err(e) => eprintln!("gpu-steward: {e}"),
        }
    } else {
        print!("{}", report.render_text());
        if let Some(ts) = &config.sharing.time_slicing {
            for r in &ts.resources {
                println!(
                    "resource {} advertised as {} x{} per GPU",
                    r.name,
                    ts.advertised_name(r),
                    r.replicas
                );
            }
        }
    }
    if report.audit_failed {
        // Said on stderr too, where --json output or a pipe would not hide it.
        if let Some(e) = &report.error {
            eprintln!("gpu-steward: sharing apply refused: {e}");
        }
    }
    if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
