//! `sandmux apply ID [PATHS…]`: the layer's changes into the workspace,
//! through one chokepoint. What `diff` holds back stays out (unless named
//! with `--include-control`); links and special files never come in; no
//! mode but the permission bits (never a set-ID bit) is carried. Every file
//! is replaced atomically (a temporary beside it, renamed over it); what it
//! replaces or removes is moved into the layer's `taken/` first, and each
//! step is written to the layer's `apply.jsonl` before it is made, so a
//! crash leaves a state a second `apply` finishes (a path already equal to
//! the layer is skipped) and `apply --undo` reverses. A host entry changed
//! since the instance started (its ctime is later) is a conflict: reported,
//! left as it is.

use super::diff::{read, stat_at, Change, Trees};
use crate::sandbox::beneath::beneath;
use nix::fcntl::{renameat, renameat2, OFlag, RenameFlags};
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// One step, as the journal records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "op")]
pub(crate) enum Step {
    /// A directory made.
    Mkdir { rel: PathBuf },
    /// A file written where nothing was.
    Create { rel: PathBuf },
    /// A file replaced; the old one is `taken`.
    Replace { rel: PathBuf, taken: PathBuf },
    /// An entry removed into `taken`.
    Remove { rel: PathBuf, taken: PathBuf },
}

/// The layer, the workspace and the journal of one `apply`.
pub(crate) struct Door<'a> {
    pub(crate) trees: &'a Trees,
    pub(crate) layer: &'a Path,
    /// Entries of the workspace changed on the host after this are conflicts.
    pub(crate) since_ns: i128,
    journal: std::fs::File,
}

