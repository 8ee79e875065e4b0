//! Opening paths beneath a directory without ever following a link: every
//! open resolves with `openat2` (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS`) relative to a descriptor, so a link an agent
//! planted cannot point the caller elsewhere on the host. The mount layer
//! (before the sandbox's filter, which refuses `openat2`) and the workspace
//! guard (in the supervisor) open trees the agent can write with it.

use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// Opens `path` (relative; empty: `dir` itself) beneath `dir`.
pub(crate) fn beneath(dir: &impl AsFd, path: &Path, flags: OFlag) -> nix::Result<OwnedFd> {
    let how = OpenHow::new().flags(flags | OFlag::O_CLOEXEC).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    );
    let p = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    openat2(dir, p, how)
}

/// Opens a tree's root as a directory, refusing a symlink at its last component.
pub(crate) fn open_root(root: &Path) -> nix::Result<OwnedFd> {
    nix::fcntl::open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Gives the owner rwx on the directory `name` under `dir` (never through a
/// link: the directory is opened first, then changed through its descriptor).
pub(crate) fn unlock_dir(dir: &impl AsFd, name: &Path) {
    if let Ok(fd) = beneath(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW,
    ) {
        if let Ok(st) = nix::sys::stat::fstat(&fd) {
            let mode = (st.st_mode & 0o7777) | 0o700;
            let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
            // The magic link names the opened inode itself, not a path.
            let _ =
                std::fs::set_permissions(proc, std::os::unix::fs::PermissionsExt::from_mode(mode));
        }
    }
}

/// The entries of the directory at `path` (`.` and `..` left out), the
/// directory itself opened without following a link at its last
/// component (the caller has checked the components above).
pub(crate) fn entries(
    path: &Path,
) -> nix::Result<Vec<(std::ffi::OsString, Option<nix::dir::Type>)>> {
    use std::os::unix::ffi::OsStrExt;
    let mut d = nix::dir::Dir::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    Ok(d.iter()
        .flatten()
        .filter(|e| !matches!(e.file_name().to_bytes(), b"." | b".."))
        .map(|e| {
            let name = std::ffi::OsStr::from_bytes(e.file_name().to_bytes()).to_os_string();
            (name, e.file_type())
        })
        .collect())
}

/// The text of the regular file at `path` when it is at most `max` bytes,
/// opened without following a link at its last component.
pub(crate) fn read_small(path: &Path, max: u64) -> Option<String> {
    use std::io::Read;
    let fd = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let f = std::fs::File::from(fd);
    let m = f.metadata().ok()?;
    if !m.is_file() || m.len() > max {
        return None;
    }
    let mut s = String::new();
    f.take(max).read_to_string(&mut s).ok()?;
    Some(s)
}
