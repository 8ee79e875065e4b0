//! The views `apply --upto N` and `diff --upto N` work on (`door::upto`):
//! checkpoint N written out whole in the layer's directory, `upto-N/`. A
//! view an apply ran on holds a journal and the human's replaced files in
//! its `taken/`, so it counts as the layer's own journal wherever one does:
//! `serve --resume` refuses the layer, a start's clearing of empty or old
//! layers keeps it and counts from its last apply, `ps --all` says
//! `applied` (`supervisor::kept`).

use std::path::{Path, PathBuf};

/// A view's directory in the layer's: `upto-N`.
const VIEW: &str = "upto-";
/// A view being made: `.new-upto-N-NONCE`, renamed to `upto-N` when whole
/// (a crash leaves one: it is counted in the layer's usage, and swept).
pub(crate) const MAKING: &str = ".new-upto-";

/// The view of checkpoint `n` of the layer at `top`.
pub(crate) fn dir(top: &Path, n: u64) -> PathBuf {
    top.join(format!("{VIEW}{n}"))
}

/// The views of the layer at `top`, with their checkpoints.
pub(crate) fn views(top: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(top) else {
        return Vec::new();
    };
    let mut v: Vec<(u64, PathBuf)> = rd
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.strip_prefix(VIEW)?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    v.sort();
    v
}

/// Whether an `apply --upto` ran on a view of the layer at `top`: the
/// human's replaced files are in it (`serve --resume` must not remove
/// them with the old layer's directory).
pub(crate) fn applied(top: &Path) -> bool {
    !journaled(top).is_empty()
}

/// Every view's directory, those a crash left half made too: what the
/// layer's usage counts besides `upper/` (`kept.rs`).
pub(crate) fn dirs(top: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(top) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with(VIEW) || n.starts_with(MAKING)
        })
        .map(|e| e.path())
        .collect()
}

/// The checkpoints whose views an `apply --upto` ran on (a journal, or
/// the human's files in `taken/`).
pub(crate) fn journaled(top: &Path) -> Vec<u64> {
    let kept = |d: &Path| {
        ["apply.jsonl", "taken"]
            .iter()
            .any(|f| d.join(f).symlink_metadata().is_ok())
    };
    views(top)
        .into_iter()
        .filter(|(_, d)| kept(d))
        .map(|(n, _)| n)
        .collect()
}
