//! Inspect tools: read-only by construction (P2, P3).

use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
pub use crate::mcp::targets::PaneRow;
use crate::mcp::targets::{self, PaneSel, SessionSel, WindowSel};
use crate::mcp::text::{self, Capped};
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use super::wait::{Wait, Woke};
use std::time::{Duration, Instant};

/// Default line cap for captures.
pub const MAX_LINES: usize = 500;
/// Default byte cap for captures.
pub const MAX_BYTES: usize = 128_000;

/// No arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct NoArgs {}

/// `list_sessions`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListSessions {
    /// Lookups such as {"session_name__contains": "dev"}.
    pub filters: Option<Value>,
}

/// One session.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SessionRow {
    /// `$N`.
    pub session_id: String,
    /// Name.
    pub session_name: String,
    /// Number of windows.
    pub windows: usize,
    /// Number of panes.
    pub panes: usize,
}

/// `list_sessions` result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Sessions {
    /// The sessions.
    pub sessions: Vec<SessionRow>,
}

fn sessions_of(panes: &[PaneRow]) -> Vec<SessionRow> {
    let mut out: Vec<SessionRow> = Vec::new();
    for p in panes {
        match out.iter_mut().find(|s| s.session_id == p.session_id) {
            Some(s) => s.panes += 1,
            None => out.push(SessionRow {
                session_id: p.session_id.clone(),
                session_name: p.session_name.clone(),
                windows: 0,
                panes: 1,
            }),
        }
    }
    for s in &mut out {
        let mut w: Vec<&str> = panes
            .iter()
            .filter(|p| p.session_id == s.session_id)
            .map(|p| p.window_id.as_str())
            .collect();
        w.dedup();
        s.windows = w.len();
    }
    out
}

/// Lists sessions.
pub async fn list_sessions(c: &Call<'_>, a: ListSessions) -> Result<Sessions, ToolError> {
    let panes = targets::panes(c).await?;
    Ok(Sessions {
        sessions: targets::filter(sessions_of(&panes), &a.filters)?,
    })
}

/// `get_session_info`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SessionArgs {
    /// Session id such as "$1".
    pub session_id: Option<String>,
    /// Session name.
    pub session_name: Option<String>,
}

/// One session's metadata.
pub async fn get_session_info(c: &Call<'_>, a: SessionArgs) -> Result<SessionRow, ToolError> {
    let first = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
    let panes = targets::panes(c).await?;
    sessions_of(&panes)
        .into_iter()
        .find(|s| s.session_id == first.session_id)
        .ok_or_else(|| ToolError::not_found("session", "call list_sessions"))
}

/// `list_windows`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListWindows {
    /// Session name (all sessions when omitted).
    pub session_name: Option<String>,
    /// Session id (`$N`).
    pub session_id: Option<String>,
    /// Lookups such as {"window_name": "build"}.
    pub filters: Option<Value>,
}

/// One window.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct WindowRow {
    /// `@N`.
    pub window_id: String,
    /// Index in the session.
    pub window_index: u32,
    /// Name.
    pub window_name: String,
    /// `$N`.
    pub session_id: String,
    /// Session name.
    pub session_name: String,
    /// Number of panes.
    pub panes: usize,
    /// Columns (of the window's panes' extent).
    pub width: u32,
    /// Height in rows.
    pub height: u32,
}

/// `list_windows` result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Windows {
    /// The windows.
    pub windows: Vec<WindowRow>,
}

fn windows_of(panes: &[PaneRow]) -> Vec<WindowRow> {
    let mut out: Vec<WindowRow> = Vec::new();
    for p in panes {
        match out
            .iter_mut()
            .find(|w| w.window_id == p.window_id && w.session_id == p.session_id)
        {
            Some(w) => {
                w.panes += 1;
                w.width = w.width.max(p.right + 1);
                w.height = w.height.max(p.bottom + 1);
            }
            None => out.push(WindowRow {
                window_id: p.window_id.clone(),
                window_index: p.window_index,
                window_name: p.window_name.clone(),
                session_id: p.session_id.clone(),
                session_name: p.session_name.clone(),
                panes: 1,
                width: p.right + 1,
                height: p.bottom + 1,
            }),
        }
    }
    out
}

/// Lists windows.
pub async fn list_windows(c: &Call<'_>, a: ListWindows) -> Result<Windows, ToolError> {
    let mut panes = targets::panes(c).await?;
    if SessionSel::new(&a.session_name, &a.session_id).given() {
        let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
        panes.retain(|p| p.session_id == s.session_id);
    }
    Ok(Windows {
        windows: targets::filter(windows_of(&panes), &a.filters)?,
    })
}

/// `get_window_info`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct WindowArgs {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub w: WindowSel,
}

/// One window's metadata.
pub async fn get_window_info(c: &Call<'_>, a: WindowArgs) -> Result<WindowRow, ToolError> {
    let first = targets::window(c, &a.w).await?;
    let panes = targets::panes(c).await?;
    windows_of(&panes)
        .into_iter()
        .find(|w| w.window_id == first.window_id)
        .ok_or_else(|| ToolError::not_found("window", "call list_windows"))
}

