//! A checkpoint's state written out whole into an empty directory (`apply
//! --upto N` and `diff --upto N` work on it as on any layer's `upper/`):
//! the same writer as a rewind's ([`super::rewind::put`]: by descriptor
//! beneath the root, never through a link, whiteouts and opaque marks as
//! overlayfs keeps them), from the history's own records, never from the
//! layer the agent wrote.
//!
//! Bounded: the history keeps each content once, so a checkpoint can name
//! one object under many paths (200 names of a 500 MB sparse file). The
//! view writes each content (with its mode and owner) once and gives its
//! other paths hard links to it, and writes runs of zeros as holes
//! ([`super::rewind::put`]); [`need`] is what the caller weighs against
//! the free space before anything is written.

use super::store;
use super::walk::{self, split, Node};
use super::{HistoryError, State};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The state of checkpoint `n` of the history at `history`, refused when
/// the log does not have it or it holds a file whose content the history
/// could not keep.
pub(crate) fn target(history: &Path, n: u64) -> Result<State, HistoryError> {
    let last = store::read_lines(history)?.last().map_or(0, |l| l.n);
    if n > last {
        return Err(HistoryError::NoCheckpoint(n));
    }
    let target: State = store::state_at(history, n)?;
    if let Some((p, _)) = target
        .iter()
        .find(|(_, t)| matches!(t, Node::Unkept { .. }))
    {
        return Err(HistoryError::Unkept { n, path: p.clone() });
    }
    Ok(target)
}

/// What one entry costs besides its bytes: its name and inode (a file
/// system's smallest allocations), and a block for a directory or a long
/// link target. Without it a checkpoint of a million empty directories
/// would weigh nothing and fill a disk's blocks or inodes.
const ENTRY: u64 = 256;
/// A directory's block, and a link target stored out of its inode.
const BLOCK: u64 = 4096;
/// The most names of one inode on ext4 (`EMLINK` past it): a view's
/// content with more names is written again ([`write`]).
const LINK_MAX: u64 = 65_000;

/// What a view of `target` holds: each content with its mode and owner
/// once, as [`write`] writes it (apparent sizes, holes too), every name,
/// and a block per directory and per long link; and the inodes it takes.
pub(crate) fn need(target: &State) -> (u64, u64) {
    let mut names: HashMap<_, u64> = HashMap::new();
    let (mut bytes, mut inodes) = (0u64, 0u64);
    for n in target.values() {
        let (b, i) = match n {
            Node::File { size, .. } => {
                let c = names.entry(key(n)).or_insert(0);
                *c += 1;
                // Another name of a content already written is a hard
                // link, up to the most names an inode may have; then a
                // fresh copy ([`write`]).
                match (*c - 1) % LINK_MAX {
                    0 => (size.saturating_add(ENTRY), 1),
                    _ => (ENTRY, 0),
                }
            }
            Node::Dir { .. } => (BLOCK + ENTRY, 1),
            Node::Link { target, .. } if target.len() / 2 > 60 => (BLOCK + ENTRY, 1),
            _ => (ENTRY, 1),
        };
        bytes = bytes.saturating_add(b);
        inodes += i;
    }
    (bytes, inodes)
}

/// What files of a view share one inode by: content, mode, owner.
fn key(n: &Node) -> Option<(String, u32, Option<walk::Owner>)> {
    match n {
        Node::File {
            object,
            mode,
            owner,
            ..
        } => Some((object.clone(), *mode, *owner)),
        _ => None,
    }
}

/// Writes the state of checkpoint `n` of the history at `history` into
/// the empty directory `root`; the number of entries written.
#[cfg(test)]
pub(crate) fn materialise(history: &Path, n: u64, root: &Path) -> Result<usize, HistoryError> {
    write(history, &target(history, n)?, root)
}

