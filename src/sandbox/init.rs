//! `sandmux __init`: the sandbox's start-up, top to bottom, in a single-threaded
//! re-exec of the binary (namespace creation and Landlock act on the calling
//! thread, so this never runs inside the supervisor's runtime).
//!
//! ```text
//! outer (this file)         join cgroup → unshare namespaces → id maps → fork
//!   └─ PID 1 (pid1.rs)      mount view + pivot → git guard → hostname → loopback
//!        │                  → rlimits → keyring → setsid → close fds → fork payload
//!        │                  → [tmux: wait for socket, cover it] → confine itself → reap
//!        └─ payload         drop caps → no_new_privs → Landlock → seccomp → exec
//!           (payload.rs)    (tmux -D, or the command of `sandmux run`)
//! ```
//!
//! What the view holds, the Landlock rules and each layer's requirement come
//! compiled from the supervisor (`sandbox::plan`); these files only execute
//! them. The outer process stays outside the new pid namespace and only
//! relays signals and the exit status. Every layer is reported as it is
//! applied; a required layer that fails ends start-up with a `Fatal` report.
//! Every system call's result is checked: a failure is fatal, or a named
//! best-effort layer reported as dropped.

use super::cgroup::Placement;
use super::plan::Blueprint;
use super::report::{Message, Refusal, Reporter};
use super::{caps, namespaces, Plan, EXIT_INTERNAL, EXIT_LAYER};
use crate::profile::{Layer, NetMode};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use std::fmt::Display;
use std::io::Read;
use std::os::fd::FromRawFd;

/// File descriptor the plan arrives on.
pub(crate) const PLAN_FD: i32 = 3;
/// File descriptor reports leave on.
pub(crate) const REPORT_FD: i32 = 4;

/// Why `__init` could not begin: its signal state, or the plan.
#[derive(Debug, thiserror::Error)]
enum BeginError {
    /// Signals could not be unblocked.
    #[error("unblocking signals: {0}")]
    Unblock(nix::Error),
    /// A signal's disposition could not be reset.
    #[error("resetting {signal}: {source}")]
    Reset { signal: Signal, source: nix::Error },
    /// The plan could not be read.
    #[error("reading the plan: {0}")]
    Read(std::io::Error),
    /// The plan could not be parsed.
    #[error("reading the plan: {0}")]
    Parse(serde_json::Error),
}

/// Why start-up stopped.
pub(super) struct Stop {
    pub(super) layer: Option<Layer>,
    pub(super) message: String,
    /// The layer is missing on this machine (as opposed to failing to apply).
    pub(super) unavailable: bool,
    /// What refused it, where the fix depends on that.
    pub(super) refused: Option<Refusal>,
}

impl Stop {
    /// A layer that failed to apply here.
    pub(super) fn applying(layer: Layer, message: impl Into<String>) -> Stop {
        Stop {
            unavailable: false,
            layer: Some(layer),
            message: message.into(),
            refused: None,
        }
    }

    /// The same stop, saying what refused it.
    pub(super) fn refused(self, by: Refusal) -> Stop {
        Stop {
            refused: Some(by),
            ..self
        }
    }
}

/// Reports why start-up stopped and returns the exit status: `EXIT_LAYER`
/// for a layer, else `other`.
pub(super) fn fatal(rep: &mut Reporter, stop: Stop, other: i32) -> i32 {
    let code = if stop.layer.is_some() {
        EXIT_LAYER
    } else {
        other
    };
    rep.send(&Message::Fatal {
        layer: stop.layer,
        message: stop.message,
        unavailable: stop.unavailable,
        refused: stop.refused,
    });
    code
}

/// Records a layer's outcome: enforced, dropped (best-effort) or fatal.
pub(super) struct Layers<'a> {
    pub(super) rep: &'a mut Reporter,
    pub(super) best_effort: &'a std::collections::BTreeSet<Layer>,
}