/// `list_panes`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListPanes {
    /// Session name.
    pub session_name: Option<String>,
    /// Session id (`$N`).
    pub session_id: Option<String>,
    /// Window id (`@N`).
    pub window_id: Option<String>,
    /// Window index (with a session).
    pub window_index: Option<String>,
    /// Lookups such as {"current_command": "bash"}.
    pub filters: Option<Value>,
}

/// `list_panes` result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Panes {
    /// The panes.
    pub panes: Vec<PaneRow>,
}

/// Lists panes.
pub async fn list_panes(c: &Call<'_>, a: ListPanes) -> Result<Panes, ToolError> {
    let mut panes = targets::panes(c).await?;
    if a.window_id.is_some() || a.window_index.is_some() {
        let w = targets::window(
            c,
            &WindowSel {
                window_id: a.window_id,
                window_index: a.window_index,
                s: SessionSel::new(&a.session_name, &a.session_id),
            },
        )
        .await?;
        panes.retain(|p| p.window_id == w.window_id);
    } else if SessionSel::new(&a.session_name, &a.session_id).given() {
        let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
        panes.retain(|p| p.session_id == s.session_id);
    }
    Ok(Panes {
        panes: targets::filter(panes, &a.filters)?,
    })
}

/// Pane target only.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct PaneArgs {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
}

/// One pane's metadata.
pub async fn get_pane_info(c: &Call<'_>, a: PaneArgs) -> Result<PaneRow, ToolError> {
    targets::pane(c, &a.p).await
}

/// `find_pane_by_position`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct FindPane {
    /// Which corner.
    pub corner: crate::mcp::choices::Corner,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub w: WindowSel,
}

/// The pane at a window corner.
pub async fn find_pane_by_position(c: &Call<'_>, a: FindPane) -> Result<PaneRow, ToolError> {
    let w = targets::window(c, &a.w).await?;
    let panes: Vec<PaneRow> = targets::panes(c)
        .await?
        .into_iter()
        .filter(|p| p.window_id == w.window_id)
        .collect();
    use crate::mcp::choices::Corner;
    let key = |p: &PaneRow| -> (i64, i64) {
        match a.corner {
            Corner::TopLeft => (p.top as i64, p.left as i64),
            Corner::TopRight => (p.top as i64, -(p.right as i64)),
            Corner::BottomLeft => (-(p.bottom as i64), p.left as i64),
            Corner::BottomRight => (-(p.bottom as i64), -(p.right as i64)),
        }
    };
    panes
        .into_iter()
        .min_by_key(key)
        .ok_or_else(|| ToolError::not_found("pane", "call list_panes"))
}

/// `get_server_info` result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ServerInfo {
    /// Always true while sandmux answers.
    pub alive: bool,
    /// tmux version.
    pub version: String,
    /// The server's pid inside the sandbox.
    pub pid: i32,
    /// The generation id sandmux set when it started this server.
    pub generation: String,
    /// Sessions (sandmux's own hidden one excluded).
    pub sessions: usize,
    /// "none", or why calls are refused.
    pub drift: String,
    /// The socket is private to sandmux; no tool takes one.
    pub socket: String,
    /// Profile name.
    pub profile: String,
}

/// The server.
pub async fn get_server_info(c: &Call<'_>, _: NoArgs) -> Result<ServerInfo, ToolError> {
    let panes = targets::panes(c).await?;
    Ok(ServerInfo {
        alive: true,
        version: c.s.info().tmux_version.clone(),
        pid: c.s.info().server_pid,
        generation: c.s.info().generation.clone(),
        sessions: sessions_of(&panes).len(),
        drift: c.s.drift.tripped().unwrap_or_else(|| "none".into()),
        socket: "private to this sandmux instance (not reachable from inside the sandbox)".into(),
        profile: c.s.policy.name.clone(),
    })
}

/// `capture_pane`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Capture {
    #[serde(flatten)]
    #[allow(missing_docs)]
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

/// Captured text.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Captured {
    /// The pane (or buffer) read.
    pub source: String,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub content: Capped,
}

/// Captures a pane as plain text (checked reply, see `tmux::client`).
pub async fn capture_text(
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
        out.push_str(&text::clean(&l));
        out.push('\n');
    }
    // Trailing empty screen rows are not content.
    while out.ends_with("\n\n") {
        out.pop();
    }
    if out == "\n" {
        out.clear();
    }
    Ok(out)
}

fn caps(max_lines: Option<usize>, max_bytes: Option<usize>) -> (usize, usize) {
    (
        max_lines.unwrap_or(MAX_LINES).min(100_000),
        max_bytes.unwrap_or(MAX_BYTES).min(1_000_000),
    )
}

