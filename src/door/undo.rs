//! `sandmux apply ID --undo`: the journal `apply` wrote (`apply.jsonl`)
//! reversed, newest first, through the same no-follow descriptors, with
//! what each step replaced or removed brought back from the layer's
//! `taken/`. A step whose result the human changed since is left, and stays
//! in the journal. What it puts back is noted in the layer's
//! `restored.jsonl` as it stands then (device, inode, ctime): the rename
//! gave it a new ctime, and a later `apply` of the same layer must not take
//! that for the human's change.

use super::diff::{stat_at, Trees};
use super::error::UndoError;
use super::journal::Step;
use super::journal::{create_new, journaled, note_restored, taken_stat};
use crate::sandbox::beneath::beneath;
use nix::fcntl::{renameat2, OFlag, RenameFlags};
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Reverses the journal of the layer at `layer`, newest first, through
/// the same no-follow descriptors as `apply`. A step whose result the human
/// has changed since (a file no longer equal to the layer's, a directory no
/// longer empty, a path taken again) is left, and stays in the journal.
/// Returns how many steps were undone and what was left.
pub(crate) fn undo(trees: &Trees, layer: &Path) -> Result<(usize, Vec<String>), UndoError> {
    let path = layer.join("apply.jsonl");
    if !path.exists() {
        return Err(UndoError::NoJournal(path));
    }
    let steps = journaled(layer)?;
    let (mut done, mut left, mut kept) = (0, Vec::new(), Vec::new());
    for s in steps.iter().rev() {
        match undo_step(trees, layer, s) {
            Ok(Undone::Done) => done += 1,
            Ok(Undone::Stays) => kept.push(s.clone()),
            Err(e) => {
                left.push(format!("{}: {e}", s.rel().display()));
                kept.push(s.clone());
            }
        }
    }
    // A `Kept` line whose kept file went back (its step undone) says
    // nothing more.
    kept.retain(|s| !matches!(s, Step::Kept { taken, .. } if !was_set_aside(layer, taken)));
    kept.reverse();
    let rest: String = kept
        .iter()
        .filter_map(|s| serde_json::to_string(s).ok())
        .map(|l| l + "\n")
        .collect();
    if rest.is_empty() {
        let _ = std::fs::remove_file(&path);
    } else {
        std::fs::write(&path, rest).map_err(UndoError::Rewrite)?;
    }
    Ok((done, left))
}

impl Step {
    fn rel(&self) -> &Path {
        match self {
            Step::Mkdir { rel } | Step::Create { rel, .. } => rel,
            Step::Replace { rel, .. } | Step::Remove { rel, .. } => rel,
            Step::Kept { rel, .. } => rel,
        }
    }
}

/// What undoing one step did.
enum Undone {
    /// Reversed, or nothing to reverse: the step leaves the journal.
    Done,
    /// Nothing to reverse, and the step stays in the journal: a replace
    /// killed before its rename (the host's file is the kept one; its
    /// ctime is the link's, and a later `apply` finishes it by its `Kept`
    /// line), and those lines themselves.
    Stays,
}

fn undo_step(t: &Trees, layer: &Path, s: &Step) -> Result<Undone, UndoError> {
    match s {
        Step::Kept { .. } => return Ok(Undone::Stays),
        Step::Replace { taken, .. } if still_there(t, layer, s.rel(), taken) => {
            return Ok(Undone::Stays)
        }
        _ => {}
    }
    reverse(t, layer, s).map(|()| Undone::Done)
}

