//! Reads docs/walkthrough.md into steps a test can run, and matches a command's output against
//! the doc's block. The conventions are the page's own (its "How to read the outputs" section):
//!
//! - a paragraph starting `` `NAME`: `` just before a fenced block: save the block as `NAME`;
//! - ```` ```sh ````: one command a line (comments and blank lines skipped), output not shown;
//! - ```` ```console ````: `$ command` lines, each followed by its expected output; a command
//!   ending in `&` runs in the background, and lines of a console block before its first `$`
//!   are more output of the last background command, waited for (the page's "after N s");
//! - in expected output, a line that is only `…` stands for any number of lines, `…` within a
//!   line for any text, `<TS>` for an RFC 3339 time, `<TIME>` for a time of day, `<N>` for a
//!   number.
//!
//! It must not run anything: the runner is `tests/walkthrough.rs`.

use regex::Regex;

/// One thing the page asks the reader to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Save `text` as the file `name` (relative to the current directory).
    Save {
        name: String,
        text: String,
        line: usize,
    },
    /// Run `command`; with `expected`, its output must match (see `matches`).
    Run {
        command: String,
        expected: Option<Vec<String>>,
        background: bool,
        line: usize,
    },
    /// Wait until the last background command's output matches `expected` (with more after it).
    More { expected: Vec<String>, line: usize },
}

/// The steps of a page, in order.
pub fn parse(doc: &str) -> Result<Vec<Step>, String> {
    let lines: Vec<&str> = doc.lines().collect();
    let marker = Regex::new(r"^`([^`/\s][^`\s]*)`:").expect("a constant pattern");
    let mut steps = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(lang) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let open = i + 1; // 1-based line of the fence
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].trim_end() == "```")
            .ok_or_else(|| format!("docs/walkthrough.md:{open}: fenced block never closed"))?;
        let body = &lines[i + 1..end];
        // The paragraph just before the block, by its first line.
        let before: Vec<&&str> = lines[..i]
            .iter()
            .rev()
            .skip_while(|l| l.trim().is_empty())
            .take_while(|l| !l.trim().is_empty())
            .collect();
        let save = before
            .last()
            .and_then(|l| marker.captures(l))
            .map(|c| c[1].to_string());
        match (lang.trim(), save) {
            (_, Some(name)) => steps.push(Step::Save {
                name,
                text: body.iter().map(|l| format!("{l}\n")).collect(),
                line: open,
            }),
            ("sh", None) => {
                for (k, l) in body.iter().enumerate() {
                    let t = l.trim();
                    if !t.is_empty() && !t.starts_with('#') {
                        steps.push(Step::Run {
                            command: t.to_string(),
                            expected: None,
                            background: false,
                            line: open + 1 + k,
                        });
                    }
                }
            }
            ("console", None) => console(body, open, &mut steps)?,
            _ => {}
        }
        i = end + 1;
    }
    Ok(steps)
}

fn console(body: &[&str], open: usize, steps: &mut Vec<Step>) -> Result<(), String> {
    let mut k = 0;
    let mut more = Vec::new();
    while k < body.len() && !body[k].starts_with("$ ") {
        more.push(body[k].to_string());
        k += 1;
    }
    if !more.is_empty() {
        steps.push(Step::More {
            expected: more,
            line: open + 1,
        });
    }
    while k < body.len() {
        let line = open + 1 + k;
        let cmd = body[k]["$ ".len()..].trim();
        let (command, background) = match cmd.strip_suffix('&') {
            Some(c) if !c.ends_with('&') => (c.trim().to_string(), true),
            _ => (cmd.to_string(), false),
        };
        let mut expected = Vec::new();
        k += 1;
        while k < body.len() && !body[k].starts_with("$ ") {
            expected.push(body[k].to_string());
            k += 1;
        }
        steps.push(Step::Run {
            command,
            expected: Some(expected),
            background,
            line,
        });
    }
    Ok(())
}

/// One expected line: any number of lines, or a line pattern.
enum Pat {
    Any,
    Line(Regex),
}

