//! Snapshot and restore: the guard where the kernel cannot make control files
//! read-only. A profile that lets the mount layer be missing (`container`)
//! can end up with a writable `.git/config` or `.envrc`; for those, the
//! supervisor keeps a copy of each guarded file at start (bounded), watches
//! their directories, and when one changes, moves the agent's version into the
//! quarantine and writes the original back. New entries in closed directories
//! (`.git/hooks`, `.git/info`, a guarded directory such as `.vscode`, and
//! anything but git's data at the top of a git directory) are taken.
//! Where the mount layer holds, nothing changes and this stays idle.

use super::quarantine::{Quarantine, Taken};
use crate::sandbox::beneath::beneath;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Bytes kept per file and in all.
const MAX_FILE: u64 = 256 << 10;
const MAX_TOTAL: usize = 4 << 20;
/// Files kept in all.
const MAX_FILES: usize = 2048;

/// Control files of a git directory, relative to it.
const GIT_FILES: &[&str] = &[
    "config",
    "config.worktree",
    "commondir",
    "gitdir",
    "objects/info/alternates",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    /// No entry may appear that was not there.
    Any,
    /// Only git's data names may appear (the top of a git directory).
    GitTop,
}

struct Saved {
    rel: PathBuf,
    bytes: Vec<u8>,
    mode: u32,
}

/// The copies of one tree's guarded files.
pub(crate) struct Snapshot {
    root: PathBuf,
    fd: OwnedFd,
    files: Vec<Saved>,
    closed: Vec<(PathBuf, Closed, BTreeSet<std::ffi::OsString>)>,
    total: usize,
}

fn read_file(dir: &OwnedFd, rel: &Path) -> Option<(Vec<u8>, u32)> {
    let f = beneath(
        dir,
        rel,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
    )
    .ok()?;
    let st = nix::sys::stat::fstat(&f).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size as u64 > MAX_FILE {
        return None;
    }
    let mut b = Vec::new();
    std::fs::File::from(f)
        .take(MAX_FILE + 1)
        .read_to_end(&mut b)
        .ok()?;
    Some((b, st.st_mode & 0o7777))
}

fn names_in(dir: &OwnedFd, rel: &Path) -> Option<BTreeSet<std::ffi::OsString>> {
    let fd = beneath(dir, rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY).ok()?;
    let mut d = nix::dir::Dir::from_fd(fd).ok()?;
    Some(
        d.iter()
            .flatten()
            .map(|e| e.file_name().to_bytes().to_vec())
            .filter(|n| n != b"." && n != b"..")
            .map(std::os::unix::ffi::OsStringExt::from_vec)
            .collect(),
    )
}

impl Snapshot {
    /// Copies the guarded files of the tree at `root`: `protected` are the
    /// absolute paths the mount layer would make read-only, `repos` the git
    /// directories among them (relative).
    pub(crate) fn take(
        root: &Path,
        protected: &[PathBuf],
        repos: &BTreeSet<PathBuf>,
    ) -> Option<Snapshot> {
        let fd = crate::sandbox::beneath::open_root(root).ok()?;
        let mut s = Snapshot {
            root: root.to_path_buf(),
            fd,
            files: Vec::new(),
            closed: Vec::new(),
            total: 0,
        };
        for p in protected {
            let Ok(rel) = p.strip_prefix(root) else {
                continue;
            };
            let is_dir = beneath(&s.fd, rel, OFlag::O_PATH | OFlag::O_DIRECTORY).is_ok();
            if repos.contains(rel) && is_dir {
                for f in GIT_FILES {
                    s.save(&rel.join(f));
                }
                s.close(rel, Closed::GitTop);
                for d in ["hooks", "info"] {
                    s.save_dir(&rel.join(d), 0);
                }
            } else if is_dir {
                s.save_dir(rel, 0);
            } else {
                s.save(rel);
            }
        }
        Some(s)
    }