/// Captures a pane.
pub async fn capture_pane(c: &Call<'_>, a: Capture) -> Result<Captured, ToolError> {
    let p = targets::pane(c, &a.p).await?;
    let t = capture_text(c, &p.pane_id, a.start, a.end).await?;
    let (l, b) = caps(a.max_lines, a.max_bytes);
    Ok(Captured {
        source: p.pane_id,
        content: text::cap(&t, l, b),
    })
}

/// `capture_since`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CaptureSince {
    /// The cursor from the previous call (omit on the first call).
    pub cursor: Option<String>,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
    /// Line cap (default 500).
    pub max_lines: Option<usize>,
    /// Byte cap (default 128000).
    pub max_bytes: Option<usize>,
}

/// `capture_since` result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SinceResult {
    /// Pane read.
    pub pane_id: String,
    /// Pass this to the next call.
    pub cursor: String,
    /// Output lost between the cursor and now (it scrolled out of sandmux's buffer).
    pub lines_missed: bool,
    /// Whether this is the visible screen (first call) rather than new output.
    pub full_screen: bool,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub content: Capped,
}

/// A capture_since cursor for a pane at a stream offset.
pub fn cursor_for(c: &Call<'_>, pane: &PaneRow, offset: u64) -> String {
    format!(
        "sc1.{}.{}.{}",
        pane.num,
        offset,
        &c.s.info().generation[..8]
    )
}

/// Parses a cursor of this instance: (pane number, offset).
pub fn parse_cursor(c: &Call<'_>, cur: &str) -> Result<(u32, u64), ToolError> {
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

/// Output since a cursor, from the `%output` stream.
pub async fn capture_since(c: &Call<'_>, a: CaptureSince) -> Result<SinceResult, ToolError> {
    let (l, b) = caps(a.max_lines, a.max_bytes);
    let Some(cur) = a.cursor else {
        let p = targets::pane(c, &a.p).await?;
        let (offset, _) = c.s.hub().subscribe(p.num);
        let t = capture_text(c, &p.pane_id, None, None).await?;
        return Ok(SinceResult {
            cursor: cursor_for(c, &p, offset),
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
        cursor: cursor_for(c, &p, chunk.end),
        pane_id,
        lines_missed: chunk.missed > 0,
        full_screen: false,
        content: text::cap(&t, l, b),
    })
}

/// `snapshot_pane`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Snapshot {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
    /// Line cap (default 500).
    pub max_lines: Option<usize>,
}

/// Pane state plus content.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotResult {
    /// Pane metadata.
    pub pane: PaneRow,
    /// Content.
    pub content: Capped,
}

