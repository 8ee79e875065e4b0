//! What a copy-on-write instance changed: its layer's `upper/` read against
//! the workspace, both opened beneath their roots without following any
//! link. Overlayfs keeps a removed entry as a whiteout (a `c 0 0` node) and
//! a directory that replaced the workspace's as an opaque one
//! (`user.overlay.opaque`); everything else in `upper/` is new or changed.
//! A copy workspace's `copy/` is read the same way, its snapshot
//! (`supervisor::copy`) telling what is the agent's: an entry touched
//! since the copy was made is read as `upper/`'s, one the snapshot has
//! and the copy lacks as a whiteout.

use super::error::DiffError;
use crate::sandbox::beneath::{beneath, open_root};
use nix::dir::{Dir, Type};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstatat, FileStat};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Files larger than this are compared and listed, not shown as text.
const SHOW_BYTES: u64 = 1 << 20;
/// The time one file's text diff may take.
const DIFF_TIME: std::time::Duration = std::time::Duration::from_secs(1);

/// One change, by path relative to the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// New: a file, a directory, a link or a special file (`what` says).
    Added { rel: PathBuf, what: &'static str },
    /// A file whose content or mode changed.
    Modified {
        rel: PathBuf,
        mode: Option<(u32, u32)>,
    },
    /// Removed (a whiteout), or replaced by a new directory (opaque).
    Removed { rel: PathBuf },
    /// A part of the layer that could not be read (a path longer than the
    /// kernel resolves, an entry gone meanwhile): never applied.
    Unreadable { rel: PathBuf, why: String },
}

impl Change {
    /// The path it is about.
    pub(crate) fn rel(&self) -> &Path {
        match self {
            Change::Added { rel, .. }
            | Change::Modified { rel, .. }
            | Change::Removed { rel }
            | Change::Unreadable { rel, .. } => rel,
        }
    }
}

/// The layer and the workspace, opened.
pub(crate) struct Trees {
    /// The layer's `upper/`.
    pub(crate) upper: OwnedFd,
    /// The workspace on the host.
    pub(crate) lower: OwnedFd,
    /// What the walk saw of each changed entry of the layer (one `stat` a
    /// path, not one a question).
    seen: std::cell::RefCell<std::collections::HashMap<PathBuf, FileStat>>,
    /// The same for the workspace's entry at each changed path.
    seen_lower: std::cell::RefCell<std::collections::HashMap<PathBuf, FileStat>>,
    /// A copy workspace's snapshot (None: an overlay's layer).
    snapshot: Option<crate::supervisor::copy::Snapshot>,
}

impl Trees {
    /// Opens the layer at `dir` and the workspace it overlays (a copy
    /// workspace's layer: its copy, and its snapshot).
    pub(crate) fn open(dir: &Path, workspace: &Path) -> Result<Trees, DiffError> {
        let open = |p: &Path| {
            open_root(p).map_err(|source| DiffError::Open {
                path: p.to_path_buf(),
                source,
            })
        };
        let top = crate::supervisor::layer::writes(dir);
        let snapshot = crate::supervisor::layer::is_copy(dir)
            .then(|| crate::supervisor::copy::Snapshot::load(dir, &top))
            .transpose()
            .map_err(|source| DiffError::Snapshot {
                dir: dir.to_path_buf(),
                source,
            })?;
        let upper = open(&top)?;
        if let Some(s) = &snapshot {
            let st = nix::sys::stat::fstat(&upper).map_err(DiffError::Stat)?;
            s.check_end(Path::new(""), &st).map_err(DiffError::Ended)?;
        }
        Ok(Trees {
            upper,
            lower: open(workspace)?,
            seen: Default::default(),
            seen_lower: Default::default(),
            snapshot,
        })
    }

    /// A copy's file as opened for an apply, refused when it changed after
    /// the instance ended (before or while it is copied).
    pub(crate) fn check_end(&self, rel: &Path, f: &std::fs::File) -> Result<(), DiffError> {
        match &self.snapshot {
            Some(s) => {
                let st = nix::sys::stat::fstat(f).map_err(DiffError::Stat)?;
                s.check_end(rel, &st).map_err(DiffError::Ended)
            }
            None => Ok(()),
        }
    }

    /// Whether this is a copy workspace's layer (whose entries are not all
    /// the agent's, and whose files must never be moved out).
    pub(crate) fn is_copy(&self) -> bool {
        self.snapshot.is_some()
    }

