//! The agent's tmux objects are bounded by the profile (`[limits]
//! max_sessions`, `max_panes`). Every tool that makes a session, window or
//! pane (`create_session`, `create_window`, `split_window`; no other tool
//! makes one) is admitted here first: what exists is counted and, at a limit,
//! the call is refused before tmux is asked for anything.
//!
//! Concurrent calls: counting and creating happen under one lock
//! (`State::creating`), held until the new pane exists, so
//! two calls never both pass the check (serialized, not undone afterwards).
//!
//! Sandmux's control session is not counted. Sessions and panes a human makes
//! from a host-side client are counted (they use the same server), and the hub
//! gives at most `max_sessions` sessions a watcher, so the host runs at most
//! `1 + max_sessions` tmux clients for the instance whoever made them. A pane
//! cannot make any: the socket is covered for every process inside (T1).

use super::ctx::Call;
use super::error::ToolError;
use crate::tmux::hub::{Cmd, Hub};
use schemars::JsonSchema;
use serde::Serialize;
use std::collections::BTreeSet;

/// What a creating call adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Adds {
    /// A session (and its first pane).
    Session,
    /// A pane (a window's first one, or a split).
    Pane,
}

/// What exists now (sandmux's control session aside).
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
pub(crate) struct InUse {
    /// Sessions.
    pub sessions: usize,
    /// Panes across all sessions, dead ones (remain-on-exit) included.
    pub panes: usize,
    /// tmux clients the supervisor runs on the host (one command client, one
    /// watcher per session, at most `max_sessions` watchers).
    pub host_clients: usize,
}

/// Counts sessions and panes with one listing (ids only: nothing a pane
/// controls is in the reply).
pub(crate) async fn in_use(hub: &Hub) -> Result<InUse, ToolError> {
    let rows = hub
        .run(&Cmd::new("list-panes").flag("-a").opt("-F", "#{session_id}"))
        .await?;
    let ids: Vec<&[u8]> = rows
        .iter()
        .map(Vec::as_slice)
        .filter(|id| *id != hub.control_session_id().as_bytes())
        .collect();
    Ok(InUse {
        sessions: ids.iter().collect::<BTreeSet<_>>().len(),
        panes: ids.len(),
        host_clients: hub.host_clients(),
    })
}

/// Admits one creation: takes the creation lock, counts, and refuses at a
/// limit. The caller creates while it holds the returned guard.
pub(crate) async fn admit<'s>(
    c: &Call<'s>,
    adds: Adds,
) -> Result<tokio::sync::MutexGuard<'s, ()>, ToolError> {
    let guard = c.s.creating.lock().await;
    let now = in_use(&c.s.hub()).await?;
    let l = &c.s.policy.limits;
    if adds == Adds::Session && now.sessions >= l.max_sessions as usize {
        return Err(ToolError::Limit {
            message: format!(
                "the profile's limits.max_sessions is {}, and {} sessions exist; no session was created",
                l.max_sessions, now.sessions
            ),
            hint: "end a session you no longer need (kill_session, or `exit` in each of its panes), or add a window to an existing one; only the profile can raise max_sessions".into(),
        });
    }
    if now.panes >= l.max_panes as usize {
        return Err(ToolError::Limit {
            message: format!(
                "the profile's limits.max_panes is {}, and {} panes exist across all sessions (dead ones included); nothing was created",
                l.max_panes, now.panes
            ),
            hint: "end a pane you no longer need (kill_pane, kill_window, kill_session, or `exit` in its shell); only the profile can raise max_panes".into(),
        });
    }
    Ok(guard)
}