impl<'a> Door<'a> {
    /// Opens the journal (appending) of the layer at `layer`.
    pub(crate) fn open(
        trees: &'a Trees,
        layer: &'a Path,
        since_ns: i128,
    ) -> Result<Door<'a>, String> {
        let journal = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(layer.join("apply.jsonl"))
            .map_err(|e| format!("the journal in {}: {e}", layer.display()))?;
        std::fs::create_dir_all(layer.join("taken"))
            .map_err(|e| format!("{}: {e}", layer.join("taken").display()))?;
        // 20 ms before the layer was made: a coarse ctime just after it
        // still counts as a change.
        Ok(Door {
            trees,
            layer,
            since_ns: since_ns - 20_000_000,
            journal,
        })
    }

    fn record(&mut self, step: &Step) -> Result<(), String> {
        let mut line = serde_json::to_vec(step).map_err(|e| e.to_string())?;
        line.push(b'\n');
        self.journal
            .write_all(&line)
            .and_then(|()| self.journal.sync_data())
            .map_err(|e| format!("writing the journal: {e}"))
    }

    /// Whether the host's entry at `rel` changed after the instance started.
    fn changed_on_host(&self, rel: &Path) -> bool {
        stat_at(&self.trees.lower, rel).is_some_and(|s| {
            (s.st_ctime as i128) * 1_000_000_000 + s.st_ctime_nsec as i128 > self.since_ns
        })
    }

    /// Applies one change; `Ok(false)`: nothing to do (already applied).
    pub(crate) fn apply(&mut self, c: &Change) -> Result<bool, String> {
        match c {
            Change::Added {
                rel,
                what: "directory",
            } => self.mkdir(rel),
            Change::Added { rel, what: "file" } => self.write(rel, false),
            Change::Added { what, .. } => Err(format!("a {what} is never applied")),
            Change::Modified { rel, .. } => self.write(rel, true),
            Change::Removed { rel } => self.remove(rel),
            Change::Unreadable { why, .. } => Err(format!("unreadable in the layer: {why}")),
        }
    }

    fn parent(&self, rel: &Path) -> Result<(OwnedFd, PathBuf), String> {
        let parent = rel.parent().unwrap_or(Path::new(""));
        let name = rel.file_name().ok_or("no name")?;
        let fd = beneath(
            &self.trees.lower,
            parent,
            OFlag::O_PATH | OFlag::O_DIRECTORY,
        )
        .map_err(|e| format!("its directory in the workspace: {e}"))?;
        Ok((fd, PathBuf::from(name)))
    }

    fn mkdir(&mut self, rel: &Path) -> Result<bool, String> {
        match stat_at(&self.trees.lower, rel) {
            Some(s) if s.st_mode & libc::S_IFMT == libc::S_IFDIR => return Ok(false),
            Some(_) => return Err("something else is there now".into()),
            None => {}
        }
        let (dir, name) = self.parent(rel)?;
        self.record(&Step::Mkdir { rel: rel.into() })?;
        mkdirat(&dir, &name, Mode::from_bits_truncate(0o755)).map_err(|e| format!("mkdir: {e}"))?;
        Ok(true)
    }

    /// A file from the layer, written beside its place and renamed over it.
    fn write(&mut self, rel: &Path, replace: bool) -> Result<bool, String> {
        let host = stat_at(&self.trees.lower, rel);
        if let Some(h) = &host {
            let same = h.st_mode & libc::S_IFMT == libc::S_IFREG && self.same(rel);
            if same {
                return Ok(false);
            }
            if !replace || self.changed_on_host(rel) {
                return Err("changed on the host since the instance started".into());
            }
        } else if replace {
            return Err("removed on the host since the instance started".into());
        }
        let src = beneath(
            &self.trees.upper,
            rel,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
        )
        .map_err(|e| format!("the layer's file: {e}"))?;
        let mut src = std::fs::File::from(src);
        let meta = src.metadata().map_err(|e| e.to_string())?;
        if !meta.is_file() {
            return Err("not a regular file in the layer".into());
        }
        let mode = match &host {
            Some(h) => h.st_mode & 0o777,
            None if std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0 => {
                0o755
            }
            None => 0o644,
        };
        let (dir, name) = self.parent(rel)?;
        let tmp = PathBuf::from(format!(".sandmux-apply-{}", crate::nonce::hex()));
        let fd = nix::fcntl::openat(
            &dir,
            &tmp,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(|e| format!("a temporary file beside it: {e}"))?;
        let mut out = std::fs::File::from(fd);
        let copied = std::io::copy(&mut src, &mut out)
            .and_then(|_| out.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode)))
            .and_then(|()| out.sync_all());
        if let Err(e) = copied {
            let _ = unlinkat(&dir, &tmp, UnlinkatFlags::NoRemoveDir);
            return Err(format!("copying: {e}"));
        }
        let placed = if host.is_some() {
            let tname = taken_name(&name);
            let taken = self.layer.join("taken").join(&tname);
            self.record(&Step::Replace {
                rel: rel.into(),
                taken,
            })?;
            self.take(rel, &dir, &name, &tname, true)?;
            renameat(&dir, &tmp, &dir, &name)
        } else {
            self.record(&Step::Create { rel: rel.into() })?;
            renameat2(&dir, &tmp, &dir, &name, RenameFlags::RENAME_NOREPLACE)
        };
        placed.map_err(|e| {
            let _ = unlinkat(&dir, &tmp, UnlinkatFlags::NoRemoveDir);
            format!("putting it in place: {e}")
        })?;
        Ok(true)
    }

    fn same(&self, rel: &Path) -> bool {
        const CAP: u64 = 64 << 20;
        match (
            read(&self.trees.lower, rel, CAP),
            read(&self.trees.upper, rel, CAP),
        ) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }

    fn remove(&mut self, rel: &Path) -> Result<bool, String> {
        if stat_at(&self.trees.lower, rel).is_none() {
            return Ok(false);
        }
        if self.changed_on_host(rel) {
            return Err("changed on the host since the instance started".into());
        }
        let (dir, name) = self.parent(rel)?;
        let tname = taken_name(&name);
        let taken = self.layer.join("taken").join(&tname);
        self.record(&Step::Remove {
            rel: rel.into(),
            taken,
        })?;
        self.take(rel, &dir, &name, &tname, false)?;
        Ok(true)
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
    ) -> Result<(), String> {
        let taken = self.layer.join("taken").join(tname);
        let tdir = crate::sandbox::beneath::open_root(&self.layer.join("taken"))
            .map_err(|e| format!("the layer's taken/: {e}"))?;
        let moved = if keep {
            nix::unistd::linkat(dir, name, &tdir, tname, nix::fcntl::AtFlags::empty())
        } else {
            renameat(dir, name, &tdir, tname)
        };
        match moved {
            Ok(()) => Ok(()),
            Err(nix::Error::EXDEV) => {
                let src = beneath(
                    &self.trees.lower,
                    rel,
                    OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
                )
                .map(std::fs::File::from)
                .ok()
                .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
                .ok_or("on another file system and not a regular file: left in place")?;
                let mut dst = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&taken)
                    .map_err(|e| format!("{}: {e}", taken.display()))?;
                std::io::copy(&mut &src, &mut dst)
                    .map_err(|e| format!("{}: {e}", taken.display()))?;
                if !keep {
                    unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)
                        .map_err(|e| format!("removing it: {e}"))?;
                }
                Ok(())
            }
            Err(e) => Err(format!("keeping it aside: {e}")),
        }
    }
}

/// A unique name in `taken/` for an entry called `name`.
fn taken_name(name: &Path) -> PathBuf {
    PathBuf::from(format!("{}-{}", crate::nonce::hex(), name.display()))
}

/// Reverses the journal of the layer at `layer` over the workspace `ws`,
/// newest first; returns what it could not undo.
pub(crate) fn undo(layer: &Path, ws: &Path) -> Result<(usize, Vec<String>), String> {
    let text = std::fs::read_to_string(layer.join("apply.jsonl"))
        .map_err(|e| format!("no journal: {e}"))?;
    let steps: Vec<Step> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let mut left = Vec::new();
    let mut done = 0;
    for s in steps.iter().rev() {
        let r = match s {
            Step::Mkdir { rel } => {
                std::fs::remove_dir(ws.join(rel)).map_err(|e| format!("{}: {e}", rel.display()))
            }
            Step::Create { rel } => {
                std::fs::remove_file(ws.join(rel)).map_err(|e| format!("{}: {e}", rel.display()))
            }
            Step::Replace { rel, taken } | Step::Remove { rel, taken } => {
                std::fs::rename(taken, ws.join(rel)).map_err(|e| format!("{}: {e}", rel.display()))
            }
        };
        match r {
            Ok(()) => done += 1,
            Err(e) => left.push(e),
        }
    }
    let _ = std::fs::remove_file(layer.join("apply.jsonl"));
    Ok((done, left))
}
