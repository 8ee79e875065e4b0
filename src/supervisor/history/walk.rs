//! Reading where the agent's writes are (an overlay's `upper/`, a copy
//! workspace's copy) as checkpoints see it: every entry by its path, never
//! through a link (each directory is opened beneath its parent with
//! `openat2`'s no-symlinks rule; a file is read only if the inode opened
//! is the one listed), with what tells a change apart (inode, ctime, size)
//! and what a rewind puts back (kind, mode, a link's target, a whiteout,
//! an opaque directory).

use super::HistoryError;
use crate::sandbox::beneath::beneath;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstatat, FileStat, SFlag};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Entries a walk reads at most: past it the checkpoint fails (closed).
pub(crate) const MAX_ENTRIES: usize = 1_000_000;

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub(crate) enum Node {
    /// A regular file: its content is the object named by its SHA-256.
    File {
        /// Permission bits (set-ID bits never kept).
        mode: u32,
        /// Apparent size.
        size: u64,
        /// The content's SHA-256 (hex): its object in the store.
        object: String,
        /// Its owner (uid, gid): a rewind as root puts it back so (None:
        /// recorded before owners were).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<Owner>,
    },
    /// A directory; `opaque`: it hides what the workspace has below it.
    Dir {
        /// Permission bits.
        mode: u32,
        /// Overlayfs's opaque mark (`user.overlay.opaque`).
        opaque: bool,
        /// Its owner, as a file's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<Owner>,
    },
    /// A symbolic link (never followed), its target in hex.
    Link {
        /// The target's bytes, hex.
        target: String,
        /// Its owner, as a file's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<Owner>,
    },
    /// Overlayfs's mark of an entry removed from the workspace.
    Whiteout,
    /// A regular file whose content the history could not keep: more than
    /// `[workspace] history_bytes` had room for (its apparent size counts,
    /// holes too). A rewind to a state that holds one refuses, naming it.
    Unkept {
        /// Permission bits.
        mode: u32,
        /// Apparent size.
        size: u64,
    },
}

/// An entry's owner: (uid, gid) on the host.
pub(crate) type Owner = (u32, u32);

impl Node {
    /// Its owner, where recorded.
    pub(crate) fn owner(&self) -> Option<Owner> {
        match self {
            Node::File { owner, .. } | Node::Dir { owner, .. } | Node::Link { owner, .. } => *owner,
            Node::Whiteout | Node::Unkept { .. } => None,
        }
    }

    /// Whether `self` (how an entry is) is `want` (a checkpoint's), an
    /// owner `want` did not record matching any.
    pub(crate) fn is(&self, want: &Node) -> bool {
        let strip = |n: &Node| {
            let mut n = n.clone();
            if let Node::File { owner, .. } | Node::Dir { owner, .. } | Node::Link { owner, .. } =
                &mut n
            {
                *owner = None;
            }
            n
        };
        match want.owner() {
            Some(_) => self == want,
            None => strip(self) == *want,
        }
    }
}

/// An entry as listed, before its content is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Inode, ctime (ns) and size: what changes when anything about it does.
    pub(crate) stamp: (u64, i128, u64),
    /// The file type bits (`S_IFMT`).
    pub(crate) fmt: u32,
    /// More than one name (a hard link): a write by another name changes
    /// it without an event in its own directory.
    pub(crate) linked: bool,
}

/// Every entry below the root, by its path relative to it (no `.`).
pub(crate) type Listing = BTreeMap<PathBuf, Seen>;

fn seen(st: &FileStat) -> Seen {
    Seen {
        stamp: (
            st.st_ino,
            st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128,
            st.st_size as u64,
        ),
        fmt: st.st_mode & SFlag::S_IFMT.bits(),
        linked: st.st_nlink > 1 && st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFDIR.bits(),
    }
}

/// How the entry at `rel` below `root` is now (None: gone).
pub(crate) fn stat_at(root: &OwnedFd, rel: &Path) -> Option<Seen> {
    let (parent, name) = split(rel);
    let dir = open_dir(root, parent).ok()?;
    fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .ok()
        .map(|st| seen(&st))
}

/// Lists every entry below `root` without following a link.
pub(crate) fn list(root: &OwnedFd) -> Result<Listing, HistoryError> {
    list_below(root, Path::new(""))
}

/// Lists every entry below the directory `start` (relative to `root`; not
/// `start` itself) without following a link.
pub(crate) fn list_below(root: &OwnedFd, start: &Path) -> Result<Listing, HistoryError> {
    list_watching(root, start, &mut |_: &Path| {})
}

/// [`list_below`], calling `before` on each directory (`start` too)
/// before its entries are read (the feed watches it there: nothing made
/// after the read is missed).
pub(crate) fn list_watching(
    root: &OwnedFd,
    start: &Path,
    before: &mut dyn FnMut(&Path),
) -> Result<Listing, HistoryError> {
    let mut out = Listing::new();
    let mut stack = vec![start.to_path_buf()];
    while let Some(rel) = stack.pop() {
        before(&rel);
        let dir = match open_dir_errno(root, &rel) {
            Ok(d) => d,
            // Gone (or replaced) since it was listed: the next event says.
            Err(nix::errno::Errno::ENOENT) | Err(nix::errno::Errno::ENOTDIR) => continue,
            // Anything else fails the checkpoint: nothing is skipped unsaid.
            Err(e) => return Err(HistoryError::io("opening the directory", &rel, e.into())),
        };
        for (path, s) in children_of(&dir, &rel)? {
            if is_dir(&s) {
                stack.push(path.clone());
            }
            out.insert(path, s);
            if out.len() > MAX_ENTRIES {
                return Err(HistoryError::TooLarge(MAX_ENTRIES));
            }
        }
    }
    Ok(out)
}

