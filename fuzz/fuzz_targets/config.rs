//! The config file parser on arbitrary text: it must never panic, and every rejection must name
//! the file and a line and column inside the text (the contract of `check-config`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match gpu_steward::config::from_text("fuzz.toml", text, &Default::default()) {
        Ok(config) => {
            let _ = config.describe("");
        }
        Err(e) => {
            let message = e.to_string();
            let mut parts = message.splitn(4, ':');
            assert_eq!(parts.next(), Some("fuzz.toml"), "{message}");
            let line: usize = parts.next().and_then(|l| l.parse().ok()).expect("a line");
            let column: usize = parts.next().and_then(|c| c.parse().ok()).expect("a column");
            assert!(
                line >= 1 && line <= text.lines().count().max(1) + 1,
                "{message}"
            );
            assert!(column >= 1, "{message}");
            assert!(
                parts.next().is_some_and(|m| !m.trim().is_empty()),
                "{message}"
            );
        }
    }
});
