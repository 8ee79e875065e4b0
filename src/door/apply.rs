//! `sandmux apply ID [PATHS…]`: the layer's changes into the workspace,
//! through one chokepoint. What `diff` holds back stays out (unless named
//! with `--include-control`); links and special files never come in; no
//! mode but the permission bits (never a set-ID bit) is carried. Every file
//! is replaced atomically (a temporary beside it, renamed over it); what it
//! replaces is kept in the layer's `taken/` (a hard link, or a copy across
//! file systems) and what it removes is moved there, and each step is
//! written to the layer's `apply.jsonl` before it is made (all made
//! durable at the end, [`Door::finish`]), so a
//! crash leaves a state a second `apply` finishes (a path already equal to
//! the layer is skipped) and `apply --undo` reverses. A host entry changed
//! since the instance started (its ctime is later) is a conflict: reported,
//! left as it is.

use super::diff::{stat_at, Change, Trees};
use super::journal::{create_new, journaled, taken_name, taken_stat};
use crate::sandbox::beneath::beneath;
use nix::fcntl::{renameat, renameat2, OFlag, RenameFlags};
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A file moved out of the layer as placed: its inode, size and
/// modification time (an edit in place keeps the inode, not the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Placed {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i64,
}

impl Placed {
    fn of(m: &std::fs::Metadata) -> Placed {
        use std::os::unix::fs::MetadataExt;
        Placed {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        }
    }

    pub(super) fn is(&self, s: &nix::sys::stat::FileStat) -> bool {
        let mtime = s.st_mtime * 1_000_000_000 + s.st_mtime_nsec;
        (s.st_dev, s.st_ino, s.st_size as u64, mtime)
            == (self.dev, self.ino, self.size, self.mtime_ns)
    }
}

/// What [`Door::set_aside`] does with the host's entry.
enum Aside {
    /// Kept while a file takes its place (moved out of the layer: its
    /// device and inode).
    Replace(Option<Placed>),
    /// Moved out.
    Remove,
}

/// One step, as the journal records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "op")]
pub(crate) enum Step {
    /// A directory made.
    Mkdir { rel: PathBuf },
    /// A file written where nothing was; `placed`: what a file moved out
    /// of the layer was when placed (its content is no longer there to
    /// compare).
    Create {
        rel: PathBuf,
        #[serde(default)]
        placed: Option<Placed>,
    },
    /// A file replaced; the old one is `taken`.
    Replace {
        rel: PathBuf,
        taken: PathBuf,
        #[serde(default)]
        placed: Option<Placed>,
    },
    /// An entry removed into `taken`.
    Remove { rel: PathBuf, taken: PathBuf },
    /// After a `Replace` kept the host's file as `taken` (a hard link,
    /// which sets the inode's ctime): that ctime. The host's file still
    /// that inode with that ctime is untouched since, and a later `apply`
    /// finishes the step (one killed before its rename); no line, no
    /// finishing: a conflict, as for any file the human changed.
    Kept {
        rel: PathBuf,
        taken: PathBuf,
        ctime_ns: i64,
    },
}

