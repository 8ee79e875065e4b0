//! Mounts: the sandbox's filesystem view, built on a fresh tmpfs root.
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

use crate::guard::scan::beneath;
use crate::profile::{MountKind, Policy};
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
pub struct MountError {
    /// What was being done.
    pub what: &'static str,
    /// The path inside the sandbox (or on the host for sources).
    pub path: String,
    /// The OS error.
    pub source: std::io::Error,
}

fn merr(what: &'static str, path: impl AsRef<Path>) -> impl FnOnce(nix::Error) -> MountError {
    // Paths can be the agent's (names in the workspace): escaped for terminals.
    let path = crate::term::printable(&path.as_ref().to_string_lossy());
    move |e| MountError {
        what,
        path,
        source: std::io::Error::from_raw_os_error(e as i32),
    }
}

fn ierr(what: &'static str, path: impl AsRef<Path>) -> impl FnOnce(std::io::Error) -> MountError {
    let path = crate::term::printable(&path.as_ref().to_string_lossy());
    move |source| MountError { what, path, source }
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
pub struct RunFiles {
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
}

/// What the view ended up with, for the report.
#[derive(Debug, Default, Clone)]
pub struct Built {
    /// Protected paths made read-only.
    pub protected: Vec<PathBuf>,
    /// Masked paths covered.
    pub masked: Vec<PathBuf>,
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

/// Builds the new root at `newroot` (an empty directory on the host, seen only
/// in this mount namespace) and pivots into it.
pub fn build_and_pivot(
    policy: &Policy,
    newroot: &Path,
    host_sock_dir: &Path,
    files: &RunFiles,
) -> Result<Built, MountError> {
    let mut built = Built::default();
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(merr("make private", "/"))?;
    mount(
        Some("tmpfs"),
        newroot,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=16m,mode=0755"),
    )
    .map_err(merr("mount root tmpfs on", newroot))?;
    let fd = nix::fcntl::open(
        newroot,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::empty(),
    )
    .map_err(merr("open", newroot))?;
    let dev = fstat(&fd).map_err(merr("stat", newroot))?.st_dev;
    let mut root = Root {
        fd,
        ours: [dev].into(),
    };
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;

    // /run/sandmux: the sandbox's own files.
    let run_p = Path::new("/run/sandmux");
    let run = root.tmpfs(run_p, "size=4m,mode=0755", nosuid_nodev)?;
    let run_rw = openat(
        &run,
        ".",
        OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(merr("open", run_p))?;
    write_file(&run_rw, "empty", b"", 0o444)?;
    write_file(&run_rw, "passwd", files.passwd.as_bytes(), 0o444)?;
    write_file(&run_rw, "group", files.group.as_bytes(), 0o444)?;
    write_file(&run_rw, "gate.json", files.gate_json.as_bytes(), 0o444)?;
    if let Some((resolv, hosts)) = &files.names {
        write_file(&run_rw, "resolv.conf", resolv.as_bytes(), 0o444)?;
        write_file(&run_rw, "hosts", hosts.as_bytes(), 0o444)?;
    }
    if let Some(conf) = &files.tmux_conf {
        write_file(&run_rw, "tmux.conf", conf.as_bytes(), 0o444)?;
    }
    // The binary by path: /proc/self/exe refers to a mount of the namespace we left.
    let exe_path = std::fs::read_link("/proc/self/exe").map_err(ierr("read", "/proc/self/exe"))?;
    let exe = nix::fcntl::open(&exe_path, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(merr("open", &exe_path))?;
    let gate = root.ensure_file(&run_p.join("bin/sandmux-pane"))?;
    bind(
        &exe,
        &gate,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        "bind the gate binary onto",
        &run_p.join("bin/sandmux-pane"),
    )?;
    let sock_src = open_host(host_sock_dir)?;
    let sock = root.ensure_dir(&run_p.join("sock"))?;
    bind(
        &sock_src,
        &sock,
        MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
        "bind the socket directory onto",
        &run_p.join("sock"),
    )?;

    // The profile's entries, parents first.
    for e in &policy.fs {
        let p = e.path.as_path();
        match &e.kind {
            MountKind::ReadOnly | MountKind::ReadWrite => {
                let src = open_host(p)?;
                let is_dir =
                    fstat(&src).map_err(merr("stat", p))?.st_mode & libc::S_IFMT == libc::S_IFDIR;
                let dst = if is_dir {
                    root.ensure_dir(p)?
                } else {
                    root.ensure_file(p)?
                };
                let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
                if e.kind == MountKind::ReadOnly {
                    attrs |= MOUNT_ATTR_RDONLY;
                }
                bind(&src, &dst, attrs, "bind onto", p)?;
            }
            MountKind::Tmpfs => {
                let mode = if p == Path::new("/tmp") {
                    "1777"
                } else {
                    "0755"
                };
                root.tmpfs(
                    p,
                    &format!("size={},mode={mode}", policy.limits.tmpfs_size.0),
                    nosuid_nodev,
                )?;
            }
            MountKind::Masked => {
                let src = match open_host(p) {
                    Ok(fd) => fd,
                    Err(_) => continue,
                };
                let is_dir =
                    fstat(&src).map_err(merr("stat", p))?.st_mode & libc::S_IFMT == libc::S_IFDIR;
                // Resolved on the host already (profile.rs); absent from the view means
                // there is nothing to hide. Any other failure is an error, never a skip.
                let dst = match beneath(&root.fd, &rel(p), OFlag::O_PATH | OFlag::O_NOFOLLOW) {
                    Ok(fd) => fd,
                    Err(nix::Error::ENOENT) => continue,
                    Err(e) => return Err(merr("open the path to mask", p)(e)),
                };
                if is_dir {
                    mount(
                        Some("tmpfs"),
                        &fd_path(&dst),
                        Some("tmpfs"),
                        MsFlags::MS_RDONLY | nosuid_nodev | MsFlags::MS_NOEXEC,
                        Some("size=4k,mode=0555"),
                    )
                    .map_err(merr("mask", p))?;
                } else {
                    let empty = beneath(&root.fd, Path::new("run/sandmux/empty"), OFlag::O_PATH)
                        .map_err(merr("open", "/run/sandmux/empty"))?;
                    bind(
                        &empty,
                        &dst,
                        MOUNT_ATTR_RDONLY
                            | MOUNT_ATTR_NOSUID
                            | MOUNT_ATTR_NODEV
                            | MOUNT_ATTR_NOEXEC,
                        "mask",
                        p,
                    )?;
                }
                built.masked.push(p.to_path_buf());
            }
            MountKind::Symlink(target) => {
                let parent = root.ensure_dir(p.parent().unwrap_or(Path::new("/")))?;
                let name = p.file_name().unwrap_or_default();
                symlinkat(target.as_path(), &parent, name).map_err(merr("create symlink", p))?;
            }
        }
    }

    // Commit mode (P8): the agent's own repository over the workspace's .git,
    // and the real one read-only where the agent's alternates name it.
    if let Some(c) = &policy.guard.commit {
        let host_root = open_host(Path::new("/"))?;
        let src = beneath(
            &host_root,
            &rel(&c.agent),
            OFlag::O_PATH | OFlag::O_DIRECTORY,
        )
        .map_err(merr(
            "open the agent's repository (no symlinks) at",
            &c.agent,
        ))?;
        let dst = beneath(
            &root.fd,
            &rel(&c.real),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW,
        )
        .map_err(merr("open the workspace's .git at", &c.real))?;
        bind(
            &src,
            &dst,
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            "bind the agent's repository onto",
            &c.real,
        )?;
        let real = beneath(
            &host_root,
            &rel(&c.real),
            OFlag::O_PATH | OFlag::O_DIRECTORY,
        )
        .map_err(merr("open the git directory (no symlinks) at", &c.real))?;
        let dst = root.ensure_dir(&c.origin)?;
        bind(
            &real,
            &dst,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            "bind the workspace's git directory read-only onto",
            &c.origin,
        )?;
    }

    // Pinned directories: the parents of protected paths, bound onto themselves
    // so that renaming a parent cannot carry a protected path away.
    for p in &policy.pinned {
        match beneath(&root.fd, &rel(p), OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW) {
            Ok(dst) => bind(&dst, &dst, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, "pin", p)?,
            Err(nix::Error::ENOENT) | Err(nix::Error::ENOTDIR) => {}
            Err(nix::Error::ELOOP) => {
                return Err(MountError {
                    what: "a parent of a protected path is a symlink (remove it, or take the path off the profile's protected list)",
                    path: crate::term::printable(&p.to_string_lossy()),
                    source: std::io::Error::from_raw_os_error(libc::ELOOP),
                })
            }
            Err(e) => return Err(merr("open the parent of a protected path", p)(e)),
        }
    }

    // Protected paths: read-only inside read-write roots, never through a symlink.
    for p in &policy.protected {
        match beneath(&root.fd, &rel(p), OFlag::O_PATH | OFlag::O_NOFOLLOW) {
            Ok(dst) => {
                if fstat(&dst).map_err(merr("stat", p))?.st_mode & libc::S_IFMT == libc::S_IFLNK {
                    return Err(MountError {
                        what: "protected path is a symlink (remove it, or take it off the profile's protected list)",
                        path: crate::term::printable(&p.to_string_lossy()),
                        source: std::io::Error::from_raw_os_error(libc::ELOOP),
                    });
                }
                bind(&dst, &dst, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, "protect", p)?;
                built.protected.push(p.clone());
            }
            Err(nix::Error::ENOENT) | Err(nix::Error::ENOTDIR) => {}
            Err(nix::Error::ELOOP) => {
                return Err(MountError {
                    what: "protected path goes through a symlink (remove it, or take it off the profile's protected list)",
                    path: crate::term::printable(&p.to_string_lossy()),
                    source: std::io::Error::from_raw_os_error(libc::ELOOP),
                })
            }
            Err(e) => return Err(merr("open protected path", p)(e)),
        }
    }

    // Git directories outside every read-write tree that a `.git` file names
    // (linked worktrees, submodules): read-only at the same path (P8).
    for p in &policy.guard.git_outside {
        let host_root = open_host(Path::new("/"))?;
        let src = beneath(&host_root, &rel(p), OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(merr("open the git directory (no symlinks) at", p))?;
        let dst = root.ensure_dir(p)?;
        bind(
            &src,
            &dst,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            "bind the git directory read-only onto",
            p,
        )?;
    }

    // /dev
    let dev_p = Path::new("/dev");
    let dev = root.tmpfs(
        dev_p,
        "size=64k,mode=0755",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
    )?;
    for n in ["null", "zero", "full", "random", "urandom", "tty"] {
        let host = Path::new("/dev").join(n);
        let src = open_host(&host)?;
        let dst = root.ensure_file(&host)?;
        bind(
            &src,
            &dst,
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
            "bind device onto",
            &host,
        )?;
    }
    let pts = root.ensure_dir(Path::new("/dev/pts"))?;
    mount(
        Some("devpts"),
        &fd_path(&pts),
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(merr("mount devpts on", "/dev/pts"))?;
    root.tmpfs(
        Path::new("/dev/shm"),
        &format!("size={},mode=1777", policy.limits.tmpfs_size.0),
        nosuid_nodev | MsFlags::MS_NOEXEC,
    )?;
    for (name, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlinkat(target, &dev, name).map_err(merr("create symlink", dev_p.join(name)))?;
    }
    set_attr(&root.reopen(dev_p)?, MOUNT_ATTR_RDONLY, false)
        .map_err(ierr("make read-only", dev_p))?;

    // /proc: fresh, with read-only covers on the parts that reach the host kernel.
    let proc_p = Path::new("/proc");
    let proc_dir = root.ensure_dir(proc_p)?;
    mount(
        Some("proc"),
        &fd_path(&proc_dir),
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(merr("mount a fresh procfs on", proc_p))?;
    let proc = root.reopen(proc_p)?;
    // /proc/keys and /proc/key-users would list the caller's key descriptions: emptied.
    let empty = beneath(&root.fd, Path::new("run/sandmux/empty"), OFlag::O_PATH)
        .map_err(merr("open", "/run/sandmux/empty"))?;
    for n in ["keys", "key-users"] {
        if let Ok(fd) = beneath(&proc, Path::new(n), OFlag::O_PATH | OFlag::O_NOFOLLOW) {
            bind(
                &empty,
                &fd,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                "mask",
                &proc_p.join(n),
            )?;
        }
    }
    for n in [
        "sys",
        "sysrq-trigger",
        "irq",
        "bus",
        "fs",
        "acpi",
        "scsi",
        "timer_list",
        "latency_stats",
        "sched_debug",
        "kcore",
    ] {
        if let Ok(fd) = beneath(&proc, Path::new(n), OFlag::O_PATH | OFlag::O_NOFOLLOW) {
            bind(
                &fd,
                &fd,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                "cover",
                &proc_p.join(n),
            )?;
        }
    }

    // /etc/passwd and /etc/group: the sandbox's identity only, no host
    // accounts; /etc/resolv.conf and /etc/hosts: the network policy in words.
    let names: &[&str] = if files.names.is_some() {
        &["passwd", "group", "resolv.conf", "hosts"]
    } else {
        &["passwd", "group"]
    };
    for n in names.iter().copied() {
        let p = Path::new("/etc").join(n);
        if let Ok(dst) = beneath(&root.fd, &rel(&p), OFlag::O_PATH | OFlag::O_NOFOLLOW) {
            let src = beneath(&root.fd, &Path::new("run/sandmux").join(n), OFlag::O_PATH)
                .map_err(merr("open", &p))?;
            bind(
                &src,
                &dst,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                "bind onto",
                &p,
            )?;
        }
    }
    drop((run, run_rw, gate, sock, dev, pts, proc_dir, proc));

    // Seal: /run/sandmux and / become read-only (not their submounts).
    set_attr(&root.reopen(run_p)?, MOUNT_ATTR_RDONLY, false)
        .map_err(ierr("make read-only", run_p))?;
    set_attr(&root.reopen(Path::new("/"))?, MOUNT_ATTR_RDONLY, false)
        .map_err(ierr("make read-only", "/"))?;

    fchdir(&root.fd).map_err(merr("chdir", newroot))?;
    pivot_root(".", ".").map_err(merr("pivot_root into", newroot))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(merr("detach the old root", "/"))?;
    nix::unistd::chdir("/").map_err(merr("chdir", "/"))?;
    Ok(built)
}

/// Covers the tmux socket directory once the server listens: from then on no
/// process in the sandbox can find the socket by path (P2, T1). The server keeps
/// its listening fd; the supervisor connects through the host path.
pub fn hide_socket_dir() -> Result<(), MountError> {
    let p = Path::new("/run/sandmux/sock");
    mount(
        Some("tmpfs"),
        p,
        Some("tmpfs"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=4k,mode=0"),
    )
    .map_err(merr("hide", p))
}
