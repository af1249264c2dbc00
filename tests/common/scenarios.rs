//! Edits of scenario text, for tests that change one GPU of a node under the agent.

/// The scenario with `extra` inserted into GPU `index`'s table (before its processes).
pub fn with_gpu(text: &str, index: usize, extra: &str) -> String {
    let at = text.match_indices("[[gpu]]").nth(index).expect("GPU").0 + "[[gpu]]".len();
    format!("{}\n{extra}{}", &text[..at], &text[at..])
}

/// The scenario with `event` appended to GPU `index`'s tables (before the next GPU).
pub fn with_event(text: &str, index: usize, event: &str) -> String {
    match text.match_indices("[[gpu]]").nth(index + 1) {
        Some((at, _)) => format!("{}{event}\n{}", &text[..at], &text[at..]),
        None => format!("{text}\n{event}"),
    }
}

/// The first `n` GPUs of the scenario.
pub fn first(text: &str, n: usize) -> &str {
    &text[..text.match_indices("[[gpu]]").nth(n).expect("more GPUs").0]
}
