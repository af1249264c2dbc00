//! The simulator's scenario parser on arbitrary text: it must never panic (a panic would cross
//! the C boundary as UNKNOWN at init), and every rejection must render as `FILE:LINE:COL: ...`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = nvml_sim::scenario::parse(text) {
        let line = e.render("fuzz.toml");
        assert!(line.contains("fuzz.toml:"), "{line}");
    }
});
