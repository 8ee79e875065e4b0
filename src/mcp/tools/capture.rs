//! What a pane shows: captures, output since a cursor, snapshots, searches
//! and restricted formats. Read-only by construction (P2, P3).

use super::read::{caps, capture_text, cursor_for, matcher, parse_cursor, Captured};
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::targets::{self, PaneRow, PaneSel, SessionSel};
use crate::mcp::text::{self, Capped};
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `capture_pane`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Capture {
    #[serde(flatten)]
    pub p: PaneSel,
    /// First line (0 = top of the visible screen, negative = scrollback).
    pub start: Option<i64>,
    /// Last line (default: the bottom of the screen).
    pub end: Option<i64>,
    /// Keep the last N lines (default 500).
    pub max_lines: Option<usize>,
    /// Keep the last N bytes (default 128000).
    pub max_bytes: Option<usize>,
}

/// Captures a pane.
pub(crate) async fn capture_pane(c: &Call<'_>, a: Capture) -> Result<Captured, ToolError> {
    let p = targets::pane_ref(c, &a.p).await?;
    let t = capture_text(c, &p.pane_id, a.start, a.end)
        .await
        .map_err(|e| p.gone(e))?;
    let (l, b) = caps(a.max_lines, a.max_bytes);
    Ok(Captured {
        source: p.pane_id,
        content: text::cap(&t, l, b),
    })
}

/// `capture_since`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct CaptureSince {
    /// The cursor from the previous call (omit on the first call).
    pub cursor: Option<String>,
    #[serde(flatten)]
    pub p: PaneSel,
    /// Line cap (default 500).
    pub max_lines: Option<usize>,
    /// Byte cap (default 128000).
    pub max_bytes: Option<usize>,
}

/// `capture_since` result.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SinceResult {
    /// Pane read.
    pub pane_id: String,
    /// Pass this to the next call.
    pub cursor: String,
    /// Output lost between the cursor and now (it scrolled out of sandmux's buffer).
    pub lines_missed: bool,
    /// Whether this is the visible screen (first call) rather than new output.
    pub full_screen: bool,
    #[serde(flatten)]
    pub content: Capped,
}

/// Output since a cursor, from the `%output` stream.
pub(crate) async fn capture_since(c: &Call<'_>, a: CaptureSince) -> Result<SinceResult, ToolError> {
    let (l, b) = caps(a.max_lines, a.max_bytes);
    let Some(cur) = a.cursor else {
        let p = targets::pane(c, &a.p).await?;
        let (offset, _) = c.s.hub().subscribe(p.num);
        let t = capture_text(c, &p.pane_id, None, None).await?;
        return Ok(SinceResult {
            cursor: cursor_for(c, p.num, offset),
            pane_id: p.pane_id,
            lines_missed: false,
            full_screen: true,
            content: text::cap(&t, l, b),
        });
    };
    let (num, offset) = parse_cursor(c, &cur)?;
    let pane_id = format!("%{num}");
    if let Some(want) = &a.p.pane_id {
        if want != &pane_id {
            return Err(ToolError::invalid(
                "cursor",
                &format!("belongs to pane {pane_id}, not {want}"),
                "use a cursor from the same pane",
            ));
        }
    }
    let p = targets::explicit_pane(c, &pane_id).await?;
    let chunk = c.s.hub().read_since(p.num, offset);
    let t = text::clean(&chunk.data);
    Ok(SinceResult {
        cursor: cursor_for(c, p.num, chunk.end),
        pane_id,
        lines_missed: chunk.missed > 0,
        full_screen: false,
        content: text::cap(&t, l, b),
    })
}

/// `snapshot_pane`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Snapshot {
    #[serde(flatten)]
    pub p: PaneSel,
    /// Line cap (default 500).
    pub max_lines: Option<usize>,
}

/// Pane state plus content.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SnapshotResult {
    /// Pane metadata.
    #[schemars(with = "targets::OnePane")]
    pub pane: PaneRow,
    /// Content.
    pub content: Capped,
}

/// Snapshot of a pane.
pub(crate) async fn snapshot_pane(c: &Call<'_>, a: Snapshot) -> Result<SnapshotResult, ToolError> {
    let p = targets::pane(c, &a.p).await?;
    let t = capture_text(c, &p.pane_id, None, None).await?;
    let (l, b) = caps(a.max_lines, None);
    Ok(SnapshotResult {
        content: text::cap(&t, l, b),
        pane: p,
    })
}

/// `search_panes`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Search {
    /// Text or regular expression.
    pub pattern: String,
    /// `pattern` is a regular expression (no backreferences).
    #[serde(default)]
    pub regex: bool,
    /// Only this session.
    pub session_name: Option<String>,
    /// Only this session.
    pub session_id: Option<String>,
    /// Case-sensitive.
    #[serde(default)]
    pub match_case: bool,
    /// First line to search (negative = scrollback).
    pub content_start: Option<i64>,
    /// Last line to search.
    pub content_end: Option<i64>,
    /// Matching lines per pane (default 50).
    pub max_matched_lines_per_pane: Option<usize>,
    /// Panes per page (default 500).
    pub limit: Option<usize>,
    /// Panes to skip.
    #[serde(default)]
    pub offset: usize,
}

/// Matches in one pane.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct PaneMatches {
    /// Pane.
    pub pane_id: String,
    /// Session.
    pub session_name: String,
    /// Matching lines.
    pub lines: Vec<String>,
    /// More lines matched than returned.
    pub truncated: bool,
}

