//! Inherited descriptors: every one above stderr is marked close-on-exec
//! before the payload runs, so no host descriptor reaches the sandbox.
//! `close_range(CLOSE_RANGE_CLOEXEC)` does it in one call; where that is
//! refused (kernels before 5.11, a container runtime's seccomp profile), each
//! open descriptor is marked with `fcntl`. A descriptor that cannot be marked
//! ends the start-up: nothing runs with a host descriptor open.

/// A descriptor that could not be marked close-on-exec.
#[derive(Debug, thiserror::Error)]
#[error("fd {fd}: {source}")]
pub(crate) struct FdError {
    fd: i32,
    source: std::io::Error,
}

/// Why the descriptors were not all marked: `close_range` was refused, and
/// then one descriptor could not be marked.
#[derive(Debug, thiserror::Error)]
#[error("close_range: {refused}; marking one by one: {one}")]
pub(crate) struct CloexecError {
    refused: std::io::Error,
    one: FdError,
}

/// Marks every descriptor above 2 close-on-exec; says how.
pub(crate) fn cloexec_above_stderr() -> Result<&'static str, CloexecError> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return Ok("close_range");
    }
    let refused = std::io::Error::last_os_error();
    one_by_one()
        .map(|()| "fcntl, one by one (close_range was refused)")
        .map_err(|one| CloexecError { refused, one })
}

/// The descriptors to mark: those `/proc/self/fd` lists, or every number
/// below the hard `RLIMIT_NOFILE` (at most 2^20) where `/proc` is not there.
fn open_fds() -> Vec<i32> {
    if let Ok(rd) = std::fs::read_dir("/proc/self/fd") {
        return rd
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
    }
    let hard = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(_, h)| h)
        .unwrap_or(1 << 20);
    (0..hard.min(1 << 20) as i32).collect()
}

fn one_by_one() -> Result<(), FdError> {
    for fd in open_fds().into_iter().filter(|&fd| fd > 2) {
        // SAFETY: F_GETFD/F_SETFD on a descriptor number touch only its flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EBADF) => continue,
                _ => {
                    return Err(FdError {
                        fd,
                        source: std::io::Error::last_os_error(),
                    })
                }
            }
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
            return Err(FdError {
                fd,
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}
