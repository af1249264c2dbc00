//! `gpu-steward sharing show|apply`: one observe, one diff, at most one apply, through the
//! same `sharing::apply::run` the daemon uses. Exit codes: 0 when the node matches (or the
//! plan was made), 1 when it does not or the audit log cannot be opened, 2 for a bad
//! configuration. Prints; the subsystem under it does not.

use std::path::PathBuf;

use super::SharingArgs;
use crate::config::{self, Overrides};

/// Points `config` at the simulated node of `scenario`: the simulator, and the stand-in
/// nvidia-smi told the node's GPUs (by UUID, in index order) for its compute-policy table,
/// and, for an apply (not `dry_run`), the audit log beside the scenario unless the named config
/// (`named`) sets one.
fn simulated(
    scenario: &std::path::Path,
    nvml_lib: Option<&str>,
    named: bool,
    dry_run: bool,
    config: &mut crate::config::Config,
) -> Result<(), String> {
    let sim = crate::demo::simulate(scenario, nvml_lib)?;
    config.sharing.nvidia_smi = crate::demo::stand_in(&sim.nvml_lib, &sim.stand_in_dir)?;
    config.nvml_lib = sim.nvml_lib;
    if dry_run {
        return Ok(());
    }
    if let Some(audit) = crate::demo::simulated_audit_file(scenario, named, &config.audit_file)? {
        eprintln!(
            "gpu-steward sharing: simulated node: audit log '{}'",
            audit.display()
        );
        config.audit_file = audit;
    }
    Ok(())
}

/// Runs the command; the exit status.
pub fn run(args: &SharingArgs, dry_run: bool) -> u8 {
    let (path, required) = match &args.config {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(config::DEFAULT_CONFIG), false),
    };
    let overrides = Overrides {
        nvml_lib: args.nvml_lib.clone(),
        ..Overrides::default()
    };
    let mut config = match config::load(&path, required, &overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gpu-steward sharing: {e}");
            return 2;
        }
    };
    if let Some(scenario) = &args.scenario {
        if let Err(e) = simulated(
            scenario,
            args.nvml_lib.as_deref(),
            args.config.is_some(),
            dry_run,
            &mut config,
        ) {
            eprintln!("gpu-steward sharing: {e}");
            return 2;
        }
    }
    // The same owner of changes as in the daemon: it records, lends its NVML session, and
    // refuses the apply when the audit log cannot be written.
    let owner = super::owner_of(&config);
    if !dry_run {
        if let Err(e) = owner.audit_ready() {
            eprintln!(
                "gpu-steward sharing: {e}; nothing was changed (set [audit] file to a writable path)"
            );
            return 1;
        }
    }
    let wait = crate::sharing::change::LOCK_WAIT;
    let report = owner.handle(crate::sharing::change::SharingApply {
        config: config.sharing.clone(),
        dry_run,
        trigger: "cli",
        wait,
        on_wait: Box::new(move |pid| {
            let who = pid.map_or_else(|| "another process".into(), |p| format!("pid {p}"));
            eprintln!(
                "gpu-steward sharing: waiting for the apply of {who} to release the node lock (at most {} s)…",
                wait.as_secs()
            );
        }),
    });
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(j) => println!("{j}"),
            Err(e) => eprintln!("gpu-steward sharing: {e}"),
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
            eprintln!("gpu-steward sharing: apply refused: {e}");
        }
    }
    if report.ok {
        0
    } else {
        1
    }
}
