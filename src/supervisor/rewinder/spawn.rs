//! Starting the rewinder (run by the broker, or by an unconfined
//! supervisor): the sandbox's namespaces and the workspace's own tree are
//! opened here, from the instance's fixed configuration and the `__init`
//! pid the caller checked; nothing the agent wrote is read.

use super::{RewinderError, LOWER_FD, MNT_FD, MOUNTINFO_FD, SOCK_FD, USER_FD};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Child;

/// The rewinder's address space at most (`RLIMIT_AS`): two states of a
/// million entries each, their objects' descriptors and its buffers fit
/// well below it.
const MEMORY: libc::rlim_t = 4 << 30;

/// The namespace `kind` of `init_pid`, None when it is ours (no user
/// namespace: the sandbox shares the host's).
fn ns(init_pid: u32, kind: &str) -> Result<Option<OwnedFd>, RewinderError> {
    let path = format!("/proc/{init_pid}/ns/{kind}");
    let theirs = std::fs::read_link(&path).map_err(|source| RewinderError::Namespace {
        path: path.clone(),
        source,
    })?;
    if std::fs::read_link(format!("/proc/self/ns/{kind}")).ok() == Some(theirs) {
        return Ok(None);
    }
    std::fs::File::open(&path)
        .map(|f| Some(f.into()))
        .map_err(|source| RewinderError::Namespace { path, source })
}

/// Starts `sandmux __rewind` for the sandbox of `init_pid` (one of this
/// instance's: the caller checked) whose workspace is `workspace`; the
/// supervisor's end of its socket, and the process (reap it with [`reap`]).
pub(crate) fn spawn(init_pid: u32, workspace: &Path) -> Result<(UnixStream, Child), RewinderError> {
    use std::os::unix::process::CommandExt;
    let mnt = ns(init_pid, "mnt")?.ok_or(RewinderError::NoMountNamespace)?;
    let user = ns(init_pid, "user")?;
    // The sandbox's mount table, as its `__init` sees it (the rewinder
    // checks that the workspace it opens is the overlay mounted there).
    let table = format!("/proc/{init_pid}/mountinfo");
    let mountinfo = std::fs::File::open(&table).map_err(|source| RewinderError::Namespace {
        path: table,
        source,
    })?;
    let lower = crate::sandbox::beneath::open_root(workspace).map_err(|source| {
        RewinderError::Workspace {
            path: workspace.to_path_buf(),
            source,
        }
    })?;
    let (ours, theirs) = UnixStream::pair()?;
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg0("sandmux-rewinder")
        .arg("__rewind")
        .arg(workspace)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    if user.is_some() {
        cmd.arg("--userns");
    }
    let from = [
        Some(theirs.as_raw_fd()),
        Some(lower.as_raw_fd()),
        Some(mnt.as_raw_fd()),
        user.as_ref().map(|u| u.as_raw_fd()),
        Some(mountinfo.as_raw_fd()),
    ];
    // SAFETY: only async-signal-safe calls (fcntl, dup2, setrlimit, prctl) between
    // fork and exec, on descriptors opened before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let mut moved = [-1; 5];
            for (m, f) in moved.iter_mut().zip(from) {
                if let Some(f) = f {
                    *m = libc::fcntl(f, libc::F_DUPFD_CLOEXEC, 10);
                    if *m < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            for (m, to) in moved
                .iter()
                .zip([SOCK_FD, LOWER_FD, MNT_FD, USER_FD, MOUNTINFO_FD])
            {
                if *m >= 0 && libc::dup2(*m, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // Its memory, outside every cgroup of the instance, is bounded
            // here (the plan it reads is bounded by the serve side).
            let cap = libc::rlimit {
                rlim_cur: MEMORY,
                rlim_max: MEMORY,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &cap) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            crate::sandbox::die_with_parent()
        });
    }
    let child = cmd.spawn()?;
    Ok((ours, child))
}

/// Reaps the rewinder on a thread of its own; past [`super::DEADLINE`]
/// it is killed first (it is in no cgroup of the instance: the freeze
/// that stops the agent would stop it too; this is its bound in time).
pub(crate) fn reap(mut child: Child) {
    let start = std::time::Instant::now();
    let _ = std::thread::Builder::new()
        .name("rewinder-reaper".into())
        .spawn(move || loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if start.elapsed() > super::DEADLINE => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        });
}
