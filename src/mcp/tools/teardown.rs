//! Teardown tools: always an explicit target; the instance's own control
//! session is never a target, and ending the server ends the instance.

use super::manage::{Done, PaneOnly};
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::targets::{self, SessionSel};
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::Deserialize;

fn done(s: impl Into<String>) -> Result<Done, ToolError> {
    Ok(Done { done: s.into() })
}

/// The result of a kill: says so when no session of the agent's is left.
/// The instance stays up then (its own control session is sandmux's, and
/// `--no-session` starts the same way), so the agent learns both ways on.
async fn killed(c: &Call<'_>, what: String) -> Result<Done, ToolError> {
    // The kill is done: a listing that fails here must not report it as failed.
    if targets::panes(c).await.is_ok_and(|p| p.is_empty()) {
        return done(format!(
            "{what}; that was the last session: the instance stays up with none \
             (create_session starts one, kill_server ends the instance)"
        ));
    }
    done(what)
}

/// `kill_session`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct KillSession {
    /// Session name.
    pub session_name: Option<String>,
    /// Session id (`$N`).
    pub session_id: Option<String>,
}

/// Kills a session (explicit target only).
pub async fn kill_session(c: &Call<'_>, a: KillSession) -> Result<Done, ToolError> {
    if a.session_name.is_none() && a.session_id.is_none() {
        return Err(ToolError::invalid(
            "session_id",
            "an explicit session is required",
            "give session_id or session_name (see list_sessions)",
        ));
    }
    let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
    c.s.hub()
        .run(&Cmd::new("kill-session").opt("-t", &s.session_id))
        .await?;
    killed(c, format!("session {} killed", s.session_id)).await
}

/// `kill_window`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct KillWindow {
    /// Window id (required).
    pub window_id: String,
}

/// Kills a window.
pub async fn kill_window(c: &Call<'_>, a: KillWindow) -> Result<Done, ToolError> {
    let w = targets::window(
        c,
        &targets::WindowSel {
            window_id: Some(a.window_id),
            ..Default::default()
        },
    )
    .await?;
    c.s.hub()
        .run(&Cmd::new("kill-window").opt("-t", &w.window_id))
        .await?;
    killed(c, format!("window {} killed", w.window_id)).await
}

/// `kill_pane`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct KillPane {
    /// Pane id (required).
    pub pane_id: String,
}

/// Kills a pane.
pub async fn kill_pane(c: &Call<'_>, a: KillPane) -> Result<Done, ToolError> {
    let p = targets::explicit_pane(c, &a.pane_id).await?;
    c.s.hub()
        .run(&Cmd::new("kill-pane").opt("-t", &p.pane_id))
        .await?;
    killed(c, format!("pane {} killed", p.pane_id)).await
}

/// Resets a pane and clears its history.
pub async fn clear_pane(c: &Call<'_>, a: PaneOnly) -> Result<Done, ToolError> {
    let p = targets::pane(c, &a.p).await?;
    c.s.hub()
        .run(&Cmd::new("send-keys").flag("-R").opt("-t", &p.pane_id))
        .await?;
    c.s.hub()
        .run(&Cmd::new("clear-history").opt("-t", &p.pane_id))
        .await?;
    done(format!("pane {} cleared", p.pane_id))
}

/// `delete_buffer`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct DeleteBuffer {
    /// A name returned by load_buffer.
    pub buffer_name: String,
}

/// Deletes a buffer.
pub async fn delete_buffer(c: &Call<'_>, a: DeleteBuffer) -> Result<Done, ToolError> {
    super::inspect::buffer_name(&a.buffer_name)?;
    c.s.hub()
        .run(&Cmd::new("delete-buffer").opt("-b", &a.buffer_name))
        .await?;
    done(format!("buffer {} deleted", a.buffer_name))
}

/// Ends the instance: answers first, then the server stops.
pub async fn kill_server(c: &Call<'_>, _: super::inspect::NoArgs) -> Result<Done, ToolError> {
    c.s.shutdown.cancel();
    done("the instance is ending: the tmux server, every process in the sandbox and the runtime directory go away after this reply; start sandmux again for a fresh one")
}