    fn save(&mut self, rel: &Path) {
        if self.files.len() >= MAX_FILES || self.total >= MAX_TOTAL {
            return;
        }
        if let Some((bytes, mode)) = read_file(&self.fd, rel) {
            self.total += bytes.len();
            self.files.push(Saved {
                rel: rel.to_path_buf(),
                bytes,
                mode,
            });
        }
    }

    fn close(&mut self, rel: &Path, how: Closed) {
        if let Some(names) = names_in(&self.fd, rel) {
            self.closed.push((rel.to_path_buf(), how, names));
        }
    }

    fn save_dir(&mut self, rel: &Path, depth: usize) {
        let Some(names) = names_in(&self.fd, rel) else {
            return;
        };
        self.closed
            .push((rel.to_path_buf(), Closed::Any, names.clone()));
        for n in names {
            let child = rel.join(&n);
            if depth < 3 && beneath(&self.fd, &child, OFlag::O_PATH | OFlag::O_DIRECTORY).is_ok() {
                self.save_dir(&child, depth + 1);
            } else {
                self.save(&child);
            }
        }
    }

    /// The tree's root, opened.
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The directories to watch (relative to the tree).
    pub(crate) fn dirs(&self) -> BTreeSet<PathBuf> {
        let mut d: BTreeSet<PathBuf> = self.closed.iter().map(|c| c.0.clone()).collect();
        for f in &self.files {
            d.insert(f.rel.parent().unwrap_or(Path::new("")).to_path_buf());
        }
        d
    }

    /// Restores what changed in `dir` (or everywhere), taking the agent's
    /// version into the quarantine first.
    pub(crate) fn check(&self, dir: Option<&Path>, q: &mut Quarantine) -> Vec<Taken> {
        let mut out = Vec::new();
        let here = |p: &Path| dir.is_none_or(|d| p.parent().unwrap_or(Path::new("")) == d);
        for f in self.files.iter().filter(|f| here(&f.rel)) {
            if read_file(&self.fd, &f.rel).is_some_and(|(b, m)| b == f.bytes && m == f.mode) {
                continue;
            }
            let mut t = q
                .take(&self.fd, &self.root, &f.rel, "a guarded file changed")
                .unwrap_or(Taken {
                    path: self.root.join(&f.rel),
                    kept: None,
                    how: super::quarantine::How::Removed,
                    restored: false,
                    why: "a guarded file was removed".into(),
                    took_ms: 0.0,
                });
            if self.write_back(f) {
                t.restored = true;
            } else {
                t.how = super::quarantine::How::Failed;
            }
            out.push(t);
        }
        for (d, how, before) in self.closed.iter().filter(|c| dir.is_none_or(|x| x == c.0)) {
            let Some(now) = names_in(&self.fd, d) else {
                continue;
            };
            for n in now.difference(before) {
                let data =
                    *how == Closed::GitTop && super::commit::is_git_data(&n.to_string_lossy());
                if !data {
                    if let Some(t) = q.take(
                        &self.fd,
                        &self.root,
                        &d.join(n),
                        "a new entry in a guarded directory",
                    ) {
                        out.push(t);
                    }
                }
            }
        }
        out
    }

    fn write_back(&self, f: &Saved) -> bool {
        let Ok(parent) = beneath(
            &self.fd,
            f.rel.parent().unwrap_or(Path::new("")),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        ) else {
            return false;
        };
        let Some(name) = f.rel.file_name() else {
            return false;
        };
        let Ok(o) = openat(
            &parent,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(f.mode),
        ) else {
            return false;
        };
        // The exact mode, whatever the umask: a differing mode reads as a change.
        if nix::sys::stat::fchmod(&o, Mode::from_bits_truncate(f.mode)).is_err() {
            return false;
        }
        let mut w = std::fs::File::from(o);
        w.write_all(&f.bytes).is_ok() && w.flush().is_ok()
    }
}
