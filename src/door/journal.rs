//! The apply journal's reader and the layer's `taken/` names: what
//! `apply` (which writes the journal) and `apply --undo` (which reverses
//! it) share.

use super::apply::Step;
use super::diff::stat_at;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// A unique name in `taken/` for an entry called `name`.
pub(super) fn taken_name(name: &Path) -> PathBuf {
    PathBuf::from(format!("{}-{}", crate::nonce::hex(), name.display()))
}

/// The steps the journal of the layer at `layer` records (none when it
/// has none). A line that cannot be read is an error: dropped, a rewrite
/// of the journal would lose the step it records. A torn last line (no
/// newline: a crash while it was written) recorded a step never made.
pub(super) fn journaled(layer: &Path) -> Result<Vec<Step>, String> {
    let path = layer.join("apply.jsonl");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("the journal {}: {e}", path.display())),
    };
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete
        .lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| format!("{}: line {}: {e}", path.display(), i + 1))
        })
        .collect()
}

/// The stat of `taken` (a name in the layer's `taken/`), through no link.
pub(super) fn taken_stat(layer: &Path, taken: &Path) -> Option<nix::sys::stat::FileStat> {
    let n = taken.file_name()?;
    let tdir = crate::sandbox::beneath::open_root(&layer.join("taken")).ok()?;
    stat_at(&tdir, Path::new(n))
}

/// A new file `name` in `dir` for writing, never through a link, never
/// one that exists: the temporary an entry is written to before it is
/// renamed into place.
pub(super) fn create_new(dir: &OwnedFd, name: &Path, mode: u32) -> nix::Result<OwnedFd> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
}