/// Snapshot of a pane.
pub async fn snapshot_pane(c: &Call<'_>, a: Snapshot) -> Result<SnapshotResult, ToolError> {
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
pub struct Search {
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
pub struct PaneMatches {
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
pub struct SearchResult {
    /// Panes with matches (this page).
    pub matches: Vec<PaneMatches>,
    /// Panes with matches in all.
    pub total_panes_matched: usize,
    /// More pages follow.
    pub truncated_panes: bool,
}

/// Builds a matcher for a literal or regex pattern, size-limited.
pub fn matcher(
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

/// Searches panes.
pub async fn search_panes(c: &Call<'_>, a: Search) -> Result<SearchResult, ToolError> {
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
pub struct Display {
    /// Literal text with plain #{variable} lookups, e.g. "#{pane_current_command} in #{pane_current_path}".
    pub format_string: String,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
}

/// `display_message` result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Displayed {
    /// The expanded text.
    pub text: String,
}

/// Turns the caller's format into a safe tmux format: literal text has every
/// `#` doubled; each `#{name}` of a known variable becomes `#{q:name}` (undone
/// after), so no modifier, `#(`, conditional or second expansion gets through.
pub fn safe_format(f: &str) -> Result<String, ToolError> {
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
pub async fn display_message(c: &Call<'_>, a: Display) -> Result<Displayed, ToolError> {
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

/// `wait_for_text`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitText {
    /// Patterns to wait for (null: any new output).
    pub patterns: Option<Vec<String>>,
    /// Patterns that end the wait early with outcome "stopped".
    pub stop: Option<Vec<String>>,
    /// Patterns are regular expressions.
    #[serde(default)]
    pub regex: bool,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
    /// Seconds (default 8).
    pub timeout: Option<f64>,
    /// Ignored (waits are event-driven).
    pub interval: Option<f64>,
    /// Case-sensitive.
    #[serde(default)]
    pub match_case: bool,
    /// Count output from this cursor (from send_keys or capture_since) on.
    pub cursor: Option<String>,
}

/// How a wait ended.
#[derive(Debug, Serialize, JsonSchema)]
pub struct WaitResult {
    /// matched | any_output | stopped | stable | gone | timeout.
    pub outcome: String,
    /// The pane.
    pub pane_id: String,
    /// Lines that matched.
    pub matched_lines: Vec<String>,
    /// The last lines of output seen (at most 20 lines / 2000 bytes).
    pub tail: String,
    /// Seconds waited.
    pub elapsed: f64,
    /// The timeout in force after clamping.
    pub effective_timeout: f64,
}

/// Waits on a pane's stream: calls `check` with all text written since the
/// start each time the pane writes, until it returns an outcome or time is up.
/// Progress is sent every two seconds.
pub async fn wait_stream<F>(
    c: &Call<'_>,
    pane: &PaneRow,
    from: Option<u64>,
    timeout: Duration,
    mut check: F,
) -> Result<(Option<(String, Vec<String>)>, String, f64), ToolError>
where
    F: FnMut(&str) -> Option<(String, Vec<String>)>,
{
    let (now, mut rx) = c.s.hub().subscribe(pane.num);
    let start = from.unwrap_or(now).min(now);
    let mut wait = Wait::call(c, timeout).progress("waiting for pane output");
    loop {
        let chunk = c.s.hub().read_since(pane.num, start);
        let text = text::clean(&chunk.data);
        if let Some(found) = check(&text) {
            return Ok((Some(found), tail(&text), wait.elapsed()));
        }
        match wait.until(rx.changed()).await? {
            Woke::Event(r) => r.map_err(|_| ToolError::stream_closed())?,
            Woke::Deadline => return Ok((None, tail(&text), wait.elapsed())),
        }
    }
}

impl WaitResult {
    /// How `wait` ended on `pane_id`, with the tail of `seen`.
    fn new(
        outcome: &str,
        pane_id: String,
        matched_lines: Vec<String>,
        seen: &str,
        wait: &Wait<'_>,
    ) -> WaitResult {
        WaitResult {
            outcome: outcome.into(),
            pane_id,
            matched_lines,
            tail: tail(seen),
            elapsed: wait.elapsed(),
            effective_timeout: wait.total(),
        }
    }
}

/// The last 20 lines / 2000 bytes.
pub fn tail(t: &str) -> String {
    text::cap(t, 20, 2000).text
}

/// Waits for text.
pub async fn wait_for_text(c: &Call<'_>, a: WaitText) -> Result<WaitResult, ToolError> {
    let timeout = c.clamp(a.timeout, 8.0)?;
    let pats = match &a.patterns {
        Some(v) => v
            .iter()
            .map(|p| matcher("patterns", p, a.regex, a.match_case))
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![],
    };
    let stops = a
        .stop
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .map(|p| matcher("stop", p, a.regex, a.match_case))
        .collect::<Result<Vec<_>, _>>()?;
    let (p, from) = match &a.cursor {
        Some(cur) => {
            let (num, off) = parse_cursor(c, cur)?;
            (
                targets::explicit_pane(c, &format!("%{num}")).await?,
                Some(off),
            )
        }
        None => (targets::pane(c, &a.p).await?, None),
    };
    let any = a.patterns.is_none();
    let (found, tail, elapsed) = wait_stream(c, &p, from, timeout, |t| {
        let hits = |res: &[regex::Regex]| -> Vec<String> {
            t.lines()
                .filter(|l| res.iter().any(|r| r.is_match(l)))
                .map(str::to_string)
                .collect()
        };
        let s = hits(&stops);
        if !s.is_empty() {
            return Some(("stopped".into(), s));
        }
        if any && !t.is_empty() {
            return Some(("any_output".into(), vec![]));
        }
        let m = hits(&pats);
        (!m.is_empty()).then(|| ("matched".into(), m))
    })
    .await?;
    let (outcome, matched_lines) = found.unwrap_or(("timeout".into(), vec![]));
    Ok(WaitResult {
        outcome,
        pane_id: p.pane_id,
        matched_lines,
        tail,
        elapsed,
        effective_timeout: timeout.as_secs_f64(),
    })
}

/// `wait_for_stable`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitStable {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
    /// Quiet time in milliseconds (default 400).
    pub quiet_ms: Option<u64>,
    /// Seconds (default 10).
    pub timeout: Option<f64>,
}

/// Waits until a pane is quiet.
pub async fn wait_for_stable(c: &Call<'_>, a: WaitStable) -> Result<WaitResult, ToolError> {
    let timeout = c.clamp(a.timeout, 10.0)?;
    let quiet = Duration::from_millis(a.quiet_ms.unwrap_or(400).clamp(10, 60_000));
    let p = targets::pane(c, &a.p).await?;
    let (start, mut rx) = c.s.hub().subscribe(p.num);
    let mut wait = Wait::call(c, timeout);
    let outcome = loop {
        // Quiet: no output for `quiet`; any output starts the quiet anew.
        match wait.until(tokio::time::timeout(quiet, rx.changed())).await? {
            Woke::Event(Ok(r)) => r.map_err(|_| ToolError::stream_closed())?,
            Woke::Event(Err(_)) => break "stable",
            Woke::Deadline => break "timeout",
        }
    };
    let text = text::clean(&c.s.hub().read_since(p.num, start).data);
    Ok(WaitResult::new(outcome, p.pane_id, vec![], &text, &wait))
}

/// `wait_for_gone`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitGone {
    /// Patterns that must disappear from the visible screen.
    pub patterns: Vec<String>,
    /// Patterns are regular expressions.
    #[serde(default)]
    pub regex: bool,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
    /// Seconds (default 8).
    pub timeout: Option<f64>,
    /// Case-sensitive.
    #[serde(default)]
    pub match_case: bool,
}

/// Waits until text is gone from the screen (re-checked on each write).
pub async fn wait_for_gone(c: &Call<'_>, a: WaitGone) -> Result<WaitResult, ToolError> {
    let timeout = c.clamp(a.timeout, 8.0)?;
    let pats = a
        .patterns
        .iter()
        .map(|p| matcher("patterns", p, a.regex, a.match_case))
        .collect::<Result<Vec<_>, _>>()?;
    if pats.is_empty() {
        return Err(ToolError::invalid(
            "patterns",
            "is empty",
            "give at least one pattern",
        ));
    }
    let p = targets::pane(c, &a.p).await?;
    let (_, mut rx) = c.s.hub().subscribe(p.num);
    let mut wait = Wait::call(c, timeout);
    loop {
        let screen = capture_text(c, &p.pane_id, None, None).await?;
        let still: Vec<String> = screen
            .lines()
            .filter(|l| pats.iter().any(|r| r.is_match(l)))
            .map(str::to_string)
            .collect();
        if still.is_empty() {
            return Ok(WaitResult::new("gone", p.pane_id, still, &screen, &wait));
        }
        match wait.until(rx.changed()).await? {
            Woke::Event(r) => r.map_err(|_| ToolError::stream_closed())?,
            Woke::Deadline => {
                return Ok(WaitResult::new("timeout", p.pane_id, still, &screen, &wait));
            }
        }
    }
}

/// Option scope.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Server options.
    Server,
    /// Session options.
    Session,
    /// Window options.
    Window,
    /// Pane options.
    Pane,
}

/// `show_option`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShowOption {
    /// Option name, e.g. "history-limit".
    pub option: String,
    /// server, session, window or pane.
    pub scope: Option<Scope>,
    /// A session, window or pane id for the scope.
    pub target: Option<String>,
    /// The global value.
    #[serde(default)]
    pub global_: bool,
}

/// An option's value.
#[derive(Debug, Serialize, JsonSchema)]
pub struct OptionValue {
    /// Option name.
    pub option: String,
    /// Value (null when unset).
    pub value: Option<String>,
}

/// Checks an option name.
pub fn option_name(o: &str) -> Result<(), ToolError> {
    let ok = !o.is_empty()
        && o.len() <= 64
        && o.chars().all(|c| {
            c.is_ascii_alphanumeric() || c == '-' || c == '@' || c == '_' || c == '[' || c == ']'
        });
    if ok {
        Ok(())
    } else {
        Err(ToolError::invalid(
            "option",
            &format!("{o:?} is not an option name"),
            "e.g. history-limit",
        ))
    }
}

/// Builds the scope flags for show/set-option.
pub fn scope_cmd(
    mut cmd: Cmd,
    scope: Option<Scope>,
    target: &Option<String>,
    global: bool,
) -> Result<Cmd, ToolError> {
    if target.is_some() && scope.is_none() {
        return Err(ToolError::invalid(
            "scope",
            "is required with target",
            "give scope: session, window or pane",
        ));
    }
    cmd = match scope {
        Some(Scope::Server) => cmd.flag("-s"),
        Some(Scope::Window) => cmd.flag("-w"),
        Some(Scope::Pane) => cmd.flag("-p"),
        _ => cmd,
    };
    if global {
        cmd = cmd.flag("-g");
    }
    if let Some(t) = target {
        if !targets::is_id(t, &['$', '@', '%']) {
            return Err(ToolError::invalid(
                "target",
                &format!("{t:?} is not a session, window or pane id"),
                "use ids like $1, @2, %3",
            ));
        }
        cmd = cmd.opt("-t", t);
    }
    Ok(cmd)
}

/// Shows an option.
pub async fn show_option(c: &Call<'_>, a: ShowOption) -> Result<OptionValue, ToolError> {
    option_name(&a.option)?;
    let cmd = scope_cmd(
        Cmd::new("show-options").flag("-v").flag("-q"),
        a.scope,
        &a.target,
        a.global_,
    )?
    .arg(&a.option);
    let r = c.s.hub().run(&cmd).await?;
    let v = r
        .iter()
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    Ok(OptionValue {
        option: a.option,
        value: if r.is_empty() { None } else { Some(v) },
    })
}

/// `show_environment`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShowEnv {
    /// Session name (global environment when omitted).
    pub session_name: Option<String>,
    /// Session id (`$N`).
    pub session_id: Option<String>,
}