fn reverse(t: &Trees, layer: &Path, s: &Step) -> Result<(), UndoError> {
    let rel = s.rel();
    let parent = rel.parent().unwrap_or(Path::new(""));
    let name = rel.file_name().ok_or(UndoError::NoName)?;
    let dir =
        beneath(&t.lower, parent, OFlag::O_PATH | OFlag::O_DIRECTORY).map_err(UndoError::Dir)?;
    // The file the apply placed is still there: the very file it moved out
    // of the layer, unedited, or the same bytes as the layer's.
    let placed = match s {
        Step::Create { placed, .. } | Step::Replace { placed, .. } => *placed,
        _ => None,
    };
    let ours = || match placed {
        Some(p) => stat_at(&t.lower, rel).is_some_and(|s| p.is(&s)),
        None => t.same_content(rel),
    };
    match s {
        Step::Mkdir { .. } => {
            unlinkat(&dir, name, UnlinkatFlags::RemoveDir).map_err(UndoError::NotEmpty)
        }
        // A step journaled by an apply that crashed before making it.
        Step::Create { .. } if stat_at(&t.lower, rel).is_none() => Ok(()),
        // Journaled, then killed before the host's entry was set aside:
        // it was never touched.
        Step::Replace { taken, .. } | Step::Remove { taken, .. }
            if !was_set_aside(layer, taken) =>
        {
            Ok(())
        }
        Step::Create { .. } if !ours() => Err(UndoError::Changed),
        Step::Create { .. } => {
            unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir).map_err(UndoError::Sys)
        }
        Step::Replace { .. } if !ours() => Err(UndoError::Changed),
        Step::Replace { taken, .. } => {
            restore(layer, taken, &dir, name.as_ref(), true).map(|()| noted(t, layer, rel))
        }
        Step::Remove { .. } if stat_at(&t.lower, rel).is_some() => Err(UndoError::ThereAgain),
        Step::Remove { taken, .. } => {
            restore(layer, taken, &dir, name.as_ref(), false).map(|()| noted(t, layer, rel))
        }
        Step::Kept { .. } => Ok(()),
    }
}

/// Notes what was just put back at `rel` (its rename gave it a new
/// ctime), so the same layer applies again cleanly.
fn noted(t: &Trees, layer: &Path, rel: &Path) {
    if let Some(s) = stat_at(&t.lower, rel) {
        note_restored(layer, rel, &s);
    }
}

/// Whether `taken` is in the layer's `taken/`.
fn was_set_aside(layer: &Path, taken: &Path) -> bool {
    taken_stat(layer, taken).is_some()
}

/// Whether the host's entry at `rel` is the very file kept as `taken` (a
/// replace that crashed before its rename, or one already undone).
fn still_there(t: &Trees, layer: &Path, rel: &Path, taken: &Path) -> bool {
    let Some(now) = stat_at(&t.lower, rel) else {
        return false;
    };
    taken_stat(layer, taken).is_some_and(|k| (k.st_dev, k.st_ino) == (now.st_dev, now.st_ino))
}

/// Puts `taken` back at `name` in `dir`: a rename (over what is there when
/// `replace`), or across file systems a copy beside it with the kept mode,
/// renamed into place.
fn restore(
    layer: &Path,
    taken: &Path,
    dir: &OwnedFd,
    name: &Path,
    replace: bool,
) -> Result<(), UndoError> {
    let tdir = crate::sandbox::beneath::open_root(&layer.join("taken")).map_err(UndoError::Sys)?;
    let tname = taken.file_name().ok_or(UndoError::NoName)?;
    let flags = if replace {
        RenameFlags::empty()
    } else {
        RenameFlags::RENAME_NOREPLACE
    };
    match renameat2(&tdir, tname, dir, name, flags) {
        Ok(()) => Ok(()),
        Err(nix::Error::EXDEV) => {
            let src = beneath(&tdir, Path::new(tname), OFlag::O_RDONLY | OFlag::O_NOFOLLOW)
                .map(std::fs::File::from)
                .map_err(UndoError::Sys)?;
            let meta = src.metadata().map_err(UndoError::Io)?;
            if !meta.is_file() {
                return Err(UndoError::DirAcross);
            }
            let tmp = PathBuf::from(format!(".sandmux-undo-{}", crate::nonce::hex()));
            let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
            let fd = create_new(dir, &tmp, mode & 0o777).map_err(UndoError::Sys)?;
            let mut out = std::fs::File::from(fd);
            std::io::copy(&mut &src, &mut out)
                .and_then(|_| out.sync_all())
                .map_err(UndoError::Io)?;
            renameat2(dir, &tmp, dir, name, flags).map_err(|e| {
                let _ = unlinkat(dir, &tmp, UnlinkatFlags::NoRemoveDir);
                UndoError::Sys(e)
            })
        }
        Err(e) => Err(UndoError::Sys(e)),
    }
}
