//! The copy workspace (`[workspace] mode = "copy"`, and what copy-on-write
//! becomes where no overlay can be had under a profile that lets the mount
//! layer go): the workspace copied into the layer's `copy/` before the
//! sandbox starts (a reflink a file where the file system has them), which
//! the agent works on at its own path, confined by Landlock alone.
//!
//! The door reads it as it reads an overlay's `upper/`: what the agent
//! changed is every entry of the copy that is not the one copied (its
//! ctime is at or after the `since` mark beside the copy, which no process
//! can set back,
//! or its inode is not the one the snapshot names at its path) and every
//! entry of the snapshot that is gone. The copy never follows a link,
//! keeps no set-ID bit and no special file, and is bounded by the layer's
//! bound (`[workspace] layer_bytes`, `layer_files`): a workspace larger
//! than that is refused, naming the fix.

use crate::sandbox::beneath::beneath;
use nix::dir::Dir;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The snapshot's file in the layer's directory (the human's, 0700).
pub(crate) const SNAPSHOT: &str = "snapshot";
/// The mark whose ctime divides the copy's entries from the agent's.
const SINCE: &str = "since";
/// The mark set once the instance has ended: nothing may change the copy
/// after it (a process that outlived the sandbox, the system's ageing of
/// `/var/tmp`), or the door reads none of it.
const ENDED: &str = "ended";

/// Why the copy could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CopyError {
    /// A file-system step.
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// Larger than the layer's bound.
    #[error("the workspace holds more than {bound} {unit}, the copy workspace's bound ([workspace] {key}): nothing copied; run where the overlay can be had (a runtime that gives user namespaces: podman, or docker with --security-opt seccomp=unconfined --security-opt apparmor=unconfined), raise {key} in a profile of your own, or choose --workspace-mode live")]
    TooLarge {
        bound: u64,
        unit: &'static str,
        key: &'static str,
    },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CopyError + 'a {
    move |source| CopyError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// What a copy took.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Made {
    /// Apparent bytes of its files.
    pub(crate) bytes: u64,
    /// Entries copied.
    pub(crate) entries: u64,
    /// Entries left out: special files, and what could not be read.
    pub(crate) left_out: u64,
    /// The `since` mark, in nanoseconds since the epoch.
    pub(crate) since_ns: i128,
}

/// Copies the workspace at `workspace` into the empty directory `copy`
/// (the layer's `copy/`), writes the snapshot beside it in `layer`, and
/// sets the `since` mark. `bound`: (bytes, entries).
pub(crate) fn make(
    workspace: &Path,
    layer: &Path,
    copy: &Path,
    bound: (u64, u64),
) -> Result<Made, CopyError> {
    let src = crate::sandbox::beneath::open_root(workspace)
        .map_err(|e| io("opening", workspace)(e.into()))?;
    let dst =
        crate::sandbox::beneath::open_root(copy).map_err(|e| io("opening", copy)(e.into()))?;
    let mut c = Copier {
        made: Made::default(),
        bound,
        snapshot: Vec::new(),
        copy,
        root: nix::unistd::geteuid().is_root(),
    };
    c.dir(&src, &dst, Path::new(""))?;
    let snap = layer.join(SNAPSHOT);
    std::fs::write(&snap, &c.snapshot).map_err(io("writing", &snap))?;
    c.made.since_ns = mark(copy)?;
    Ok(c.made)
}

/// Sets the `since` mark beside the copy (on its file system, whose clock
/// granularity it shares, in a directory the agent cannot write): first
/// written after every copied entry, so at or after each one's ctime, then
/// changed again until its ctime is later still. Every copied entry is
/// then before it, and every later change at or after it.
fn mark(copy: &Path) -> Result<i128, CopyError> {
    let mark = mark_path(copy);
    std::fs::write(&mark, b"").map_err(io("writing", &mark))?;
    let first = since_of(copy).map_err(io("reading", &mark))?;
    // Up to 2 s: a file system that keeps whole seconds.
    for _ in 0..200 {
        std::thread::sleep(std::time::Duration::from_millis(10));
        let f = std::fs::File::open(&mark).map_err(io("opening", &mark))?;
        nix::sys::stat::fchmod(&f, Mode::from_bits_truncate(0o600))
            .map_err(|e| io("changing", &mark)(e.into()))?;
        let now = since_of(copy).map_err(io("reading", &mark))?;
        if now > first {
            return Ok(now);
        }
    }
    let e = std::io::Error::other("its ctime did not move in 2 s");
    Err(io("setting the mark", &mark)(e))
}

