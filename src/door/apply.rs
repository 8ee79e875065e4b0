//! `sandmux apply ID [PATHS…]`: the layer's changes into the workspace,
//! through one chokepoint. What `diff` holds back stays out (unless named
//! with `--include-control`); links and special files never come in; no
//! mode but the permission bits (never a set-ID bit) is carried. Every file
//! is replaced atomically (a temporary beside it, renamed over it); what it
//! replaces is kept in the layer's `taken/` (a hard link, or a copy across
//! file systems) and what it removes is moved there (`aside.rs`), and each
//! step is written to the layer's `apply.jsonl` before it is made (all made
//! durable at the end, [`Door::finish`]), so a crash leaves a state a
//! second `apply` finishes (a path already equal to the layer is skipped;
//! `moved.rs`) and `apply --undo` reverses. A host entry changed since the
//! instance started (its ctime is later) is a conflict: reported, left as
//! it is — unless it is what an `apply --undo` of this layer put back,
//! untouched since (`restored.jsonl`).
//!
//! Each workspace directory is opened once (beneath the workspace, no link
//! followed) and its entries asked about and written through that
//! descriptor; a directory the apply removes is forgotten with everything
//! below it.

use super::diff::{Change, Trees};
use super::error::{ApplyError, JournalError};
use super::journal::{create_new, journaled, restored, Restored, Step};
use crate::sandbox::beneath::beneath;
use nix::fcntl::{renameat, renameat2, AtFlags, OFlag, RenameFlags};
use nix::sys::stat::{fstatat, mkdirat, FileStat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

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
    /// The journal's length (what a failed write is cut back to).
    journal_len: u64,
    /// The layer's `taken/`, opened once.
    pub(super) taken_dir: OwnedFd,
    /// This apply's names in `taken/`: a random prefix and a count.
    pub(super) taken_prefix: String,
    pub(super) taken_count: u64,
    /// What earlier applies of this layer journaled about each path (a
    /// killed one's steps are finished, not taken for the human's
    /// changes): its `replace` and `kept` steps, by path.
    pub(super) earlier: HashMap<PathBuf, Vec<Step>>,
    /// The `taken/` names a `kept` step of an earlier apply names.
    pub(super) kept_names: HashSet<PathBuf>,
    /// What earlier `apply --undo`s of this layer put back, by path.
    restored: HashMap<PathBuf, Restored>,
    /// The workspace's directories opened so far, by path.
    dirs: std::cell::RefCell<HashMap<PathBuf, Rc<OwnedFd>>>,
    /// The layer's, the same.
    udirs: std::cell::RefCell<HashMap<PathBuf, Rc<OwnedFd>>>,
}