    /// Whether the layer's entry at `rel` is a copy workspace's, copied and
    /// untouched since: not the agent's (an overlay's: never).
    pub(crate) fn untouched(&self, rel: &Path) -> bool {
        let (Some(s), Some(name)) = (&self.snapshot, rel.file_name()) else {
            return false;
        };
        let parent = rel.parent().unwrap_or(Path::new(""));
        stat_at(&self.upper, rel).is_some_and(|st| s.untouched(parent, name, &st))
    }

    /// The workspace's entry at `rel` as the walk saw it, else as it is now.
    pub(crate) fn lower_stat(&self, rel: &Path) -> Option<FileStat> {
        if let Some(s) = self.seen_lower.borrow().get(rel) {
            return Some(*s);
        }
        stat_at(&self.lower, rel)
    }

    /// The layer's entry at `rel` as the walk saw it, else as it is now.
    pub(crate) fn upper_stat(&self, rel: &Path) -> Option<FileStat> {
        if let Some(s) = self.seen.borrow().get(rel) {
            return Some(*s);
        }
        stat_at(&self.upper, rel)
    }

    /// Whether `rel` exists in either tree (the layer's whiteouts aside:
    /// over-reporting is the safe side for [`Trees::bare_shape`]).
    fn exists(&self, rel: &Path) -> bool {
        stat_at(&self.upper, rel).is_some() || stat_at(&self.lower, rel).is_some()
    }

    /// Whether git could take the directory `rel` for a repository: it
    /// has `HEAD` and any of `objects`, `refs`, `commondir` (the rest in
    /// another directory) or `gitdir`, in either tree.
    pub(crate) fn bare_shape(&self, rel: &Path) -> bool {
        self.exists(&rel.join("HEAD"))
            && ["objects", "refs", "commondir", "gitdir"]
                .iter()
                .any(|n| self.exists(&rel.join(n)))
    }
}

/// Every change of the layer at `dir` over `workspace`, in path order.
pub(crate) fn changes(t: &Trees) -> Result<Vec<Change>, DiffError> {
    let mut out = Vec::new();
    t.walk(Path::new(""), true, &mut out)?;
    out.sort_by(|a, b| a.rel().cmp(b.rel()));
    Ok(out)
}

/// `rel`'s status beneath `dir`, its last component not followed.
pub(crate) fn stat_at(dir: &OwnedFd, rel: &Path) -> Option<FileStat> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let parent = rel.parent().unwrap_or(Path::new(""));
    let d = beneath(dir, parent, OFlag::O_PATH | OFlag::O_DIRECTORY).ok()?;
    fstatat(&d, rel.file_name()?, AtFlags::AT_SYMLINK_NOFOLLOW).ok()
}

fn kind(mode: u32) -> u32 {
    mode & libc::S_IFMT
}

impl Trees {
    /// The changes below `rel`; `lower_there`: the workspace has a
    /// directory at `rel` (else everything below is new).
    fn walk(&self, rel: &Path, lower_there: bool, out: &mut Vec<Change>) -> Result<(), DiffError> {
        let opened =
            beneath(&self.upper, rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY).and_then(Dir::from_fd);
        let mut d = match opened {
            Ok(d) => d,
            Err(e) => {
                out.push(Change::Unreadable {
                    rel: rel.to_path_buf(),
                    why: e.to_string(),
                });
                return Ok(());
            }
        };
        let mut names: Vec<(PathBuf, Option<Type>)> = Vec::new();
        for e in d.iter().flatten() {
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                names.push((rel.join(std::ffi::OsStr::from_bytes(n)), e.file_type()));
            }
        }
        // Each entry is asked about beside its directory's descriptors (the
        // workspace's opened once a directory too), not by a path walked
        // again from the roots.
        let low_dir = lower_there
            .then(|| beneath(&self.lower, rel, OFlag::O_PATH | OFlag::O_DIRECTORY).ok())
            .flatten();
        let low_at = |name: &std::ffi::OsStr| {
            low_dir
                .as_ref()
                .and_then(|l| fstatat(l, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok())
        };
        let mut now = std::collections::HashSet::new();
        for (child, _) in names {
            let Some(name) = child.file_name() else {
                continue;
            };
            let up = fstatat(&d, name, AtFlags::AT_SYMLINK_NOFOLLOW);
            if let Some(s) = &self.snapshot {
                // Listed is there: one that cannot be asked about (the
                // agent took the directory's search right) is unreadable,
                // never read as removed.
                now.insert(name.to_os_string());
                let u = match up {
                    Ok(u) => u,
                    Err(e) => {
                        out.push(Change::Unreadable {
                            rel: child.clone(),
                            why: e.to_string(),
                        });
                        continue;
                    }
                };
                s.check_end(&child, &u).map_err(DiffError::Ended)?;
                if s.untouched(rel, name, &u) {
                    // The copy's own: only what is below it can be the agent's.
                    if kind(u.st_mode) == libc::S_IFDIR {
                        let low = low_at(name).is_some_and(|l| kind(l.st_mode) == libc::S_IFDIR);
                        self.walk(&child, low, out)?;
                    }
                    continue;
                }
            }
            self.entry(&child, (up.ok(), low_at(name)), out)?;
        }
        if let Some(s) = &self.snapshot {
            // What the copy had here and the agent removed.
            for gone in s.gone(rel, &now) {
                if let Some(l) = gone.file_name().and_then(low_at) {
                    self.seen_lower.borrow_mut().insert(gone.clone(), l);
                    out.push(Change::Removed { rel: gone });
                }
            }
        }
        Ok(())
    }