/// An environment.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EnvList {
    /// Variables; a null value means "removed in this session".
    pub environment: std::collections::BTreeMap<String, Option<String>>,
}

/// Shows an environment.
pub async fn show_environment(c: &Call<'_>, a: ShowEnv) -> Result<EnvList, ToolError> {
    let cmd = if a.session_name.is_none() && a.session_id.is_none() {
        Cmd::new("show-environment").flag("-g")
    } else {
        let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
        Cmd::new("show-environment").opt("-t", &s.session_id)
    };
    let r = c.s.hub().run_checked(&cmd).await?;
    let mut env = std::collections::BTreeMap::new();
    for l in r {
        let l = String::from_utf8_lossy(&l).into_owned();
        match l.split_once('=') {
            Some((k, v)) => env.insert(k.to_string(), Some(v.to_string())),
            None => env.insert(l.trim_start_matches('-').to_string(), None),
        };
    }
    Ok(EnvList { environment: env })
}

/// `show_hooks`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShowHooks {
    /// server, session, window or pane.
    pub scope: Option<Scope>,
    /// A session, window or pane id.
    pub target: Option<String>,
    /// Global hooks.
    #[serde(default)]
    pub global_: bool,
}

/// Hooks.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Hooks {
    /// One line per hook (sandmux keeps this empty; anything else is drift).
    pub hooks: Vec<String>,
}