/// Whether a listed entry is a directory.
pub(crate) fn is_dir(s: &Seen) -> bool {
    s.fmt == SFlag::S_IFDIR.bits()
}

/// The direct children of the open directory `dir` (at `rel`), by path.
pub(crate) fn children_of(dir: &OwnedFd, rel: &Path) -> Result<Vec<(PathBuf, Seen)>, HistoryError> {
    Ok(children(dir, rel)?
        .into_iter()
        .map(|(name, st)| (rel.join(name), seen(&st)))
        .collect())
}

/// `p` and everything below it in `listing` (a path sorts just before
/// what is below it).
pub(crate) fn subtree(listing: &Listing, p: &Path) -> Vec<PathBuf> {
    use std::ops::Bound;
    let below = listing
        .range::<PathBuf, _>((Bound::Excluded(p.to_path_buf()), Bound::Unbounded))
        .map(|(q, _)| q)
        .take_while(|q| p.as_os_str().is_empty() || q.starts_with(p))
        .cloned();
    listing
        .contains_key(p)
        .then(|| p.to_path_buf())
        .into_iter()
        .chain(below)
        .collect()
}

/// Opens the directory `rel` beneath `root` (no link on the way).
/// One component at a time (a path longer than the kernel takes at once,
/// which an agent can make, is still opened).
pub(crate) fn open_dir(root: &impl AsFd, rel: &Path) -> Result<OwnedFd, HistoryError> {
    open_dir_errno(root, rel).map_err(|e| HistoryError::io("opening the directory", rel, e.into()))
}

fn open_dir_errno(root: &impl AsFd, rel: &Path) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
    let mut fd = beneath(root, Path::new(""), flags)?;
    for c in rel.components() {
        fd = beneath(&fd, Path::new(c.as_os_str()), flags)?;
    }
    Ok(fd)
}

fn children(dir: &OwnedFd, rel: &Path) -> Result<Vec<(PathBuf, FileStat)>, HistoryError> {
    let fd = dir
        .try_clone()
        .map_err(|e| HistoryError::io("listing", rel, e))?;
    let mut d =
        nix::dir::Dir::from_fd(fd).map_err(|e| HistoryError::io("listing", rel, e.into()))?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e.map_err(|e| HistoryError::io("listing", rel, e.into()))?;
        let name = e.file_name().to_bytes();
        if matches!(name, b"." | b"..") {
            continue;
        }
        let name = OsStr::from_bytes(name);
        match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => out.push((PathBuf::from(name), st)),
            // Gone since the listing: not there.
            Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(HistoryError::io("reading", &rel.join(name), e.into())),
        }
    }
    Ok(out)
}

/// What the entry at `rel` is, its file's content handed to `store`
/// (which returns the object's name). None: it is gone, or it changed
/// between the listing and the read (the next checkpoint sees it).
pub(crate) fn node(
    root: &OwnedFd,
    rel: &Path,
    s: &Seen,
    store: &mut dyn FnMut(OwnedFd, u64) -> Result<Option<String>, HistoryError>,
) -> Result<Option<Node>, HistoryError> {
    let fmt = SFlag::from_bits_truncate(s.fmt);
    let (parent, name) = split(rel);
    let dir = open_dir(root, parent)?;
    if fmt == SFlag::S_IFLNK {
        let target = match nix::fcntl::readlinkat(&dir, name) {
            Ok(t) => t,
            Err(nix::errno::Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(HistoryError::io("reading the link", rel, e.into())),
        };
        let st = fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok();
        return Ok(Some(Node::Link {
            target: hex(target.as_bytes()),
            owner: st.map(|st| (st.st_uid, st.st_gid)),
        }));
    }
    if fmt == SFlag::S_IFCHR {
        // A whiteout is `c 0 0`; any other device is no entry of a layer.
        let st = fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok();
        return Ok(st.filter(|st| st.st_rdev == 0).map(|_| Node::Whiteout));
    }
    let flags = if fmt == SFlag::S_IFDIR {
        OFlag::O_RDONLY | OFlag::O_DIRECTORY
    } else if fmt == SFlag::S_IFREG {
        OFlag::O_RDONLY | OFlag::O_NOCTTY | OFlag::O_NONBLOCK
    } else {
        return Ok(None);
    };
    let fd = match beneath(&dir, Path::new(name), flags) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(HistoryError::io("opening", rel, e.into())),
    };
    let st = nix::sys::stat::fstat(&fd).map_err(|e| HistoryError::io("reading", rel, e.into()))?;
    if seen(&st) != *s {
        return Ok(None);
    }
    let mode = st.st_mode & 0o777;
    let owner = Some((st.st_uid, st.st_gid));
    if fmt == SFlag::S_IFDIR {
        return Ok(Some(Node::Dir {
            mode,
            opaque: super::rewind::is_opaque(&fd),
            owner,
        }));
    }
    let size = st.st_size as u64;
    Ok(Some(match store(fd, size)? {
        Some(object) => Node::File {
            mode,
            size,
            object,
            owner,
        },
        None => Node::Unkept { mode, size },
    }))
}

/// A path's parent and its last component.
pub(crate) fn split(rel: &Path) -> (&Path, &OsStr) {
    (
        rel.parent().unwrap_or(Path::new("")),
        rel.file_name().unwrap_or(OsStr::new(".")),
    )
}

/// Bytes as lowercase hex.
pub(crate) fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

/// Hex back to bytes (None: not hex).
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}
