//! What the workspace must show after a rewind, and writing it through the
//! merged view (inside the sandbox's mount namespace).
//!
//! The history records the overlay's upper layer; the panes see the merged
//! view: the workspace's own tree (the lower layer) with the upper one
//! over it. Both the target (checkpoint N) and the current state are read
//! over the same lower tree ([`merged`]), so each path either layer names
//! gets what the target shows there: the target's entry, the lower's
//! entry again (copied in: an upper entry cannot be taken back through the
//! mount), or nothing. Where the two states differ in whether the lower
//! shows below a directory (the agent removed a directory of the
//! workspace, or made one opaque), the lower's whole subtree there is
//! considered too. Every directory is opened beneath the root with no link
//! followed; files and links are made under a fresh name and renamed into
//! place; nothing is written through a name the agent planted.

use super::Done;
use crate::supervisor::history::{walk, HistoryError, Node, State};
use nix::fcntl::{renameat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{symlinkat, unlinkat, UnlinkatFlags};
use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Deepest directory a removal descends into.
const MAX_DEPTH: usize = 4096;

/// Why the rewinder stopped (paths are the agent's: escaped where printed).
#[derive(Debug, thiserror::Error)]
pub(crate) enum InsideError {
    /// Walking a tree.
    #[error(transparent)]
    Walk(#[from] HistoryError),
    /// A step on the workspace.
    #[error("{what} {}: {errno}", crate::term::printable(&path.to_string_lossy()))]
    Step {
        what: &'static str,
        path: PathBuf,
        errno: nix::Error,
    },
    /// The supervisor sent no descriptor for this path's content.
    #[error("no content for {} (the history's object could not be opened)", crate::term::printable(&.0.to_string_lossy()))]
    NoObject(PathBuf),
    /// An entry rewinding a running instance does not bring back.
    #[error("the workspace holds {} as a FIFO, socket or device node: rewinding a running instance brings back files, directories and links only (stop it and rewind the layer: `sandmux stop ID`, then `sandmux rewind ID N`)", crate::term::printable(&.0.to_string_lossy()))]
    Special(PathBuf),
    /// A tree deeper than [`MAX_DEPTH`].
    #[error("{} is more than {MAX_DEPTH} directories deep", crate::term::printable(&.0.to_string_lossy()))]
    Depth(PathBuf),
    /// After writing, an entry is not what the target shows.
    #[error("after the rewind {} is not as checkpoint N has it", crate::term::printable(&.0.to_string_lossy()))]
    Check(PathBuf),
    /// Entering or confining (the rewinder's own set-up).
    #[error("{0}")]
    Setup(String),
    /// Refused before anything was written.
    #[error("{0}; nothing was written")]
    Before(Box<InsideError>),
}

impl InsideError {
    /// Whether the workspace is as it was (nothing written yet).
    pub(crate) fn wrote_nothing(&self) -> bool {
        matches!(self, InsideError::Setup(_) | InsideError::Before(_))
    }
}

fn step<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> InsideError + 'a {
    move |errno| InsideError::Step {
        what,
        path: path.to_path_buf(),
        errno,
    }
}

/// What a path shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Want {
    Absent,
    Dir(u32),
    /// A file: the history's object (None: the lower's file at that path).
    File {
        object: Option<String>,
        mode: u32,
    },
    Link(Vec<u8>),
    /// A FIFO, socket or device node of the lower tree.
    Special,
}

/// The lower tree (the workspace's own), read by descriptor, cached.
pub(crate) struct Lower<'a> {
    fd: &'a OwnedFd,
    seen: HashMap<PathBuf, Want>,
}

impl<'a> Lower<'a> {
    pub(crate) fn new(fd: &'a OwnedFd) -> Self {
        Lower {
            fd,
            seen: HashMap::new(),
        }
    }

    /// The SHA-256 of the lower's file at `p`.
    fn digest(&mut self, p: &Path) -> Option<String> {
        super::content::digest_at(self.fd, p)
    }

    /// The lower's entry at `p` (a path through a link is no path: absent).
    fn at(&mut self, p: &Path) -> Want {
        if let Some(w) = self.seen.get(p) {
            return w.clone();
        }
        let w = entry(self.fd, p).unwrap_or(Want::Absent);
        self.seen.insert(p.to_path_buf(), w.clone());
        w
    }
}

