//! Session tools: list, describe, create, rename, kill.

use super::spawn::{self, Created};
use super::{done, kill, Done};
use crate::mcp::bounds::Adds;
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::targets::{self, PaneRow, SessionSel};
use crate::mcp::text;
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `list_sessions`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ListSessions {
    /// Lookups such as {"session_name__contains": "dev"}.
    pub filters: Option<Value>,
}

/// One session.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct SessionRow {
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
pub(crate) struct Sessions {
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
pub(crate) async fn list_sessions(c: &Call<'_>, a: ListSessions) -> Result<Sessions, ToolError> {
    let panes = targets::panes(c).await?;
    Ok(Sessions {
        sessions: targets::filter(sessions_of(&panes), &a.filters)?,
    })
}

/// `get_session_info`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SessionArgs {
    pub session_id: Option<String>,
    pub session_name: Option<String>,
}

/// One session's metadata.
pub(crate) async fn get_session_info(
    c: &Call<'_>,
    a: SessionArgs,
) -> Result<SessionRow, ToolError> {
    let first = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
    let panes = targets::panes(c).await?;
    sessions_of(&panes)
        .into_iter()
        .find(|s| s.session_id == first.session_id)
        .ok_or_else(|| ToolError::not_found("session", "call list_sessions"))
}

/// `create_session`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct CreateSession {
    pub session_name: Option<String>,
    /// First window's name.
    pub window_name: Option<String>,
    /// Working directory (inside the sandbox; default: the workspace).
    pub start_directory: Option<String>,
    /// Width in columns.
    pub x: Option<u32>,
    /// Height in rows.
    pub y: Option<u32>,
    /// Extra variables for the session's panes.
    pub environment: Option<Value>,
}

/// Creates a session.
pub(crate) async fn create_session(c: &Call<'_>, a: CreateSession) -> Result<Created, ToolError> {
    let mut cmd = spawn::making("new-session").flag("-d");
    if let Some(n) = &a.session_name {
        text::session_name("session_name", n)?;
        cmd = cmd.opt("-s", crate::tmux::fmt_literal(n));
    }
    if let Some(n) = &a.window_name {
        text::name("window_name", n)?;
        cmd = cmd.opt("-n", crate::tmux::fmt_literal(n));
    }
    cmd = spawn::process(c, cmd, &a.start_directory, &a.environment, None)?
        .opt("-x", a.x.unwrap_or(200).clamp(10, 1000).to_string())
        .opt("-y", a.y.unwrap_or(50).clamp(5, 1000).to_string());
    spawn::spawn(c, cmd, Adds::Session).await
}

/// `rename_session`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct RenameSession {
    /// The new name.
    pub new_name: String,
    pub session_name: Option<String>,
    pub session_id: Option<String>,
}

/// Renames a session.
pub(crate) async fn rename_session(c: &Call<'_>, a: RenameSession) -> Result<Done, ToolError> {
    text::session_name("new_name", &a.new_name)?;
    let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
    c.s.hub()
        .run(
            &Cmd::new("rename-session")
                .opt("-t", &s.session_id)
                .arg(crate::tmux::fmt_literal(&a.new_name)),
        )
        .await?;
    done(format!("session {} renamed", s.session_id))
}

/// `kill_session`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct KillSession {
    pub session_name: Option<String>,
    pub session_id: Option<String>,
}

/// Kills a session (explicit target only).
pub(crate) async fn kill_session(c: &Call<'_>, a: KillSession) -> Result<Done, ToolError> {
    if a.session_name.is_none() && a.session_id.is_none() {
        return Err(ToolError::invalid(
            "session_id",
            "an explicit session is required",
            "give session_id or session_name (see list_sessions)",
        ));
    }
    let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
    kill(c, "session", &s.session_id).await
}
