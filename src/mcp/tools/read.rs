//! Reading a pane: its text (plain, capped), cursors into its output
//! stream, and the patterns waits and searches match.

use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::text::{self, Capped};
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::Serialize;

/// Default line cap for captures.
pub(crate) const MAX_LINES: usize = 500;
/// Default byte cap for captures.
pub(crate) const MAX_BYTES: usize = 128_000;

pub(crate) fn caps(max_lines: Option<usize>, max_bytes: Option<usize>) -> (usize, usize) {
    (
        max_lines.unwrap_or(MAX_LINES).min(100_000),
        max_bytes.unwrap_or(MAX_BYTES).min(1_000_000),
    )
}

/// Captured text.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Captured {
    /// The pane (or buffer) read.
    pub source: String,
    #[serde(flatten)]
    pub content: Capped,
}

/// Captures a pane as plain text (checked reply, see `tmux::client`).
pub(crate) async fn capture_text(
    c: &Call<'_>,
    pane: &str,
    start: Option<i64>,
    end: Option<i64>,
) -> Result<String, ToolError> {
    let mut cmd = Cmd::new("capture-pane")
        .flag("-p")
        .flag("-J")
        .opt("-t", pane);
    if let Some(s) = start {
        cmd = cmd.opt("-S", s.to_string());
    }
    if let Some(e) = end {
        cmd = cmd.opt("-E", e.to_string());
    }
    let lines = c.s.hub().run_checked(&cmd).await?;
    let mut out = String::new();
    for l in lines {
        out.push_str(&text::clean_lines(&l));
        out.push('\n');
    }
    // Trailing empty screen rows are not content.
    while out.ends_with("\n\n") {
        out.pop();
    }
    if out == "\n" {
        out.clear();
    }
    Ok(text::commands_as_typed(&out))
}

/// A capture_since cursor for a pane at a stream offset.
pub(crate) fn cursor_for(c: &Call<'_>, pane: u32, offset: u64) -> String {
    format!("sc1.{}.{}.{}", pane, offset, &c.s.info().generation[..8])
}

/// Parses a cursor of this instance: (pane number, offset).
pub(crate) fn parse_cursor(c: &Call<'_>, cur: &str) -> Result<(u32, u64), ToolError> {
    let parts: Vec<&str> = cur.split('.').collect();
    let bad = || {
        ToolError::invalid(
            "cursor",
            "is not a cursor from this instance",
            "call capture_since without a cursor to start over",
        )
    };
    if parts.len() != 4 || parts[0] != "sc1" || parts[3] != &c.s.info().generation[..8] {
        return Err(bad());
    }
    Ok((
        parts[1].parse().map_err(|_| bad())?,
        parts[2].parse().map_err(|_| bad())?,
    ))
}

/// Builds a matcher for a literal or regex pattern, size-limited.
pub(crate) fn matcher(
    arg: &str,
    pattern: &str,
    regex: bool,
    match_case: bool,
) -> Result<regex::Regex, ToolError> {
    if pattern.is_empty() {
        return Err(ToolError::invalid(
            arg,
            "is empty",
            "give some text to look for",
        ));
    }
    let src = if regex {
        pattern.to_string()
    } else {
        regex::escape(pattern)
    };
    regex::RegexBuilder::new(&src)
        .case_insensitive(!match_case)
        .size_limit(1 << 20)
        .dfa_size_limit(1 << 20)
        .build()
        .map_err(|e| {
            ToolError::invalid(
                arg,
                &format!("bad regular expression: {e}"),
                "check the syntax, or pass regex=false to search literally",
            )
        })
}