impl Layers<'_> {
    pub(super) fn ok(&mut self, layer: Layer, detail: impl Into<String>) {
        self.rep.send(&Message::Enforced {
            layer,
            detail: detail.into(),
        });
    }

    pub(super) fn missing(&mut self, layer: Layer, reason: impl Into<String>) -> Result<(), Stop> {
        self.refused(layer, reason.into(), None)
    }

    /// [`Self::missing`], saying what refused the layer.
    pub(super) fn refused(
        &mut self,
        layer: Layer,
        reason: String,
        refused: Option<Refusal>,
    ) -> Result<(), Stop> {
        if self.best_effort.contains(&layer) {
            self.rep.send(&Message::Dropped { layer, reason });
            Ok(())
        } else {
            Err(Stop {
                unavailable: true,
                layer: Some(layer),
                message: reason,
                refused,
            })
        }
    }

    /// A best-effort step of `layer`: on failure the layer is reported
    /// dropped (the error, then `note`: what that leaves) when the profile
    /// lets it go; otherwise start-up ends with the layer failing to apply.
    pub(super) fn step<E: Display>(
        &mut self,
        layer: Layer,
        r: Result<(), E>,
        note: &str,
    ) -> Result<(), Stop> {
        match r {
            Ok(()) => Ok(()),
            Err(e) if self.best_effort.contains(&layer) => {
                let reason = format!("{e}; {note}");
                self.rep.send(&Message::Dropped { layer, reason });
                Ok(())
            }
            Err(e) => Err(Stop::applying(layer, e.to_string())),
        }
    }

    /// A layer's outcome: enforced with what to report, or missing
    /// (dropped or fatal, as [`Self::missing`]) with the error's text.
    pub(super) fn result<E: Display>(
        &mut self,
        layer: Layer,
        r: Result<String, E>,
    ) -> Result<(), Stop> {
        match r {
            Ok(d) => {
                self.ok(layer, d);
                Ok(())
            }
            Err(e) => self.missing(layer, e.to_string()),
        }
    }
}

/// Entry point of `sandmux __init`. Never returns.
pub(crate) fn main() -> ! {
    let clean = reset_signals();
    // SAFETY: the supervisor hands us fd 3 (plan) and fd 4 (report) and nothing else uses them.
    let (mut plan_in, report) = unsafe {
        (
            std::fs::File::from_raw_fd(PLAN_FD),
            std::fs::File::from_raw_fd(REPORT_FD),
        )
    };
    let mut rep = Reporter::new(report);
    let mut buf = Vec::new();
    let plan: Plan = match clean.and_then(|_| {
        plan_in
            .read_to_end(&mut buf)
            .map_err(BeginError::Read)
            .and_then(|_| serde_json::from_slice(&buf).map_err(BeginError::Parse))
    }) {
        Ok(p) => p,
        Err(e) => {
            rep.send(&Message::Fatal {
                layer: None,
                message: e.to_string(),
                unavailable: false,
                refused: None,
            });
            std::process::exit(EXIT_INTERNAL);
        }
    };
    drop(plan_in);
    rep.notes(&plan.log);
    rep.note(|| "init: the plan read".into());
    match outer(&plan, &plan.blueprint, &mut rep) {
        Ok(code) => std::process::exit(code),
        Err(stop) => {
            std::process::exit(fatal(&mut rep, stop, EXIT_INTERNAL));
        }
    }
}

pub(super) fn internal<E: Display>(what: &str) -> impl FnOnce(E) -> Stop + '_ {
    move |e| Stop {
        unavailable: false,
        refused: None,
        layer: None,
        message: format!("{what}: {e}"),
    }
}

