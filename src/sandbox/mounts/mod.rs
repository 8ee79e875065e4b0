//! Mounts: the sandbox's filesystem view, built on a fresh tmpfs root from
//! the plan's steps (`sandbox::plan`, executed by [`exec`]).
//!
//! Every path is resolved through file descriptors with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`) relative to the new root, and binds
//! use the fd-based mount API (`open_tree`, `mount_setattr`, `move_mount`), so a
//! symlink planted in the workspace can never redirect a mount (E10). Mount
//! points are only ever created on tmpfs mounts made here, never inside a host
//! tree, so no artefacts are left in the workspace.
//!
//! Layout inside (paths are the same as on the host unless stated):
//! - `/` fresh tmpfs, read-only once built;
//! - profile `read_only` (ro, nosuid, nodev), `read_write` (nosuid, nodev),
//!   `tmpfs` (sized), `masked` (empty ro file or dir), protected paths (ro);
//! - `/dev`: tmpfs with null, zero, full, random, urandom, tty bound from the
//!   host, a private devpts instance, `/dev/shm`;
//! - `/proc`: fresh procfs of the sandbox's pid namespace with read-only covers;
//! - `/run/sandmux`: tmpfs with `bin/sandmux-pane` (this binary, ro), `sock/`
//!   (the tmux socket directory, hidden once the server listens), the tmux
//!   config, the gate config, and the `/etc/passwd`/`/etc/group` shown inside.

mod exec;
pub(crate) use exec::{after_ready, build_and_pivot, Sources};

use crate::sandbox::beneath::beneath;
use nix::fcntl::{openat, OFlag};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::{fstat, mkdirat, Mode};
use nix::unistd::{fchdir, pivot_root, symlinkat};
use std::collections::BTreeSet;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// An error while building the view; always names the path.
#[derive(Debug, thiserror::Error)]
#[error("mount setup, {what} {path}: {source}")]
pub(crate) struct MountError {
    /// What was being done.
    pub what: &'static str,
    /// The path inside the sandbox (or on the host for sources).
    pub path: String,
    /// The OS error.
    pub source: std::io::Error,
    /// What refused it, where the fix depends on that: set where the
    /// kernel refused a fresh procfs or the overlay (the `mount(2)` call
    /// itself), never read from the text.
    pub refused: Option<crate::sandbox::report::Refusal>,
}

fn merr(what: &'static str, path: impl AsRef<Path>) -> impl FnOnce(nix::Error) -> MountError {
    // Paths can be the agent's (names in the workspace): escaped for terminals.
    let path = crate::term::printable(&path.as_ref().to_string_lossy());
    move |e| MountError {
        what,
        path,
        source: std::io::Error::from_raw_os_error(e as i32),
        refused: None,
    }
}

fn ierr(what: &'static str, path: impl AsRef<Path>) -> impl FnOnce(std::io::Error) -> MountError {
    let path = crate::term::printable(&path.as_ref().to_string_lossy());
    move |source| MountError {
        what,
        path,
        source,
        refused: None,
    }
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const AT_RECURSIVE: u32 = 0x8000;
const OPEN_TREE_CLONE: u32 = 1;
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: u32 = 0x40;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Files written into `/run/sandmux` before it becomes read-only.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct RunFiles {
    /// tmux configuration (absent in `run` mode).
    pub tmux_conf: Option<String>,
    /// Gate configuration (JSON).
    pub gate_json: String,
    /// `/etc/passwd` shown inside.
    pub passwd: String,
    /// `/etc/group` shown inside.
    pub group: String,
    /// `/etc/resolv.conf` and `/etc/hosts` shown inside, explaining the
    /// network policy (none in `host` mode: the host's files stay).
    #[serde(default)]
    pub names: Option<(String, String)>,
    /// With credentials: the CA bundle clients read (the host's roots and
    /// the instance's CA) and the instance's CA alone.
    #[serde(default)]
    pub ca: Option<(String, String)>,
}

/// What the view ended up with, for the report.
#[derive(Debug, Default, Clone)]
pub(crate) struct Built {
    /// Protected paths made read-only.
    pub protected: Vec<PathBuf>,
    /// Masked paths covered.
    pub masked: Vec<PathBuf>,
    /// Best-effort steps that failed, reported as their layer dropped.
    pub dropped: Vec<(crate::profile::Layer, String)>,
}

fn fd_path(fd: &impl AsRawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn rel(p: &Path) -> PathBuf {
    p.components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect()
}

fn open_host(path: &Path) -> Result<OwnedFd, MountError> {
    nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(merr("open source", path))
}

/// Clones the mount tree at `src` (recursively), applies `attrs`, and moves it
/// onto `dst`. Every step works on file descriptors.
fn bind(
    src: &OwnedFd,
    dst: &OwnedFd,
    attrs: u64,
    what: &'static str,
    path: &Path,
) -> Result<(), MountError> {
    let e = |what| ierr(what, path);
    // SAFETY: open_tree with a valid fd and an empty NUL-terminated path.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            src.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as u32 | libc::AT_EMPTY_PATH as u32 | AT_RECURSIVE,
        )
    };
    if tree < 0 {
        return Err(e(what)(std::io::Error::last_os_error()));
    }
    // SAFETY: open_tree returned a fresh fd that we now own.
    let tree = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(tree as i32) };
    set_attr(&tree, attrs, true).map_err(e("set attributes on"))?;
    // SAFETY: move_mount with two valid fds and empty paths.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            dst.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(e("move mount onto")(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Sets mount attributes on the mount `fd` refers to.
