//! A bounded walk of one read-write tree that finds what host programs obey:
//! git control planes (`.git` entries and bare-repository directories) and
//! guarded tool-configuration names, at any depth.
//!
//! The walk never follows a symlink: every directory is opened with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`) relative to the tree's root, so a
//! link planted by an agent cannot point it elsewhere on the host.

use crate::sandbox::beneath::{beneath, open_root};
use nix::dir::{Dir, Type};
use nix::fcntl::OFlag;

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub(crate) use crate::profile::guard::MAX_ENTRIES;

pub(crate) use crate::profile::guard::Found;

/// Special files a walk records.
pub(crate) const MAX_SPECIAL: usize = 4096;

/// Whether an entry of this type is a socket, a FIFO or a device node.
pub(crate) fn is_special(mode: u32) -> bool {
    matches!(
        mode & libc::S_IFMT,
        libc::S_IFSOCK | libc::S_IFIFO | libc::S_IFCHR | libc::S_IFBLK
    )
}

/// Whether `rel` exists under `dir` without following any symlink; a symlink
/// on the way or at the end counts as existing (the caller refuses it later).
fn exists_beneath(dir: &impl AsFd, rel: &Path) -> bool {
    match beneath(dir, rel, OFlag::O_PATH | OFlag::O_NOFOLLOW) {
        Ok(_) => true,
        Err(nix::Error::ELOOP) => true,
        Err(_) => false,
    }
}

/// Walks the tree at `root`. `guarded` are relative paths (their first
/// component is matched at every depth); `git` adds `.git` entries and
/// bare-repository directories.
pub(crate) fn walk(root: &Path, guarded: &[PathBuf], git: bool) -> nix::Result<Found> {
    walk_with(root, guarded, git, None)
}

/// [`walk`], giving the owner read and search rights back on a directory it
/// cannot open (the end sweep: the agent's directories, which the user owns)
/// — except those that were already unreadable at start (`keep`): the
/// human's own locked directories stay as they are.
pub(crate) fn walk_unlocking(
    root: &Path,
    guarded: &[PathBuf],
    git: bool,
    keep: &BTreeSet<PathBuf>,
) -> nix::Result<Found> {
    walk_with(root, guarded, git, Some(keep))
}

fn walk_with(
    root: &Path,
    guarded: &[PathBuf],
    git: bool,
    unlock: Option<&BTreeSet<PathBuf>>,
) -> nix::Result<Found> {
    let mut w = Walker {
        root_fd: open_root(root)?,
        by_first: by_first(guarded),
        git,
        unlock,
        found: Found {
            complete: true,
            ..Found::default()
        },
        stack: vec![PathBuf::new()],
    };
    while let Some(rel) = w.stack.pop() {
        let Some(fd) = w.open_dir(&rel) else {
            continue;
        };
        let Ok(dir) = Dir::from_fd(fd) else {
            continue;
        };
        if !w.directory(dir, &rel) {
            break;
        }
    }
    Ok(w.found)
}

/// Guarded paths by their first component: one lookup per entry.
fn by_first(guarded: &[PathBuf]) -> HashMap<&OsStr, Vec<&PathBuf>> {
    let mut by_first: HashMap<&OsStr, Vec<&PathBuf>> = HashMap::new();
    for g in guarded {
        if let Some(c) = g.components().next() {
            by_first.entry(c.as_os_str()).or_default().push(g);
        }
    }
    by_first
}

/// One walk's state: the directories still to read and what it found.
struct Walker<'a> {
    root_fd: OwnedFd,
    by_first: HashMap<&'a OsStr, Vec<&'a PathBuf>>,
    git: bool,
    unlock: Option<&'a BTreeSet<PathBuf>>,
    found: Found,
    stack: Vec<PathBuf>,
}

