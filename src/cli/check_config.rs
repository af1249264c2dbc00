//! `gpu-steward check-config FILE`: load and validate the file as the daemon would (the web
//! config it names included) and print what it would do, the alert rules and remediation
//! routes it loaded among it. Exit codes: 0 valid, 2 not. Reads files only: no NVML, no
//! sockets. An audit log or state directory another user could replace is refused as `run`
//! refuses it ([`crate::audit::check_places`]), with the same text.
//!
//! A valid file can still leave the agent unable to act: warnings (on stderr, exit still 0)
//! say when the audit log's directory cannot be written (every change to the node would be
//! refused) and when a `[rules] files` pattern matches no file.

use std::path::Path;

use nix::unistd::{access, AccessFlags};

use crate::config::{self, Config, Overrides};

/// Runs the command; the exit status.
pub fn run(file: &Path) -> u8 {
    match crate::rules::served::load(file, true, &Overrides::default()) {
        Ok(loaded) => {
            let c = &loaded.config;
            let web = c.web_config_file.as_ref().map(|f| config::web::load(f));
            if let Some(Err(e)) = web {
                eprintln!("{e}");
                return 2;
            }
            // What `run` refuses before it starts is not valid here either: the same check,
            // the same text.
            if let Err(e) = crate::audit::check_places(&c.audit_file) {
                eprintln!("{e}");
                return 2;
            }
            println!("{}: valid", file.display());
            println!(
                "size: {} bytes, the file and its drop-ins together (limit {} bytes)",
                config::dropins::total_bytes(file),
                config::dropins::MAX_TOTAL_BYTES
            );
            match config::dropins::list(file) {
                Ok(d) if !d.is_empty() => {
                    let names: Vec<String> = d.iter().map(|p| p.display().to_string()).collect();
                    println!("drop-ins, merged in this order: {}", names.join(", "));
                }
                _ => {}
            }
            print!("{}", loaded.describe());
            for w in warnings(c) {
                eprintln!("{}: warning: {w}", file.display());
            }
            0
        }
        Err(e) => {
            eprintln!("{e}");
            2
        }
    }
}

/// What keeps a valid configuration from working as written, checked as the user running
/// `check-config` (run it as the agent's user for the agent's view).
pub fn warnings(c: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(w) = audit_warning(&c.audit_file) {
        out.push(w);
    }
    // The agent reads the token file as it starts the API, and keeps the API off when the file
    // is unfit (readable by others, another owner, empty): `valid` alone would hide that.
    if c.api_enabled {
        if let Err(e) = crate::config::token::load_token(&c.api_token_file) {
            out.push(e);
        }
    }
    for p in c.rule_patterns() {
        let wildcard = p.contains(['*', '?', '[']);
        let none = glob::glob(&p).is_ok_and(|mut m| m.all(|f| f.is_err()));
        if wildcard && none {
            out.push(format!(
                "[rules] files pattern '{p}' matches no file: no rules from it are evaluated"
            ));
        }
    }
    out
}

const REFUSED: &str = "every change to the node (MIG, sharing, reclaim, remediation) would be \
                       refused, and reclaim stays in dry run";

/// Whether the audit log can be opened for append here, and if not, why.
fn audit_warning(file: &Path) -> Option<String> {
    let writable = |p: &Path| access(p, AccessFlags::W_OK).is_ok();
    if file.exists() {
        return (!writable(file)).then(|| {
            format!(
                "the audit log '{}' is not writable by this user: {REFUSED}",
                file.display()
            )
        });
    }
    let dir = crate::audit::dir_of(file);
    let dir = dir.as_path();
    if dir.is_dir() {
        return (!writable(dir)).then(|| {
            format!(
                "the audit log's directory '{}' is not writable by this user: {REFUSED}",
                dir.display()
            )
        });
    }
    let state = crate::audit::state_dir();
    if dir == state && dir.parent().is_some_and(|p| p.is_dir() && writable(p)) {
        return None; // the agent creates its state directory
    }
    Some(format!(
        "the audit log's directory '{}' does not exist{}: {REFUSED}; create it or fix [audit] file",
        dir.display(),
        if dir == state {
            " and cannot be created by this user"
        } else {
            ""
        }
    ))
}