/// Lists hooks.
pub async fn show_hooks(c: &Call<'_>, a: ShowHooks) -> Result<Hooks, ToolError> {
    let cmd = scope_cmd(
        Cmd::new("show-hooks"),
        a.scope
            .filter(|s| *s != Scope::Session && *s != Scope::Server),
        &a.target,
        a.global_,
    )?;
    let r = c.s.hub().run(&cmd).await?;
    Ok(Hooks {
        hooks: r
            .iter()
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect(),
    })
}

/// `show_hook`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShowHook {
    /// Hook name, e.g. "after-new-window".
    pub hook_name: String,
    /// server, session, window or pane.
    pub scope: Option<Scope>,
    /// A session, window or pane id.
    pub target: Option<String>,
    /// The global hook.
    #[serde(default)]
    pub global_: bool,
}

/// Shows one hook.
pub async fn show_hook(c: &Call<'_>, a: ShowHook) -> Result<Hooks, ToolError> {
    option_name(&a.hook_name)?;
    let cmd = scope_cmd(
        Cmd::new("show-hooks"),
        a.scope
            .filter(|s| *s != Scope::Session && *s != Scope::Server),
        &a.target,
        a.global_,
    )?
    .arg(&a.hook_name);
    let r = c.s.hub().run(&cmd).await?;
    Ok(Hooks {
        hooks: r
            .iter()
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect(),
    })
}

/// `show_buffer`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShowBuffer {
    /// A name returned by load_buffer.
    pub buffer_name: String,
    /// Line cap (default 500).
    pub max_lines: Option<usize>,
}

/// Checks that a buffer name is one sandmux made.
pub fn buffer_name(n: &str) -> Result<(), ToolError> {
    let ok = n.starts_with(super::manage::BUFFER_PREFIX)
        && n.len() <= 100
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ToolError::refused(format!(
            "buffer {n:?} was not made by load_buffer (names start with {})",
            super::manage::BUFFER_PREFIX
        )))
    }
}

/// Shows a buffer.
pub async fn show_buffer(c: &Call<'_>, a: ShowBuffer) -> Result<Captured, ToolError> {
    buffer_name(&a.buffer_name)?;
    let r =
        c.s.hub()
            .run_checked(&Cmd::new("show-buffer").opt("-b", &a.buffer_name))
            .await?;
    let t: String = r.iter().map(|l| text::clean(l) + "\n").collect();
    let (l, b) = caps(a.max_lines, None);
    Ok(Captured {
        source: a.buffer_name,
        content: text::cap(&t, l, b),
    })
}

/// One operation of a read batch.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct BatchOp {
    /// An inspect tool's name.
    pub tool: String,
    /// Its arguments.
    #[serde(default)]
    pub arguments: Value,
}

/// `call_read_tools_batch`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Batch {
    /// 1–100 operations.
    pub operations: Vec<BatchOp>,
    /// After an error: stop (default) or continue.
    pub on_error: Option<crate::mcp::choices::OnError>,
}

/// One result of a batch.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BatchItem {
    /// Position.
    pub index: usize,
    /// Tool.
    pub tool: String,
    /// Whether it succeeded.
    pub ok: bool,
    /// Its structured result.
    pub result: Option<Value>,
    /// Its error.
    pub error: Option<String>,
}

/// Batch result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BatchResult {
    /// Results in order.
    pub results: Vec<BatchItem>,
}

/// Runs several inspect tools (each checked and audited on its own by the server).
pub async fn call_read_tools_batch(c: &Call<'_>, a: Batch) -> Result<BatchResult, ToolError> {
    let stop = super::batch_rules(a.operations.len(), a.on_error)?;
    let deadline = Instant::now() + c.s.wait_max;
    let mut results = Vec::new();
    for (index, op) in a.operations.into_iter().enumerate() {
        if Instant::now() > deadline {
            results.push(BatchItem {
                index,
                tool: op.tool,
                ok: false,
                result: None,
                error: Some("the batch deadline passed".into()),
            });
            break;
        }
        let r = crate::mcp::server::dispatch_nested(c, &op.tool, op.arguments).await;
        let failed = r.is_err();
        results.push(match r {
            Ok(v) => BatchItem {
                index,
                tool: op.tool,
                ok: true,
                result: Some(v),
                error: None,
            },
            Err(e) => BatchItem {
                index,
                tool: op.tool,
                ok: false,
                result: None,
                error: Some(e.to_string()),
            },
        });
        if failed && stop {
            break;
        }
    }
    Ok(BatchResult { results })
}

