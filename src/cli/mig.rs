//! `gpu-steward mig show|plan|apply`: one NVML session, one observe, one plan, at most one
//! apply. Exit codes: 0 done or nothing to do, 2 bad input or an infeasible layout (nothing
//! changed), 1 anything that kept the layout from being reached (a refusal, a failed step with
//! the found layout restored or what is left printed, a mode change waiting for a GPU reset, a
//! failed post-apply hook).

use std::path::PathBuf;

use super::{MigArgs, MigCommand};
use crate::changes::{MigApply, MigFailed};
use crate::config::mig::read_mig_parted;
use crate::config::mig_layout::Layouts;
use crate::config::{self, Config, Overrides};
use crate::gpu::Session;
use crate::mig::apply::{self, ApplyError, Outcome};
use crate::mig::intent::LOCK_WAIT;
use crate::mig::plan::plan;
use crate::mig::show;

/// Runs the command; the exit status.
pub fn run(args: &MigArgs) -> u8 {
    match run_inner(args) {
        Ok(()) => 0,
        Err((code, message)) => {
            // The same prefix as `gpu-steward sharing`: the command that speaks.
            eprintln!("gpu-steward mig: {}", message.trim_end());
            code
        }
    }
}

type Failure = (u8, String);

/// Writes to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn out(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn load_config(args: &MigArgs) -> Result<Config, Failure> {
    let (path, required) = match &args.config {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(config::DEFAULT_CONFIG), false),
    };
    let overrides = Overrides {
        nvml_lib: args.nvml_lib.clone(),
        ..Overrides::default()
    };
    config::load(&path, required, &overrides).map_err(|e| (2, e.to_string()))
}

/// The layouts: `--mig-config` alone when given, else the config's.
fn layouts(args: &MigArgs, cfg: &Config) -> Result<Layouts, Failure> {
    match &args.mig_config {
        Some(f) => read_mig_parted(f).map_err(|e| (2, e.to_string())),
        None => Ok(cfg.mig.all_layouts()),
    }
}

/// Where the layouts were looked for, for an error that names it.
fn where_layouts(args: &MigArgs, cfg: &Config) -> String {
    match (&args.mig_config, &cfg.file) {
        (Some(f), _) => format!("--mig-config '{}'", f.display()),
        (None, Some(f)) => format!("the config '{}'", f.display()),
        (None, None) => format!(
            "the built-in defaults (no config file: '{}' does not exist; give one with --config)",
            config::DEFAULT_CONFIG
        ),
    }
}

fn run_inner(args: &MigArgs) -> Result<(), Failure> {
    let mut cfg = load_config(args)?;
    if let Some(scenario) = &args.scenario {
        let sim = crate::demo::simulate(scenario, args.nvml_lib.as_deref()).map_err(|e| (2, e))?;
        cfg.nvml_lib = sim.nvml_lib;
        // An apply's audit log (and the MIG lock and intent beside it) of the simulated node,
        // unless the named config sets one: never the node's own.
        let applies = matches!(args.command, MigCommand::Apply { dry_run: false, .. });
        let audit = match applies {
            true => {
                crate::demo::simulated_audit_file(scenario, args.config.is_some(), &cfg.audit_file)
                    .map_err(|e| (2, e))?
            }
            false => None,
        };
        if let Some(audit) = audit {
            eprintln!(
                "gpu-steward mig: simulated node: audit log '{}'",
                audit.display()
            );
            cfg.audit_file = audit;
        }
    }
    let layouts = match &args.command {
        MigCommand::Show { .. } => Layouts::new(),
        _ => layouts(args, &cfg)?,
    };
    let pick = |name: &str| {
        layouts.get(name).cloned().ok_or_else(|| {
            let known: Vec<&str> = layouts.keys().map(String::as_str).collect();
            (
                2,
                format!(
                    "layout '{name}' is not defined in {}; known layouts: {}",
                    where_layouts(args, &cfg),
                    if known.is_empty() {
                        "none (define [mig.layouts.NAME] or [mig] mig_config in the config, or \
                         pass --mig-config FILE, a mig-parted YAML file)"
                            .into()
                    } else {
                        known.join(", ")
                    }
                ),
            )
        })
    };
    // Validate the input before touching NVML.
    let chosen = match &args.command {
        MigCommand::Show { .. } => None,
        MigCommand::Plan { layout } | MigCommand::Apply { layout, .. } => {
            Some((layout.clone(), pick(layout)?))
        }
    };
    if let (MigCommand::Apply { dry_run, force, .. }, Some((name, layout))) =
        (&args.command, chosen.clone())
    {
        // A Ctrl-C, a SIGTERM or a SIGHUP (a closed terminal) stops the apply between two
        // steps and rolls back what it did, as in the daemon: killing it mid-step would
        // leave GPU instances without their compute instances.
        let _signals = if *dry_run {
            None
        } else {
            Some(stop_on_signals().map_err(|e| {
                (
                    1,
                    format!("cannot catch signals ({e}); nothing was changed"),
                )
            })?)
        };
        let on_wait = Box::new(|pid: Option<u32>| {
            let who = pid.map_or_else(|| "another process".into(), |p| format!("pid {p}"));
            eprintln!(
                "gpu-steward: waiting for the MIG apply of {who} to finish (at most {} s)…",
                LOCK_WAIT.as_secs()
            );
        });
        let layout_name = name.clone();
        let on_found = Box::new(move |l: &crate::mig::intent::Interrupted| {
            eprintln!(
                "gpu-steward: an apply of '{}' (pid {}, started at {} s since the epoch) was \
                 killed half-way and left its intent record: the GPUs may be half-made; applying \
                 '{layout_name}' over it, the record is kept until the node is in a known layout \
                 (audit record intent.found)",
                l.layout, l.pid, l.started
            );
        });
        // The owner of changes, as in the daemon: its NVML session, the audit log and the
        // node lock.
        let owner = super::owner_of(&cfg);
        let r = owner.handle(MigApply {
            layout_name: name.clone(),
            layout: Some(layout),
            dry_run: *dry_run,
            force: *force,
            trigger: "cli",
            wait: LOCK_WAIT,
            on_wait,
            on_found,
        });
        return report(&name, r);
    }
    let session = Session::open(&cfg.nvml_lib).map_err(|e| (1, e.reason))?;
    let ctl = session.mig();
    match (&args.command, chosen) {
        (MigCommand::Show { json }, _) => {
            let gpus =
                apply::observe(&ctl).map_err(|e| (1, format!("cannot read MIG state: {e}")))?;
            if *json {
                let text = serde_json::to_string_pretty(&show::json(&gpus))
                    .map_err(|e| (1, e.to_string()))?;
                out(&format!("{text}\n"));
            } else {
                out(&show::text(&gpus));
            }
            Ok(())
        }
        (MigCommand::Plan { .. }, Some((name, layout))) => {
            let gpus =
                apply::observe(&ctl).map_err(|e| (1, format!("cannot read MIG state: {e}")))?;
            let p = plan(&gpus, &layout).map_err(|e| (2, format!("layout '{name}': {e}")))?;
            out(&show::plan_text(&name, &p));
            Ok(())
        }
        _ => Err((2, "no layout given".into())),
    }
}

