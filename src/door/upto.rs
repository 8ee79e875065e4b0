//! `sandmux diff ID --upto N` and `sandmux apply ID --upto N`: the work up
//! to tool call N, through the same door as the whole layer. Checkpoint
//! N's state is written out whole from the history's records
//! (`history::materialise`) into a view of its own in the layer's
//! directory (`upto-N/upper`, the human's, 0700: the agent never sees it),
//! and the ordinary `diff` and `apply` run on that view as on a layer: the
//! same plan and hold-backs, the same review digest (kept in the view:
//! `apply --upto N` checks what `diff --upto N` showed), the same journal
//! and `taken/` (in the view: `apply ID --upto N --undo` reverses it), the
//! same record in the instance's audit log. There is no second apply to
//! miss a rule. A view an apply ran on counts as the layer's own journal
//! wherever one does (`supervisor::history::views`).

use super::review::REVIEWED;
use super::DoorError;
use crate::supervisor::history::views::{self, views, MAKING};
use crate::supervisor::history::{materialise, History, HistoryError};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Checkpoint `n` of the layer at `top` (instance `id`, ended: the caller
/// holds its lock) as a view the door works on; made once, then reused
/// (a checkpoint's state never changes once taken).
pub(crate) fn view(
    top: &Path,
    meta: &crate::supervisor::layer::Meta,
    id: &str,
    n: u64,
) -> Result<PathBuf, DoorError> {
    let history = History::dir_of(top);
    if meta.copy.is_some() || !history.join("log.jsonl").exists() {
        return Err(DoorError::Layer(
            HistoryError::None(id.to_string()).to_string(),
        ));
    }
    let dir = views::dir(top, n);
    if dir.is_dir() {
        return Ok(dir);
    }
    sweep(top);
    let failed = |e: HistoryError| DoorError::Layer(format!("checkpoint {n} of layer {id}: {e}"));
    let target = materialise::target(&history, n).map_err(failed)?;
    // Bounded before anything is written: each content once, against the
    // free space of the layer's file system.
    let (need, inodes) = materialise::need(&target);
    let fs = nix::sys::statvfs::statvfs(top)
        .map_err(|e| DoorError::Failed(format!("the layer's free space: {e}")))?;
    let free = fs.blocks_available().saturating_mul(fs.fragment_size());
    // A file system that counts no inodes (0 in all) has no such limit.
    let (files_free, counts) = (fs.files_available(), fs.files() > 0);
    if need > free || (counts && inodes > files_free) {
        return Err(DoorError::ViewNoSpace {
            n,
            need,
            free,
            inodes,
        });
    }
    // The view counts with the kept layers (`ps --all`): past `[workspace]
    // kept_bytes` no instance would start.
    let cap = crate::profile::user::load()
        .map_err(|e| DoorError::Layer(e.to_string()))?
        .workspace
        .kept_bytes
        .0;
    let kept = crate::supervisor::kept::list()
        .iter()
        .fold(0u64, |t, k| t.saturating_add(k.bytes));
    if kept.saturating_add(need) > cap {
        return Err(DoorError::ViewOverKept {
            n,
            need,
            kept,
            cap,
            config: crate::profile::user::path(),
        });
    }
    let making = top.join(format!("{MAKING}{n}-{}", &crate::nonce::hex()[..12]));
    let made = std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(making.join("upper"))
        .map_err(|e| HistoryError::io("creating", &making, e))
        .and_then(|()| materialise::write(&history, &target, &making.join("upper")))
        .map_err(failed)
        .and_then(|_| {
            std::fs::rename(&making, &dir)
                .map_err(|e| DoorError::Layer(format!("{}: {e}", dir.display())))
        });
    if made.is_err() {
        let _ = crate::supervisor::layer::remove_tree(&making);
    }
    // The layer holds more: measured again when next listed (`ps`,
    // `kept_bytes`).
    let _ = std::fs::remove_file(top.join(crate::supervisor::kept::USAGE));
    made.map(|()| dir)
}

/// The view of checkpoint `n` if one was made (`apply --upto N --undo`
/// has nothing to undo in a view that does not exist: none is made).
pub(crate) fn existing(top: &Path, n: u64) -> Option<PathBuf> {
    let dir = views::dir(top, n);
    dir.is_dir().then_some(dir)
}

/// Every other state's review of the layer at `top` is stale once `at`
/// (the layer's directory or a view) was reviewed: the last review wins,
/// across views too (a plain `apply` of another state is then refused by
/// [`reviewed_elsewhere`]).
pub(crate) fn forget_others(top: &Path, at: &Path) {
    let others = std::iter::once(top.to_path_buf()).chain(views(top).into_iter().map(|(_, d)| d));
    for d in others.filter(|d| d != at) {
        let _ = std::fs::remove_file(d.join(REVIEWED));
    }
}

/// Removes views a crash left half made (the caller holds the lock).
fn sweep(top: &Path) {
    let Ok(rd) = std::fs::read_dir(top) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with(MAKING) {
            let _ = crate::supervisor::layer::remove_tree(&e.path());
        }
    }
}

/// Applied = reviewed, across views: when the target of this apply (`at`:
/// the layer's directory or one of its views) has no review but another
/// of the same layer does, the human reviewed something else than what
/// would be applied: the `diff` that would have shown it. None: no such
/// review.
pub(crate) fn reviewed_elsewhere(top: &Path, at: &Path, id: &str) -> Option<String> {
    if at.join(REVIEWED).exists() {
        return None;
    }
    let mut others = vec![(None, top.to_path_buf())];
    others.extend(views(top).into_iter().map(|(n, d)| (Some(n), d)));
    let (n, _) = others
        .into_iter()
        .find(|(_, d)| d != at && d.join(REVIEWED).exists())?;
    let was = |n: Option<u64>| match n {
        Some(n) => format!("`sandmux diff {id} --upto {n}`"),
        None => format!("`sandmux diff {id}`"),
    };
    let this = views(top)
        .into_iter()
        .find(|(_, d)| d == at)
        .map(|(n, _)| n);
    Some(format!(
        "your last review of layer {id} was {}, not of what this apply brings: nothing applied; run {} first",
        was(n),
        was(this)
    ))
}
