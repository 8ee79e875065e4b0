//! PID 1's end: it reaps every child until the payload ends, forwarding
//! termination to it, and without a pid namespace ends what the payload
//! left behind.

use super::init::relay_signals;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// PID 1's last job: reap every child; forward termination to the payload;
/// return when the payload ends (the kernel then kills the whole namespace;
/// without one, `end_descendants` follows). Without a pid namespace, a
/// signal to a PID 1 whose `relay` is gone (its parent-death signal) ends
/// the payload at once. The signals are blocked already.
pub(super) fn reap(payload: Pid, relay: Option<Pid>) -> i32 {
    let set = relay_signals();
    loop {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(p, c)) if p == payload => return c,
                Ok(WaitStatus::Signaled(p, s, _)) if p == payload => return 128 + s as i32,
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
        match set.wait() {
            Ok(Signal::SIGCHLD) | Err(_) => {}
            // The payload may be gone already (ESRCH): its status is the next wait's.
            Ok(s) => {
                let orphaned = relay.is_some_and(|r| r != nix::unistd::getppid());
                let _ = kill(payload, if orphaned { Signal::SIGKILL } else { s });
            }
        }
    }
}

/// Without a pid namespace, nothing ends what the payload left behind (a
/// daemon that double-forked): as their subreaper, PID 1 kills its children
/// until none is left (a killed child's own children come to it next), for
/// at most 5 s.
pub(super) fn end_descendants() {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Err(nix::errno::Errno::ECHILD) => return,
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
        for pid in super::procfs::children_of(std::process::id()) {
            let _ = kill(pid, Signal::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
