//! The rule file parser and the evaluator on arbitrary input: `RULES \0 EXPOSITION`. Loading must
//! never panic and every rejection must be `FILE:LINE:COL: message` inside the text; rules that
//! load are evaluated over three polls of the exposition text (the second and third a second
//! apart, the third with every series gone, so staleness and `for` run too) and must never panic.
#![no_main]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use gpu_steward::publication::Page;
use gpu_steward::rules::{Engine, RuleSet};
use libfuzzer_sys::fuzz_target;

/// Lines as YAML counts them: a lone `\r` breaks a line too (so does an editor showing an old
/// Mac file), and YAML 1.1's NEL, LS and PS; plus one for an error at the very end.
fn yaml_lines(text: &str) -> usize {
    let crlf = text.matches("\r\n").count();
    let breaks = text
        .chars()
        .filter(|c| matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}'))
        .count();
    breaks - crlf + 2
}

fuzz_target!(|data: &[u8]| {
    let (rules, exposition) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    let (Ok(rules), Ok(exposition)) = (std::str::from_utf8(rules), std::str::from_utf8(exposition))
    else {
        return;
    };
    let mut set = RuleSet::default();
    if let Err(e) = set.add(Path::new("fuzz.yml"), rules.to_string()) {
        assert_eq!(e.file, "fuzz.yml", "{e}");
        assert!(e.line >= 1 && e.line <= yaml_lines(rules), "{e}");
        assert!(e.column >= 1, "{e}");
        assert!(!e.message.trim().is_empty(), "{e}");
        return;
    }
    let mut engine = Engine::new(Arc::new(set), Duration::from_secs(1));
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    // Indexed by reading its lines: such a page keeps no label pairs (only the renderer's
    // families give them), so the engine keeps no series of it and evaluates an empty history.
    let page = Page::from_text(exposition);
    let _ = engine.step(&page, t0);
    let _ = engine.step(&page, t0 + Duration::from_secs(1));
    let _ = engine.step(&Page::from_text(""), t0 + Duration::from_secs(2));
    let _ = engine.counts();
});