/// Writes `target` (a checkpoint's state of the history at `history`)
/// into the empty directory `root`: a content already written is linked.
pub(crate) fn write(history: &Path, target: &State, root: &Path) -> Result<usize, HistoryError> {
    let fd = crate::sandbox::beneath::open_root(root)
        .map_err(|e| HistoryError::io("opening", root, e.into()))?;
    let objects = history.join("objects");
    let mut first: HashMap<_, &PathBuf> = HashMap::new();
    // Parents sort before their children: each parent exists when needed.
    for (path, node) in target {
        let k = key(node);
        if let Some(to) = k.as_ref().and_then(|k| first.get(k)) {
            match link(&fd, to, path) {
                Ok(()) => continue,
                // The file system's most names of one inode (65,000 on
                // ext4): a fresh copy, which the names after it link to.
                Err(LinkError::Link {
                    errno: nix::errno::Errno::EMLINK,
                }) => {}
                Err(LinkError::Link { errno }) => {
                    return Err(HistoryError::io("linking", path, errno.into()))
                }
                Err(LinkError::Open(e)) => return Err(e),
            }
        }
        super::rewind::put(&fd, path, node, &objects)?;
        if let Some(k) = k {
            first.insert(k, path);
        }
    }
    super::rewind::dir_modes(&fd, target)?;
    Ok(target.len())
}

/// Links `path` to the view's file `to` (both beneath `root`, no link
/// followed: the view is the human's, written only here).
fn link(root: &std::os::fd::OwnedFd, to: &Path, path: &Path) -> Result<(), LinkError> {
    let (from_dir, from_name) = split(to);
    let (dir, name) = split(path);
    let at = |d| walk::open_dir(root, d).map_err(LinkError::Open);
    let (a, b) = (at(from_dir)?, at(dir)?);
    nix::unistd::linkat(&a, from_name, &b, name, nix::fcntl::AtFlags::empty())
        .map_err(|errno| LinkError::Link { errno })
}

/// Why a second name of a content was not linked.
#[derive(Debug)]
enum LinkError {
    /// A directory on the way could not be opened.
    Open(HistoryError),
    /// `linkat` refused (`EMLINK`: the inode has the most names it may).
    Link { errno: nix::errno::Errno },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(object: &str, mode: u32, size: u64) -> Node {
        Node::File {
            mode,
            size,
            object: object.into(),
            owner: Some((1000, 1000)),
        }
    }

    /// 200 names of one 500 MB content weigh 500 MB (written once, linked);
    /// under three modes, three times that (three inodes); other content
    /// adds its size. Control: the names' apparent sizes, what a view
    /// written name by name held, are 200 times it.
    #[test]
    fn a_view_weighs_each_content_once_per_mode() {
        let big = 500 << 20;
        let mut s = State::new();
        for i in 0..200 {
            s.insert(PathBuf::from(format!("f{i}")), file("aa", 0o644, big));
        }
        let named: u64 = s
            .values()
            .map(|n| match n {
                Node::File { size, .. } => *size,
                _ => 0,
            })
            .sum();
        assert_eq!(named, 200 * big);
        assert_eq!(need(&s), (big + 200 * ENTRY, 1));
        s.insert("g".into(), file("aa", 0o600, big));
        s.insert("h".into(), file("aa", 0o640, big));
        s.insert("i".into(), file("bb", 0o644, 7));
        s.insert("d".into(), Node::Whiteout);
        assert_eq!(need(&s), (3 * big + 7 + 204 * ENTRY, 5));
    }

    /// A million empty directories, or long links, weigh their blocks and
    /// inodes (second review: they weighed nothing, and a view of them
    /// filled a disk's blocks or inodes). Control: the file bytes alone
    /// are 0.
    #[test]
    fn directories_and_long_links_weigh_their_blocks_and_inodes() {
        let mut s = State::new();
        for i in 0..1_000_000u32 {
            let n = Node::Dir {
                mode: 0o755,
                opaque: false,
                owner: None,
            };
            s.insert(PathBuf::from(format!("d{i}")), n);
        }
        let files: u64 = s
            .values()
            .map(|n| match n {
                Node::File { size, .. } => *size,
                _ => 0,
            })
            .sum();
        assert_eq!(files, 0);
        assert_eq!(need(&s), (1_000_000 * (BLOCK + ENTRY), 1_000_000));
        let long = Node::Link {
            target: "61".repeat(100),
            owner: None,
        };
        let short = Node::Link {
            target: "61".repeat(10),
            owner: None,
        };
        let mut l = State::new();
        l.insert("a".into(), long);
        l.insert("b".into(), short);
        assert_eq!(need(&l), (BLOCK + 2 * ENTRY, 2));
        // Past the most names of an inode, a content is written again.
        let mut f = State::new();
        for i in 0..(2 * LINK_MAX + 1) {
            f.insert(PathBuf::from(format!("f{i}")), file("aa", 0o644, 10));
        }
        assert_eq!(need(&f), (3 * 10 + (2 * LINK_MAX + 1) * ENTRY, 3));
    }
}
