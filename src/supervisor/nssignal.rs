//! Signalling a whole sandbox from the host, when there is no freezer cgroup
//! (`freeze`'s SIGSTOP path).
//!
//! Scanning `/proc` and signalling pid by pid cannot stop a process that
//! forks its successor and exits: the scan lists it, it is gone by the time
//! it is looked at, and its successor was not listed. So the signal is sent
//! from inside: a helper joins the sandbox's user and pid namespaces (the
//! supervisor owns them) and calls `kill(-1, sig)`, which the kernel delivers
//! to every process of that namespace at once, a fork under way included
//! (the child gets it too). PID 1, which `kill(-1)` skips, is signalled
//! from the host through a `/proc/PID` descriptor (`pidfd_send_signal`:
//! never a reused pid). A `/proc` scan then only checks the result.

use nix::fcntl::{open, openat, readlinkat, OFlag};
use nix::sys::stat::Mode;
use std::os::fd::{AsRawFd, OwnedFd};

/// Why the sandbox's namespace could not be signalled.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NsSignalError {
    /// Its `/proc/PID/ns` link is gone or closed.
    #[error("{path}: {source} (is the sandbox still running?)")]
    Gone {
        path: String,
        source: std::io::Error,
    },
    /// The sandbox shares the supervisor's pid namespace.
    #[error("the sandbox has no freezer cgroup and no pid namespace of its own (the profile let both go), so its processes cannot be told from the host's; `sandmux stop` ends it")]
    NoNamespace,
    /// Signalling PID 1 through its descriptor failed.
    #[error("signalling the sandbox's PID 1: {0}")]
    Pid1(std::io::Error),
    /// PID 1 is gone.
    #[error("the sandbox has no PID 1 (it is ending)")]
    NoPid1,
    /// A namespace of the sandbox could not be opened.
    #[error("{path}: {source}")]
    OpenNs { path: String, source: nix::Error },
    /// `fork` or `waitpid` for the helper.
    #[error("{what}: {source}")]
    Sys {
        what: &'static str,
        source: std::io::Error,
    },
    /// The helper could not join the user namespace.
    #[error("joining the sandbox's user namespace failed")]
    JoinUser,
    /// The helper could not join the pid namespace.
    #[error("joining the sandbox's pid namespace failed")]
    JoinPid,
    /// The pid namespace's PID 1 is gone.
    #[error("the sandbox's pid namespace takes no new process (it is ending)")]
    Ending,
    /// The helper failed otherwise.
    #[error("the signalling helper failed (wait status {0})")]
    Helper(i32),
}

/// The sandbox's pid namespace (`pid:[N]`), refused when it is the
/// supervisor's own (a profile that let the pid layer go): signalling
/// "every process of the namespace" would then reach the host's.
pub(crate) fn sandbox_ns(init_pid: u32) -> Result<String, NsSignalError> {
    let p = format!("/proc/{init_pid}/ns/pid_for_children");
    let ns = std::fs::read_link(&p)
        .map_err(|source| NsSignalError::Gone { path: p, source })?
        .to_string_lossy()
        .into_owned();
    let own = std::fs::read_link("/proc/self/ns/pid")
        .map(|l| l.to_string_lossy().into_owned())
        .unwrap_or_default();
    if ns == own {
        return Err(NsSignalError::NoNamespace);
    }
    Ok(ns)
}

/// Sends `sig` to every process of the sandbox (the pid namespace the outer
/// `__init`, `init_pid`, made for its children) and to its PID 1.
pub(crate) fn signal_all(init_pid: u32, sig: i32) -> Result<(), NsSignalError> {
    let inside = kill_inside(init_pid, sig);
    let one = pid1(init_pid).map(|fd| send(&fd, sig));
    match (inside, one) {
        (Err(e), _) => Err(e),
        (Ok(()), Some(Err(e))) => Err(NsSignalError::Pid1(e)),
        (Ok(()), None) => Err(NsSignalError::NoPid1),
        (Ok(()), Some(Ok(()))) => Ok(()),
    }
}

/// The sandbox's PID 1, held open: the outer `__init`'s only child.
pub(crate) fn pid1(init_pid: u32) -> Option<OwnedFd> {
    let kids =
        std::fs::read_to_string(format!("/proc/{init_pid}/task/{init_pid}/children")).ok()?;
    let pid: i32 = kids.split_whitespace().next()?.parse().ok()?;
    let fd = open_proc(pid)?;
    // The pid is checked through the descriptor: still the child of `__init`.
    let status = read_at(&fd, "status")?;
    let ppid = status.lines().find_map(|l| l.strip_prefix("PPid:"))?;
    (ppid.trim() == init_pid.to_string()).then_some(fd)
}