impl<'a> Door<'a> {
    /// Opens the journal (appending) of the layer at `layer`.
    pub(crate) fn open(
        trees: &'a Trees,
        layer: &'a Path,
        since_ns: i128,
    ) -> Result<Door<'a>, JournalError> {
        let journal = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(layer.join("apply.jsonl"))
            .map_err(|source| JournalError::Open {
                layer: layer.to_path_buf(),
                source,
            })?;
        // A torn last line (a crash, a full disk while it was written) is a
        // step never made: cut, so the next line does not join it.
        let text = std::fs::read(layer.join("apply.jsonl")).unwrap_or_default();
        let whole = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        if whole < text.len() {
            journal.set_len(whole as u64).map_err(JournalError::Cut)?;
        }
        let taken = layer.join("taken");
        std::fs::create_dir_all(&taken).map_err(|source| JournalError::Taken {
            path: taken.clone(),
            source,
        })?;
        let taken_dir =
            crate::sandbox::beneath::open_root(&taken).map_err(JournalError::TakenDir)?;
        let mut earlier: HashMap<PathBuf, Vec<Step>> = Default::default();
        let mut kept_names = HashSet::new();
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
            journal_len: whole as u64,
            taken_dir,
            taken_prefix: crate::nonce::hex()[..16].to_string(),
            taken_count: 0,
            earlier,
            kept_names,
            restored: restored(layer),
            dirs: Default::default(),
            udirs: Default::default(),
        })
    }

    /// Makes the apply durable: the journal, then every file system it
    /// wrote (one `syncfs` each for the workspace's and the layer's,
    /// instead of an fsync per file and per step: a power loss in the
    /// middle can leave steps the journal does not know, never a file of
    /// the human's anywhere but in place or in `taken/`).
    pub(crate) fn finish(&mut self) -> Result<(), JournalError> {
        self.journal.sync_data().map_err(JournalError::Sync)?;
        for fd in [&self.trees.lower, &self.trees.upper] {
            nix::unistd::syncfs(fd).map_err(JournalError::SyncFs)?;
        }
        Ok(())
    }

    pub(super) fn record(&mut self, step: &Step) -> Result<(), JournalError> {
        let mut line = serde_json::to_vec(step).map_err(JournalError::Encode)?;
        line.push(b'\n');
        // Written before the step is made (another process sees it at
        // once: a killed apply is finished or undone from it); made
        // durable with everything else at the end ([`Door::finish`]).
        if let Err(e) = self.journal.write_all(&line) {
            // No part of a line stays to join the next one.
            let _ = self.journal.set_len(self.journal_len);
            return Err(JournalError::Write(e));
        }
        self.journal_len += line.len() as u64;
        Ok(())
    }

    /// The workspace's directory `rel`, opened beneath it once.
    pub(super) fn dir(&self, rel: &Path) -> nix::Result<Rc<OwnedFd>> {
        opened(&self.dirs, &self.trees.lower, rel)
    }

    /// The layer's file at `rel`, opened for reading beneath its directory
    /// (itself opened once), no link followed.
    fn layer_file(&self, rel: &Path) -> nix::Result<std::fs::File> {
        let parent = rel.parent().unwrap_or(Path::new(""));
        let name = rel.file_name().ok_or(nix::Error::EINVAL)?;
        let dir = opened(&self.udirs, &self.trees.upper, parent)?;
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
        beneath(&*dir, Path::new(name), flags).map(std::fs::File::from)
    }

    /// Forgets the directories at and below `rel` (moved out of the
    /// workspace: their descriptors now point into `taken/`).
    pub(super) fn forget(&self, rel: &Path) {
        self.dirs.borrow_mut().retain(|d, _| !d.starts_with(rel));
    }

    /// The host's entry at `rel`, its last component not followed.
    pub(super) fn host(&self, rel: &Path) -> Option<FileStat> {
        let name = rel.file_name()?;
        let dir = self.dir(rel.parent().unwrap_or(Path::new(""))).ok()?;
        fstatat(&*dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()
    }

    /// Whether the host's entry `s` at `rel` changed after the instance
    /// started: its ctime is later, and it is not what an `apply --undo`
    /// of this layer put back, untouched since.
    pub(super) fn changed(&self, rel: &Path, s: &FileStat) -> bool {
        (s.st_ctime as i128) * 1_000_000_000 + s.st_ctime_nsec as i128 > self.since_ns
            && !self.restored.get(rel).is_some_and(|r| r.is(s))
    }

    /// [`Door::changed`] of the host's entry at `rel` now (none: unchanged).
    pub(super) fn changed_on_host(&self, rel: &Path) -> bool {
        self.host(rel).is_some_and(|s| self.changed(rel, &s))
    }

    /// Applies one change; `Ok(false)`: nothing to do (already applied).
    pub(crate) fn apply(&mut self, c: &Change) -> Result<bool, ApplyError> {
        match c {
            Change::Added {
                rel,
                what: "directory",
            } => self.mkdir(rel),
            Change::Added { rel, what: "file" } => self.write(rel, false),
            Change::Added { what, .. } => Err(ApplyError::Never { what }),
            Change::Modified { rel, .. } => self.write(rel, true),
            Change::Removed { rel } => self.remove(rel),
            Change::Unreadable { why, .. } => Err(ApplyError::Unreadable(why.clone())),
        }
    }

    /// The directory `rel` is in (opened once) and its name there.
    pub(super) fn parent(&self, rel: &Path) -> Result<(Rc<OwnedFd>, PathBuf), ApplyError> {
        let parent = rel.parent().unwrap_or(Path::new(""));
        let name = rel.file_name().ok_or(ApplyError::NoName)?;
        let fd = self.dir(parent).map_err(ApplyError::Parent)?;
        Ok((fd, PathBuf::from(name)))
    }

    fn mkdir(&mut self, rel: &Path) -> Result<bool, ApplyError> {
        match self.host(rel) {
            Some(s) if s.st_mode & libc::S_IFMT == libc::S_IFDIR => return Ok(false),
            Some(_) => return Err(ApplyError::SomethingElse),
            None => {}
        }
        let (dir, name) = self.parent(rel)?;
        self.record(&Step::Mkdir { rel: rel.into() })?;
        mkdirat(&*dir, &name, Mode::from_bits_truncate(0o755)).map_err(ApplyError::Mkdir)?;
        Ok(true)
    }

    /// Whether the host's file (stat `h`) at `rel` has the layer's bytes
    /// already (sizes first: the walk's stat of the layer's file).
    fn same(&self, rel: &Path, h: &FileStat) -> bool {
        h.st_mode & libc::S_IFMT == libc::S_IFREG
            && self
                .trees
                .upper_stat(rel)
                .is_none_or(|u| u.st_size == h.st_size)
            && self.trees.same_content(rel)
    }

    /// A file from the layer, written beside its place and renamed over it.
    fn write(&mut self, rel: &Path, replace: bool) -> Result<bool, ApplyError> {
        let host = self.host(rel);
        let mut kept = None;
        if let Some(h) = &host {
            if self.same(rel, h) {
                return Ok(false);
            }
            kept = replace.then(|| self.kept_before(rel, h)).flatten();
            if !replace || (kept.is_none() && self.changed(rel, h)) {
                return Err(ApplyError::ChangedOnHost);
            }
        } else if replace {
            return Err(ApplyError::RemovedOnHost);
        }
        let mut src = self.layer_file(rel).map_err(ApplyError::LayerFile)?;
        let meta = src.metadata().map_err(ApplyError::Io)?;
        if !meta.is_file() {
            return Err(ApplyError::NotRegular);
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
        let tmp = self.copy_beside(rel, (&mut src, &meta), (&dir, &name), mode)?;
        self.place(rel, (&dir, &name, &tmp), host.is_some(), kept)?;
        Ok(true)
    }

    /// The layer's file `src` (`meta`) copied into a temporary beside
    /// `name` in `dir`, with `mode`; the temporary's name.
    fn copy_beside(
        &self,
        rel: &Path,
        (src, meta): (&mut std::fs::File, &std::fs::Metadata),
        (dir, name): (&OwnedFd, &Path),
        mode: u32,
    ) -> Result<PathBuf, ApplyError> {
        let tmp = self.temp_name(name);
        let create = || create_new(dir, &tmp, mode);
        // One a crashed apply of this layer left (never renamed into
        // place, so never the human's): taken out, and made again.
        let fd = match create() {
            Err(nix::Error::EEXIST) => {
                unlinkat(dir, &tmp, UnlinkatFlags::NoRemoveDir).and_then(|()| create())
            }
            r => r,
        }
        .map_err(ApplyError::Temp)?;
        let mut out = std::fs::File::from(fd);
        let copied = super::sparse::copy_of(src, meta, &mut out)
            .and_then(|()| out.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode)))
            .map_err(ApplyError::Copying)
            .and_then(|()| Ok(self.trees.check_end(rel, src)?));
        if let Err(e) = copied {
            let _ = unlinkat(dir, &tmp, UnlinkatFlags::NoRemoveDir);
            return Err(e);
        }
        Ok(tmp)
    }

    /// Journals and renames the temporary `tmp` to `name` in `dir`: over
    /// the host's file (`replace`; kept first unless an earlier apply kept
    /// it, `kept`), or where nothing is.
    fn place(
        &mut self,
        rel: &Path,
        (dir, name, tmp): (&OwnedFd, &Path, &Path),
        replace: bool,
        kept: Option<(PathBuf, Option<super::journal::Placed>)>,
    ) -> Result<(), ApplyError> {
        let placed = if replace {
            match kept {
                None => self.set_aside(rel, dir, name, super::aside::Aside::Replace(None))?,
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
            renameat(dir, tmp, dir, name)
        } else {
            self.record(&Step::Create {
                rel: rel.into(),
                placed: None,
            })?;
            renameat2(dir, tmp, dir, name, RenameFlags::RENAME_NOREPLACE)
        };
        placed.map_err(|e| {
            let _ = unlinkat(dir, tmp, UnlinkatFlags::NoRemoveDir);
            ApplyError::Placing(e)
        })
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
}

/// The directory `rel` beneath `root`, from `cache` or opened (a path
/// descriptor, no link followed) and kept there.
fn opened(
    cache: &std::cell::RefCell<HashMap<PathBuf, Rc<OwnedFd>>>,
    root: &OwnedFd,
    rel: &Path,
) -> nix::Result<Rc<OwnedFd>> {
    if let Some(d) = cache.borrow().get(rel) {
        return Ok(d.clone());
    }
    let fd = Rc::new(beneath(root, rel, OFlag::O_PATH | OFlag::O_DIRECTORY)?);
    cache.borrow_mut().insert(rel.to_path_buf(), fd.clone());
    Ok(fd)
}
