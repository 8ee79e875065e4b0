//! How `apply` keeps what it replaces or removes of the human's: in the
//! layer's `taken/`, journaled first. A file about to be replaced is hard
//! linked there and left in place (the rename over it is then atomic); an
//! entry removed is moved there; across file systems, a copy made durable
//! before the original goes. A directory the agent removed goes only when
//! nothing below it changed on the host and it holds no repository.

use super::apply::Door;
use super::error::ApplyError;
use super::journal::{taken_name, Placed, Step};
use crate::sandbox::beneath::beneath;
use nix::fcntl::{renameat, AtFlags, OFlag};
use nix::sys::stat::fstatat;
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What [`Door::set_aside`] does with the host's entry.
pub(super) enum Aside {
    /// Kept while a file takes its place (moved out of the layer: its
    /// device and inode).
    Replace(Option<Placed>),
    /// Moved out.
    Remove,
}

impl Door<'_> {
    pub(super) fn remove(&mut self, rel: &Path) -> Result<bool, ApplyError> {
        let Some(st) = self.host(rel) else {
            return Ok(false);
        };
        if self.changed(rel, &st) {
            return Err(ApplyError::ChangedOnHost);
        }
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            self.removable_dir(rel)?;
        }
        let (dir, name) = self.parent(rel)?;
        self.set_aside(rel, &dir, &name, Aside::Remove)?;
        // Its descriptors, and those below it, now point into `taken/`.
        self.forget(rel);
        Ok(true)
    }

    /// Journals, then keeps the host's entry at `rel` in `taken/`: left in
    /// place to be replaced (`keep`), or moved there (a removal).
    pub(super) fn set_aside(
        &mut self,
        rel: &Path,
        dir: &OwnedFd,
        name: &Path,
        aside: Aside,
    ) -> Result<(), ApplyError> {
        self.taken_count += 1;
        let tname = taken_name(&self.taken_prefix, self.taken_count, name);
        let taken = self.layer.join("taken").join(&tname);
        self.taken.push(taken.clone());
        let rel = rel.to_path_buf();
        let keep = matches!(aside, Aside::Replace(_));
        self.record(&match aside {
            Aside::Replace(placed) => Step::Replace {
                rel: rel.clone(),
                taken: taken.clone(),
                placed,
            },
            Aside::Remove => Step::Remove {
                rel: rel.clone(),
                taken: taken.clone(),
            },
        })?;
        self.take(&rel, dir, name, &tname, keep)?;
        if keep {
            // The ctime the link gave the host's file, for a later apply
            // should this one be killed before the rename.
            if let Ok(k) = fstatat(&self.taken_dir, &tname, AtFlags::AT_SYMLINK_NOFOLLOW) {
                self.record(&Step::Kept {
                    rel,
                    taken,
                    ctime_ns: k.st_ctime * 1_000_000_000 + k.st_ctime_nsec,
                })?;
            }
        }
        Ok(())
    }

    /// A directory the agent removed may go only when nothing below it
    /// changed on the host since the instance started and it holds no
    /// repository (the human's unpushed work); at most 100,000 entries are
    /// looked at, and a larger one is left.
    fn removable_dir(&self, rel: &Path) -> Result<(), ApplyError> {
        let mut stack = vec![rel.to_path_buf()];
        let mut seen = 0usize;
        while let Some(d) = stack.pop() {
            let fd = beneath(&self.trees.lower, &d, OFlag::O_RDONLY | OFlag::O_DIRECTORY).map_err(
                |source| ApplyError::Unlisted {
                    dir: d.clone(),
                    source,
                },
            )?;
            let mut dir = nix::dir::Dir::from_fd(fd).map_err(ApplyError::Sys)?;
            for e in dir.iter().flatten() {
                let n = e.file_name().to_bytes();
                if n == b"." || n == b".." {
                    continue;
                }
                seen += 1;
                if seen > 100_000 {
                    return Err(ApplyError::TooManyBelow);
                }
                let child = d.join(std::ffi::OsStr::from_bytes(n));
                if super::hold::is_vcs_name(std::ffi::OsStr::from_bytes(n))
                    || self.trees.bare_shape(&child)
                {
                    return Err(ApplyError::HoldsRepo(child));
                }
                if self.changed_on_host(&child) {
                    return Err(ApplyError::BelowChanged(child));
                }
                if e.file_type() == Some(nix::dir::Type::Directory) {
                    stack.push(child);
                }
            }
        }
        Ok(())
    }

    /// Keeps the host's entry at `rel` in the layer's `taken/`: `keep`
    /// leaves it in place (a hard link, or a copy across file systems: the
    /// rename over it is then atomic), otherwise it is moved there (a
    /// rename, or a copy and an unlink).
    fn take(
        &self,
        rel: &Path,
        dir: &OwnedFd,
        name: &Path,
        tname: &Path,
        keep: bool,
    ) -> Result<(), ApplyError> {
        let moved = if keep {
            nix::unistd::linkat(dir, name, &self.taken_dir, tname, AtFlags::empty())
        } else {
            renameat(dir, name, &self.taken_dir, tname)
        };
        match moved {
            Ok(()) => Ok(()),
            Err(nix::Error::EXDEV) => self.take_copy(rel, (dir, name), tname, keep),
            Err(e) => Err(ApplyError::KeepAside(e)),
        }
    }

    /// [`Door::take`] across file systems: a copy, durable before the
    /// original is unlinked (`keep`: left).
    fn take_copy(
        &self,
        rel: &Path,
        (dir, name): (&OwnedFd, &Path),
        tname: &Path,
        keep: bool,
    ) -> Result<(), ApplyError> {
        let taken: PathBuf = self.layer.join("taken").join(tname);
        let src = beneath(
            &self.trees.lower,
            rel,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
        )
        .map(std::fs::File::from)
        .ok()
        .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
        .ok_or(ApplyError::OtherFs)?;
        let in_taken = |source| ApplyError::Taken {
            path: taken.clone(),
            source,
        };
        let mut dst = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&taken)
            .map_err(in_taken)?;
        // Its mode kept, and on disk before the original goes: the end's
        // syncfs is of the workspace's file system, not this one.
        let mode = src
            .metadata()
            .map(|m| m.permissions())
            .map_err(ApplyError::Io)?;
        std::io::copy(&mut &src, &mut dst)
            .and_then(|_| dst.set_permissions(mode))
            .and_then(|()| dst.sync_all())
            .map_err(in_taken)?;
        if !keep {
            unlinkat(dir, name, UnlinkatFlags::NoRemoveDir).map_err(ApplyError::Removing)?;
        }
        Ok(())
    }
}
