//! The quarantine: where the guard moves what the agent planted, in sandmux's
//! state directory (`$XDG_STATE_HOME/sandmux`, `~/.local/state/sandmux`, or
//! `$TMPDIR/sandmux-state-<uid>` when neither can be used), never inside a tree
//! the agent can write.
//!
//! Every operation on the agent's tree is relative to a directory descriptor
//! and never follows a link: a planted entry is moved with `renameat2`, or, when
//! that would cross file systems, copied (symlinks as symlinks, bounded) and
//! removed. This is the one host-side file operation sandmux does on the
//! agent's behalf (trust boundary 5 of the threat model).

use super::GuardError;
use crate::sandbox::beneath::{beneath, unlock_dir};
use nix::fcntl::{openat, renameat2, AtFlags, OFlag, RenameFlags};
use nix::sys::stat::{fstatat, mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Bytes a quarantine keeps per instance; past it, planted entries are still
/// removed from the workspace, but not kept.
pub(crate) const MAX_KEPT_BYTES: u64 = 64 << 20;
/// Entries a quarantine keeps per instance.
pub(crate) const MAX_KEPT_ITEMS: usize = 1000;
/// Entries (files, directories, links) a quarantine copies per instance.
pub(crate) const MAX_KEPT_ENTRIES: usize = 100_000;
/// Depth of a planted directory tree that is copied and removed entry by entry.
const MAX_DEPTH: usize = 64;

/// How a planted entry was taken; the guard's list also carries two
/// things that are not entries, told apart here and never by their text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum How {
    /// Moved into the quarantine.
    #[serde(rename = "rename")]
    Renamed,
    /// Copied into the quarantine (across file systems), then removed.
    #[serde(rename = "copy")]
    Copied,
    /// Copied in part (past the budget: the rest is removed).
    #[serde(rename = "copy, in part")]
    CopiedInPart,
    /// Removed, not kept (over the budget).
    #[serde(rename = "removed")]
    Removed,
    /// Could not be removed.
    #[serde(rename = "FAILED")]
    Failed,
    /// Not an entry: what the end sweep could not check (`why`).
    #[serde(rename = "warning")]
    Warning,
    /// Not an entry: where the agent's work went (`why`): a kept layer, …
    #[serde(rename = "layer")]
    LayerNotice,
}

impl How {
    /// The word the audit log and the summary have always used.
    pub(crate) fn word(self) -> &'static str {
        match self {
            How::Renamed => "rename",
            How::Copied => "copy",
            How::CopiedInPart => "copy, in part",
            How::Removed => "removed",
            How::Failed => "FAILED",
            How::Warning => "warning",
            How::LayerNotice => "layer",
        }
    }
}

impl Taken {
    /// How it was taken, in words (`rename (original restored)`).
    pub(crate) fn how_said(&self) -> String {
        match self.restored {
            true => format!("{} (original restored)", self.how.word()),
            false => self.how.word().to_string(),
        }
    }

    /// A line of the list that is not an entry: a warning, or the layer's
    /// notice.
    pub(crate) fn notice(how: How, why: String) -> Taken {
        Taken {
            path: PathBuf::new(),
            kept: None,
            how,
            restored: false,
            why,
            took_ms: 0.0,
        }
    }
}

/// One planted entry the guard took out of a workspace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Taken {
    /// Where it was (host path).
    pub path: PathBuf,
    /// Where it is kept now, if it was kept.
    pub kept: Option<PathBuf>,
    /// How it was taken (or what else the list carries, [`How`]).
    pub how: How,
    /// A guarded file the agent changed: the original was written back
    /// after the changed one was taken.
    #[serde(default)]
    pub restored: bool,
    /// Why it was taken: the guarded name or "new repository".
    pub why: String,
    /// Milliseconds between the guard noticing it and having taken it.
    pub took_ms: f64,
}

/// A parent directory of ours without write and search for its owner (an
/// agent's `chmod 555`): given them, for a supervisor that is not root
/// (root needs no permission bit). Returns the mode to put back.
fn open_parent(parent: &OwnedFd) -> Option<u32> {
    let me = nix::unistd::geteuid();
    let st = nix::sys::stat::fstat(parent).ok()?;
    let mode = st.st_mode & 0o7777;
    if me.is_root() || st.st_uid != me.as_raw() || mode & 0o300 == 0o300 {
        return None;
    }
    nix::sys::stat::fchmod(parent, Mode::from_bits_truncate(mode | 0o300)).ok()?;
    Some(mode)
}

/// sandmux's state directory, created 0700, outside every tree in `forbidden`.
pub(crate) fn state_dir(forbidden: &[PathBuf]) -> Result<PathBuf, GuardError> {
    state_dir_with(forbidden, true)
}