/// The entry at `p` beneath `root`, as a [`Want`] (a file by no object).
fn entry(root: &OwnedFd, p: &Path) -> Option<Want> {
    let (parent, name) = walk::split(p);
    let dir = walk::open_dir(root, parent).ok()?;
    let st = fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
    let mode = st.st_mode & 0o777;
    Some(
        match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFDIR => Want::Dir(st.st_mode & 0o7777),
            SFlag::S_IFREG => Want::File { object: None, mode },
            SFlag::S_IFLNK => {
                Want::Link(nix::fcntl::readlinkat(&dir, name).ok()?.as_bytes().to_vec())
            }
            _ => Want::Special,
        },
    )
}

/// What `state` (an upper layer) over the lower shows at `p`, and whether
/// the lower shows below `p` (a directory neither opaque nor below one).
pub(crate) fn merged(state: &State, lower: &mut Lower, p: &Path) -> (Want, bool) {
    let mut hidden = false;
    let mut a = PathBuf::new();
    let comps: Vec<_> = p.components().collect();
    for c in &comps[..comps.len().saturating_sub(1)] {
        a.push(c);
        match state.get(&a) {
            Some(Node::Dir { opaque, .. }) => hidden |= *opaque,
            Some(_) => return (Want::Absent, false),
            None if hidden => return (Want::Absent, false),
            None if !matches!(lower.at(&a), Want::Dir(_)) => return (Want::Absent, false),
            None => {}
        }
    }
    match state.get(p) {
        Some(Node::Whiteout) => (Want::Absent, false),
        Some(Node::Dir { mode, opaque, .. }) => (Want::Dir(*mode & 0o7777), !hidden && !opaque),
        Some(Node::File { mode, object, .. }) => (
            Want::File {
                object: Some(object.clone()),
                mode: *mode & 0o777,
            },
            false,
        ),
        Some(Node::Link { target, .. }) => {
            (Want::Link(walk::unhex(target).unwrap_or_default()), false)
        }
        // A file whose content was not kept: a file all the same.
        Some(Node::Unkept { mode, .. }) => (
            Want::File {
                object: None,
                mode: *mode & 0o777,
            },
            false,
        ),
        None if hidden => (Want::Absent, false),
        None => {
            let w = lower.at(p);
            let below = matches!(w, Want::Dir(_));
            (w, below)
        }
    }
}

/// Every path the rewind looks at: what either state names, and the
/// lower's subtree below a directory where the two differ in whether the
/// lower shows.
pub(crate) fn paths(
    target: &State,
    current: &State,
    lower: &mut Lower,
) -> Result<BTreeSet<PathBuf>, InsideError> {
    let mut all: BTreeSet<PathBuf> = target.keys().chain(current.keys()).cloned().collect();
    let mut more = Vec::new();
    for p in &all {
        let (want, shows) = merged(target, lower, p);
        if matches!(want, Want::Dir(_)) && shows != merged(current, lower, p).1 {
            more.extend(walk::list_below(lower.fd, p)?.into_keys());
        }
    }
    all.extend(more);
    Ok(all)
}

/// The descriptor of a history object, from the supervisor.
pub(crate) type Objects<'a> = dyn FnMut(&str) -> Option<OwnedFd> + 'a;