    fn entry(
        &self,
        rel: &Path,
        (up, low): (Option<FileStat>, Option<FileStat>),
        out: &mut Vec<Change>,
    ) -> Result<(), DiffError> {
        let Some(up) = up else {
            return Ok(()); // gone while we looked
        };
        self.seen.borrow_mut().insert(rel.to_path_buf(), up);
        if let Some(l) = low {
            self.seen_lower.borrow_mut().insert(rel.to_path_buf(), l);
        }
        let rel_buf = rel.to_path_buf();
        match kind(up.st_mode) {
            libc::S_IFCHR if up.st_rdev == 0 && self.snapshot.is_none() => {
                if low.is_some() {
                    out.push(Change::Removed { rel: rel_buf });
                }
            }
            libc::S_IFDIR => {
                let low_dir = low.is_some_and(|l| kind(l.st_mode) == libc::S_IFDIR);
                let opaque = self.opaque(rel);
                if low.is_some() && (!low_dir || opaque) {
                    out.push(Change::Removed {
                        rel: rel_buf.clone(),
                    });
                }
                if !low_dir || opaque {
                    out.push(Change::Added {
                        rel: rel_buf,
                        what: "directory",
                    });
                }
                self.walk(rel, low_dir && !opaque, out)?;
            }
            libc::S_IFREG => match low {
                Some(l) if kind(l.st_mode) == libc::S_IFREG => {
                    let mode = (l.st_mode & 0o7777 != up.st_mode & 0o7777)
                        .then_some((l.st_mode & 0o7777, up.st_mode & 0o7777));
                    // Sizes that differ are different bytes: nothing to read.
                    let size = l.st_size != up.st_size;
                    if mode.is_some() || size || !self.same_content(rel) {
                        out.push(Change::Modified { rel: rel_buf, mode });
                    }
                }
                Some(_) => {
                    out.push(Change::Removed {
                        rel: rel_buf.clone(),
                    });
                    out.push(Change::Added {
                        rel: rel_buf,
                        what: "file",
                    });
                }
                None => out.push(Change::Added {
                    rel: rel_buf,
                    what: "file",
                }),
            },
            k => {
                if low.is_some() {
                    out.push(Change::Removed {
                        rel: rel_buf.clone(),
                    });
                }
                let what = if k == libc::S_IFLNK {
                    "symbolic link"
                } else {
                    "special file"
                };
                out.push(Change::Added { rel: rel_buf, what });
            }
        }
        Ok(())
    }

    /// Whether the layer's directory at `rel` hides the workspace's (a
    /// copy's never does: what it lacks, the snapshot says).
    fn opaque(&self, rel: &Path) -> bool {
        if self.snapshot.is_some() {
            return false;
        }
        let Ok(fd) = beneath(&self.upper, rel, OFlag::O_PATH | OFlag::O_DIRECTORY) else {
            return false;
        };
        let proc = format!("/proc/self/fd/{}\0", fd.as_raw_fd());
        let mut v = [0u8; 4];
        // SAFETY: getxattr with a NUL-terminated path and name, and a
        // buffer of the length given.
        let n = unsafe {
            libc::getxattr(
                proc.as_ptr().cast(),
                c"user.overlay.opaque".as_ptr(),
                v.as_mut_ptr().cast(),
                v.len(),
            )
        };
        n == 1 && v[0] == b'y'
    }

    /// Whether the file at `rel` has the same bytes in both trees
    /// (compared a block at a time: the agent chooses the sizes).
    pub(crate) fn same_content(&self, rel: &Path) -> bool {
        use std::io::Read;
        let open = |dir: &OwnedFd| {
            beneath(
                dir,
                rel,
                OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
            )
            .ok()
            .map(std::fs::File::from)
            .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
        };
        let (Some(mut a), Some(mut b)) = (open(&self.lower), open(&self.upper)) else {
            return false;
        };
        let size = |f: &std::fs::File| f.metadata().map(|m| m.len()).ok();
        if size(&a) != size(&b) {
            return false;
        }
        let (mut x, mut y) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
        loop {
            let n = match a.read(&mut x) {
                Ok(n) => n,
                Err(_) => return false,
            };
            if b.read_exact(&mut y[..n]).is_err() || x[..n] != y[..n] {
                return false;
            }
            if n == 0 {
                return true;
            }
        }
    }