fn outer(plan: &Plan, bp: &Blueprint, rep: &mut Reporter) -> Result<i32, Stop> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| internal("PR_SET_PDEATHSIG")(e.to_string()))?;
    if nix::unistd::getppid().as_raw() != plan.supervisor_pid {
        return Err(internal("start-up")("the supervisor exited"));
    }
    let best_effort = bp.best_effort();
    let mut layers = Layers {
        rep,
        best_effort: &best_effort,
    };
    join_cgroup(plan, &mut layers)?;
    layers.rep.note(|| "init: the namespaces".into());
    let ns = namespaces(plan, &mut layers)?;
    proxy_listener(bp.net.mode, &ns)?;
    layers.rep.note(|| "init: forking PID 1".into());
    fork_pid1(plan, bp, &ns, layers)
}

/// Step 1: the cgroup (created by the supervisor), joined before any
/// namespace exists.
fn join_cgroup(plan: &Plan, layers: &mut Layers<'_>) -> Result<(), Stop> {
    let limits = &plan.blueprint.limits;
    match &plan.cgroup {
        Placement::In(cg) => {
            cg.join_self().map_err(|e| Stop {
                unavailable: false,
                refused: None,
                layer: Some(Layer::Cgroup),
                message: format!("joining {}: {e}", cg.dirs[0].display()),
            })?;
            layers.ok(
                Layer::Cgroup,
                format!(
                    "{} pids.max={} memory={}",
                    cg.place(),
                    limits.processes,
                    limits.memory.0
                ),
            );
            Ok(())
        }
        Placement::Without { why } => layers.missing(Layer::Cgroup, why.clone()),
    }
}

/// Step 2: the namespaces, in one unshare (no pid namespace where a fresh
/// procfs would be refused and the profile lets pid go); then the
/// single-id user mapping.
fn namespaces(plan: &Plan, layers: &mut Layers<'_>) -> Result<namespaces::Created, Stop> {
    let bp = &plan.blueprint;
    let no_pid = bp
        .best_effort()
        .contains(&Layer::Pid)
        .then(namespaces::proc_covered)
        .flatten();
    let ns = namespaces::create(bp.net.mode, no_pid);
    for m in &ns.missing {
        layers.refused(m.layer, m.why.clone(), m.refused)?;
    }
    if bp.net.mode == NetMode::Host {
        // The profile chose this: reported as dropped whatever best_effort says.
        layers.rep.send(&Message::Dropped {
            layer: Layer::Net,
            reason: "network mode 'host': the host's network is shared; only Landlock TCP port rules limit it (UDP is not limited)".into(),
        });
    }
    if ns.has(Layer::Userns) {
        namespaces::write_id_maps(bp.identity.uid, plan.host_uid, plan.host_gid).map_err(|e| {
            Stop {
                unavailable: false,
                refused: None,
                layer: Some(Layer::Userns),
                message: format!("writing the id maps: {e}"),
            }
        })?;
        let l = &bp.limits;
        // Where /proc/sys cannot be written (a container runtime's masks)
        // the cap is said to be missing, not fatal: the runtime's own
        // limits are the host's there, and the layers a masked /proc
        // refuses (pid) say what to do.
        let inotify = match namespaces::cap_inotify(l.inotify_watches, l.inotify_instances) {
            Ok((w, i)) => format!("inotify capped at {w} watches, {i} instances"),
            Err(e) => format!("inotify NOT capped ({e}: /proc/sys/user cannot be written here)"),
        };
        layers.ok(
            Layer::Userns,
            format!(
                "host uid {} → uid {} inside, nothing else mapped; {inotify}",
                plan.host_uid, bp.identity.uid
            ),
        );
    }
    for l in [Layer::Pid, Layer::Ipc, Layer::Uts, Layer::Net] {
        if ns.has(l) {
            layers.ok(l, "new namespace");
        }
    }
    Ok(ns)
}

/// Step 2b: proxy mode's listener is made here, in the new network
/// namespace, and handed to the supervisor, which serves it.
fn proxy_listener(mode: NetMode, ns: &namespaces::Created) -> Result<(), Stop> {
    if mode != NetMode::Proxy {
        return Ok(());
    }
    if !ns.has(Layer::Net) {
        return Err(Stop::applying(
            Layer::Net,
            "network mode 'proxy' needs the sandbox's own network namespace",
        ));
    }
    super::net::send_listener()
        .map_err(|e| Stop::applying(Layer::Net, format!("the proxy's listener: {e}")))
}

