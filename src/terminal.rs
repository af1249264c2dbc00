//! Text from outside, made safe for a terminal or a log line.
//!
//! Process names, pod names, hook output and anything else another user controls can carry
//! control characters: `ESC ] 0 ; … BEL` retitles the operator's terminal, `ESC [ 31 m` paints
//! it, a newline forges a second log line. [`escape`] writes every control character (C0, DEL,
//! C1) and the Unicode bidirectional overrides as a visible `\u{…}` escape (`\n`, `\t`, `\r` as
//! themselves escaped), and leaves all other text as it is.
//!
//! This module must not truncate or otherwise change printable text: callers fit columns.

use std::borrow::Cow;

/// True for the characters [`escape`] rewrites.
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            // Bidirectional embeddings, overrides and isolates (Trojan Source, CVE-2021-42574).
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `s` with every control character written as a visible escape; borrowed when there is none.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// At most `max` characters of `s` (text from outside: a query, a header), escaped as
/// [`escape`] does, with how much was left out: what an error message may quote of it.
pub fn excerpt(s: &str, max: usize) -> String {
    let count = s.chars().count();
    if count <= max {
        return escape(s).into_owned();
    }
    let head: String = s.chars().take(max).collect();
    format!("{}… ({} more characters)", escape(&head), count - max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        assert!(matches!(
            escape("python3 train.py ünïcode"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn escape_sequences_and_newlines_become_visible_text() {
        let hostile = "\u{1b}]0;owned\u{7}\u{1b}[31mred\nline2\u{9b}x\u{202e}";
        let safe = escape(hostile);
        assert_eq!(
            safe,
            "\\u{1b}]0;owned\\u{7}\\u{1b}[31mred\\nline2\\u{9b}x\\u{202e}"
        );
        assert!(!safe.chars().any(unsafe_char));
    }

    #[test]
    fn an_excerpt_is_bounded_escaped_and_says_what_it_left_out() {
        assert_eq!(excerpt("abc", 8), "abc");
        assert_eq!(excerpt("a\u{1b}[2J\0", 8), "a\\u{1b}[2J\\u{0}");
        let long = "x".repeat(60_000);
        assert_eq!(excerpt(&long, 4), "xxxx… (59996 more characters)");
    }
}