    /// The workspace's file at `rel` (at most `cap` bytes; None past it).
    pub(crate) fn lower_bytes(&self, rel: &Path, cap: u64) -> Option<Vec<u8>> {
        read(&self.lower, rel, cap)
    }

    /// The layer's file at `rel` (at most `cap` bytes; None past it).
    pub(crate) fn upper_bytes(&self, rel: &Path, cap: u64) -> Option<Vec<u8>> {
        read(&self.upper, rel, cap)
    }

    /// The agent's file at `rel`: the layer's, unless it is a copy's
    /// untouched since it was made (then the workspace's is the one).
    pub(crate) fn agents_bytes(&self, rel: &Path, cap: u64) -> Option<Vec<u8>> {
        (!self.untouched(rel))
            .then(|| self.upper_bytes(rel, cap))
            .flatten()
    }
}

/// A regular file's bytes, opened beneath `dir` without following links;
/// None when it is not a regular file or longer than `cap`.
pub(crate) fn read(dir: &OwnedFd, rel: &Path, cap: u64) -> Option<Vec<u8>> {
    let fd = beneath(
        dir,
        rel,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
    )
    .ok()?;
    let f = std::fs::File::from(fd);
    let m = f.metadata().ok()?;
    if !m.is_file() || m.len() > cap {
        return None;
    }
    let mut b = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(f, cap), &mut b).ok()?;
    Some(b)
}

/// The unified diff of every change that has text (`patch -p1` in the
/// workspace applies it); binary or large files get one line saying so.
pub(crate) fn unified(t: &Trees, changes: &[&Change]) -> String {
    let mut out = String::new();
    for c in changes.iter().copied() {
        let (old, new) = match c {
            Change::Modified { rel, .. } => (
                t.lower_bytes(rel, SHOW_BYTES),
                t.upper_bytes(rel, SHOW_BYTES),
            ),
            Change::Added { rel, what: "file" } => (Some(vec![]), t.upper_bytes(rel, SHOW_BYTES)),
            Change::Removed { rel }
                if stat_at(&t.lower, rel).is_some_and(|s| kind(s.st_mode) == libc::S_IFREG) =>
            {
                (t.lower_bytes(rel, SHOW_BYTES), Some(vec![]))
            }
            _ => continue,
        };
        let rel = c.rel().display().to_string();
        // Text is UTF-8 without NUL or a carriage return outside CRLF (the
        // diff would split lines where `patch` does not).
        let text = |b: &Option<Vec<u8>>| {
            b.as_ref().and_then(|b| {
                let lone_cr = b
                    .iter()
                    .enumerate()
                    .any(|(i, c)| *c == b'\r' && b.get(i + 1) != Some(&b'\n'));
                (!b.contains(&0) && !lone_cr)
                    .then(|| String::from_utf8(b.clone()).ok())
                    .flatten()
            })
        };
        let (a, b) = match (text(&old), text(&new)) {
            (Some(a), Some(b)) => (a, b),
            _ => {
                out.push_str(&format!(
                    "Binary or large files a/{rel} and b/{rel} differ\n"
                ));
                continue;
            }
        };
        if a == b {
            continue;
        }
        let old_name = match c {
            Change::Added { .. } => "/dev/null".to_string(),
            _ => format!("a/{rel}"),
        };
        let new_name = match c {
            Change::Removed { .. } => "/dev/null".to_string(),
            _ => format!("b/{rel}"),
        };
        // Bounded in time: past the deadline the rest is one hunk of
        // removed and added lines (still exact, only less minimal), and
        // the summary says so.
        let started = std::time::Instant::now();
        // Patience anchors on lines that occur once: a lockfile rewritten
        // whole costs it little, where Myers is quadratic in the changes.
        let d = similar::TextDiff::configure()
            .algorithm(similar::Algorithm::Patience)
            .timeout(DIFF_TIME)
            .diff_lines(&a, &b);
        if started.elapsed() >= DIFF_TIME {
            out.push_str(&format!(
                "# {rel}: too large to diff line by line within {} s: its changes from there on are one hunk\n",
                DIFF_TIME.as_secs()
            ));
        }
        out.push_str(
            &d.unified_diff()
                .context_radius(3)
                .header(&old_name, &new_name)
                .to_string(),
        );
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}