/// [`state_dir`] without making anything: the one that exists (`diff`,
/// `apply`, `discard` look there).
pub(crate) fn existing_state_dir() -> Result<PathBuf, GuardError> {
    state_dir_with(&[], false)
}

fn state_dir_with(forbidden: &[PathBuf], create: bool) -> Result<PathBuf, GuardError> {
    let uid = nix::unistd::geteuid().as_raw();
    let xdg = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")));
    let mut tried = Vec::new();
    for cand in xdg
        .map(|b| b.join("sandmux"))
        .into_iter()
        .chain([std::env::temp_dir().join(format!("sandmux-state-{uid}"))])
    {
        match usable(&cand, uid, forbidden, create) {
            Ok(p) => return Ok(p),
            Err(e) => tried.push(format!("{}: {e}", cand.display())),
        }
    }
    Err(GuardError::NoStateDir { tried })
}

/// Why a candidate state directory is not used.
#[derive(Debug, thiserror::Error)]
enum Unusable {
    #[error("not absolute")]
    NotAbsolute,
    #[error("inside {}, which the agent can write", .0.display())]
    InTree(PathBuf),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a directory of this user that only it can write")]
    NotOwn,
}

fn usable(p: &Path, uid: u32, forbidden: &[PathBuf], create: bool) -> Result<PathBuf, Unusable> {
    if !p.is_absolute() {
        return Err(Unusable::NotAbsolute);
    }
    // Nothing is made inside a tree the agent can write, not even to find
    // out (the real path is checked again below).
    if let Some(t) = forbidden.iter().find(|t| p.starts_with(t)) {
        return Err(Unusable::InTree(t.clone()));
    }
    if create {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(p)?;
    }
    let m = std::fs::symlink_metadata(p)?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
        return Err(Unusable::NotOwn);
    }
    let real = std::fs::canonicalize(p)?;
    if let Some(t) = forbidden.iter().find(|t| real.starts_with(t)) {
        return Err(Unusable::InTree(t.clone()));
    }
    Ok(real)
}

/// The quarantine of one instance: `<state>/quarantine/<id>/`.
pub(crate) struct Quarantine {
    /// Its directory.
    pub dir: PathBuf,
    fd: OwnedFd,
    budget: Budget,
    kept_items: usize,
    seq: usize,
}

impl Quarantine {
    /// Opens (creating) the quarantine for instance `id` under `state`.
    pub(crate) fn open(state: &Path, id: &str) -> Result<Quarantine, GuardError> {
        let dir = state.join("quarantine").join(id);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| GuardError::Io {
                what: "creating",
                path: dir.clone(),
                source,
            })?;
        let fd = crate::sandbox::beneath::open_root(&dir).map_err(|e| GuardError::Io {
            what: "opening",
            path: dir.clone(),
            source: e.into(),
        })?;
        Ok(Quarantine {
            dir,
            fd,
            budget: Budget {
                bytes: MAX_KEPT_BYTES,
                entries: MAX_KEPT_ENTRIES,
                lost: 0,
            },
            kept_items: 0,
            seq: 0,
        })
    }

    /// Takes `rel` (relative to the tree `root_fd` opened at `root`) out of
    /// the tree. When a directory on the way is a symlink, that link is what
    /// redirects the guarded path, and it is taken instead. `None` when there
    /// was nothing there.
    pub(crate) fn take(
        &mut self,
        root_fd: &OwnedFd,
        root: &Path,
        rel: &Path,
        why: &str,
    ) -> Option<Taken> {
        let t0 = std::time::Instant::now();
        let rel = redirect_or_self(root_fd, rel)?;
        let rel = rel.as_path();
        let parent = beneath(
            root_fd,
            rel.parent().unwrap_or(Path::new("")),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        )
        .ok()?;
        let name = Path::new(rel.file_name()?);
        fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        self.seq += 1;
        let kept_name = format!("{:04}-{}", self.seq, flat(rel));
        // A directory the agent made unwritable cannot be moved to another
        // parent (its `..` changes) nor emptied: the user owns it, so unlock it.
        unlock_dir(&parent, name);
        // Nor can anything leave a parent made unwritable: opened for the
        // take, and put back as it was after it.
        let parent_was = open_parent(&parent);
        let how = self.move_out(&parent, name, &kept_name);
        if let Some(mode) = parent_was {
            let _ = nix::sys::stat::fchmod(&parent, Mode::from_bits_truncate(mode));
        }
        let kept = matches!(how, How::Renamed | How::Copied);
        if kept {
            self.kept_items += 1;
        }
        Some(Taken {
            path: root.join(rel),
            kept: kept.then(|| self.dir.join(&kept_name)),
            how,
            restored: false,
            why: why.into(),
            took_ms: t0.elapsed().as_secs_f64() * 1000.0,
        })
    }

    /// Moves `name` out of `parent` into the quarantine as `kept_name`, or
    /// removes it when the quarantine is full or the move cannot be made.
    /// Whether the entry is out: a rename moves it at once; a removal may
    /// fail (a directory that grew meanwhile), gets one more try, and is
    /// then reported FAILED. Whatever stands at the name afterwards is a
    /// new entry (the agent planted again at once, maybe on a reused
    /// inode): its own event takes it.
    fn move_out(&mut self, parent: &OwnedFd, name: &Path, kept_name: &str) -> How {
        let over = self.kept_items >= MAX_KEPT_ITEMS || self.budget.bytes == 0;
        if over {
            return removed_or_failed(parent, name);
        }
        match renameat2(
            parent,
            name,
            &self.fd,
            kept_name,
            RenameFlags::RENAME_NOREPLACE,
        ) {
            Ok(()) => How::Renamed,
            Err(nix::Error::EXDEV) => self.copy_out(parent, name, kept_name),
            Err(_) => removed_or_failed(parent, name),
        }
    }

    /// Across file systems: copies `name` into the quarantine (bounded by
    /// the budget), then removes it from the tree.
    fn copy_out(&mut self, parent: &OwnedFd, name: &Path, kept_name: &str) -> How {
        self.budget.lost = 0;
        if copy_tree(
            parent,
            name,
            &self.fd,
            Path::new(kept_name),
            &mut self.budget,
            0,
        )
        .is_err()
        {
            self.budget.lost += 1;
        }
        match (remove_twice(parent, name), self.budget.lost) {
            (false, _) => How::Failed,
            (true, 0) => How::Copied,
            (true, _) => How::CopiedInPart,
        }
    }
}

