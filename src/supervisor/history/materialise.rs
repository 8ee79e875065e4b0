//! A checkpoint's state written out whole into an empty directory (`apply
//! --upto N` and `diff --upto N` work on it as on any layer's `upper/`):
//! the same writer as a rewind's ([`super::rewind::put`]: by descriptor
//! beneath the root, never through a link, whiteouts and opaque marks as
//! overlayfs keeps them), from the history's own records, never from the
//! layer the agent wrote.

use super::store;
use super::walk::Node;
use super::{HistoryError, State};
use std::path::Path;

/// Writes the state of checkpoint `n` of the history at `history` into
/// the empty directory `root`; the number of entries written. A
/// checkpoint holding a file whose content the history could not keep is
/// refused before anything is written.
pub(crate) fn materialise(history: &Path, n: u64, root: &Path) -> Result<usize, HistoryError> {
    let last = store::read_lines(history)?.last().map_or(0, |l| l.n);
    if n > last {
        return Err(HistoryError::NoCheckpoint(n));
    }
    let target: State = store::state_at(history, n)?;
    if let Some((p, _)) = target
        .iter()
        .find(|(_, t)| matches!(t, Node::Unkept { .. }))
    {
        return Err(HistoryError::Unkept { n, path: p.clone() });
    }
    let fd = crate::sandbox::beneath::open_root(root)
        .map_err(|e| HistoryError::io("opening", root, e.into()))?;
    let objects = history.join("objects");
    // Parents sort before their children: each parent exists when needed.
    for (path, node) in &target {
        super::rewind::put(&fd, path, node, &objects)?;
    }
    super::rewind::dir_modes(&fd, &target)?;
    Ok(target.len())
}