fn mark_path(copy: &Path) -> PathBuf {
    beside(copy, SINCE)
}

fn beside(copy: &Path, name: &str) -> PathBuf {
    copy.parent().unwrap_or(Path::new("/")).join(name)
}

/// The `since` mark of the copy at `copy`.
pub(crate) fn since_of(copy: &Path) -> std::io::Result<i128> {
    let m = nix::sys::stat::stat(&mark_path(copy))?;
    Ok(ctime(&m))
}

/// Sets the `ended` mark of the copy at `copy` unless it is set: called
/// once its instance is known to have ended (its end, or a door that
/// found the layer's lock free).
pub(crate) fn mark_ended(copy: &Path) -> std::io::Result<()> {
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(beside(copy, ENDED));
    match made {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        r => r.map(drop),
    }
}

/// The `ended` mark of the copy at `copy`, once set.
fn ended_of(copy: &Path) -> Option<i128> {
    let m = nix::sys::stat::stat(&beside(copy, ENDED)).ok()?;
    Some(ctime(&m))
}

fn ctime(s: &FileStat) -> i128 {
    s.st_ctime as i128 * 1_000_000_000 + s.st_ctime_nsec as i128
}

struct Copier<'a> {
    made: Made,
    bound: (u64, u64),
    /// Records: inode (8 bytes LE), path length (4), path.
    snapshot: Vec<u8>,
    copy: &'a Path,
    /// Running as root: owners are kept.
    root: bool,
}

