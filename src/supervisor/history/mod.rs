//! The workspace's history (issue 43): a numbered checkpoint of the
//! layer's state after each tool call that can change it, kept in the
//! layer's own directory (`LAYER/history/`, the human's, 0700: the agent
//! never sees it), so the human can list, diff and rewind to any call.
//!
//! - `objects/SHA256`: each file content once (deduplicated by content).
//! - `base.json`: the state at the oldest checkpoint kept (`{}` at first).
//! - `deltas/N.json`: what checkpoint N changed: entries and removals.
//! - `log.jsonl`: one line a checkpoint: its number, time, the call (tool,
//!   request id, arguments as the audit log redacts them), its digest
//!   (SHA-256 of the previous digest and the delta: a chain, so a
//!   checkpoint names every state before it), what changed.
//!
//! A checkpoint compares the layer with the last one by inode, ctime and
//! size, reading only what changed; everything is read by descriptor,
//! never through a link ([`walk`]). The store is bounded: past its bytes
//! the oldest checkpoints fold into the base, and the log says so.

pub(crate) mod feed;
mod files;
pub(crate) mod materialise;
pub(crate) mod rewind;
pub(crate) mod store;
pub(crate) mod views;
pub(crate) mod walk;

#[cfg(test)]
mod tests;

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
pub(crate) use store::History;
pub(crate) use walk::Node;

/// The state of the layer: every entry by its path.
pub(crate) type State = BTreeMap<PathBuf, Node>;

/// Why a checkpoint, a listing or a rewind failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HistoryError {
    /// A file-system step.
    #[error("{what} {}: {source}", crate::term::printable(&path.to_string_lossy()))]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// More entries than a walk reads.
    #[error("the layer holds more than {0} entries: no checkpoint")]
    TooLarge(usize),
    /// A record of the store that does not parse.
    #[error("the history's {0} does not parse: {1}")]
    Corrupt(String, String),
    /// No such checkpoint.
    #[error("no checkpoint {0} (see `sandmux log ID`)")]
    NoCheckpoint(u64),
    /// Folded into the base past the store's bound.
    #[error("checkpoint {0} was folded into later ones when the history reached its bound; the oldest kept is {1}")]
    Folded(u64, u64),
    /// A file the history could not keep stands in the way of a rewind.
    #[error("checkpoint {n} holds {} whose content the history could not keep (it had no room under [workspace] history_bytes): nothing was rewound", crate::term::printable(&path.to_string_lossy()))]
    Unkept {
        /// The checkpoint.
        n: u64,
        /// The file.
        path: PathBuf,
    },
    /// The layer has no history.
    #[error("layer {0} has no history (it was made before checkpoints, or in live mode)")]
    None(String),
}

impl HistoryError {
    pub(crate) fn io(what: &'static str, path: &Path, source: std::io::Error) -> HistoryError {
        HistoryError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The call a checkpoint follows.
#[derive(Debug, Clone)]
pub(crate) struct Cause {
    /// The tool (`(start)`, `(rewind)` for sandmux's own).
    pub(crate) tool: String,
    /// The JSON-RPC request id.
    pub(crate) request_id: String,
    /// The arguments as the audit log redacts them.
    pub(crate) args: Value,
}

/// One line of `log.jsonl`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Line {
    /// The checkpoint's number (0: the layer at the start).
    pub(crate) n: u64,
    /// When it was taken (RFC 3339, UTC).
    pub(crate) ts: String,
    /// The call it follows.
    pub(crate) tool: String,
    /// Its request id.
    pub(crate) request_id: String,
    /// Its arguments, redacted as in the audit log.
    pub(crate) args: Value,
    /// SHA-256 of the previous digest and this delta.
    pub(crate) digest: String,
    /// Entries added or changed, and removed.
    pub(crate) changed: usize,
    /// Entries removed.
    pub(crate) removed: usize,
    /// The first paths changed (hex), at most [`PATHS_LOGGED`].
    pub(crate) paths: Vec<String>,
    /// Bytes of new objects it stored.
    pub(crate) stored: u64,
    /// The checkpoints folded into the base to make room, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) folded_upto: Option<u64>,
}

/// Paths a log line names.
pub(crate) const PATHS_LOGGED: usize = 20;

/// What checkpoint N changed.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Delta {
    /// Entries added or changed, by hex path.
    pub(crate) changed: BTreeMap<String, Node>,
    /// Entries removed, by hex path.
    pub(crate) removed: Vec<String>,
}

impl Delta {
    /// Applies the delta to `state`.
    pub(crate) fn apply(&self, state: &mut State) -> Result<(), HistoryError> {
        for p in &self.removed {
            state.remove(&path_of(p)?);
        }
        for (p, n) in &self.changed {
            state.insert(path_of(p)?, n.clone());
        }
        Ok(())
    }
}

/// A path from its hex form.
pub(crate) fn path_of(hex: &str) -> Result<PathBuf, HistoryError> {
    use std::os::unix::ffi::OsStringExt;
    let bytes = walk::unhex(hex).ok_or_else(|| HistoryError::Corrupt("path".into(), hex.into()))?;
    let p = PathBuf::from(std::ffi::OsString::from_vec(bytes));
    // Relative, no `..`: a record the human's side wrote, checked anyway.
    let plain = p
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !plain || p.as_os_str().is_empty() {
        return Err(HistoryError::Corrupt("path".into(), hex.into()));
    }
    Ok(p)
}

/// A path's hex form.
pub(crate) fn hex_of(p: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    walk::hex(p.as_os_str().as_bytes())
}