/// Makes the merged view at `ws` show `target` over the lower tree at
/// every path of [`paths`], then checks each of them.
pub(crate) fn apply(
    ws: &OwnedFd,
    lower_fd: &OwnedFd,
    target: &State,
    current: &State,
    objects: &mut Objects,
) -> Result<Done, InsideError> {
    let mut lower = Lower::new(lower_fd);
    let before = |e: InsideError| InsideError::Before(Box::new(e));
    let all = paths(target, current, &mut lower).map_err(before)?;
    let wants: Vec<(&PathBuf, Want)> = all
        .iter()
        .map(|p| (p, merged(target, &mut lower, p).0))
        .collect();
    // What is not built is refused before anything is written.
    if let Some((p, _)) = wants.iter().find(|(_, w)| *w == Want::Special) {
        return Err(before(InsideError::Special(p.to_path_buf())));
    }
    let mut w = Writer {
        ws,
        lower,
        objects,
        done: Done::default(),
        modes: Vec::new(),
    };
    // The workspace's top (the history records no mode for it): opened
    // while the rewind writes, its mode as found put back at the end.
    let st = nix::sys::stat::fstat(ws).map_err(step("reading", Path::new(".")))?;
    if st.st_mode & 0o700 != 0o700 {
        fchmod(ws, Mode::from_bits_truncate((st.st_mode & 0o7777) | 0o700))
            .map_err(step("opening up", Path::new(".")))?;
        w.modes.push((PathBuf::new(), st.st_mode & 0o7777));
    }
    for (p, want) in &wants {
        let same = target.get(*p).is_some() && target.get(*p) == current.get(*p);
        w.put(p, want, same)?;
    }
    let (done, mut modes, mut w_lower) = (w.done, w.modes, w.lower);
    // Deepest first: a directory made unwritable last.
    modes.sort_by_key(|(p, _): &(PathBuf, u32)| std::cmp::Reverse(p.components().count()));
    for (p, mode) in &modes {
        let fd = walk::open_dir(ws, p)?;
        fchmod(&fd, Mode::from_bits_truncate(*mode)).map_err(step("setting the mode of", p))?;
    }
    for (p, want) in &wants {
        if !shows(ws, &mut w_lower, p, want) {
            return Err(InsideError::Check(p.to_path_buf()));
        }
    }
    Ok(done)
}

/// Whether the merged view shows `want` at `p` (files by content and
/// mode, links by target, directories by mode).
fn shows(ws: &OwnedFd, lower: &mut Lower, p: &Path, want: &Want) -> bool {
    match (entry(ws, p), want) {
        (None, Want::Absent) => true,
        (Some(Want::File { mode, .. }), Want::File { mode: m, object }) => {
            let have = super::content::digest_at(ws, p);
            let should = match object {
                Some(o) => Some(o.clone()),
                None => lower.digest(p),
            };
            mode == *m && have.is_some() && have == should
        }
        (Some(got), want) => got == *want,
        (None, _) => false,
    }
}

/// What writes the merged view: where, from what, and what it did.
struct Writer<'a, 'b> {
    ws: &'a OwnedFd,
    lower: Lower<'a>,
    objects: &'a mut Objects<'b>,
    done: Done,
    /// Directories opened while the rewind writes, with their final mode.
    modes: Vec<(PathBuf, u32)>,
}

impl Writer<'_, '_> {
    /// Whether the file at `p` may hold other content than `want` names
    /// although the history says it does not ([`super::content`]).
    fn stale(&mut self, p: &Path, want: &Want) -> bool {
        match want {
            Want::File {
                object: Some(o), ..
            } => super::content::digest_at(self.ws, p).as_deref() != Some(o.as_str()),
            Want::File { object: None, .. } => {
                super::content::digest_at(self.ws, p) != self.lower.digest(p)
            }
            _ => false,
        }
    }

