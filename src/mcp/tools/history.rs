//! `workspace_history`: the agent's own history of the workspace
//! (`supervisor::history`), read-only — the checkpoints taken after its
//! changing calls, or one checkpoint's changed paths. Names are the
//! agent's own, returned as data (never to a human's terminal here), and
//! bounded like every result: entries, names and bytes are capped, and
//! the result says when it cut.

use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::supervisor::history::{self, store, Line};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Checkpoints listed at most (the newest).
const LISTED: usize = 50;
/// Paths named at most: per listed checkpoint, and for one checkpoint.
const PATHS_LISTED: usize = 5;
const PATHS_ONE: usize = 200;
/// Longest name returned, in bytes (cut on a character boundary).
const NAME_MAX: usize = 256;

/// `workspace_history` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct HistoryArgs {
    /// Only this checkpoint, with every path it changed (capped).
    pub n: Option<u64>,
}

/// One checkpoint.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Checkpoint {
    /// Its number (0: the workspace at the start).
    pub n: u64,
    /// The tool call it follows.
    pub tool: String,
    /// Entries added or changed by that call.
    pub changed: usize,
    /// Entries removed by that call.
    pub removed: usize,
    /// Paths it changed or removed (the first few; all with `n`).
    pub paths: Vec<String>,
}

/// `workspace_history` result.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct History {
    /// Checkpoints, oldest first (the newest 50; one with `n`).
    pub checkpoints: Vec<Checkpoint>,
    /// The oldest checkpoint still kept (older ones were folded).
    pub oldest: u64,
    /// Something was left out (older checkpoints, paths, long names).
    pub truncated: bool,
}

/// `workspace_history`.
pub(crate) async fn workspace_history(c: &Call<'_>, a: HistoryArgs) -> Result<History, ToolError> {
    let h = c.s.history.clone().ok_or_else(|| {
        ToolError::refused("this instance's workspace is live (or a copy): it keeps no history")
    })?;
    tokio::task::spawn_blocking(move || {
        // Held while read: no checkpoint is half written meanwhile.
        let h = h.lock().unwrap_or_else(|p| p.into_inner());
        read(h.dir(), a.n)
    })
    .await
    .map_err(|e| ToolError::Internal(e.to_string()))?
}

fn read(dir: &std::path::Path, n: Option<u64>) -> Result<History, ToolError> {
    let e = |e: history::HistoryError| ToolError::Internal(e.to_string());
    let lines = store::read_lines(dir).map_err(e)?;
    let oldest = store::base_of(dir).map_err(e)?.0;
    let mut truncated = false;
    let checkpoints = match n {
        None => {
            truncated = lines.len() > LISTED;
            let from = lines.len().saturating_sub(LISTED);
            lines[from..]
                .iter()
                .map(|l| listed(l, &mut truncated))
                .collect()
        }
        Some(n) => {
            let l = lines.iter().find(|l| l.n == n).ok_or_else(|| {
                ToolError::not_found(
                    format!("checkpoint {n}"),
                    "call workspace_history without `n` for the list",
                )
            })?;
            let mut one = listed(l, &mut truncated);
            if n > oldest {
                let d = store::delta_of(dir, n).map_err(e)?;
                let all = d.changed.keys().chain(d.removed.iter());
                one.paths = names(all, PATHS_ONE, &mut truncated);
            }
            vec![one]
        }
    };
    Ok(History {
        checkpoints,
        oldest,
        truncated,
    })
}

fn listed(l: &Line, truncated: &mut bool) -> Checkpoint {
    if l.changed + l.removed > PATHS_LISTED {
        *truncated = true;
    }
    Checkpoint {
        n: l.n,
        tool: l.tool.clone(),
        changed: l.changed,
        removed: l.removed,
        paths: names(l.paths.iter(), PATHS_LISTED, truncated),
    }
}

/// Up to `max` hex paths as text (lossy), each at most [`NAME_MAX`] bytes.
fn names<'a>(
    hex: impl Iterator<Item = &'a String>,
    max: usize,
    truncated: &mut bool,
) -> Vec<String> {
    let mut out = Vec::new();
    for h in hex {
        if out.len() == max {
            *truncated = true;
            break;
        }
        let Ok(p) = history::path_of(h) else { continue };
        let mut s = p.to_string_lossy().into_owned();
        if s.len() > NAME_MAX {
            let cut = (0..=NAME_MAX)
                .rev()
                .find(|i| s.is_char_boundary(*i))
                .unwrap_or(0);
            s.truncate(cut);
            s.push('…');
            *truncated = true;
        }
        out.push(s);
    }
    out
}
