//! `workspace_rewind`: the agent asks to put its workspace back to how it
//! was after checkpoint N (`runtime::rewind`, the operator's `sandmux
//! rewind ID N` on a running instance). Never silently: every call asks a
//! human through the approvals path first (`Props::always_asks`; the
//! operator's `sandmux approvals`, or the client's elicitation where `[mcp]
//! ask_via` allows it), whatever an earlier answer granted; with no one to
//! ask, it is refused. The rewind is audited like the operator's (the
//! door's `rewind` record, `by` the agent) and undone by rewinding to the
//! checkpoint it took before.

use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::runtime::rewind::{recorded, RewindError};
use crate::supervisor::history::HistoryError;
use crate::supervisor::rewinder::RewinderError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `workspace_rewind` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct RewindArgs {
    /// The checkpoint to go back to (`workspace_history` lists them).
    pub n: u64,
}

/// What the rewind did.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Rewound {
    /// The checkpoint the workspace is back at.
    pub to: u64,
    /// The checkpoint taken just before: rewinding to it undoes this one.
    pub before: u64,
    /// The checkpoint the rewind itself is.
    pub after: u64,
    /// Entries written or removed.
    pub changed: usize,
}

/// `workspace_rewind` (asked and allowed before it runs).
pub(crate) async fn workspace_rewind(c: &Call<'_>, a: RewindArgs) -> Result<Rewound, ToolError> {
    let w = recorded(
        &c.s.rt,
        a.n,
        "the agent (workspace_rewind), allowed by a human",
    )
    .await
    .map_err(said)?;
    Ok(Rewound {
        to: a.n,
        before: w.before,
        after: w.after,
        changed: w.written + w.removed,
    })
}

/// The agent's message: what failed, never where on the host (the
/// layer's directory is the human's).
fn said(e: RewindError) -> ToolError {
    match e {
        RewindError::NoHistory | RewindError::History(HistoryError::Unkept { .. }) => {
            ToolError::refused(text(&e))
        }
        RewindError::History(HistoryError::Io { .. }) => ToolError::Internal(text(&e)),
        RewindError::History(_) => ToolError::refused(text(&e)),
        e => ToolError::Internal(text(&e)),
    }
}

fn text(e: &RewindError) -> String {
    match e {
        RewindError::History(HistoryError::Io { what, source, .. }) => {
            format!("the history could not be read ({what}: {source})")
        }
        RewindError::Partly { source, .. } => format!(
            "{}; the workspace may be partly rewound, and the instance stays frozen until the operator rewinds it back, thaws it or stops it",
            text(source)
        ),
        // The host's side (cgroup files, /proc paths, the broker): the
        // operator's audit log and journal say which; the agent is told what.
        RewindError::Freeze(_) => {
            "the instance could not be frozen for the rewind (the operator's `sandmux journal` says why); nothing was rewound".into()
        }
        RewindError::Rewinder(
            RewinderError::Namespace { .. } | RewinderError::Io(_) | RewinderError::Workspace { .. },
        )
        | RewindError::Broker(_)
        | RewindError::Start(_)
        | RewindError::Task(_) => {
            "the rewinder could not be started or failed (the operator's `sandmux journal` says why)".into()
        }
        e => e.to_string(),
    }
}