/// Step 3: fork. The child is PID 1 of the new pid namespace; this process
/// relays termination signals to it and returns its status.
fn fork_pid1(
    plan: &Plan,
    bp: &Blueprint,
    ns: &namespaces::Created,
    layers: Layers<'_>,
) -> Result<i32, Stop> {
    // SAFETY: this process is single-threaded (a fresh exec), so fork is sound.
    match unsafe { fork() }.map_err(|e| internal("fork PID 1")(e.to_string()))? {
        ForkResult::Child => {
            let code = match super::pid1::run(plan, bp, ns, layers.rep) {
                Ok(c) => c,
                Err(stop) => fatal(layers.rep, stop, EXIT_INTERNAL),
            };
            std::process::exit(code)
        }
        ForkResult::Parent { child } => {
            // The relay keeps no privilege in the new user namespace either,
            // and takes termination signals only through sigwait.
            let ready = relay_privileges(plan, ns)
                .map_err(|e| Stop::applying(Layer::Caps, format!("the relay outside PID 1: {e}")))
                .and_then(|_| {
                    relay_signals()
                        .thread_block()
                        .map_err(|e| internal("blocking the relayed signals")(e.to_string()))
                });
            if let Err(stop) = ready {
                // Best-effort cleanup on the way out: PID 1 also dies with its
                // parent (PR_SET_PDEATHSIG), so a failed kill changes nothing.
                let _ = kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                return Err(stop);
            }
            layers.rep.close();
            Ok(relay(child))
        }
    }
}

/// The relay gives up every privilege. Without a user namespace, as root,
/// it becomes the uid PID 1 drops to, so it can still pass signals on (no
/// capability to signal another uid is kept); where that drop cannot be
/// made, PID 1 keeps uid 0 too and the capabilities go.
fn relay_privileges(plan: &Plan, ns: &namespaces::Created) -> Result<(), caps::CapsError> {
    if !ns.has(Layer::Userns)
        && nix::unistd::geteuid().is_root()
        && super::uid::drop_uid(super::uid::target(&plan.blueprint)).is_ok()
    {
        return caps::set_nondumpable();
    }
    caps::drop_all().map(drop)
}

/// Starts from a clean signal state: nothing blocked, every disposition default
/// (the supervisor may block or ignore signals, and both survive exec).
fn reset_signals() -> Result<(), BeginError> {
    use nix::sys::signal::{signal, SigHandler};
    SigSet::all()
        .thread_unblock()
        .map_err(BeginError::Unblock)?;
    for s in Signal::iterator() {
        if s != Signal::SIGKILL && s != Signal::SIGSTOP {
            // SAFETY: installing SIG_DFL runs no handler code.
            unsafe { signal(s, SigHandler::SigDfl) }
                .map_err(|source| BeginError::Reset { signal: s, source })?;
        }
    }
    Ok(())
}

/// The signals the relay and PID 1 take by `sigwait`: children, and the
/// termination signals they pass on.
pub(super) fn relay_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        set.add(s);
    }
    set
}

/// The outer process: relay termination signals to PID 1 and return its
/// status (the signals are blocked already).
fn relay(child: Pid) -> i32 {
    let set = relay_signals();
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, c)) => return c,
            Ok(WaitStatus::Signaled(_, s, _)) => return 128 + s as i32,
            Err(_) => return EXIT_INTERNAL,
            _ => {}
        }
        match set.wait() {
            Ok(Signal::SIGCHLD) | Err(_) => {}
            // PID 1 may be gone already (ESRCH): its status is the next wait's.
            Ok(s) => {
                let _ = kill(child, s);
            }
        }
    }
}
