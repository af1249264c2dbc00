//! `gpu-steward check-config FILE`: load and validate the file as the daemon would (the web
//! config it names included) and print what it would do. Exit codes: 0 valid, 2 not. Reads
//! files only: no NVML, no sockets.

use std::path::Path;

use crate::config::{self, Overrides};

/// Runs the command; the exit status.
pub fn run(file: &Path) -> u8 {
    match config::load(file, true, &Overrides::default()) {
        Ok(c) => {
            let web = c.web_config_file.as_ref().map(|f| config::web::load(f));
            if let Some(Err(e)) = web {
                eprintln!("{e}");
                return 2;
            }
            print!("{}: valid\n{}", file.display(), c.describe());
            0
        }
        Err(e) => {
            eprintln!("{e}");
            2
        }
    }
}