/// Most bytes of cast one `export_replay` answer holds.
pub const REPLAY_MAX_BYTES: usize = 900_000;
/// Fewest bytes a window may ask for (every line of a cast is shorter).
const REPLAY_MIN_BYTES: usize = 65_536;

/// `export_replay`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Replay {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
    /// Where in the recording to start: 0 (default) or a next_offset.
    pub offset: Option<u64>,
    /// Most bytes to return (65536-900000, default 900000).
    pub max_bytes: Option<usize>,
}

/// An asciicast v2 document, or a window of one.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ReplayResult {
    /// "recording" (the --record file so far) or "snapshot" (the pane's screen now).
    pub mode: String,
    /// Whole lines of asciicast v2 (a header at offset 0, then events).
    pub cast: String,
    /// Whether more follows.
    pub truncated: bool,
    /// Where this window starts.
    pub offset: u64,
    /// Where the next window starts (null at the end).
    pub next_offset: Option<u64>,
    /// Bytes of the whole recording (or snapshot).
    pub size: u64,
    /// Whether the recording stopped at [recording] max_bytes.
    pub cut: bool,
}

/// The instance's terminal output as asciicast v2: a window of the running
/// recording when serve has --record, else a snapshot of a pane's screen.
/// Never reads more of the file than the window.
pub async fn export_replay(c: &Call<'_>, a: Replay) -> Result<ReplayResult, ToolError> {
    let max = a.max_bytes.unwrap_or(REPLAY_MAX_BYTES);
    if !(REPLAY_MIN_BYTES..=REPLAY_MAX_BYTES).contains(&max) {
        return Err(ToolError::invalid(
            "max_bytes",
            "must be 65536-900000",
            "omit it for 900000",
        ));
    }
    let offset = a.offset.unwrap_or(0);
    if let Some(rec) = &c.s.record {
        let w = crate::mcp::record::read_window(rec.path(), offset, max).map_err(|e| {
            ToolError::invalid("offset", &e, "use 0 or the next_offset of the last answer")
        })?;
        return Ok(ReplayResult {
            mode: "recording".into(),
            cast: w.text,
            truncated: w.next.is_some(),
            offset,
            next_offset: w.next,
            size: w.size,
            cut: rec.view().cut,
        });
    }
    if offset != 0 {
        return Err(ToolError::invalid(
            "offset",
            "a snapshot is made anew by each call and has no offsets",
            "omit offset (it pages through a --record recording)",
        ));
    }
    let p = targets::pane(c, &a.p).await?;
    let cast = crate::mcp::record::snapshot_cast(&c.s.hub(), &p.pane_id)
        .await
        .map_err(ToolError::Internal)?;
    let size = cast.len() as u64;
    let (cast, truncated) = crate::mcp::record::cut_lines(cast, max);
    Ok(ReplayResult {
        mode: "snapshot".into(),
        cast,
        truncated,
        offset: 0,
        next_offset: None,
        size,
        cut: false,
    })
}

/// One line for `sandbox_status`: the state, its reason, the bytes used.
fn audit_state(st: &Value) -> String {
    let mut s = format!(
        "{}: {} of {} bytes",
        st["state"].as_str().unwrap_or("?"),
        st["bytes"],
        st["budget"]
    );
    if let Some(r) = st["reason"].as_str() {
        s.push_str(&format!("; {r}"));
    }
    s
}

/// `sandbox_status` result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Status {
    /// Profile name.
    pub profile: String,
    /// Profile description.
    pub description: String,
    /// Workspace (read-write inside).
    pub workspace: String,
    /// Network mode.
    pub network: String,
    /// Every layer as the sandbox reported it while starting.
    pub layers: Vec<LayerView>,
    /// Layers dropped (best-effort).
    pub dropped: Vec<String>,
    /// Toolsets' tools enabled now.
    pub tools_enabled: usize,
    /// Where the audit log is.
    pub audit_log: String,
    /// Whether calls can be recorded: `ok`, or `full`/`failing` and why
    /// (then every call is refused).
    pub audit_state: String,
    /// Drift status.
    pub drift: String,
    /// Bytes of pane output buffered by sandmux.
    pub buffered_output_bytes: usize,
    /// Processes the kernel killed for exceeding the memory limit (from the
    /// instance's cgroup; null without one).
    pub oom_kills: Option<u64>,
    /// The workspace guard (P8): what kind of checkout the workspace is, what
    /// is read-only, what is watched, what was reverted.
    pub workspace_guard: crate::guard::View,
    /// What the agent can rely on, and what it cannot do here.
    pub limits: Limits,
    /// Sessions, panes and host-side tmux clients now (null if tmux did not
    /// answer).
    pub in_use: Option<crate::mcp::bounds::InUse>,
    /// The --record file (null without one).
    pub recording: Option<crate::mcp::record::View>,
    /// The operator froze the sandbox: other calls are refused until thawed.
    pub frozen: bool,
}

