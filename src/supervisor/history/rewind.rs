//! Putting a layer's writes back to a checkpoint (`sandmux rewind`), and
//! folding the oldest checkpoints when the store reaches its bound.
//!
//! A rewind first takes a checkpoint of the layer as it is, so it can be
//! undone (rewind to that one), then writes every entry that differs from
//! the target (by descriptor beneath the root, never through a link:
//! files and links made under a fresh name and renamed into place), and
//! takes a checkpoint again: its state must be the target's, or the
//! rewind says the layer changed under it.

use super::store::{self, History};
use super::walk::{self, split, Node};
use super::{hex_of, Cause, HistoryError, Line, State};
use nix::fcntl::{renameat, OFlag};
use nix::sys::stat::mkdirat;
use nix::sys::stat::{fchmod, mknodat, Mode, SFlag};
use nix::unistd::{symlinkat, unlinkat, UnlinkatFlags};
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

const OPAQUE: &std::ffi::CStr = c"user.overlay.opaque";

/// Whether the directory open at `fd` carries overlayfs's opaque mark.
pub(crate) fn is_opaque(fd: &OwnedFd) -> bool {
    let mut v = [0u8; 4];
    // SAFETY: fgetxattr on an open descriptor, a NUL-terminated name and a
    // buffer of the length given.
    let n = unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            OPAQUE.as_ptr(),
            v.as_mut_ptr().cast(),
            v.len(),
        )
    };
    n == 1 && v[0] == b'y'
}

fn set_opaque(fd: &OwnedFd, on: bool) -> std::io::Result<()> {
    // SAFETY: fsetxattr/fremovexattr on an open descriptor with a
    // NUL-terminated name and a one-byte value.
    let r = unsafe {
        if on {
            libc::fsetxattr(fd.as_raw_fd(), OPAQUE.as_ptr(), b"y".as_ptr().cast(), 1, 0)
        } else {
            libc::fremovexattr(fd.as_raw_fd(), OPAQUE.as_ptr())
        }
    };
    match r {
        0 => Ok(()),
        _ => {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ENODATA) if !on => Ok(()),
                _ => Err(e),
            }
        }
    }
}

/// Rewinds the layer of `h` (its instance ended: the caller holds the
/// layer's lock) to checkpoint `n`. Returns the checkpoint taken before
/// (the one that undoes it) and the one after.
pub(crate) fn rewind(h: &mut History, n: u64) -> Result<(Line, Line), HistoryError> {
    let target = h.state_at(n)?;
    let before = h.take(&cause("(before rewind)", n))?;
    let current = h.state().clone();
    // Nothing is written unless all of it can be.
    if let Some((p, _)) = target
        .iter()
        .find(|(p, t)| matches!(t, Node::Unkept { .. }) && current.get(*p) != Some(*t))
    {
        return Err(HistoryError::Unkept { n, path: p.clone() });
    }
    let root = crate::sandbox::beneath::open_root(h.writes())
        .map_err(|e| HistoryError::io("opening", h.writes(), e.into()))?;
    let objects = h.dir().join("objects");
    open_dirs(&root, &current)?;
    remove_stale(&root, &current, &target)?;
    // Parents sort before their children: each parent exists when needed.
    for (path, node) in &target {
        if current.get(path) != Some(node) {
            put(&root, path, node, &objects)?;
        }
    }
    dir_modes(&root, &target)?;
    let after = h.take(&cause("(rewind)", n))?;
    // Its own writes changed every entry they made (a new inode, a new
    // ctime): the checkpoint after reads exactly those.
    if !same(h.state(), &target) {
        return Err(HistoryError::io(
            "rewinding",
            h.writes(),
            std::io::Error::other(format!(
                "the layer changed while it was rewound; checkpoint {} is how it is now, {} how it was before",
                after.n, before.n
            )),
        ));
    }
    Ok((before, after))
}

/// Whether the layer's state `now` is the checkpoint's `target` ([`Node::is`]).
fn same(now: &State, target: &State) -> bool {
    now.len() == target.len()
        && now
            .iter()
            .zip(target)
            .all(|((p, a), (q, b))| p == q && a.is(b))
}

