//! Tool implementations, one file per tmux object; which toolset a tool is in
//! is the catalogue's to say (`catalog.rs`). The object files import none of
//! each other, only what they share: this file (results, batch rules, buffer
//! names), `read` (a pane's text, cursors, patterns), `spawn` (processes
//! through the pane gate), `wait` (the one wait loop) and `follow` (a typed
//! command followed to its end marker).

pub(crate) mod buffers;
pub(crate) mod capture;
pub(crate) mod commands;
pub(crate) mod elide;
pub(crate) mod follow;
pub(crate) mod history;
pub(crate) mod input;
pub(crate) mod instance;
pub(crate) mod options;
pub(crate) mod panes;
pub(crate) mod read;
pub(crate) mod rewind;
pub(crate) mod sessions;
pub(crate) mod spawn;
pub(crate) mod status;
mod wait;
pub(crate) mod waits;
pub(crate) mod windows;

use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::targets::{self, PaneRow};
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// No arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct NoArgs {}

/// A change was made.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Done {
    /// What was done, in words.
    pub done: String,
}

fn done(s: impl Into<String>) -> Result<Done, ToolError> {
    Ok(Done { done: s.into() })
}

/// Buffers made by sandmux start with this.
pub(crate) const BUFFER_PREFIX: &str = "sandmux_";

/// Checks that a buffer name is one sandmux made.
pub(crate) fn buffer_name(n: &str) -> Result<(), ToolError> {
    let ok = n.starts_with(BUFFER_PREFIX)
        && n.len() <= 100
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ToolError::refused(format!(
            "buffer {n:?} was not made by load_buffer (names start with {})",
            BUFFER_PREFIX
        )))
    }
}

/// The rules every batch follows: 1–100 operations, and `on_error` is `stop`
/// (the default) or `continue`. Returns whether to stop at the first error.
pub(crate) fn batch_rules(
    len: usize,
    on_error: Option<crate::mcp::choices::OnError>,
) -> Result<bool, ToolError> {
    if len == 0 || len > 100 {
        return Err(ToolError::invalid(
            "operations",
            "must hold 1-100 operations",
            "split it into several batches",
        ));
    }
    Ok(on_error.unwrap_or_default() == crate::mcp::choices::OnError::Stop)
}

/// Text is meant for the program in the pane: a pane in copy mode (or any
/// mode) would instead take each character as a mode command, so the mode is
/// left first. Key names are still delivered to the mode (`q`, `Up`, ...).
async fn leave_modes(c: &Call<'_>, pane: &PaneRow) -> Result<(), ToolError> {
    if pane.in_mode {
        c.s.hub()
            .run(&Cmd::new("copy-mode").flag("-q").opt("-t", &pane.pane_id))
            .await?;
    }
    Ok(())
}

/// Kills `what` (`session`, `window` or `pane`) `id`. The result says so
/// when no session of the agent's is left: the instance stays up then (its
/// own control session is sandmux's, and `--no-session` starts the same
/// way), so the agent learns both ways on.
async fn kill(c: &Call<'_>, what: &str, id: &str) -> Result<Done, ToolError> {
    c.s.hub()
        .run(&Cmd::new(&format!("kill-{what}")).opt("-t", id))
        .await?;
    let what = format!("{what} {id} killed");
    // The kill is done: a listing that fails here must not report it as failed.
    if targets::panes(c).await.is_ok_and(|p| p.is_empty()) {
        return done(format!(
            "{what}; that was the last session: the instance stays up with none \
             (create_session starts one, kill_server ends the instance)"
        ));
    }
    done(what)
}

fn dim(arg: &str, v: u32) -> Result<String, ToolError> {
    if (1..=1000).contains(&v) {
        Ok(v.to_string())
    } else {
        Err(ToolError::invalid(arg, "must be 1-1000", "e.g. 40"))
    }
}