impl Walker<'_> {
    /// Opens the directory `rel`; when it cannot be read, gives the owner
    /// its rights back if the walk unlocks (and `rel` is not kept locked),
    /// else records it as unreadable. `None` to skip it.
    fn open_dir(&mut self, rel: &PathBuf) -> Option<OwnedFd> {
        let open = || beneath(&self.root_fd, rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY);
        match open() {
            Ok(fd) => Some(fd),
            Err(nix::Error::EACCES) => {
                let retried = self
                    .unlock
                    .filter(|keep| !keep.contains(rel))
                    .and_then(|_| {
                        let parent = beneath(
                            &self.root_fd,
                            rel.parent()?,
                            OFlag::O_PATH | OFlag::O_DIRECTORY,
                        )
                        .ok()?;
                        crate::sandbox::beneath::unlock_dir(&parent, Path::new(rel.file_name()?));
                        open().ok()
                    });
                if retried.is_none() {
                    self.found.unreadable.insert(rel.clone());
                }
                retried
            }
            // Vanished or replaced by a link since it was listed: not a directory of the tree.
            Err(_) => None,
        }
    }

    /// Reads one directory: a bare-repository shape is recorded whole, else
    /// each entry is. `false` when the walk went over its bound.
    fn directory(&mut self, mut dir: Dir, rel: &Path) -> bool {
        let names = list(&mut dir);
        self.found.entries += names.len();
        if self.found.entries > MAX_ENTRIES {
            self.found.complete = false;
            return false;
        }
        if self.git && is_bare_shape(rel, &names) {
            // A bare-repository shape (objects and refs here, or in the
            // directory `commondir` names): git discovers it as a repository.
            self.found.repos.insert(rel.to_path_buf());
            return true;
        }
        let dirfd = dir.as_fd();
        for (n, ty) in &names {
            self.entry(&dirfd, rel, n, *ty);
        }
        true
    }

    /// Records one entry of the directory `rel`: a `.git`, the guarded
    /// names it starts, a directory to walk, a special file.
    fn entry(&mut self, dirfd: &BorrowedFd, rel: &Path, n: &[u8], ty: Option<Type>) {
        let name = OsStr::from_bytes(n);
        let child = rel.join(name);
        if self.git && n == b".git" {
            self.found.repos.insert(child);
            return;
        }
        for g in self.by_first.get(name).into_iter().flatten() {
            if exists_beneath(dirfd, g) {
                self.found.names.insert(rel.join(g));
            }
        }
        let mode = entry_mode(dirfd, name, ty);
        if mode & libc::S_IFMT == libc::S_IFDIR {
            self.stack.push(child);
        } else if is_special(mode) {
            if self.found.special.len() < MAX_SPECIAL {
                self.found.special.insert(child);
            } else {
                self.found.special_overflow = true;
            }
        }
    }
}

/// A directory's entries (without `.` and `..`), with their types.
fn list(dir: &mut Dir) -> Vec<(Vec<u8>, Option<Type>)> {
    let mut names: Vec<(Vec<u8>, Option<Type>)> = Vec::new();
    for e in dir.iter().flatten() {
        let n = e.file_name().to_bytes();
        if n == b"." || n == b".." {
            continue;
        }
        names.push((n.to_vec(), e.file_type()));
    }
    names
}

/// Whether a directory below the root holding these entries is shaped as a
/// bare repository.
fn is_bare_shape(rel: &Path, names: &[(Vec<u8>, Option<Type>)]) -> bool {
    let has = |n: &[u8]| names.iter().any(|(x, _)| x == n);
    !rel.as_os_str().is_empty()
        && has(b"HEAD")
        && (has(b"commondir") || (has(b"objects") && has(b"refs")))
}

/// An entry's file type as `st_mode` bits: from the directory listing, or
/// (when the listing has none) from `fstatat` without following a link.
fn entry_mode(dirfd: &BorrowedFd, name: &OsStr, ty: Option<Type>) -> u32 {
    match ty {
        Some(Type::Directory) => libc::S_IFDIR,
        Some(Type::Socket) => libc::S_IFSOCK,
        Some(Type::Fifo) => libc::S_IFIFO,
        Some(Type::CharacterDevice) => libc::S_IFCHR,
        Some(Type::BlockDevice) => libc::S_IFBLK,
        Some(_) => libc::S_IFREG,
        None => nix::sys::stat::fstatat(dirfd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            .map(|s| s.st_mode)
            .unwrap_or(libc::S_IFREG),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_repos_and_names_at_depth_without_following_links() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(r.join("a/b/.git")).unwrap();
        std::fs::write(r.join("a/sub.git"), "x").unwrap();
        std::fs::create_dir_all(r.join("c/.git")).unwrap();
        std::fs::write(r.join("a/.envrc"), "x").unwrap();
        std::fs::create_dir_all(r.join("bare/objects")).unwrap();
        std::fs::create_dir_all(r.join("bare/refs")).unwrap();
        std::fs::write(r.join("bare/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::create_dir_all(r.join("d/.cargo")).unwrap();
        std::fs::write(r.join("d/.cargo/config.toml"), "").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(outside.path().join("deep/.git")).unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("link")).unwrap();
        let g = [PathBuf::from(".envrc"), PathBuf::from(".cargo/config.toml")];
        let f = walk(r, &g, true).unwrap();
        let want: BTreeSet<PathBuf> = [".git", "a/b/.git", "c/.git", "bare"]
            .into_iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(f.repos, want);
        let names: BTreeSet<PathBuf> = ["a/.envrc", "d/.cargo/config.toml"]
            .into_iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(f.names, names);
        assert!(f.complete);
        let f = walk(r, &g, false).unwrap();
        assert!(f.repos.is_empty());
    }

    #[test]
    fn special_files_are_recorded_by_their_entry_type() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a")).unwrap();
        nix::unistd::mkfifo(&t.path().join("a/fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let _s = std::os::unix::net::UnixListener::bind(t.path().join("sock")).unwrap();
        std::fs::write(t.path().join("plain"), "x").unwrap();
        let f = walk(t.path(), &[], false).unwrap();
        let want: BTreeSet<PathBuf> = ["a/fifo", "sock"].into_iter().map(PathBuf::from).collect();
        assert_eq!(f.special, want);
        assert!(!f.special_overflow);
    }
}