/// As root, gives the entry `name` in `dir` the owner `node` recorded
/// (a rewind by root would leave root's files, which the agent's uid can
/// no longer change); otherwise every entry made is the caller's already.
fn own(dir: &OwnedFd, name: &OsStr, node: &Node) -> nix::Result<()> {
    match node.owner() {
        Some((u, g)) if nix::unistd::geteuid().is_root() => nix::unistd::fchownat(
            dir,
            name,
            Some(u.into()),
            Some(g.into()),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ),
        _ => Ok(()),
    }
}

fn cause(tool: &str, n: u64) -> Cause {
    Cause {
        tool: tool.into(),
        request_id: String::new(),
        args: serde_json::json!({ "to": n }),
    }
}

/// Gives the owner rwx on every directory (an agent's `chmod 555` would
/// stop the rewind); [`dir_modes`] puts the target's modes back after.
fn open_dirs(root: &OwnedFd, current: &State) -> Result<(), HistoryError> {
    let dirs = std::iter::once(PathBuf::new()).chain(
        current
            .iter()
            .filter(|(_, n)| matches!(n, Node::Dir { .. }))
            .map(|(p, _)| p.clone()),
    );
    for d in dirs {
        let fd = walk::open_dir(root, &d)?;
        let st =
            nix::sys::stat::fstat(&fd).map_err(|e| HistoryError::io("reading", &d, e.into()))?;
        fchmod(&fd, Mode::from_bits_truncate((st.st_mode & 0o777) | 0o700))
            .map_err(|e| HistoryError::io("opening up", &d, e.into()))?;
    }
    Ok(())
}

/// Removes, deepest first, what the target does not have, and what it has
/// as another kind of entry.
fn remove_stale(root: &OwnedFd, current: &State, target: &State) -> Result<(), HistoryError> {
    let mut stale: Vec<&PathBuf> = current
        .iter()
        .filter(|(p, n)| match target.get(*p) {
            None => true,
            Some(t) => std::mem::discriminant(t) != std::mem::discriminant(*n),
        })
        .map(|(p, _)| p)
        .collect();
    stale.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in stale {
        let (parent, name) = split(p);
        let dir = walk::open_dir(root, parent)?;
        let how = match current.get(p) {
            Some(Node::Dir { .. }) => UnlinkatFlags::RemoveDir,
            _ => UnlinkatFlags::NoRemoveDir,
        };
        match unlinkat(&dir, name, how) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(HistoryError::io("removing", p, e.into())),
        }
    }
    Ok(())
}

/// Makes the entry `node` at `path` (its parent exists: parents sort first).
pub(super) fn put(
    root: &OwnedFd,
    path: &Path,
    node: &Node,
    objects: &Path,
) -> Result<(), HistoryError> {
    let (parent, name) = split(path);
    let dir = walk::open_dir(root, parent)?;
    let e = |what| move |err: nix::Error| HistoryError::io(what, path, err.into());
    if let Node::Dir { mode, opaque, .. } = node {
        match mkdirat(&dir, name, Mode::from_bits_truncate(mode | 0o700)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(err) => return Err(e("making")(err)),
        }
        own(&dir, name, node).map_err(e("setting the owner of"))?;
        let fd = walk::open_dir(root, path)?;
        return set_opaque(&fd, *opaque).map_err(|err| HistoryError::io("marking", path, err));
    }
    let tmp = format!(".sandmux-rewind-{}", crate::nonce::hex());
    let tmp = OsStr::new(&tmp);
    match node {
        Node::File { mode, object, .. } => {
            let fd = nix::fcntl::openat(
                &dir,
                tmp,
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            )
            .map_err(e("writing"))?;
            let src = objects.join(object);
            let mut from =
                std::fs::File::open(&src).map_err(|err| HistoryError::io("reading", &src, err))?;
            let mut f = std::fs::File::from(fd);
            copy_sparse(&mut from, &mut f).map_err(|err| HistoryError::io("writing", path, err))?;
            fchmod(&f, Mode::from_bits_truncate(mode & 0o777)).map_err(e("writing"))?;
        }
        Node::Link { target, .. } => {
            let t = walk::unhex(target).unwrap_or_default();
            use std::os::unix::ffi::OsStrExt;
            symlinkat(OsStr::from_bytes(&t), &dir, tmp).map_err(e("linking"))?;
        }
        Node::Whiteout => {
            mknodat(&dir, tmp, SFlag::S_IFCHR, Mode::empty(), 0).map_err(e("marking removed"))?;
        }
        Node::Dir { .. } | Node::Unkept { .. } => unreachable!("handled above"),
    }
    own(&dir, tmp, node).map_err(e("setting the owner of"))?;
    renameat(&dir, tmp, &dir, name).map_err(e("renaming into place"))
}