fn set_attr(fd: &OwnedFd, attrs: u64, recursive: bool) -> std::io::Result<()> {
    if attrs == 0 {
        return Ok(());
    }
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = libc::AT_EMPTY_PATH as u32 | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: mount_setattr with a valid fd, empty path and a correctly sized struct.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The new root under construction.
struct Root {
    fd: OwnedFd,
    /// Device numbers of the tmpfs mounts made here: the only places where
    /// mount points may be created.
    ours: BTreeSet<u64>,
}

impl Root {
    fn reopen(&self, p: &Path) -> Result<OwnedFd, MountError> {
        beneath(&self.fd, &rel(p), OFlag::O_PATH | OFlag::O_DIRECTORY).map_err(merr("reopen", p))
    }

    fn is_ours(&self, fd: &OwnedFd) -> bool {
        fstat(fd)
            .map(|s| self.ours.contains(&s.st_dev))
            .unwrap_or(false)
    }

    fn note_tmpfs(&mut self, p: &Path) -> Result<OwnedFd, MountError> {
        let fd = self.reopen(p)?;
        let st = fstat(&fd).map_err(merr("stat", p))?;
        self.ours.insert(st.st_dev);
        Ok(fd)
    }

    /// Opens `p` (a directory), creating missing components on our tmpfs only.
    fn ensure_dir(&self, p: &Path) -> Result<OwnedFd, MountError> {
        let mut cur = beneath(&self.fd, Path::new(""), OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(merr("open", "/"))?;
        let mut so_far = PathBuf::from("/");
        for c in rel(p).components() {
            so_far.push(c);
            let name = Path::new(c.as_os_str());
            cur = match beneath(&cur, name, OFlag::O_PATH | OFlag::O_DIRECTORY) {
                Ok(fd) => fd,
                Err(nix::Error::ENOENT) if self.is_ours(&cur) => {
                    mkdirat(&cur, name, Mode::from_bits_truncate(0o755))
                        .map_err(merr("create mount point", &so_far))?;
                    beneath(&cur, name, OFlag::O_PATH | OFlag::O_DIRECTORY)
                        .map_err(merr("open", &so_far))?
                }
                Err(nix::Error::ENOENT) => {
                    return Err(MountError {
                        what: "refusing to create a mount point inside a host tree at",
                        path: so_far.display().to_string(),
                        source: std::io::Error::from_raw_os_error(libc::ENOENT),
                        refused: None,
                    })
                }
                Err(e) => return Err(merr("open", &so_far)(e)),
            };
        }
        Ok(cur)
    }

    /// Opens `p` (a file mount point), creating an empty file on our tmpfs only.
    fn ensure_file(&self, p: &Path) -> Result<OwnedFd, MountError> {
        let parent = self.ensure_dir(p.parent().unwrap_or(Path::new("/")))?;
        let name = Path::new(p.file_name().unwrap_or_default());
        match beneath(&parent, name, OFlag::O_PATH) {
            Ok(fd) => Ok(fd),
            Err(nix::Error::ENOENT) if self.is_ours(&parent) => {
                let fd = openat(
                    &parent,
                    name,
                    OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_WRONLY
                        | OFlag::O_CLOEXEC
                        | OFlag::O_NOFOLLOW,
                    Mode::from_bits_truncate(0o444),
                )
                .map_err(merr("create mount point", p))?;
                drop(fd);
                beneath(&parent, name, OFlag::O_PATH).map_err(merr("open", p))
            }
            Err(e) => Err(merr("open mount point", p)(e)),
        }
    }

    fn tmpfs(&mut self, p: &Path, opts: &str, flags: MsFlags) -> Result<OwnedFd, MountError> {
        let dst = self.ensure_dir(p)?;
        mount(
            Some("tmpfs"),
            &fd_path(&dst),
            Some("tmpfs"),
            flags,
            Some(opts),
        )
        .map_err(merr("mount tmpfs on", p))?;
        self.note_tmpfs(p)
    }
}

fn write_file(dir: &OwnedFd, name: &str, content: &[u8], mode: u32) -> Result<(), MountError> {
    let fd = openat(
        dir,
        name,
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::from_bits_truncate(mode),
    )
    .map_err(merr("create", format!("/run/sandmux/{name}")))?;
    std::fs::File::from(fd)
        .write_all(content)
        .map_err(ierr("write", format!("/run/sandmux/{name}")))
}
