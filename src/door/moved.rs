//! What lets a second `apply` finish a first one that was killed, and
//! `--on-end apply` move the layer's own files into place instead of
//! copying them.

use super::apply::Door;
use super::journal::{taken_stat, Placed, Step};
use crate::sandbox::beneath::beneath;
use nix::fcntl::{renameat, renameat2, OFlag, RenameFlags};
use nix::sys::stat::Mode;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

impl Door<'_> {
    /// The step of an earlier apply of this layer that kept the host's
    /// file at `rel` (stat `h`) in `taken/` and was killed short of its
    /// rename: the file is that very inode, its ctime the one the link
    /// gave it (nothing changed it since, not even a `touch -r`), so its
    /// ctime is the apply's, not the human's; or one killed before it
    /// journaled that ctime, whose journaled `taken/` name is the very
    /// inode. The kept name and what the step said it placed.
    pub(super) fn kept_before(
        &self,
        rel: &Path,
        h: &nix::sys::stat::FileStat,
    ) -> Option<(PathBuf, Option<Placed>)> {
        let ctime = h.st_ctime * 1_000_000_000 + h.st_ctime_nsec;
        let same_inode = |taken: &Path| {
            taken_stat(self.layer, taken)
                .is_some_and(|k| (k.st_dev, k.st_ino) == (h.st_dev, h.st_ino))
        };
        let steps = self.earlier.get(rel)?;
        let kept = steps.iter().find_map(|s| match s {
            Step::Kept {
                taken, ctime_ns, ..
            } if *ctime_ns == ctime && same_inode(taken) => Some(taken.clone()),
            _ => None,
        });
        // Killed between the link and its `kept` line: the journaled
        // `taken/` name is that very inode, so whatever the file holds now
        // is kept there too (an undo gives it back); nothing is lost by
        // finishing.
        let unkept = || {
            steps.iter().find_map(|s| match s {
                Step::Replace { taken, .. }
                    if !self.kept_names.contains(taken) && same_inode(taken) =>
                {
                    Some(taken.clone())
                }
                _ => None,
            })
        };
        let taken = kept.or_else(unkept)?;
        let placed = steps.iter().find_map(|s| match s {
            Step::Replace {
                taken: t, placed, ..
            } if *t == taken => Some(*placed),
            _ => None,
        })?;
        Some((taken, placed))
    }

    /// The layer's file itself, renamed into place: when it is on the
    /// workspace's file system, has one link (a name of its own) and no
    /// inode flag the agent set, it takes `mode` (never a set-ID bit), loses
    /// its `user.` attributes (overlayfs's, and any the agent set) and
    /// takes now as its times, as a copy would. None: copy.
    pub(super) fn move_in(
        &mut self,
        rel: &Path,
        src: &std::fs::File,
        (dir, name): (&OwnedFd, &Path),
        mode: u32,
        replace: bool,
    ) -> Option<Result<(), super::error::ApplyError>> {
        use std::os::unix::fs::MetadataExt;
        let meta = src.metadata().ok()?;
        let here = nix::sys::stat::fstat(dir).ok()?;
        if meta.nlink() != 1 || meta.dev() != here.st_dev as u64 || super::xattr::flagged(src) {
            return None;
        }
        let perms = std::os::unix::fs::PermissionsExt::from_mode(mode);
        src.set_permissions(perms).ok()?;
        super::xattr::strip_user(src).ok()?;
        super::xattr::touch(src).ok()?;
        let udir = beneath(
            &self.trees.upper,
            rel.parent().unwrap_or(Path::new("")),
            OFlag::O_PATH | OFlag::O_DIRECTORY,
        )
        .ok()?;
        writable(&udir).ok()?;
        // As placed: after its times were set (the rename keeps them).
        let now = src.metadata().ok()?;
        let placed = if replace {
            let placed = Some(Placed::of(&now));
            if let Err(e) = self.set_aside(rel, dir, name, super::aside::Aside::Replace(placed)) {
                return Some(Err(e));
            }
            renameat(&udir, name, dir, name)
        } else {
            let placed = Some(Placed::of(&now));
            if let Err(e) = self.record(&Step::Create {
                rel: rel.into(),
                placed,
            }) {
                return Some(Err(e.into()));
            }
            renameat2(&udir, name, dir, name, RenameFlags::RENAME_NOREPLACE)
        };
        Some(placed.map_err(super::error::ApplyError::Moving))
    }
}

/// Gives the owner write permission on a layer directory the agent may
/// have taken it from (its instance has ended; the layer is going).
fn writable(dir: &OwnedFd) -> nix::Result<()> {
    let st = nix::sys::stat::fstat(dir)?;
    if st.st_mode & 0o300 == 0o300 {
        return Ok(());
    }
    let fd = nix::fcntl::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        Mode::empty(),
    )?;
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate((st.st_mode & 0o777) | 0o700))
}
