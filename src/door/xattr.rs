//! Extended attributes of a file the door moves out of the layer: the
//! `user.` ones are the agent's (or overlayfs's own, `user.overlay.*`,
//! with `userxattr`) and never reach the host tree, as a copy carries none.

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
