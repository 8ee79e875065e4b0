//! Where a layer's writes are: `upper/` for an overlay, the copy for a copy
//! workspace (`copy.rs`), made in the layer or, as root, in a directory of
//! its own under [`COPIES`] that the agent's uid can pass and no other user
//! can. `layer.rs` makes, finds and removes the layer around it.

use super::layer::{io, LayerError, Meta};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// A copy workspace's copy in its layer (`copy.rs`).
pub(super) const COPY: &str = "copy";

/// For a copy workspace's layer at `dir` whose instance has ended: sets
/// the copy's `ended` mark (see `copy.rs`) unless it is set.
pub(crate) fn mark_ended(dir: &Path) {
    if let Some(copy) = copy_of(dir) {
        if let Err(e) = super::copy::mark_ended(&copy) {
            tracing::warn!("the copy's end mark in {}: {e}", dir.display());
        }
    }
}

/// Where root's copies are: root's state directory is not one the agent's
/// uid (the workspace's owner, without a user namespace) can reach.
pub(super) const COPIES: &str = "/var/tmp/sandmux-copies";

/// The copy of the copy workspace whose layer is at `dir` (None: an
/// overlay's layer).
pub(super) fn copy_of(dir: &Path) -> Option<PathBuf> {
    let text = std::fs::read(dir.join("meta.json")).ok()?;
    let copy = serde_json::from_slice::<Meta>(&text).ok()?.copy?;
    Some(dir.join(copy))
}

/// Whether the layer at `dir` is a copy workspace's.
pub(crate) fn is_copy(dir: &Path) -> bool {
    copy_of(dir).is_some()
}

/// Where the agent's writes are in the layer at `dir`: `upper/`, or a copy
/// workspace's copy.
pub(crate) fn writes(dir: &Path) -> PathBuf {
    copy_of(dir).unwrap_or_else(|| dir.join("upper"))
}

/// Where the copy of layer `id` (staged at `dir`) is made: in the layer;
/// as root, in a directory of its own under [`COPIES`] (0711, root's),
/// the id's root's too, 0710 with the group `gid` of the uid the agent
/// runs as: it can pass, another user cannot.
pub(super) fn copy_place(dir: &Path, id: &str, gid: u32) -> Result<PathBuf, LayerError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(dir.join(COPY));
    }
    let base = Path::new(COPIES);
    match std::fs::DirBuilder::new().mode(0o711).create(base) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(io("creating", base)(e))
        }
        _ => {}
    }
    let m = std::fs::symlink_metadata(base).map_err(io("reading", base))?;
    if !m.is_dir() || m.uid() != 0 || m.mode() & 0o022 != 0 {
        let e = std::io::Error::other("not a directory of root's that only root can write");
        return Err(io("using", base)(e));
    }
    let own = base.join(id);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&own)
        .map_err(io("creating", &own))?;
    crate::sandbox::beneath::open_root(&own)
        .and_then(|d| {
            nix::unistd::fchown(&d, Some(0.into()), Some(gid.into()))?;
            nix::sys::stat::fchmod(&d, nix::sys::stat::Mode::from_bits_truncate(0o710))
        })
        .map_err(|e| io("setting the owner of", &own)(e.into()))?;
    Ok(own.join(COPY))
}