/// The limits an agent meets, in one place.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Limits {
    /// Paths that persist after the instance (read-write trees).
    pub writable: Vec<String>,
    /// Paths that are writable but vanish when the instance ends (tmpfs).
    pub vanishes_at_end: Vec<String>,
    /// Longest wait any call may ask for, in seconds.
    pub wait_max_seconds: u64,
    /// Largest text a call may send, in bytes.
    pub max_input_bytes: u64,
    /// Output kept per pane by sandmux (older output is dropped; captures of the screen still work).
    pub output_ring_bytes: usize,
    /// Sessions that may exist at once; creating one more is refused.
    pub max_sessions: u32,
    /// Panes that may exist at once, across all sessions.
    pub max_panes: u32,
    /// tmux clients the supervisor may run on the host (`1 + max_sessions`).
    pub max_host_clients: u32,
    /// What is impossible here, by policy.
    pub impossible: Vec<String>,
}

/// A layer in the status.
#[derive(Debug, Serialize, JsonSchema)]
pub struct LayerView {
    /// Layer name.
    pub layer: String,
    /// In force.
    pub enforced: bool,
    /// Detail or reason.
    pub detail: String,
}

fn limits(p: &crate::profile::Policy) -> Limits {
    use crate::profile::{MountKind, NetMode};
    let of = |k: MountKind| -> Vec<String> {
        p.fs.iter()
            .filter(|e| e.kind == k)
            .map(|e| e.path.display().to_string())
            .collect()
    };
    let mut impossible = vec![
        "reaching the host's tmux servers or any other tmux socket".to_string(),
        "gaining privileges (no capabilities, no_new_privs, no setuid)".into(),
    ];
    if p.guard.git != crate::guard::GitMode::Unguarded {
        impossible
            .push("changing git's control plane in the workspace (history is readable)".into());
    }
    if !p.guard.names.is_empty() {
        impossible.push("leaving tool configuration host programs obey (.envrc, .vscode, …): it is read-only or reverted".into());
    }
    impossible.push(format!(
        "more than {} sessions or {} panes at once (creating one more is refused)",
        p.limits.max_sessions, p.limits.max_panes
    ));
    impossible.push(match p.network.mode {
        NetMode::None => "any network, DNS included".into(),
        NetMode::Loopback => "any network beyond loopback, DNS included".into(),
        NetMode::Host => "TCP to ports the profile does not list".into(),
    });
    Limits {
        writable: of(MountKind::ReadWrite),
        vanishes_at_end: of(MountKind::Tmpfs),
        wait_max_seconds: p.mcp.wait_max_seconds,
        max_input_bytes: p.mcp.max_input_bytes,
        output_ring_bytes: crate::tmux::hub::RING_BYTES,
        max_sessions: p.limits.max_sessions,
        max_panes: p.limits.max_panes,
        max_host_clients: 1 + p.limits.max_sessions,
        impossible,
    }
}

/// The status.
pub async fn sandbox_status(c: &Call<'_>, _: NoArgs) -> Result<Status, ToolError> {
    let layers: Vec<LayerView> =
        c.s.info()
            .layers
            .iter()
            .map(|l| LayerView {
                layer: l.layer.name().into(),
                enforced: l.enforced,
                detail: l.detail.clone(),
            })
            .collect();
    let git_kernel = layers.iter().any(|l| l.layer == "git" && l.enforced);
    Ok(Status {
        profile: c.s.policy.name.clone(),
        description: c.s.policy.description.clone(),
        workspace: c.s.policy.workspace.display().to_string(),
        network: c.s.policy.network.mode.name().into(),
        dropped: layers
            .iter()
            .filter(|l| !l.enforced)
            .map(|l| l.layer.clone())
            .collect(),
        layers,
        tools_enabled: c.s.enabled.read().map(|e| e.len()).unwrap_or(0),
        audit_log: c.s.audit.path().display().to_string(),
        audit_state: audit_state(&c.s.audit.status()),
        drift: c.s.drift.tripped().unwrap_or_else(|| "none".into()),
        buffered_output_bytes: c.s.hub().buffered_bytes(),
        oom_kills: c.s.info().cgroup.as_ref().map(|cg| cg.oom_kills()),
        limits: limits(&c.s.policy),
        in_use: crate::mcp::bounds::in_use(&c.s.hub()).await.ok(),
        recording: c.s.record.as_ref().map(|r| r.view()),
        frozen: c.s.freeze.is_frozen(),
        workspace_guard: c.s.policy.guard.view(
            git_kernel,
            c.s.reverts.as_ref().map(|r| r.count()).unwrap_or(0),
            &c.s.reverts
                .as_ref()
                .map(|r| r.quarantine.clone())
                .unwrap_or_default(),
        ),
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
