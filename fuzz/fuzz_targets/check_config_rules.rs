//! Arbitrary rule text through exactly what `gpu-steward check-config` runs: a config file
//! naming one rule file, read by `gpu_steward::rules::served::load` (the bounded file read, the glob,
//! the expression limits, the PromQL parser, the subset check, the series the page serves).
//! Loading must never panic nor overflow the stack, and every rejection must be
//! `FILE:LINE:COL: message`. Rules that load are evaluated once on a thread with the stack the
//! daemon's blocking pool gives them (2 MiB), where the 3,000-minus rule used to overflow.
//!
//! It must not write anywhere but its own temporary folder.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use gpu_steward::rules::Engine;
use libfuzzer_sys::fuzz_target;

/// The folder with `c.toml` (naming `r.yml`) for this fuzzing process.
fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("gpu-steward-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a temporary folder for the fuzzer");
        std::fs::write(d.join("c.toml"), "[rules]\nfiles = [\"r.yml\"]\n").expect("c.toml");
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = dir();
    std::fs::write(dir.join("r.yml"), data).expect("r.yml");
    let loaded = match gpu_steward::rules::served::load(&dir.join("c.toml"), true, &Default::default())
    {
        Ok(loaded) => loaded,
        Err(e) => {
            let message = e.to_string();
            let mut parts = message.splitn(4, ':');
            let file = parts.next().unwrap_or_default();
            assert!(file.ends_with("r.yml"), "{message}");
            let line: usize = parts.next().and_then(|l| l.parse().ok()).expect("a line");
            let column: usize = parts.next().and_then(|c| c.parse().ok()).expect("a column");
            assert!(line >= 1 && column >= 1, "{message}");
            assert!(parts.next().is_some_and(|m| !m.trim().is_empty()), "{message}");
            return;
        }
    };
    let rules = loaded.rules.clone();
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let mut engine = Engine::new(rules, Duration::from_secs(1));
            let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
            let _ = engine.step("gpu_steward_temperature_celsius{gpu=\"0\"} 60\n", t0);
        })
        .expect("a thread")
        .join()
        .expect("evaluation never panics");
});