/// Catches SIGINT, SIGTERM and SIGHUP for as long as it is kept: the first asks the apply to
/// stop ([`crate::shutdown`]), which it does before its next step, rolling back.
struct StopOnSignals {
    _waiter: std::thread::JoinHandle<()>,
}

fn stop_on_signals() -> std::io::Result<StopOnSignals> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    // Installed here, before the first step: the handlers replace the default action (exit) at
    // once, on this thread; the waiting is done on another.
    let (mut int, mut term, mut hup) = {
        let _in = rt.enter();
        (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
        )
    };
    let waiter = std::thread::Builder::new()
        .name("mig-signals".into())
        .spawn(move || {
            rt.block_on(async {
                let name = tokio::select! {
                    _ = int.recv() => "SIGINT",
                    _ = term.recv() => "SIGTERM",
                    _ = hup.recv() => "SIGHUP",
                };
                eprintln!(
                    "gpu-steward mig: {name}: stopping the apply before its next step and rolling \
                     back what it did (at most {} s)",
                    crate::shutdown::CHANGE_BUDGET.as_secs()
                );
                crate::shutdown::request();
                // Later signals are caught and ignored until the rollback is done.
                loop {
                    tokio::select! {
                        _ = int.recv() => {},
                        _ = term.recv() => {},
                        _ = hup.recv() => {},
                    }
                }
            })
        })?;
    Ok(StopOnSignals { _waiter: waiter })
}

fn report(name: &str, r: Result<Outcome, MigFailed>) -> Result<(), Failure> {
    let r = match r {
        Ok(o) => Ok(o),
        Err(MigFailed::UnknownLayout(e)) => return Err((2, e)),
        Err(MigFailed::Apply(e)) => Err(e),
    };
    match r {
        Ok(Outcome::NothingToDo(_)) => {
            out(&format!(
                "nothing to do: every GPU already matches '{name}'\n"
            ));
            Ok(())
        }
        Ok(Outcome::DryRun { plan, refused }) => {
            out(&show::plan_text(name, &plan));
            out("dry run: nothing was changed\n");
            match refused {
                // Exit as the real apply would: a dry run that passes promises an apply that can.
                Some(reason) => Err((1, format!("apply '{name}' would be refused: {reason}"))),
                None => Ok(()),
            }
        }
        Ok(Outcome::Applied {
            plan,
            steps,
            pending,
            warnings,
        }) => {
            out(&show::plan_text(name, &plan));
            // The steps were made, but the layout is not reached until the pending mode
            // changes take effect: the exit status says so (1), and this line says why.
            let why = match (pending.len(), warnings.len()) {
                (0, 0) => String::new(),
                (0, _) => "; with the warnings below (exit status 1)".into(),
                (n, _) => format!(
                    "; the layout is not reached until {n} pending MIG mode change(s) take effect \
                     (below; exit status 1)"
                ),
            };
            out(&format!("applied '{name}': {steps} step(s){why}\n"));
            if !pending.is_empty() {
                return Err((1, show::pending_text(&pending)));
            }
            if !warnings.is_empty() {
                return Err((1, warnings.join("\n")));
            }
            Ok(())
        }
        Err(e) => {
            // A refusal reads as the dry run's "would be refused"; a failed step as failed.
            let verb = match &e {
                ApplyError::Refused(_) | ApplyError::Audit(_) | ApplyError::Busy(_) => {
                    "was refused"
                }
                ApplyError::Infeasible(_) => "cannot be applied",
                ApplyError::Failed { .. } => "failed",
            };
            let mut msg = format!("apply '{name}' {verb}: {e}");
            if let ApplyError::Failed {
                left: Some(left), ..
            } = &e
            {
                msg.push_str("\nwhat is left now:\n");
                msg.push_str(&show::text(left));
            }
            Err((e.exit_code(), msg))
        }
    }
}
