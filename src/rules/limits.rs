//! Bounds on a rule expression, checked on its text before it is parsed.
//!
//! The parser, the support check and the evaluator all recurse over the expression tree, and a
//! chain of 4,000 `+` terms is 4,000 levels deep: enough to overflow a thread's stack and abort
//! the daemon (a crash loop under systemd), though `check-config` on the bigger main-thread stack
//! accepted it. Every level of the tree needs an operator or a bracket in the text, so counting
//! those bounds the depth before anything recurses. The limits sit far above real rules (the
//! shipped ones use at most a handful of operators).

/// Longest expression text, in bytes.
pub const MAX_EXPR_BYTES: usize = 16 * 1024;

/// Most operators plus the deepest bracket nesting in one expression: a bound on the depth of
/// its tree.
pub const MAX_EXPR_NESTING: usize = 128;

/// Whether `query` is within [`MAX_EXPR_BYTES`] and [`MAX_EXPR_NESTING`]; the message says
/// which limit and what to do.
pub fn check(query: &str) -> Result<(), String> {
    if query.len() > MAX_EXPR_BYTES {
        return Err(format!(
            "the expression is {} bytes, over the limit of {MAX_EXPR_BYTES}; split it into \
             several rules",
            query.len()
        ));
    }
    let (operators, depth) = measure(query);
    if operators + depth > MAX_EXPR_NESTING {
        return Err(format!(
            "the expression has {operators} operators and brackets nested {depth} deep, over \
             the nesting limit of {MAX_EXPR_NESTING}; split it into several rules"
        ));
    }
    Ok(())
}

/// Operators and the deepest nesting of `()` and `[]`, outside quoted strings, `#` comments and
/// label matchers (`{…}`), which nest nothing.
///
/// Every operator counts on its own: `---x` is three unary minus nodes nested in each other, not
/// one, and `a >= -1` is a comparison and a unary minus. Only the two-character comparisons
/// (`==`, `!=`, `<=`, `>=`) are one token each. A word operator (`and`, `or`, `unless`,
/// `atan2`) counts once; function calls and aggregations nest through their brackets.
fn measure(query: &str) -> (usize, usize) {
    let mut operators = 0;
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut braces = 0usize;
    let mut quote: Option<char> = None;
    let mut comment = false;
    let mut escaped = false;
    let mut word = String::new();
    fn end_word(word: &mut String, operators: &mut usize) {
        if matches!(
            word.to_ascii_lowercase().as_str(),
            "and" | "or" | "unless" | "atan2"
        ) {
            *operators += 1;
        }
        word.clear();
    }
    let mut chars = query.chars().peekable();
    while let Some(c) = chars.next() {
        if comment {
            // A comment runs to the end of the line: a quote inside it opens nothing.
            comment = c != '\n';
            continue;
        }
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' && q != '`' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        if c.is_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        end_word(&mut word, &mut operators);
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '#' => comment = true,
            '{' => braces += 1,
            '}' => braces = braces.saturating_sub(1),
            _ if braces > 0 => {}
            '(' | '[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            ')' | ']' => depth = depth.saturating_sub(1),
            '=' | '!' | '<' | '>' => {
                // `==`, `!=`, `<=`, `>=` are one operator; `=`, `<`, `>` alone are one too.
                if chars.peek() == Some(&'=') {
                    chars.next();
                }
                operators += 1;
            }
            '+' | '-' | '*' | '/' | '%' | '^' => operators += 1,
            _ => {}
        }
    }
    end_word(&mut word, &mut operators);
    (operators, deepest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_operators_and_nesting_but_not_matchers_or_strings() {
        assert_eq!(measure("up == 0"), (1, 0));
        assert_eq!(measure("a + b - c"), (2, 0));
        assert_eq!(
            measure(r#"sum by (gpu) (rate(x{a!="b+c", d=~"(e)"}[5m])) > 1 and on() y"#),
            (2, 3)
        );
        assert_eq!(measure(r#"x{a="}(((("}"#), (0, 0));
        assert_eq!(measure("a >= -1"), (2, 0));
        assert_eq!(measure("---up"), (3, 0));
        assert_eq!(measure("a != b <= c == d"), (3, 0));
        assert_eq!(measure("abs(abs(up))"), (0, 2));
        assert_eq!(measure("# a \"quote\n-up"), (1, 0));
    }

    #[test]
    fn runs_of_unary_operators_count_one_level_each() {
        // The defect: 3,000 unary minus signs counted as one operator passed the check and
        // overflowed the daemon's stack.
        for q in [
            format!("{}up", "-".repeat(3000)),
            format!("{}up", "+".repeat(3000)),
            format!("{}up{}", "-(".repeat(3000), ")".repeat(3000)),
            format!("{}up{}", "abs(".repeat(3000), ")".repeat(3000)),
            format!("{}up{}", "(".repeat(3000), ")".repeat(3000)),
            // A quote inside a comment must not hide the operators after it.
            format!("# \"\n{}up\n# \"", "-".repeat(3000)),
        ] {
            let e = check(&q).expect_err("too deep");
            assert!(e.contains("nesting limit of 128"), "{e}");
        }
        assert!(check(&format!("{}up", "-".repeat(MAX_EXPR_NESTING))).is_ok());
        assert!(check(&format!("{}up", "-".repeat(MAX_EXPR_NESTING + 1))).is_err());
    }

    #[test]
    fn a_long_chain_or_deep_nesting_is_refused_naming_the_limit() {
        let chain = vec!["a"; 4000].join(" + ");
        let e = check(&chain).expect_err("too deep");
        assert!(e.contains("3999 operators") && e.contains("128"), "{e}");
        let nested = format!("{}up{}", "(".repeat(200), ")".repeat(200));
        let e = check(&nested).expect_err("too deep");
        assert!(e.contains("nested 200 deep"), "{e}");
        let long = format!("up{{a=\"{}\"}}", "x".repeat(MAX_EXPR_BYTES));
        let e = check(&long).expect_err("too long");
        assert!(e.contains("16384"), "{e}");
        assert!(check(&vec!["up"; 100].join(" + ")).is_ok());
    }
}
