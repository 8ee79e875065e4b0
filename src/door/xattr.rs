//! What a file the door moves out of the layer carries besides its bytes:
//! the `user.` extended attributes are the agent's (or overlayfs's own,
//! `user.overlay.*`, with `userxattr`) and are removed; inode flags the
//! agent can set (`chattr`: no-dump, no-atime, append-only…) make the door
//! copy instead; the times become now. A copy carries none of them.

use std::os::fd::AsRawFd;

/// Removes every `user.` attribute of `f`.
pub(crate) fn strip_user(f: &std::fs::File) -> std::io::Result<()> {
    for name in names(f)? {
        if name.to_bytes().starts_with(b"user.") {
            // SAFETY: fremovexattr on an open descriptor with a
            // NUL-terminated name.
            if unsafe { libc::fremovexattr(f.as_raw_fd(), name.as_ptr()) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// The names of `f`'s attributes.
fn names(f: &std::fs::File) -> std::io::Result<Vec<std::ffi::CString>> {
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: flistxattr on an open descriptor into a buffer of the
        // length given.
        let n = unsafe { libc::flistxattr(f.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            buf.truncate(n as usize);
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) || buf.len() >= 1 << 20 {
            return Err(e);
        }
        buf.resize(buf.len() * 4, 0);
    }
    Ok(buf
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .filter_map(|n| std::ffi::CString::new(n).ok())
        .collect())
}

/// The inode flags `chattr` sets (`FS_*_FL`: s u c S i a d A j t D T C x
/// P); the others (extents, inline data) are the file system's own.
const SETTABLE_FLAGS: libc::c_long = 0x1
    | 0x2
    | 0x4
    | 0x8
    | 0x10
    | 0x20
    | 0x40
    | 0x80
    | 0x4000
    | 0x8000
    | 0x1_0000
    | 0x2_0000
    | 0x80_0000
    | 0x200_0000
    | 0x2000_0000;

/// Whether `f` carries an inode flag the agent set (a file system without
/// flags has none).
pub(crate) fn flagged(f: &std::fs::File) -> bool {
    let mut flags: libc::c_long = 0;
    // SAFETY: FS_IOC_GETFLAGS on an open descriptor writes one long into
    // the pointer given.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    r == 0 && flags & SETTABLE_FLAGS != 0
}

/// Sets `f`'s access and modification times to now.
pub(crate) fn touch(f: &std::fs::File) -> std::io::Result<()> {
    let now = nix::sys::time::TimeSpec::UTIME_NOW;
    nix::sys::stat::futimens(f, &now, &now).map_err(std::io::Error::from)
}