/// The layer, the workspace and the journal of one `apply`.
pub(crate) struct Door<'a> {
    pub(crate) trees: &'a Trees,
    pub(crate) layer: &'a Path,
    /// Entries of the workspace changed on the host after this are conflicts.
    pub(crate) since_ns: i128,
    /// `--on-end apply`: files are moved (renamed) out of the layer where
    /// they can be, not copied (the layer is removed afterwards unless it
    /// keeps one of the human's files git cannot give back).
    pub(crate) moving: bool,
    /// What this apply set aside in the layer's `taken/` (the human's
    /// entries it replaced or removed).
    pub(crate) taken: Vec<PathBuf>,
    journal: std::fs::File,
    /// What earlier applies of this layer journaled about each path (a
    /// killed one's steps are finished, not taken for the human's
    /// changes): its `replace` and `kept` steps, by path.
    earlier: std::collections::HashMap<PathBuf, Vec<Step>>,
    /// The `taken/` names a `kept` step of an earlier apply names.
    kept_names: std::collections::HashSet<PathBuf>,
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
        // A torn last line (a crash, a full disk while it was written) is a
        // step never made: cut, so the next line does not join it.
        let text = std::fs::read(layer.join("apply.jsonl")).unwrap_or_default();
        if text.last().is_some_and(|b| *b != b'\n') {
            let whole = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
            journal
                .set_len(whole as u64)
                .map_err(|e| format!("cutting the journal's torn line: {e}"))?;
        }
        std::fs::create_dir_all(layer.join("taken"))
            .map_err(|e| format!("{}: {e}", layer.join("taken").display()))?;
        let mut earlier: std::collections::HashMap<PathBuf, Vec<Step>> = Default::default();
        let mut kept_names = std::collections::HashSet::new();
        for step in journaled(layer)? {
            match &step {
                Step::Kept { rel, taken, .. } => {
                    kept_names.insert(taken.clone());
                    earlier.entry(rel.clone()).or_default().push(step);
                }
                Step::Replace { rel, .. } => earlier.entry(rel.clone()).or_default().push(step),
                _ => {}
            }
        }
        // 20 ms before the layer was made: a coarse ctime just after it
        // still counts as a change.
        Ok(Door {
            trees,
            layer,
            since_ns: since_ns - 20_000_000,
            moving: false,
            taken: Vec::new(),
            journal,
            earlier,
            kept_names,
        })
    }

    /// Makes the apply durable: the journal, then every file system it
    /// wrote (one `syncfs` each for the workspace's and the layer's,
    /// instead of an fsync per file and per step: a power loss in the
    /// middle can leave steps the journal does not know, never a file of
    /// the human's anywhere but in place or in `taken/`).
    pub(crate) fn finish(&mut self) -> Result<(), String> {
        self.journal
            .sync_data()
            .map_err(|e| format!("syncing the journal: {e}"))?;
        for fd in [&self.trees.lower, &self.trees.upper] {
            nix::unistd::syncfs(fd).map_err(|e| format!("syncing the file system: {e}"))?;
        }
        Ok(())
    }

    fn record(&mut self, step: &Step) -> Result<(), String> {
        let mut line = serde_json::to_vec(step).map_err(|e| e.to_string())?;
        line.push(b'\n');
        let before = self.journal.metadata().map(|m| m.len());
        // Written before the step is made (another process sees it at
        // once: a killed apply is finished or undone from it); made
        // durable with everything else at the end ([`Door::finish`]).
        let wrote = self.journal.write_all(&line);
        if let Err(e) = wrote {
            // No part of a line stays to join the next one.
            if let Ok(len) = before {
                let _ = self.journal.set_len(len);
            }
            return Err(format!("writing the journal: {e}"));
        }
        Ok(())
    }

    /// Whether the host's entry at `rel` changed after the instance started.
    fn changed_on_host(&self, rel: &Path) -> bool {
        stat_at(&self.trees.lower, rel).is_some_and(|s| {
            (s.st_ctime as i128) * 1_000_000_000 + s.st_ctime_nsec as i128 > self.since_ns
        })
    }

    /// The step of an earlier apply of this layer that kept the host's
    /// file at `rel` (stat `h`) in `taken/` and was killed short of its
    /// rename: the file is that very inode, its ctime the one the link
    /// gave it (nothing changed it since, not even a `touch -r`), so its
    /// ctime is the apply's, not the human's; or one killed before it
    /// journaled that ctime, whose journaled `taken/` name is the very
    /// inode. The kept name and what the step said it placed.
    fn kept_before(
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
        let mut kept = None;
        if let Some(h) = &host {
            let same = h.st_mode & libc::S_IFMT == libc::S_IFREG && self.same(rel);
            if same {
                return Ok(false);
            }
            kept = replace.then(|| self.kept_before(rel, h)).flatten();
            if !replace || (kept.is_none() && self.changed_on_host(rel)) {
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
        self.trees.check_end(rel, &src)?;
        let mode = match &host {
            Some(h) => h.st_mode & 0o777,
            None if std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0 => {
                0o755
            }
            None => 0o644,
        };
        let (dir, name) = self.parent(rel)?;
        if let Some((taken, _)) = &kept {
            self.taken.push(taken.clone());
        }
        // A step an earlier apply journaled is finished with a copy.
        // A copy's file is never moved out: the copy would then lack it,
        // which reads as the agent's removal.
        if self.moving && !self.trees.is_copy() && kept.is_none() {
            if let Some(moved) = self.move_in(rel, &src, (&dir, &name), mode, host.is_some()) {
                return moved.map(|()| true);
            }
        }
        let tmp = self.temp_name(&name);
        let create = || create_new(&dir, &tmp, mode);
        // One a crashed apply of this layer left (never renamed into
        // place, so never the human's): taken out, and made again.
        let fd = match create() {
            Err(nix::Error::EEXIST) => {
                unlinkat(&dir, &tmp, UnlinkatFlags::NoRemoveDir).and_then(|()| create())
            }
            r => r,
        }
        .map_err(|e| format!("a temporary file beside it: {e}"))?;
        let mut out = std::fs::File::from(fd);
        let copied = super::sparse::copy(&mut src, &mut out)
            .and_then(|()| out.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode)))
            .map_err(|e| format!("copying: {e}"))
            .and_then(|()| self.trees.check_end(rel, &src));
        if let Err(e) = copied {
            let _ = unlinkat(&dir, &tmp, UnlinkatFlags::NoRemoveDir);
            return Err(e);
        }
        let placed = if host.is_some() {
            match kept {
                None => self.set_aside(rel, &dir, &name, Aside::Replace(None))?,
                // The earlier step was for a file moved out of the layer
                // (undo would look for that file): journaled again for
                // this copy, with the same kept file; undo takes the newer
                // step first and then skips the older (its kept file gone).
                Some((taken, Some(_))) => self.record(&Step::Replace {
                    rel: rel.into(),
                    taken,
                    placed: None,
                })?,
                Some((_, None)) => {}
            }
            renameat(&dir, &tmp, &dir, &name)
        } else {
            self.record(&Step::Create {
                rel: rel.into(),
                placed: None,
            })?;
            renameat2(&dir, &tmp, &dir, &name, RenameFlags::RENAME_NOREPLACE)
        };
        placed.map_err(|e| {
            let _ = unlinkat(&dir, &tmp, UnlinkatFlags::NoRemoveDir);
            format!("putting it in place: {e}")
        })?;
        Ok(true)
    }

    /// The layer's file itself, renamed into place: when it is on the
    /// workspace's file system, has one link (a name of its own) and no
    /// inode flag the agent set, it takes `mode` (never a set-ID bit), loses
    /// its `user.` attributes (overlayfs's, and any the agent set) and
    /// takes now as its times, as a copy would. None: copy.
    fn move_in(
        &mut self,
        rel: &Path,
        src: &std::fs::File,
        (dir, name): (&OwnedFd, &Path),
        mode: u32,
        replace: bool,
    ) -> Option<Result<(), String>> {
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
            if let Err(e) = self.set_aside(rel, dir, name, Aside::Replace(placed)) {
                return Some(Err(e));
            }
            renameat(&udir, name, dir, name)
        } else {
            let placed = Some(Placed::of(&now));
            if let Err(e) = self.record(&Step::Create {
                rel: rel.into(),
                placed,
            }) {
                return Some(Err(e));
            }
            renameat2(&udir, name, dir, name, RenameFlags::RENAME_NOREPLACE)
        };
        Some(placed.map_err(|e| format!("moving it into place: {e}")))
    }

    /// The temporary file beside `name`: the same for the same layer and
    /// name, so a second `apply` after a crash finds what the first left.
    fn temp_name(&self, name: &Path) -> PathBuf {
        // FNV-1a: stable across builds, unlike the standard library's hasher.
        let h = name
            .as_os_str()
            .as_bytes()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
            });
        let id = self.layer.file_name().unwrap_or_default().to_string_lossy();
        PathBuf::from(format!(".sandmux-apply-{id}-{h:016x}"))
    }

    fn same(&self, rel: &Path) -> bool {
        self.trees.same_content(rel)
    }

    fn remove(&mut self, rel: &Path) -> Result<bool, String> {
        let Some(st) = stat_at(&self.trees.lower, rel) else {
            return Ok(false);
        };
        if self.changed_on_host(rel) {
            return Err("changed on the host since the instance started".into());
        }
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            self.removable_dir(rel)?;
        }
        let (dir, name) = self.parent(rel)?;
        self.set_aside(rel, &dir, &name, Aside::Remove)?;
        Ok(true)
    }

    /// Journals, then keeps the host's entry at `rel` in `taken/`: left in
    /// place to be replaced (`keep`), or moved there (a removal).
    fn set_aside(
        &mut self,
        rel: &Path,
        dir: &OwnedFd,
        name: &Path,
        aside: Aside,
    ) -> Result<(), String> {
        let keep = matches!(aside, Aside::Replace(_));
        let tname = taken_name(name);
        let taken = self.layer.join("taken").join(&tname);
        self.taken.push(taken.clone());
        let rel = rel.to_path_buf();
        self.record(&match keep {
            true => Step::Replace {
                rel: rel.clone(),
                taken,
                placed: match aside {
                    Aside::Replace(p) => p,
                    Aside::Remove => None,
                },
            },
            false => Step::Remove {
                rel: rel.clone(),
                taken,
            },
        })?;
        self.take(&rel, dir, name, &tname, keep)?;
        if keep {
            // The ctime the link gave the host's file, for a later apply
            // should this one be killed before the rename.
            if let Some(k) = taken_stat(self.layer, &tname) {
                self.record(&Step::Kept {
                    rel,
                    taken: self.layer.join("taken").join(&tname),
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
    fn removable_dir(&self, rel: &Path) -> Result<(), String> {
        let mut stack = vec![rel.to_path_buf()];
        let mut seen = 0usize;
        while let Some(d) = stack.pop() {
            let fd = beneath(&self.trees.lower, &d, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
                .map_err(|e| format!("{} could not be read ({e}): left", d.display()))?;
            let mut dir = nix::dir::Dir::from_fd(fd).map_err(|e| e.to_string())?;
            for e in dir.iter().flatten() {
                let n = e.file_name().to_bytes();
                if n == b"." || n == b".." {
                    continue;
                }
                seen += 1;
                if seen > 100_000 {
                    return Err(
                        "more than 100,000 entries to check: left, remove it yourself".into(),
                    );
                }
                let child = d.join(std::ffi::OsStr::from_bytes(n));
                if super::hold::is_vcs_name(std::ffi::OsStr::from_bytes(n))
                    || self.trees.bare_shape(&child)
                {
                    return Err(format!(
                        "it holds a repository ({}): left, remove it yourself",
                        child.display()
                    ));
                }
                if self.changed_on_host(&child) {
                    return Err(format!(
                        "{} changed on the host since the instance started",
                        child.display()
                    ));
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
                // Its mode kept, and on disk before the original goes: the
                // end's syncfs is of the workspace's file system, not this one.
                let mode = src
                    .metadata()
                    .map(|m| m.permissions())
                    .map_err(|e| e.to_string())?;
                std::io::copy(&mut &src, &mut dst)
                    .and_then(|_| dst.set_permissions(mode))
                    .and_then(|()| dst.sync_all())
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