fn compile(expected: &[String]) -> Vec<Pat> {
    expected
        .iter()
        .map(|l| {
            if l.trim() == "…" {
                return Pat::Any;
            }
            let mut re = String::from("^");
            let mut rest = l.trim_end();
            while !rest.is_empty() {
                let next = ["…", "<TS>", "<TIME>", "<N>"]
                    .iter()
                    .filter_map(|p| rest.find(p).map(|at| (at, *p)))
                    .min();
                let Some((at, p)) = next else {
                    re.push_str(&regex::escape(rest));
                    break;
                };
                re.push_str(&regex::escape(&rest[..at]));
                re.push_str(match p {
                    "…" => ".*",
                    "<TS>" => r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z",
                    "<TIME>" => r"\d\d:\d\d:\d\d",
                    _ => r"-?\d+(?:\.\d+)?",
                });
                rest = &rest[at + p.len()..];
            }
            re.push('$');
            Pat::Line(Regex::new(&re).expect("escaped text and fixed pieces form a valid regex"))
        })
        .collect()
}

/// Whether `actual` (all of it) matches the expected lines.
pub fn matches(expected: &[String], actual: &str) -> bool {
    let pats = compile(expected);
    let lines: Vec<&str> = actual.lines().map(str::trim_end).collect();
    // Wildcard matching with backtracking to the last `…`: `…` matches any run of lines.
    let (mut p, mut a) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while a < lines.len() {
        match pats.get(p) {
            Some(Pat::Line(re)) if re.is_match(lines[a]) => {
                p += 1;
                a += 1;
            }
            Some(Pat::Any) => {
                star = Some((p, a));
                p += 1;
            }
            _ => match star {
                Some((sp, sa)) => {
                    p = sp + 1;
                    a = sa + 1;
                    star = Some((sp, sa + 1));
                }
                None => return false,
            },
        }
    }
    pats[p..].iter().all(|x| matches!(x, Pat::Any))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.lines().map(String::from).collect()
    }

    #[test]
    fn exact_lines_ellipses_and_placeholders() {
        assert!(matches(&v("a\nb"), "a\nb\n"));
        assert!(!matches(&v("a\nb"), "a\nb\nc\n"), "an extra line is drift");
        assert!(!matches(&v("a\nb"), "a\nc\n"));
        assert!(matches(&v("a\n…\nd"), "a\nb\nc\nd\n"));
        assert!(matches(&v("a\n  …\nd"), "a\nd\n"), "… is zero lines too");
        assert!(matches(&v("…\nx\n…"), "a\nx\nb\nx\n"));
        assert!(!matches(&v("…\nx"), "x\ny\n"));
        assert!(matches(
            &v("at <TS> pid <N> (…)"),
            "at 2026-11-25T18:39:57.584289Z pid 41 (a b)"
        ));
        assert!(matches(&v("<TIME> idle <N>s"), "18:40:02 idle 35s"));
        assert!(!matches(&v("idle <N>s"), "idle ?s"));
        assert!(!matches(&v("a.b"), "axb"), "text is literal");
    }

    #[test]
    fn parses_saves_commands_and_background_output() {
        let doc = "x\n\n`a.toml`: the file,\nsaved\n\n```toml\nk = 1\n```\n\n```sh\nmkdir w  # c\n# skip\n```\n\n```console\n$ run &\nready\n$ echo $?\n0\n```\n\n```console\n…\nlater\n$ next\n```\n";
        let steps = parse(doc).expect("a valid page");
        assert_eq!(
            steps[0],
            Step::Save {
                name: "a.toml".into(),
                text: "k = 1\n".into(),
                line: 6
            }
        );
        assert!(
            matches!(&steps[1], Step::Run { command, expected: None, .. } if command == "mkdir w  # c")
        );
        assert!(
            matches!(&steps[2], Step::Run { command, background: true, expected: Some(e), .. } if command == "run" && e == &v("ready"))
        );
        assert!(
            matches!(&steps[3], Step::Run { command, background: false, .. } if command == "echo $?")
        );
        assert!(matches!(&steps[4], Step::More { expected, .. } if expected == &v("…\nlater")));
        assert!(
            matches!(&steps[5], Step::Run { command, expected: Some(e), .. } if command == "next" && e.is_empty())
        );
    }
}