/// Copies `from` into the new file `to`, a run of zeros as a hole (a
/// sparse file stays sparse: a view of 200 of them must not cost their
/// apparent size on disk).
pub(crate) fn copy_sparse(from: &mut std::fs::File, to: &mut std::fs::File) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut buf = vec![0u8; 64 * 1024];
    let mut len = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        match buf[..n].iter().all(|b| *b == 0) {
            true => {
                to.seek(SeekFrom::Current(n as i64))?;
            }
            false => to.write_all(&buf[..n])?,
        }
        len += n as u64;
    }
    to.set_len(len)
}

/// Puts every directory's mode back as the target has it, deepest first.
pub(super) fn dir_modes(root: &OwnedFd, target: &State) -> Result<(), HistoryError> {
    let mut dirs: Vec<(&PathBuf, u32)> = target
        .iter()
        .filter_map(|(p, n)| match n {
            Node::Dir { mode, .. } => Some((p, *mode)),
            _ => None,
        })
        .collect();
    dirs.sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
    for (p, mode) in dirs {
        let fd = walk::open_dir(root, p)?;
        fchmod(&fd, Mode::from_bits_truncate(mode))
            .map_err(|e| HistoryError::io("setting", p, e.into()))?;
    }
    Ok(())
}

/// Folds the oldest checkpoints into the base until the objects fit in
/// `bound` (the last checkpoint always stays); returns the last folded.
pub(crate) fn fold(
    dir: &Path,
    last: u64,
    bound: u64,
    keep: &std::collections::HashSet<String>,
) -> Result<Option<u64>, HistoryError> {
    let objects = dir.join("objects");
    let (mut k, mut base) = store::base_of(dir)?;
    let start = k;
    while k < last && store::objects_bytes(&objects) > bound {
        store::delta_of(dir, k + 1)?.apply(&mut base)?;
        k += 1;
        write_base(dir, k, &base)?;
        for old in start..=k {
            let _ = std::fs::remove_file(dir.join("deltas").join(format!("{old}.json")));
        }
        collect(dir, &base, k, last, keep)?;
    }
    Ok((k > start).then_some(k))
}

fn write_base(dir: &Path, k: u64, base: &State) -> Result<(), HistoryError> {
    let hexed: std::collections::BTreeMap<String, &Node> =
        base.iter().map(|(p, n)| (hex_of(p), n)).collect();
    let text = serde_json::to_vec(&(k, hexed)).unwrap_or_default();
    let tmp = dir.join("base.json.new");
    store::write_new(&tmp, &text)?;
    std::fs::rename(&tmp, dir.join("base.json")).map_err(|e| HistoryError::io("writing", &tmp, e))
}

/// Removes every object neither the base nor a kept delta names.
fn collect(
    dir: &Path,
    base: &State,
    k: u64,
    last: u64,
    fresh: &std::collections::HashSet<String>,
) -> Result<(), HistoryError> {
    let mut keep = fresh.clone();
    let mut name = |n: &Node| {
        if let Node::File { object, .. } = n {
            keep.insert(object.clone());
        }
    };
    base.values().for_each(&mut name);
    for n in k + 1..=last {
        if let Ok(d) = store::delta_of(dir, n) {
            d.changed.values().for_each(&mut name);
        }
    }
    let objects = dir.join("objects");
    for e in std::fs::read_dir(&objects)
        .map_err(|e| HistoryError::io("listing", &objects, e))?
        .flatten()
    {
        let n = e.file_name().to_string_lossy().into_owned();
        // A `.new-` file is a store a crash or an error left (the history
        // is one process's at a time).
        if !keep.contains(&n) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    Ok(())
}
