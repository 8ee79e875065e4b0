//! How `serve` ends: termination signals are `serve`'s own from its first
//! instruction on, and every child is reaped before the process exits.
//!
//! [`Stop::install`] blocks SIGTERM, SIGINT and SIGHUP before any thread
//! exists, so every thread inherits the mask and no signal can take the
//! default action (death with status 143) at any later moment of start-up.
//! During start-up a stop signal stays pending, and start-up looks for it
//! between its steps (tearing down what exists, then exit status 0). Once the
//! supervisor has confined itself ([`crate::confine`]: Landlock
//! binds only threads started after it), [`Stop::take_signals`] starts the
//! thread that takes them with sigwait(2): it records the first and cancels
//! the stop token, which is the runtime's shutdown. Children do not inherit the mask: std's `Command`
//! (which tokio's uses) empties it in the child before exec, and
//! `sandmux __init` resets every signal again (`sandbox::init`).

use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The signals that stop `serve`.
const STOP_SIGNALS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

/// How long the last sweep waits for killed children to be reapable.
pub(crate) const REAP_LIMIT: Duration = Duration::from_secs(3);

/// A request to stop: the first termination signal, or any other cause that
/// cancels the token (stdin closed, `sandmux stop`, `kill_server`).
#[derive(Clone)]
pub(crate) struct Stop {
    token: CancellationToken,
    signal: Arc<AtomicI32>,
}

impl Stop {
    /// Blocks the stop signals in the calling thread. Call it on the main
    /// thread before any other thread is started (threads inherit the mask;
    /// one started earlier could still take a signal with its default action).
    pub(crate) fn install() -> Stop {
        if let Err(e) = stop_set().thread_block() {
            tracing::error!("blocking termination signals: {e}");
        }
        Stop {
            token: CancellationToken::new(),
            signal: Arc::new(AtomicI32::new(0)),
        }
    }

    /// Starts the thread that takes the stop signals (one already pending
    /// included) and cancels the token. Call it once, after confinement.
    pub(crate) fn take_signals(&self) {
        let set = stop_set();
        let s = self.clone();
        let spawned = std::thread::Builder::new()
            .name("sandmux-signals".into())
            .spawn(move || loop {
                if let Ok(sig) = set.wait() {
                    // The first signal is the one reported; later ones only
                    // arrive during the teardown it started.
                    let _ = s.signal.compare_exchange(
                        0,
                        sig as i32,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    );
                    s.token.cancel();
                }
            });
        if let Err(e) = spawned {
            tracing::error!("the signal thread: {e}");
        }
    }

    /// The token the runtime shuts down on.
    pub(crate) fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// The termination signal received so far, if any: taken by the signal
    /// thread, or still pending (before [`Stop::take_signals`]).
    pub(crate) fn signal(&self) -> Option<Signal> {
        match self.signal.load(Ordering::SeqCst) {
            0 => pending(),
            n => Signal::try_from(n).ok(),
        }
    }
}

fn stop_set() -> SigSet {
    let mut set = SigSet::empty();
    for s in STOP_SIGNALS {
        set.add(s);
    }
    set
}

/// A stop signal blocked and pending for this process, if any.
fn pending() -> Option<Signal> {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigpending fills the set it is given.
    if unsafe { libc::sigpending(set.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: initialised by the successful sigpending above.
    let set = unsafe { set.assume_init() };
    // SAFETY: sigismember only reads the initialised set.
    STOP_SIGNALS
        .into_iter()
        .find(|s| unsafe { libc::sigismember(&set, *s as i32) } == 1)
}

/// Ends `serve`: reaps every child, then exits with `code` (never through
/// the runtime: stdin's blocking reader would hold it).
pub(crate) fn finish(code: i32) -> ! {
    reap_children(REAP_LIMIT);
    std::process::exit(code)
}

/// The last step before `serve` exits: every child still there (the tmux
/// control clients of the last hub are killed but not yet collected, since
/// their reapers ran on the runtime that has stopped) is killed and reaped,
/// so none is left as a zombie for the parent to collect. A child's pid
/// cannot be reused before this process reaps it, so the kill cannot hit
/// another process. Returns how many were reaped.
pub(crate) fn reap_children(limit: Duration) -> usize {
    for pid in crate::sandbox::procfs::children_of(std::process::id()) {
        let _ = kill(pid, Signal::SIGKILL);
    }
    let deadline = Instant::now() + limit;
    let mut reaped = 0;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Ok(WaitStatus::StillAlive) => {
                tracing::warn!("a child did not end within {limit:?} of SIGKILL");
                return reaped;
            }
            Ok(_) => reaped += 1,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return reaped, // ECHILD: none left
        }
    }
}