    /// Makes `p` show `want`. `same`: the target's entry is the current
    /// one (left alone where it is there as that kind).
    fn put(&mut self, p: &Path, want: &Want, same: bool) -> Result<(), InsideError> {
        let stale = same && self.stale(p, want);
        let (ws, done) = (self.ws, &mut self.done);
        let (parent, name) = walk::split(p);
        let dir = match walk::open_dir(ws, parent) {
            Ok(d) => d,
            // Its parent is gone: nothing to remove; anything else fails.
            Err(_) if *want == Want::Absent => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let now = entry(ws, p);
        if same && now.as_ref().is_some_and(|n| same_kind(n, want)) && !stale {
            return Ok(());
        }
        match want {
            Want::Absent => {
                if now.is_some() {
                    remove_all(&dir, name, p, 0)?;
                    done.removed += 1;
                }
            }
            Want::Dir(mode) => {
                let dir_now = matches!(now, Some(Want::Dir(_)));
                if !dir_now {
                    if now.is_some() {
                        remove_all(&dir, name, p, 0)?;
                    }
                    mkdirat(&dir, name, Mode::from_bits_truncate(0o700))
                        .map_err(step("making", p))?;
                    done.written += 1;
                }
                if now != Some(Want::Dir(*mode)) || !dir_now || mode & 0o700 != 0o700 {
                    // Open while the rewind writes below it; its mode at the end.
                    let fd = walk::open_dir(ws, p)?;
                    fchmod(&fd, Mode::from_bits_truncate(0o700 | mode))
                        .map_err(step("opening up", p))?;
                    self.modes.push((p.to_path_buf(), *mode));
                }
            }
            Want::File { object, mode } => {
                let from = match object {
                    Some(o) => {
                        (self.objects)(o).ok_or_else(|| InsideError::NoObject(p.to_path_buf()))?
                    }
                    None => lower_file(self.lower.fd, p)?,
                };
                let tmp = fresh_name();
                write_file(&dir, &tmp, from, *mode).map_err(step("writing", p))?;
                replace(&dir, &tmp, name, now.as_ref(), p)?;
                done.written += 1;
            }
            Want::Link(target) => {
                let tmp = fresh_name();
                symlinkat(OsStr::from_bytes(target), &dir, tmp.as_os_str())
                    .map_err(step("linking", p))?;
                replace(&dir, &tmp, name, now.as_ref(), p)?;
                done.written += 1;
            }
            Want::Special => return Err(InsideError::Special(p.to_path_buf())),
        }
        Ok(())
    }
}

fn same_kind(now: &Want, want: &Want) -> bool {
    std::mem::discriminant(now) == std::mem::discriminant(want)
}

fn fresh_name() -> std::ffi::OsString {
    format!(".sandmux-rewind-{}", crate::nonce::hex()).into()
}

/// Renames `tmp` over `name` (a directory there is removed first: a
/// rename does not replace one with a file).
fn replace(
    dir: &OwnedFd,
    tmp: &OsStr,
    name: &OsStr,
    now: Option<&Want>,
    p: &Path,
) -> Result<(), InsideError> {
    if matches!(now, Some(Want::Dir(_))) {
        remove_all(dir, name, p, 0)?;
    }
    renameat(dir, tmp, dir, name).map_err(step("renaming into place", p))
}

/// The lower's regular file at `p`, open read-only (no link followed).
fn lower_file(lower: &OwnedFd, p: &Path) -> Result<OwnedFd, InsideError> {
    let (parent, name) = walk::split(p);
    let dir = walk::open_dir(lower, parent)?;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
    let fd = crate::sandbox::beneath::beneath(&dir, Path::new(name), flags)
        .map_err(step("reading the workspace's", p))?;
    let st = nix::sys::stat::fstat(&fd).map_err(step("reading the workspace's", p))?;
    match st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFREG.bits() {
        true => Ok(fd),
        false => Err(InsideError::Special(p.to_path_buf())),
    }
}

/// A new file `tmp` in `dir` with the content of `from` and `mode`.
fn write_file(dir: &OwnedFd, tmp: &OsStr, from: OwnedFd, mode: u32) -> nix::Result<()> {
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(dir, tmp, flags, Mode::from_bits_truncate(0o600))?;
    let mut to = std::fs::File::from(fd);
    let mut from = std::fs::File::from(from);
    crate::supervisor::history::rewind::copy_sparse(&mut from, &mut to)
        .map_err(|e| nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    fchmod(&to, Mode::from_bits_truncate(mode & 0o777))
}

/// Removes `name` in `dir` and everything below it (no link followed: a
/// link is removed, never what it points to).
fn remove_all(dir: &OwnedFd, name: &OsStr, p: &Path, depth: usize) -> Result<(), InsideError> {
    if depth > MAX_DEPTH {
        return Err(InsideError::Depth(p.to_path_buf()));
    }
    let st = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(nix::errno::Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(step("reading", p)(e)),
    };
    if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFDIR.bits() {
        return unlinkat(dir, name, UnlinkatFlags::NoRemoveDir).map_err(step("removing", p));
    }
    let sub = walk::open_dir(dir, Path::new(name))?;
    let _ = fchmod(&sub, Mode::from_bits_truncate((st.st_mode & 0o777) | 0o700));
    let names: Vec<std::ffi::OsString> = {
        let fd = sub.try_clone().map_err(|e| {
            step("listing", p)(nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
        })?;
        let mut d = nix::dir::Dir::from_fd(fd).map_err(step("listing", p))?;
        d.iter()
            .flatten()
            .map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
            .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
            .collect()
    };
    for n in names {
        remove_all(&sub, &n, &p.join(&n), depth + 1)?;
    }
    unlinkat(dir, name, UnlinkatFlags::RemoveDir).map_err(step("removing", p))
}
