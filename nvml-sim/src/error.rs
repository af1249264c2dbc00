//! Scenario errors: a message positioned in the scenario text as 1-based `LINE:COL`, from
//! the TOML span of the offending key or value. Both parsing (`scenario`) and the semantic
//! checks (`validate`) report them, so they live below both.

use std::ops::Range;

/// A validation or syntax error, positioned in the scenario text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl ScenarioError {
    pub(crate) fn at(text: &str, span: Option<Range<usize>>, message: impl Into<String>) -> Self {
        let offset = span.map_or(0, |s| s.start).min(text.len());
        let before = &text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        ScenarioError {
            line,
            col,
            message: message.into(),
        }
    }

    /// The stderr line: `nvml-sim: FILE:LINE:COL: message`.
    pub fn render(&self, file: &str) -> String {
        format!(
            "nvml-sim: {file}:{}:{}: {}",
            self.line, self.col, self.message
        )
    }
}

/// The message for a return-code name that `nvmlReturn_t` lacks.
pub(crate) fn unknown_code(name: &str) -> String {
    format!("unknown nvmlReturn_t name '{name}'; use a name such as 'UNKNOWN' or 'GPU_IS_LOST'")
}
