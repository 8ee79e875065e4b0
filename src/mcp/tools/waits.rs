//! Waiting on a pane: for text, for quiet, for text to go. Each waits
//! through the one wait loop (`wait`), event-driven on the pane's stream.

use super::read::{capture_text, matcher, parse_cursor};
use super::wait::{Wait, Woke};
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::targets::{self, PaneRow, PaneSel};
use crate::mcp::text;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What a wait for patterns shares: the pane, how its patterns match, its
/// timeout.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct PatternWait {
    #[serde(flatten)]
    pub p: PaneSel,
    /// Seconds (default 8).
    pub timeout: Option<f64>,
    /// Patterns are regular expressions.
    #[serde(default)]
    pub regex: bool,
    /// Case-sensitive.
    #[serde(default)]
    pub match_case: bool,
}

impl PatternWait {
    /// A matcher for each of `patterns` (the argument `arg`).
    fn all(&self, arg: &str, patterns: &[String]) -> Result<Vec<regex::Regex>, ToolError> {
        patterns
            .iter()
            .map(|p| matcher(arg, p, self.regex, self.match_case))
            .collect()
    }
}

/// `wait_for_text`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct WaitText {
    /// Patterns to wait for (null: any new output).
    pub patterns: Option<Vec<String>>,
    /// Patterns that end the wait early with outcome "stopped".
    pub stop: Option<Vec<String>>,
    #[serde(flatten)]
    pub w: PatternWait,
    /// Ignored (waits are event-driven).
    // Accepted so that libtmux-mcp's callers keep working (the doc comment
    // above is the schema's description, within tools/list's budget).
    #[allow(dead_code)]
    pub interval: Option<f64>,
    /// Count output from this cursor (from send_keys or capture_since) on.
    pub cursor: Option<String>,
}

/// How a wait ended.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct WaitResult {
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
pub(crate) fn tail(t: &str) -> String {
    text::cap(t, 20, 2000).text
}

/// Waits on a pane's stream: calls `check` with all text written since the
/// start each time the pane writes, until it returns an outcome or time is up.
/// Progress is sent every two seconds.
pub(crate) async fn wait_stream<F>(
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

/// Waits for text.
pub(crate) async fn wait_for_text(c: &Call<'_>, a: WaitText) -> Result<WaitResult, ToolError> {
    let timeout = c.clamp(a.w.timeout, 8.0)?;
    let pats = a.w.all("patterns", a.patterns.as_deref().unwrap_or(&[]))?;
    let stops = a.w.all("stop", a.stop.as_deref().unwrap_or(&[]))?;
    let (p, from) = match &a.cursor {
        Some(cur) => {
            let (num, off) = parse_cursor(c, cur)?;
            (
                targets::explicit_pane(c, &format!("%{num}")).await?,
                Some(off),
            )
        }
        None => (targets::pane(c, &a.w.p).await?, None),
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
pub(crate) struct WaitStable {
    #[serde(flatten)]
    pub p: PaneSel,
    /// Quiet time in milliseconds (default 400).
    pub quiet_ms: Option<u64>,
    /// Seconds (default 10).
    pub timeout: Option<f64>,
}

/// Waits until a pane is quiet.
pub(crate) async fn wait_for_stable(c: &Call<'_>, a: WaitStable) -> Result<WaitResult, ToolError> {
    let timeout = c.clamp(a.timeout, 10.0)?;
    let quiet = Duration::from_millis(a.quiet_ms.unwrap_or(400).clamp(10, 60_000));
    let p = targets::pane(c, &a.p).await?;
    let (start, mut rx) = c.s.hub().subscribe(p.num);
    let mut wait = Wait::call(c, timeout);
    let outcome = loop {
        // Quiet: no output for `quiet`; any output starts the quiet anew.
        match wait
            .until(tokio::time::timeout(quiet, rx.changed()))
            .await?
        {
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
pub(crate) struct WaitGone {
    /// Patterns that must disappear from the visible screen.
    pub patterns: Vec<String>,
    #[serde(flatten)]
    pub w: PatternWait,
}

/// Waits until text is gone from the screen (re-checked on each write).
pub(crate) async fn wait_for_gone(c: &Call<'_>, a: WaitGone) -> Result<WaitResult, ToolError> {
    let timeout = c.clamp(a.w.timeout, 8.0)?;
    let pats = a.w.all("patterns", &a.patterns)?;
    if pats.is_empty() {
        return Err(ToolError::invalid(
            "patterns",
            "is empty",
            "give at least one pattern",
        ));
    }
    let p = targets::pane(c, &a.w.p).await?;
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