impl Copier<'_> {
    /// Copies the directory `src` (at `rel`) into `dst`, which exists.
    fn dir(&mut self, src: &OwnedFd, dst: &OwnedFd, rel: &Path) -> Result<(), CopyError> {
        let mut names: Vec<OsString> = Vec::new();
        let listed = openat(
            src,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .and_then(Dir::from_fd);
        let mut d = listed.map_err(|e| io("listing", &self.copy.join(rel))(e.into()))?;
        for e in d.iter().flatten() {
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                names.push(OsStr::from_bytes(n).to_os_string());
            }
        }
        names.sort();
        for name in names {
            let child = rel.join(&name);
            let Ok(st) = fstatat(src, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                self.made.left_out += 1;
                continue;
            };
            self.count()?;
            let at = self.copy.join(&child);
            // Owner, mode and times from the entry as opened, never from
            // the `stat` before it (which a rename could have changed).
            let made = match st.st_mode & libc::S_IFMT {
                libc::S_IFDIR => self.subdir(src, dst, (&name, &child))?,
                libc::S_IFREG => self.file(src, dst, &name, &at)?,
                libc::S_IFLNK => self.link(src, dst, &name, &st),
                _ => None,
            };
            match made {
                Some((ino, used)) => {
                    self.own(dst, &name, &used)
                        .map_err(io("setting the owner of", &at))?;
                    self.record(ino, &child)
                }
                None => self.made.left_out += 1,
            }
        }
        Ok(())
    }

    /// Counts one entry against the bound (a file's bytes: [`Copier::file`]).
    fn count(&mut self) -> Result<(), CopyError> {
        self.made.entries += 1;
        self.bytes(0)
    }

    /// Counts `n` bytes (and the entries so far) against the bound.
    fn bytes(&mut self, n: u64) -> Result<(), CopyError> {
        self.made.bytes += n;
        if self.made.bytes > self.bound.0 {
            return Err(CopyError::TooLarge {
                bound: self.bound.0,
                unit: "bytes",
                key: "layer_bytes",
            });
        }
        if self.made.entries > self.bound.1 {
            return Err(CopyError::TooLarge {
                bound: self.bound.1,
                unit: "entries",
                key: "layer_files",
            });
        }
        Ok(())
    }

    /// As root, the entry keeps its owner, as the workspace's does.
    fn own(&self, dst: &OwnedFd, name: &OsStr, st: &FileStat) -> std::io::Result<()> {
        if !self.root {
            return Ok(());
        }
        nix::unistd::fchownat(
            dst,
            name,
            Some(st.st_uid.into()),
            Some(st.st_gid.into()),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
        Ok(())
    }

    fn record(&mut self, ino: u64, rel: &Path) {
        let b = rel.as_os_str().as_bytes();
        self.snapshot.extend_from_slice(&ino.to_le_bytes());
        self.snapshot
            .extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.snapshot.extend_from_slice(b);
    }

    /// A directory: made 0700 while it is filled, then given its mode.
    fn subdir(
        &mut self,
        src: &OwnedFd,
        dst: &OwnedFd,
        (name, rel): (&OsStr, &Path),
    ) -> Result<Option<(u64, FileStat)>, CopyError> {
        let at = self.copy.join(rel);
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let Ok(s) = openat(src, name, flags, Mode::empty()) else {
            return Ok(None); // unreadable: left out
        };
        let Ok(st) = fstat(&s) else {
            return Ok(None);
        };
        nix::sys::stat::mkdirat(dst, name, Mode::from_bits_truncate(0o700))
            .map_err(|e| io("creating", &at)(e.into()))?;
        let d =
            openat(dst, name, flags, Mode::empty()).map_err(|e| io("opening", &at)(e.into()))?;
        self.dir(&s, &d, rel)?;
        let mode = Mode::from_bits_truncate(st.st_mode & 0o1777);
        nix::sys::stat::fchmod(&d, mode).map_err(|e| io("setting the mode of", &at)(e.into()))?;
        let ino = fstat(&d).map_err(|e| io("reading", &at)(e.into()))?.st_ino;
        Ok(Some((ino, st)))
    }

    /// A regular file: a reflink where the file system makes one, else a
    /// copy (of at most the size it had when opened); its mode without
    /// set-ID bits, its times.
    fn file(
        &mut self,
        src: &OwnedFd,
        dst: &OwnedFd,
        name: &OsStr,
        at: &Path,
    ) -> Result<Option<(u64, FileStat)>, CopyError> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let Ok(fd) = openat(src, name, flags, Mode::empty()) else {
            return Ok(None); // unreadable: left out
        };
        let st = fstat(&fd).map_err(|e| io("reading", at)(e.into()))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(None); // swapped meanwhile
        }
        self.bytes(st.st_size as u64)?;
        let from = std::fs::File::from(fd);
        Self::write(&from, dst, name, &st)
            .map(|ino| Some((ino, st)))
            .map_err(io("copying", at))
    }

    /// Writes `from` (whose status is `st`) as `name` in `dst`; its inode.
    fn write(
        from: &std::fs::File,
        dst: &OwnedFd,
        name: &OsStr,
        st: &FileStat,
    ) -> std::io::Result<u64> {
        let out = openat(
            dst,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        let mut to = std::fs::File::from(out);
        if !reflink(from, &to) {
            let mut r = from.try_clone()?.take(st.st_size as u64);
            std::io::copy(&mut r, &mut to)?;
        }
        to.flush()?;
        let perms = std::os::unix::fs::PermissionsExt::from_mode(st.st_mode & 0o777);
        to.set_permissions(perms)?;
        let times = [
            nix::sys::time::TimeSpec::new(st.st_atime, st.st_atime_nsec),
            nix::sys::time::TimeSpec::new(st.st_mtime, st.st_mtime_nsec),
        ];
        nix::sys::stat::futimens(&to, &times[0], &times[1])?;
        Ok(fstat(&to)?.st_ino)
    }

    /// A symbolic link: made again, never followed (one that is no longer
    /// a link when read is left out).
    fn link(
        &mut self,
        src: &OwnedFd,
        dst: &OwnedFd,
        name: &OsStr,
        st: &FileStat,
    ) -> Option<(u64, FileStat)> {
        let target = nix::fcntl::readlinkat(src, name).ok()?;
        nix::unistd::symlinkat(target.as_os_str(), dst, name).ok()?;
        let ino = fstatat(dst, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .ok()?
            .st_ino;
        Some((ino, *st))
    }
}

/// Clones `from` into `to` (`FICLONE`); false where the file system cannot.
fn reflink(from: &std::fs::File, to: &std::fs::File) -> bool {
    // SAFETY: FICLONE takes the source descriptor as its argument; both
    // descriptors are open for the call's length.
    unsafe { libc::ioctl(to.as_raw_fd(), libc::FICLONE, from.as_raw_fd()) == 0 }
}

/// The snapshot: what the copy held when it was made, by directory.
pub(crate) struct Snapshot {
    /// The `since` mark.
    pub(crate) since_ns: i128,
    /// The `ended` mark, once set.
    ended_ns: Option<i128>,
    /// Each directory's entries (relative paths, "" the top), with their
    /// inodes in the copy.
    by_dir: HashMap<PathBuf, HashMap<OsString, u64>>,
}

/// A copy's entry changed after the instance ended.
#[derive(Debug, thiserror::Error)]
#[error("{} changed after the instance ended (a process that outlived it, or the system's clean-up of old files): nothing is read from this copy; `sandmux discard` it", shown(rel))]
pub(crate) struct ChangedAfterEnd {
    rel: PathBuf,
}

/// The agent's name: never raw on a terminal.
fn shown(rel: &Path) -> String {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    crate::term::printable(&rel.to_string_lossy())
}

impl Snapshot {
    /// Reads the snapshot of the layer at `layer`, whose copy is `copy`.
    pub(crate) fn load(layer: &Path, copy: &Path) -> std::io::Result<Snapshot> {
        let mut b = Vec::new();
        std::fs::File::open(layer.join(SNAPSHOT))?.read_to_end(&mut b)?;
        let bad = || std::io::Error::other("the copy's snapshot is not sandmux's");
        let mut by_dir: HashMap<PathBuf, HashMap<OsString, u64>> = HashMap::new();
        let mut at = 0usize;
        while at < b.len() {
            let ino = b.get(at..at + 8).ok_or_else(bad)?;
            let len = b.get(at + 8..at + 12).ok_or_else(bad)?;
            let len = u32::from_le_bytes(len.try_into().map_err(|_| bad())?) as usize;
            let path = b.get(at + 12..at + 12 + len).ok_or_else(bad)?;
            let rel = Path::new(OsStr::from_bytes(path));
            let (parent, name) = (rel.parent().unwrap_or(Path::new("")), rel.file_name());
            let ino = u64::from_le_bytes(ino.try_into().map_err(|_| bad())?);
            by_dir
                .entry(parent.to_path_buf())
                .or_default()
                .insert(name.ok_or_else(bad)?.to_os_string(), ino);
            at += 12 + len;
        }
        Ok(Snapshot {
            since_ns: since_of(copy)?,
            ended_ns: ended_of(copy),
            by_dir,
        })
    }

    /// Refuses an entry (`rel`, as `st` says it is now) changed after
    /// the instance ended: not the agent's, and not reviewable.
    pub(crate) fn check_end(&self, rel: &Path, st: &FileStat) -> Result<(), ChangedAfterEnd> {
        match self.ended_ns {
            Some(end) if ctime(st) > end => Err(ChangedAfterEnd {
                rel: rel.to_path_buf(),
            }),
            _ => Ok(()),
        }
    }

    /// Whether the entry `name` of directory `dir`, as `st` says it is
    /// now, is the one copied and untouched since.
    pub(crate) fn untouched(&self, dir: &Path, name: &OsStr, st: &FileStat) -> bool {
        ctime(st) < self.since_ns
            && self
                .by_dir
                .get(dir)
                .and_then(|d| d.get(name))
                .is_some_and(|ino| *ino == st.st_ino)
    }

    /// The entries the snapshot has in directory `dir` that `now` lacks.
    pub(crate) fn gone<'a>(
        &'a self,
        dir: &'a Path,
        now: &'a std::collections::HashSet<OsString>,
    ) -> impl Iterator<Item = PathBuf> + 'a {
        self.by_dir
            .get(dir)
            .into_iter()
            .flat_map(|d| d.keys())
            .filter(|n| !now.contains(*n))
            .map(|n| dir.join(n))
    }
}

/// Whether the copy in the layer at `layer` holds no change of the
/// agent's (the instance's end removes such a layer); unreadable: false.
pub(crate) fn untouched_all(layer: &Path) -> bool {
    let copy = super::layer::writes(layer);
    let Ok(snap) = Snapshot::load(layer, &copy) else {
        return false;
    };
    let Ok(root) = crate::sandbox::beneath::open_root(&copy) else {
        return false;
    };
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
        let Ok(mut d) = beneath(&root, &rel, flags).and_then(Dir::from_fd) else {
            return false;
        };
        let fd = d.as_fd().try_clone_to_owned();
        let Ok(fd) = fd else { return false };
        let mut now = std::collections::HashSet::new();
        for e in d.iter().flatten() {
            let n = OsStr::from_bytes(e.file_name().to_bytes());
            if n == "." || n == ".." {
                continue;
            }
            let Ok(st) = fstatat(&fd, n, AtFlags::AT_SYMLINK_NOFOLLOW) else {
                return false;
            };
            if !snap.untouched(&rel, n, &st) {
                return false;
            }
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                stack.push(rel.join(n));
            }
            now.insert(n.to_os_string());
        }
        if snap.gone(&rel, &now).next().is_some() {
            return false;
        }
    }
    true
}