/// `search_panes` result.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SearchResult {
    /// Panes with matches (this page).
    pub matches: Vec<PaneMatches>,
    /// Panes with matches in all.
    pub total_panes_matched: usize,
    /// More pages follow.
    pub truncated_panes: bool,
}

/// Searches panes.
pub(crate) async fn search_panes(c: &Call<'_>, a: Search) -> Result<SearchResult, ToolError> {
    let re = matcher("pattern", &a.pattern, a.regex, a.match_case)?;
    let mut panes = targets::panes(c).await?;
    if SessionSel::new(&a.session_name, &a.session_id).given() {
        let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
        panes.retain(|p| p.session_id == s.session_id);
    }
    let per = a.max_matched_lines_per_pane.unwrap_or(50).min(1000);
    let mut all = Vec::new();
    for p in panes {
        let t = capture_text(c, &p.pane_id, a.content_start, a.content_end).await?;
        let hits: Vec<String> = t
            .lines()
            .filter(|l| re.is_match(l))
            .map(str::to_string)
            .collect();
        if !hits.is_empty() {
            all.push(PaneMatches {
                pane_id: p.pane_id,
                session_name: p.session_name,
                truncated: hits.len() > per,
                lines: hits.into_iter().take(per).collect(),
            });
        }
    }
    let total = all.len();
    let limit = a.limit.unwrap_or(500).min(500);
    let page: Vec<PaneMatches> = all.into_iter().skip(a.offset).take(limit).collect();
    Ok(SearchResult {
        truncated_panes: a.offset + page.len() < total,
        total_panes_matched: total,
        matches: page,
    })
}

/// Variables `display_message` may look up.
const FORMAT_VARS: &[&str] = &[
    "session_name",
    "session_id",
    "session_windows",
    "window_id",
    "window_index",
    "window_name",
    "window_panes",
    "window_width",
    "window_height",
    "window_layout",
    "pane_id",
    "pane_index",
    "pane_title",
    "pane_current_command",
    "pane_current_path",
    "pane_pid",
    "pane_width",
    "pane_height",
    "pane_dead",
    "pane_dead_status",
    "pane_in_mode",
    "pane_active",
    "cursor_x",
    "cursor_y",
    "history_size",
    "history_limit",
    "alternate_on",
    "pane_mode",
    "scroll_position",
    "host",
    "host_short",
    "version",
    "pid",
    "start_time",
];

/// `display_message`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Display {
    /// Literal text with plain #{variable} lookups, e.g. "#{pane_current_command} in #{pane_current_path}".
    pub format_string: String,
    #[serde(flatten)]
    pub p: PaneSel,
}

/// `display_message` result.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Displayed {
    /// The expanded text.
    pub text: String,
}

/// Turns the caller's format into a safe tmux format: literal text has every
/// `#` doubled; each `#{name}` of a known variable becomes `#{q:name}` (undone
/// after), so no modifier, `#(`, conditional or second expansion gets through.
pub(crate) fn safe_format(f: &str) -> Result<String, ToolError> {
    if f.chars().any(|c| c.is_control()) || f.len() > 2048 {
        return Err(ToolError::invalid(
            "format_string",
            "has control characters or is over 2048 bytes",
            "use one line of text",
        ));
    }
    let mut out = String::new();
    let mut rest = f;
    while let Some(i) = rest.find('#') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(body) = after.strip_prefix('{') {
            let end = body.find('}').ok_or_else(|| {
                ToolError::invalid("format_string", "unclosed #{", "close it with }")
            })?;
            let name = &body[..end];
            if !FORMAT_VARS.contains(&name) {
                return Err(ToolError::refused(format!(
                    "format_string: #{{{name}}} is not a plain lookup of a known variable (no modifiers, conditionals or #(...) here); known: {}",
                    FORMAT_VARS.join(", ")
                )));
            }
            out.push_str(&format!("#{{q:{name}}}"));
            rest = &body[end + 1..];
        } else if let Some(r) = after.strip_prefix('#') {
            // `##` is tmux's own escape for one `#`.
            out.push_str("##");
            rest = r;
        } else if after.starts_with('(') {
            return Err(ToolError::refused(
                "format_string: #( runs a command in the server and is never accepted",
            ));
        } else {
            out.push_str("##");
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Expands a restricted format against a pane.
pub(crate) async fn display_message(c: &Call<'_>, a: Display) -> Result<Displayed, ToolError> {
    let fmt = safe_format(&a.format_string)?;
    let p = targets::pane(c, &a.p).await?;
    let r =
        c.s.hub()
            .run(
                &Cmd::new("display-message")
                    .flag("-p")
                    .opt("-t", &p.pane_id)
                    .arg(fmt),
            )
            .await?;
    let joined = r.join(&b'\n');
    Ok(Displayed {
        text: String::from_utf8_lossy(&crate::tmux::control::unquote_q(&joined)).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_restricted() {
        assert_eq!(
            safe_format("a # b #{pane_id}").unwrap(),
            "a ## b #{q:pane_id}"
        );
        assert!(safe_format("#(touch x)").is_err());
        assert!(safe_format("#{E:HOME}").is_err());
        assert!(safe_format("#{?pane_dead,a,b}").is_err());
        assert!(safe_format("#{T:status-left}").is_err());
        assert!(safe_format("#{pane_id").is_err());
    }
}