/// A relative path as one file name: `/` and control characters as `_`.
fn flat(rel: &Path) -> String {
    rel.to_string_lossy()
        .chars()
        .map(|c| if c == '/' || c.is_control() { '_' } else { c })
        .collect()
}

/// Removes `name` from `parent`, trying once more if the first removal fails.
fn remove_twice(parent: &OwnedFd, name: &Path) -> bool {
    remove_tree(parent, name, 0) || remove_tree(parent, name, 0)
}

/// [`remove_twice`], as what happened to the entry.
fn removed_or_failed(parent: &OwnedFd, name: &Path) -> How {
    if remove_twice(parent, name) {
        How::Removed
    } else {
        How::Failed
    }
}

/// What is really at `rel` under `root`, walking one component at a time
/// without following links: the first symlink on the way (it redirects the
/// guarded path), `rel` itself if it exists, or `None`.
pub(crate) fn redirect_or_self(root: &OwnedFd, rel: &Path) -> Option<PathBuf> {
    let comps: Vec<&std::ffi::OsStr> = rel.iter().collect();
    let mut cur = beneath(root, Path::new(""), OFlag::O_PATH | OFlag::O_DIRECTORY).ok()?;
    let mut so_far = PathBuf::new();
    for (i, c) in comps.iter().enumerate() {
        so_far.push(c);
        let st = fstatat(&cur, *c, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        let fmt = st.st_mode & libc::S_IFMT;
        if fmt == libc::S_IFLNK || i + 1 == comps.len() {
            return Some(so_far);
        }
        if fmt != libc::S_IFDIR {
            return None; // a file on the way: the guarded path cannot exist
        }
        cur = match beneath(&cur, Path::new(c), OFlag::O_PATH | OFlag::O_DIRECTORY) {
            Ok(fd) => fd,
            Err(nix::Error::ELOOP) => return Some(so_far), // swapped for a link meanwhile
            Err(_) => return None,
        };
    }
    None
}

/// What a copy may still use: bytes of file content and entries; and what
/// it could not keep.
pub(crate) struct Budget {
    bytes: u64,
    entries: usize,
    /// Entries not kept whole (cut, skipped, unreadable), this copy.
    lost: usize,
}

/// Copies `name` under `src` to `to` under `dst` without following links,
/// within `budget`.
fn copy_tree(
    src: &impl AsFd,
    name: &Path,
    dst: &impl AsFd,
    to: &Path,
    budget: &mut Budget,
    depth: usize,
) -> nix::Result<()> {
    if budget.entries == 0 {
        budget.lost += 1;
        return Ok(());
    }
    budget.entries -= 1;
    let st = fstatat(src, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR if depth < MAX_DEPTH => {
            unlock_dir(src, name);
            mkdirat(dst, to, Mode::from_bits_truncate(0o700))?;
            let sd = beneath(src, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
            let dd = beneath(dst, to, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
            let mut dir = nix::dir::Dir::from_fd(sd.try_clone().map_err(|_| nix::Error::EBADF)?)?;
            for n in entries(&mut dir) {
                if copy_tree(&sd, Path::new(&n), &dd, Path::new(&n), budget, depth + 1).is_err() {
                    budget.lost += 1;
                }
            }
            Ok(())
        }
        libc::S_IFLNK => {
            let target = nix::fcntl::readlinkat(src, name)?;
            nix::unistd::symlinkat(target.as_os_str(), dst, to)
        }
        libc::S_IFREG => {
            // O_NONBLOCK: a file swapped for a FIFO must not block the guard.
            let f = openat(
                src,
                name,
                OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            if nix::sys::stat::fstat(&f)?.st_mode & libc::S_IFMT != libc::S_IFREG {
                return Ok(());
            }
            let o = openat(
                dst,
                to,
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            )?;
            let mut r = std::fs::File::from(f).take(budget.bytes);
            let mut w = std::fs::File::from(o);
            let size = nix::sys::stat::fstat(r.get_ref().as_fd())?.st_size as u64;
            let n = std::io::copy(&mut r, &mut w).unwrap_or(0);
            let _ = w.flush();
            budget.bytes = budget.bytes.saturating_sub(n);
            if n < size {
                budget.lost += 1;
            }
            Ok(())
        }
        _ => {
            // Devices, FIFOs, sockets, too deep: not kept.
            budget.lost += 1;
            Ok(())
        }
    }
}

fn entries(d: &mut nix::dir::Dir) -> Vec<std::ffi::OsString> {
    d.iter()
        .flatten()
        .map(|e| e.file_name().to_bytes().to_vec())
        .filter(|n| n != b"." && n != b"..")
        .map(std::os::unix::ffi::OsStringExt::from_vec)
        .collect()
}

/// Removes `name` under `dir` (a whole tree), never following a link.
pub(crate) fn remove_tree(dir: &impl AsFd, name: &Path, depth: usize) -> bool {
    let Ok(st) = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
        return true; // gone already
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return unlinkat(dir, name, UnlinkatFlags::NoRemoveDir).is_ok();
    }
    if depth < MAX_DEPTH {
        unlock_dir(dir, name);
        if let Ok(sd) = beneath(dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
            let names = match sd
                .try_clone()
                .ok()
                .and_then(|d| nix::dir::Dir::from_fd(d).ok())
            {
                Some(mut d) => entries(&mut d),
                None => Vec::new(),
            };
            for n in names {
                remove_tree(&sd, Path::new(&n), depth + 1);
            }
        }
    }
    unlinkat(dir, name, UnlinkatFlags::RemoveDir).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_without_following_links() {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path().join("ws");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(ws.join(".vscode")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "host").unwrap();
        std::fs::write(ws.join(".vscode/tasks.json"), "{}").unwrap();
        std::os::unix::fs::symlink(&outside, ws.join(".vscode/link")).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join(".envrc")).unwrap();
        let state = t.path().join("state");
        let mut q = Quarantine::open(&state, "i1").unwrap();
        let fd = crate::sandbox::beneath::open_root(&ws).unwrap();
        let a = q.take(&fd, &ws, Path::new(".vscode"), ".vscode").unwrap();
        assert_eq!(a.how, How::Renamed);
        let b = q.take(&fd, &ws, Path::new(".envrc"), ".envrc").unwrap();
        assert_eq!(b.how, How::Renamed);
        assert!(q.take(&fd, &ws, Path::new(".absent"), "x").is_none());
        assert!(
            !ws.join(".vscode").exists() && std::fs::symlink_metadata(ws.join(".envrc")).is_err()
        );
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).unwrap(),
            "host"
        );
        assert!(a.kept.unwrap().join("tasks.json").is_file());
        // The copy-and-remove path, as used across file systems.
        std::fs::create_dir_all(ws.join("d/e")).unwrap();
        std::fs::write(ws.join("d/e/f"), "12345").unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("d/l")).unwrap();
        let mut budget = Budget {
            bytes: 3,
            entries: 100,
            lost: 0,
        };
        copy_tree(
            &fd,
            Path::new("d"),
            &q.fd,
            Path::new("copy"),
            &mut budget,
            0,
        )
        .unwrap();
        assert_eq!(budget.lost, 1, "the cut file is counted");
        remove_tree(&fd, Path::new("d"), 0);
        assert!(!ws.join("d").exists());
        assert_eq!(
            std::fs::read_to_string(q.dir.join("copy/e/f")).unwrap(),
            "123"
        );
        assert!(std::fs::symlink_metadata(q.dir.join("copy/l"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).unwrap(),
            "host"
        );
    }
}