/// `kill(-1, sig)` from a helper in the sandbox's user and pid namespaces.
fn kill_inside(init_pid: u32, sig: i32) -> Result<(), NsSignalError> {
    let ns = |n: &str| {
        let path = format!("/proc/{init_pid}/ns/{n}");
        open(
            path.as_str(),
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|source| NsSignalError::OpenNs { path, source })
    };
    let same_user = std::fs::read_link(format!("/proc/{init_pid}/ns/user")).ok()
        == std::fs::read_link("/proc/self/ns/user").ok();
    let user = if same_user { None } else { Some(ns("user")?) };
    let pid = ns("pid_for_children")?;
    let (user, pid) = (user.as_ref().map(|f| f.as_raw_fd()), pid.as_raw_fd());
    // SAFETY: the child makes only async-signal-safe system calls (setns,
    // fork, kill, waitpid, _exit) on values prepared before the fork.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(NsSignalError::Sys {
            what: "fork",
            source: std::io::Error::last_os_error(),
        });
    }
    if child == 0 {
        // SAFETY: in the forked child; `helper` never returns (it `_exit`s).
        unsafe { helper(user, pid, sig) }
    }
    let mut st = 0;
    // SAFETY: waiting for the child just made.
    if unsafe { libc::waitpid(child, &mut st, 0) } != child {
        return Err(NsSignalError::Sys {
            what: "waitpid",
            source: std::io::Error::last_os_error(),
        });
    }
    match libc::WIFEXITED(st).then(|| libc::WEXITSTATUS(st)) {
        Some(0) => Ok(()),
        Some(1) => Err(NsSignalError::JoinUser),
        Some(2) => Err(NsSignalError::JoinPid),
        Some(3) => Err(NsSignalError::Ending),
        _ => Err(NsSignalError::Helper(st)),
    }
}

/// The forked helper: joins the namespaces, forks into the pid namespace
/// (joining it applies to children), and that child signals everything.
///
/// # Safety
/// Only in a child just forked: it never returns.
unsafe fn helper(user: Option<i32>, pid: i32, sig: i32) -> ! {
    if let Some(u) = user {
        if libc::setns(u, libc::CLONE_NEWUSER) != 0 {
            libc::_exit(1);
        }
    }
    if libc::setns(pid, libc::CLONE_NEWPID) != 0 {
        libc::_exit(2);
    }
    match libc::fork() {
        // ESRCH: nothing but PID 1 there.
        0 => {
            let r = libc::kill(-1, sig);
            libc::_exit(if r == 0 || *libc::__errno_location() == libc::ESRCH {
                0
            } else {
                4
            })
        }
        g if g > 0 => {
            let mut st = 0;
            libc::waitpid(g, &mut st, 0);
            libc::_exit(if libc::WIFEXITED(st) {
                libc::WEXITSTATUS(st)
            } else {
                5
            })
        }
        _ => libc::_exit(3),
    }
}

/// A process inside, as its state was read through `/proc/PID`.
pub(crate) struct Member {
    /// It can run no more user code: stopped, traced, dead, or with a stop
    /// pending (the next thing it does is stop).
    pub still: bool,
}

/// Opens `/proc/PID` (a handle on that process, not on its number).
pub(crate) fn open_proc(pid: i32) -> Option<OwnedFd> {
    open(
        format!("/proc/{pid}").as_str(),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

fn read_at(fd: &OwnedFd, name: &str) -> Option<String> {
    let f = openat(fd, name, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(f), &mut text).ok()?;
    Some(text)
}

/// The processes of namespace `ns` that the host can inspect now, and PID 1.
pub(crate) fn members(ns: &str, init_pid: u32) -> Vec<Member> {
    let mut out = Vec::new();
    if let Some(fd) = pid1(init_pid) {
        let still = is_still(&fd);
        out.push(Member { still });
    }
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Some(fd) = open_proc(pid) else { continue };
        if readlinkat(&fd, "ns/pid").is_ok_and(|l| l.to_string_lossy() == ns) {
            let still = is_still(&fd);
            out.push(Member { still });
        }
    }
    out
}

/// Reads `status`: state T/t/Z/X, or SIGSTOP pending (a process that is gone
/// is still).
pub(crate) fn is_still(fd: &OwnedFd) -> bool {
    let Some(text) = read_at(fd, "status") else {
        return true;
    };
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(str::trim)
            .unwrap_or_default()
    };
    let state = field("State:").chars().next().unwrap_or('X');
    let stop_bit = 1u64 << (libc::SIGSTOP - 1);
    let pending = ["SigPnd:", "ShdPnd:"]
        .iter()
        .any(|k| u64::from_str_radix(field(k), 16).is_ok_and(|m| m & stop_bit != 0));
    matches!(state, 'T' | 't' | 'Z' | 'X') || pending
}

/// Sends `sig` to the process `fd` holds (never to a reused pid).
pub(crate) fn send(fd: &OwnedFd, sig: i32) -> std::io::Result<()> {
    // SAFETY: pidfd_send_signal with a valid descriptor, no siginfo, no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn no_namespace_of_its_own_is_refused() {
        // This process's children share its pid namespace.
        let e = sandbox_ns(std::process::id()).unwrap_err();
        assert!(matches!(e, NsSignalError::NoNamespace), "{e}");
        assert!(e.to_string().contains("no pid namespace of its own"), "{e}");
    }

    #[test]
    fn a_stopped_child_is_still_and_a_running_one_is_not() {
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let fd = open_proc(c.id() as i32).unwrap();
        assert!(!is_still(&fd));
        send(&fd, libc::SIGSTOP).unwrap();
        let t0 = Instant::now();
        while !is_still(&fd) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(is_still(&fd));
        send(&fd, libc::SIGKILL).unwrap();
        c.wait().unwrap();
        // The descriptor outlives the process: a reused pid is never reached.
        assert!(send(&fd, libc::SIGCONT).is_err());
    }
}
