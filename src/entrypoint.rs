//! sandmux as a container's PID 1 (`serve` or `run` as the entrypoint).
//!
//! PID 1 of a container adopts every orphan in it and gets the runtime's
//! stop signal, which the kernel drops when PID 1 has no handler. So when
//! `serve` or `run` finds itself PID 1, it forks first, before any thread or
//! child exists: the parent stays PID 1 and only reaps — every adopted orphan
//! and, last, the child — and forwards termination signals to the child,
//! which does the command's work unchanged. The parent then exits with the
//! child's status (128+N if it died of signal N), so the statuses are the
//! README's; its exit ends the container's pid namespace, which kills every
//! descendant left. The child's own children (the broker, the sandbox's
//! `__init`, tmux clients) stay the child's to reap: nothing here waits for
//! a pid the command knows.

use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

/// The signals passed on to the command.
const FORWARDED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// The signals the command finds blocked, as `serve` blocks them at its first
/// instruction: one forwarded before it installs its own handling is a clean
/// stop, not the default action.
const STOP: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

/// When this process is PID 1: forks, returns in the child (which goes on as
/// the command), and never returns in the parent. Otherwise does nothing.
/// Must run before any thread exists.
pub(crate) fn take_pid1_duties() {
    if nix::unistd::getpid().as_raw() != 1 {
        return;
    }
    let mut set: SigSet = FORWARDED.into_iter().collect();
    set.add(Signal::SIGCHLD);
    let mut old = SigSet::empty();
    if let Err(e) = nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old))
    {
        tracing::warn!("PID 1: blocking signals: {e}; not reaping orphans");
        return;
    }
    // PID 1 adopts orphans anyway; as a subreaper it also would outside a pid namespace.
    let _ = nix::sys::prctl::set_child_subreaper(true);
    // SAFETY: no thread exists yet (the caller's contract), so fork is sound.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let mut mask = old;
            STOP.into_iter().for_each(|s| mask.add(s));
            let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&mask), None);
            let _ = nix::sys::prctl::set_child_subreaper(false);
        }
        Ok(ForkResult::Parent { child }) => {
            release_stdio();
            std::process::exit(reap_until(child, &set))
        }
        Err(e) => {
            let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
            tracing::warn!("PID 1: fork: {e}; not reaping orphans");
        }
    }
}

/// The MCP client's pipes are the command's alone: its end of stdout is the
/// client's end of the session. stderr stays for PID 1's own messages.
fn release_stdio() {
    use std::os::fd::AsRawFd;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    for fd in [0, 1] {
        // SAFETY: plain descriptor calls on this process's own stdin/stdout.
        unsafe {
            match &null {
                Ok(n) => libc::dup2(n.as_raw_fd(), fd),
                Err(_) => libc::close(fd),
            };
        }
    }
}

/// Reaps every child that ends; forwards the signals in `set` but SIGCHLD to
/// `child`; returns `child`'s status once it ends.
fn reap_until(child: Pid, set: &SigSet) -> i32 {
    loop {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(p, c)) if p == child => return c,
                Ok(WaitStatus::Signaled(p, s, _)) if p == child => return 128 + s as i32,
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                // ECHILD: the child is gone without a status we saw.
                Err(_) => return crate::sandbox::EXIT_INTERNAL,
            }
        }
        match set.wait() {
            Ok(Signal::SIGCHLD) | Err(_) => {}
            Ok(s) => {
                let _ = kill(child, s);
            }
        }
    }
}
