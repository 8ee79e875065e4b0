//! PID 1 of the sandbox: its start-up as named steps, in the order [`run`]
//! takes them (the numbers are those of docs/architecture.md). What the mount
//! view holds and which layers are required come compiled in the plan.

use super::init::{fatal, internal, relay_signals, Layers, Stop};
use super::payload::{self, Exec};
use super::plan::{Blueprint, GitStep, HostView, MountNeed};
use super::reap::{end_descendants, reap};
use super::report::{Message, Refusal, Reporter};
use super::{caps, fds, keyring, limits, mounts, namespaces, net, seccomp};
use super::{Payload, Plan};
use crate::profile::{Layer, NetMode};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

/// PID 1, from the fork to the payload's end; returns the exit status.
pub(super) fn run(
    plan: &Plan,
    bp: &Blueprint,
    ns: &namespaces::Created,
    rep: &mut Reporter,
) -> Result<i32, Stop> {
    let relay = parent_death(ns)?;
    let best_effort = bp.best_effort();
    let mut layers = Layers {
        rep,
        best_effort: &best_effort,
    };
    layers.rep.note(|| "PID 1: the mount view".into());
    mount_view(plan, bp, ns, &mut layers)?;
    layers
        .rep
        .note(|| "PID 1: the git guard, hostname and loopback".into());
    needs_mount(bp.needs_mount, ns)?;
    git_guard(&bp.git, ns, &mut layers)?;
    hostname_and_loopback(bp, ns, &mut layers)?;
    layers
        .rep
        .note(|| "PID 1: rlimits, keyring, session, descriptors".into());
    rlimits_and_keyring(plan, ns, &mut layers)?;
    session_and_descriptors()?;
    let filters = seccomp::build().map_err(|e| Stop::applying(Layer::Seccomp, e.to_string()))?;
    let host_view = host_view(plan, bp, ns)?;
    let mut job = payload::Job::of(plan, bp, host_view);
    without_userns(plan, ns, &mut job, &mut layers)?;
    confine_before_fork(&job, &filters, &mut layers)?;
    become_subreaper(ns)?;
    layers.rep.note(|| "PID 1: starting the payload".into());
    let payload = spawn_payload(plan, &job, &filters, ns, &mut layers)?;
    hand_over(plan, bp, &job, ns, payload, &filters, &mut layers)?;
    let code = reap(payload, relay);
    if !ns.has(Layer::Pid) {
        end_descendants();
    }
    Ok(code)
}

/// Before step 4: PID 1's end when the relay ends. With a pid namespace,
/// PID 1's end ends everything inside. Without one it must live to end what
/// is left: the relay's death is a SIGTERM that `reap` sees come from an
/// orphaned PID 1. Returns the relay's pid in that case.
fn parent_death(ns: &namespaces::Created) -> Result<Option<Pid>, Stop> {
    let (death, relay) = if ns.has(Layer::Pid) {
        (Signal::SIGKILL, None)
    } else {
        (Signal::SIGTERM, Some(nix::unistd::getppid()))
    };
    nix::sys::prctl::set_pdeathsig(death)
        .map_err(|e| internal("PR_SET_PDEATHSIG")(e.to_string()))?;
    if relay.is_some_and(|r| r != nix::unistd::getppid()) {
        return Err(internal("start-up")("the relay exited"));
    }
    Ok(relay)
}

/// Step 8d: In `run` mode PID 1 needs no privilege after the fork: it drops
/// it and installs the filter once, and the payload inherits both (the
/// filter is costly to install, so this keeps it off the command's start-up
/// path). The tmux server's PID 1 still has a mount to make after the fork.
fn confine_before_fork(
    job: &payload::Job<'_>,
    filters: &seccomp::Filters,
    layers: &mut Layers<'_>,
) -> Result<(), Stop> {
    if job.pre_confined {
        payload::drop_privileges(layers)?;
        caps::set_nondumpable().map_err(internal("PR_SET_DUMPABLE"))?;
        payload::filter(layers, filters)?;
    }
    Ok(())
}

/// Step 8e: No pid namespace to end with us: orphans come here, not to the
/// host's init, so that they can be reaped and ended.
fn become_subreaper(ns: &namespaces::Created) -> Result<(), Stop> {
    if !ns.has(Layer::Pid) {
        nix::sys::prctl::set_child_subreaper(true)
            .map_err(|e| internal("PR_SET_CHILD_SUBREAPER")(e.to_string()))?;
    }
    Ok(())
}

/// Steps 10–11 and the hand-over to the supervisor: the socket covered, PID
/// 1 confined, the relayed signals blocked, `Ready` sent, the report pipe
/// closed. From here on a failure leaves a payload behind: end it first.
/// PID 1's exit kills the namespace anyway, so a failed kill changes nothing.
fn hand_over(
    plan: &Plan,
    bp: &Blueprint,
    job: &payload::Job<'_>,
    ns: &namespaces::Created,
    payload: Pid,
    filters: &seccomp::Filters,
    layers: &mut Layers<'_>,
) -> Result<(), Stop> {
    let stop = |stop: Stop| {
        let _ = kill(payload, Signal::SIGKILL);
        stop
    };
    let socket_watch = cover_socket(plan, bp, job, ns, payload).map_err(stop)?;
    if !job.pre_confined {
        confine_self(layers, filters, job).map_err(stop)?;
    }
    // Taken by sigwait from now on; blocked before the report pipe closes, so
    // a failure can still be reported.
    relay_signals()
        .thread_block()
        .map_err(|e| stop(internal("blocking the relayed signals")(e.to_string())))?;
    if let Payload::Tmux { .. } = &plan.payload {
        layers.rep.send(&Message::Ready {
            server_pid: payload.as_raw(),
        });
    }
    layers.rep.close();
    // Closing an inotify instance waits for an SRCU grace period (the
    // kernel's fsnotify_destroy_group, 8-16 ms): only once Ready is sent.
    drop(socket_watch);
    Ok(())
}

/// Step 4: The mount view: the plan's steps on a fresh root, then `pivot_root`.
fn mount_view(
    plan: &Plan,
    bp: &Blueprint,
    ns: &namespaces::Created,
    layers: &mut Layers<'_>,
) -> Result<(), Stop> {
    if !ns.has(Layer::Mount) {
        return Ok(());
    }
    let sources = mounts::Sources {
        newroot: &plan.rundir.join("root"),
        host_sock_dir: &plan.rundir.join("sock"),
        files: &plan.run_files,
    };
    let built = mounts::build_and_pivot(&bp.mounts, &sources, layers.best_effort).map_err(|f| {
        let stop = Stop::applying(f.layer, f.error.to_string());
        match f.refused {
            Some(by) => stop.refused(by),
            None => stop,
        }
    })?;
    for (layer, reason) in built.dropped {
        layers.rep.send(&Message::Dropped { layer, reason });
    }
    layers.ok(
        Layer::Mount,
        format!(
            "fresh root; {} entries, {} masked, {} protected paths read-only ({} parents pinned), {} git directories outside bound read-only",
            bp.counts.entries,
            built.masked.len(),
            built.protected.len(),
            bp.counts.pinned,
            bp.counts.git_outside,
        ),
    );
    Ok(())
}

/// Step 4a: what cannot be had without a mount namespace stops start-up,
/// whatever the git guard's mode.
fn needs_mount(need: Option<MountNeed>, ns: &namespaces::Created) -> Result<(), Stop> {
    if ns.has(Layer::Mount) {
        return Ok(());
    }
    match need {
        Some(MountNeed::Layer) => Err(Stop {
            unavailable: true,
            refused: None,
            layer: Some(Layer::Mount),
            message: "[workspace] mode = \"copy-on-write\" needs a mount namespace (the layer is an overlay over the workspace); without one, use mode = \"live\"".into(),
        }),
        Some(MountNeed::Commit) => Err(Stop {
            unavailable: true,
            refused: None,
            layer: Some(Layer::Git),
            message: "git = \"commit\" needs a mount namespace (the agent's repository is mounted over .git); use git = \"read-only\" here".into(),
        }),
        None => Ok(()),
    }
}

/// Step 4b: The git guard rides on the mount view (P8).
fn git_guard(
    step: &GitStep,
    ns: &namespaces::Created,
    layers: &mut Layers<'_>,
) -> Result<(), Stop> {
    let said = match step {
        GitStep::Unguarded => {
            layers.rep.send(&Message::Dropped {
                layer: Layer::Git,
                reason: "UNGUARDED by the profile ([workspace] git = \"unguarded\"): the agent can change what host git obeys".into(),
            });
            return Ok(());
        }
        GitStep::Guarded { said } => said,
    };
    if ns.has(Layer::Mount) {
        layers.ok(Layer::Git, said.clone());
        Ok(())
    } else {
        layers.missing(
            Layer::Git,
            "no mount namespace: git's control plane cannot be made read-only inside a writable workspace (only watched and reverted)",
        )
    }
}

/// Step 5: Hostname and loopback. A refused `sethostname` (a container's
/// seccomp profile denies it) is the `uts` layer's best-effort step: dropped
/// and reported when the profile lets `uts` go, fatal otherwise.
fn hostname_and_loopback(
    bp: &Blueprint,
    ns: &namespaces::Created,
    layers: &mut Layers<'_>,
) -> Result<(), Stop> {
    if ns.has(Layer::Uts) {
        let r = namespaces::set_hostname(&bp.identity.hostname)
            .map_err(|e| format!("sethostname: {e}"));
        layers
            .step(
                Layer::Uts,
                r,
                "the new UTS namespace keeps the hostname it was created with",
            )
            .map_err(|s| s.refused(Refusal::Sethostname))?;
    }
    // `none` and `loopback` alike: the sandbox's own loopback reaches nothing
    // outside, and a dev server with its client in the same sandbox works.
    if ns.has(Layer::Net) && matches!(bp.net.mode, NetMode::None | NetMode::Loopback) {
        net::loopback_up()
            .map_err(|e| Stop::applying(Layer::Net, format!("bringing lo up: {e}")))?;
    }
    Ok(())
}

/// Step 6: rlimits (inherited by everything below), then a fresh, empty session
/// keyring: keys of the caller's session stay outside (E8).
fn rlimits_and_keyring(
    plan: &Plan,
    ns: &namespaces::Created,
    layers: &mut Layers<'_>,
) -> Result<(), Stop> {
    // The kernel never applies RLIMIT_NPROC to host uid 0, so for root only
    // the cgroup limits processes (without a user namespace, root drops to
    // an unprivileged uid, which it does bind).
    let rl = limits::apply(&plan.blueprint.limits).map(|d| {
        if plan.host_uid == 0 && ns.has(Layer::Userns) {
            format!("{d} (nproc is not enforced for host root: the cgroup layer limits processes)")
        } else {
            d
        }
    });
    layers.result(Layer::Rlimits, rl)?;
    layers.result(Layer::Keyring, keyring::fresh_session())
}

/// Step 7–8: A new session (no controlling terminal from the host), and every
/// inherited descriptor above stderr closes at exec (the report pipe too).
fn session_and_descriptors() -> Result<(), Stop> {
    nix::unistd::setsid().map_err(|e| internal("setsid")(e.to_string()))?;
    fds::cloexec_above_stderr()
        .map(drop)
        .map_err(internal("inherited descriptors"))
}

/// Step 8b: tmux mode keeps its socket, configuration and gate in
/// `/run/sandmux`, which only a mount view has. Without one, as root with no
/// user namespace (a container runtime's defaults), they go to a host
/// directory only root can write (`hostview`) and everything confined drops
/// to an unprivileged uid; otherwise start-up stops, naming the ways out.
fn host_view<'a>(
    plan: &Plan,
    bp: &'a Blueprint,
    ns: &namespaces::Created,
) -> Result<Option<&'a HostView>, Stop> {
    if ns.has(Layer::Mount) || !matches!(plan.payload, Payload::Tmux { .. }) {
        return Ok(None);
    }
    let root = nix::unistd::geteuid().is_root();
    let why = match (&bp.host_view, ns.has(Layer::Userns), root) {
        (Some(h), false, true) => return Ok(Some(h)),
        (_, true, _) => return Err(Stop::applying(Layer::Mount, "tmux mode needs a mount namespace for /run/sandmux (its socket, configuration and pane gate), and no mount namespace could be made; sandmux run works without one").refused(Refusal::NoMountNamespace)),
        _ => "without user namespaces (a container runtime's seccomp profile refuses them) tmux mode must start as root, so that it can drop everything confined to an unprivileged uid and keep its socket from it by file permissions: run the container as root (no --user), or with the full-confinement flags (--security-opt seccomp=.../container/seccomp.json, and --security-opt unmask=/proc/* on podman or --security-opt systempaths=unconfined on docker); sandmux run works without either",
    };
    Err(Stop::applying(Layer::Mount, why.to_string()))
}

/// Step 8c: Without a user namespace, sandmux's own files are kept by
/// permissions and grants (`uid`): no write grant on a tree holding the
/// runtime directory, the host view or the binary (without a mount view),
/// and as root the drop to an unprivileged uid (in `run` mode PID 1 drops
/// now; in tmux mode the payload and, once the socket is covered, PID 1).
/// All of it is reported in the userns layer's line.
fn without_userns(
    plan: &Plan,
    ns: &namespaces::Created,
    job: &mut payload::Job<'_>,
    layers: &mut Layers<'_>,
) -> Result<(), Stop> {
    if ns.has(Layer::Userns) {
        return Ok(());
    }
    let mut said = vec![ns
        .missing
        .iter()
        .find(|m| m.layer == Layer::Userns)
        .map(|m| m.why.clone())
        .unwrap_or_else(|| "no user namespace".into())];
    if !ns.has(Layer::Mount) {
        said.extend(withhold_writes(plan, job)?);
    }
    if nix::unistd::geteuid().is_root() {
        said.push(drop_uid(plan, job)?);
    }
    layers.rep.send(&Message::Dropped {
        layer: Layer::Userns,
        reason: said.join("; "),
    });
    Ok(())
}

/// No write grant on a tree holding sandmux's own files (no mount view).
fn withhold_writes(plan: &Plan, job: &mut payload::Job<'_>) -> Result<Option<String>, Stop> {
    let exe = std::fs::read_link("/proc/self/exe")
        .map_err(|e| internal("reading /proc/self/exe")(e.to_string()))?;
    let mut keep = vec![plan.rundir.clone(), exe];
    keep.extend(job.host_view.map(|h| h.paths.run_dir.clone()));
    let withheld = job.withhold_writes(&keep);
    let trees: Vec<String> = withheld.iter().map(|p| p.display().to_string()).collect();
    Ok((!trees.is_empty()).then(|| {
        format!(
            "read-only instead of writable (they hold the runtime directory or the sandmux binary): {}",
            trees.join(", ")
        )
    }))
}

/// As root: the uid everything confined runs as (see [`without_userns`]);
/// with a host view, its files too. Returns what to report.
fn drop_uid(plan: &Plan, job: &mut payload::Job<'_>) -> Result<String, Stop> {
    let t = super::uid::target(&plan.blueprint);
    let now = job.pre_confined;
    let r = if now {
        super::uid::drop_uid(t)
    } else {
        super::uid::check(t)
    };
    let said = match r {
        // Without a mount view, tmux's socket is kept by permissions alone.
        Err(e) if job.host_view.is_some() => return Err(Stop::applying(Layer::Caps, e.to_string())),
        Err(e) if !super::uid::host_root() => {
            return Ok(format!(
                "confined processes keep uid 0, this user namespace's root, not the host's (the drop to uid {} failed: {e})",
                t.uid
            ))
        }
        Err(e) => return Err(Stop::applying(Layer::Caps, e.to_string())),
        Ok(d) => d,
    };
    if !now {
        job.drop_to = Some(t);
    }
    let Some(h) = job.host_view else {
        return Ok(said);
    };
    let relay = nix::unistd::getppid().as_raw() as u32;
    super::hostview::alone(t.uid, &[relay])
        .and_then(|()| super::hostview::make(plan, h, t))
        .map_err(|e| Stop::applying(Layer::Mount, e.to_string()))?;
    Ok(format!(
        "{said}; no mount view: tmux's socket, configuration and gate are in {} (root's; the socket's directory is closed to uid {} once the server listens)",
        h.paths.run_dir.display(),
        t.uid
    ))
}

/// Step 9: The payload: a child that confines itself, then execs.
fn spawn_payload(
    plan: &Plan,
    job: &payload::Job,
    filters: &seccomp::Filters,
    ns: &namespaces::Created,
    layers: &mut Layers<'_>,
) -> Result<Pid, Stop> {
    // SAFETY: PID 1 is single-threaded, so fork is sound.
    match unsafe { fork() }.map_err(|e| internal("fork the payload")(e.to_string()))? {
        ForkResult::Child => {
            let x = Exec {
                job,
                filters,
                net_isolated: ns.has(Layer::Net),
            };
            let code = match payload::confine_and_exec(plan, x, layers) {
                Ok(never) => match never {},
                Err(stop) => fatal(layers.rep, stop, 127),
            };
            // SAFETY: _exit in a forked child skips the parent's atexit handlers.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => Ok(child),
    }
}

/// Step 10: tmux: once the server listens, cover its socket directory for
/// everyone inside (the plan's after-ready mounts). Returns the inotify
/// instance that waited, for the caller to close later.
fn cover_socket(
    plan: &Plan,
    bp: &Blueprint,
    job: &payload::Job<'_>,
    ns: &namespaces::Created,
    server: Pid,
) -> Result<Option<nix::sys::inotify::Inotify>, Stop> {
    if !matches!(plan.payload, Payload::Tmux { .. }) {
        return Ok(None);
    }
    let sock = job.host_view.map_or(&bp.paths.socket, |h| &h.paths.socket);
    let watch = wait_for_socket(server, sock)
        .map_err(|e| internal("waiting for the tmux server")(e.to_string()))?;
    if ns.has(Layer::Mount) {
        mounts::after_ready(&bp.after_ready).map_err(|f| {
            let stop = Stop::applying(f.layer, f.error.to_string());
            match f.refused {
                Some(by) => stop.refused(by),
                None => stop,
            }
        })?;
    }
    if let Some(h) = job.host_view {
        super::hostview::cover(&h.paths.socket)
            .map_err(|e| Stop::applying(Layer::Mount, e.to_string()))?;
    }
    Ok(Some(watch))
}

/// Step 11: PID 1 itself: no capabilities, no new privileges, the same syscall
/// filter. A failure here ends the sandbox like any other (PID 1 outlives
/// everything inside). A layer the profile lets go (best_effort) was already
/// reported dropped by the payload, which met the same kernel; PID 1 goes
/// without it too.
fn confine_self(
    layers: &Layers<'_>,
    filters: &seccomp::Filters,
    job: &payload::Job<'_>,
) -> Result<(), Stop> {
    if let Some(t) = job.drop_to {
        super::uid::drop_uid(t).map_err(|e| Stop {
            unavailable: true,
            refused: None,
            layer: Some(Layer::Caps),
            message: format!("confining PID 1: {e}"),
        })?;
    }
    optional(layers, Layer::Caps, caps::drop_all().map(drop))
        .and_then(|_| optional(layers, Layer::NoNewPrivs, caps::set_no_new_privs()))
        .and_then(|_| caps::set_nondumpable().map_err(|e| (Layer::Caps, e.to_string())))
        .and_then(|_| optional(layers, Layer::Seccomp, seccomp::install(filters)))
        .map_err(|(layer, e)| Stop {
            unavailable: true,
            refused: None,
            layer: Some(layer),
            message: format!("confining PID 1: {e}"),
        })
}

/// A step of [`confine_self`]: the failure of a layer the profile lets go
/// is passed over; any other names its layer.
fn optional<E: std::fmt::Display>(
    layers: &Layers<'_>,
    l: Layer,
    r: Result<(), E>,
) -> Result<(), (Layer, String)> {
    match r {
        Err(_) if layers.best_effort.contains(&l) => Ok(()),
        Err(e) => Err((l, e.to_string())),
        Ok(()) => Ok(()),
    }
}

/// Why the tmux server's socket did not appear.
#[derive(Debug, thiserror::Error)]
enum SocketWait {
    #[error("{0}")]
    Watch(nix::Error),
    #[error("the tmux server exited before it listened")]
    Exited,
    #[error("the tmux server did not create its socket within 10 s")]
    TooLong,
    #[error("{0}: {1}")]
    Failed(&'static str, nix::Error),
}

/// Waits (event-driven, inotify) until the tmux socket exists, or the server
/// dies; returns the inotify instance (closing it is slow: see `run`).
fn wait_for_socket(
    server: Pid,
    sock: &std::path::Path,
) -> Result<nix::sys::inotify::Inotify, SocketWait> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let ino =
        Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).map_err(SocketWait::Watch)?;
    ino.add_watch(sock.parent().unwrap_or(sock), AddWatchFlags::IN_CREATE)
        .map_err(SocketWait::Watch)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if sock.exists() {
            return Ok(ino);
        }
        match waitpid(server, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => {
                return Err(SocketWait::Exited)
            }
            Ok(_) => {}
            Err(e) => return Err(SocketWait::Failed("waiting for the server", e)),
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(SocketWait::TooLong);
        }
        // A short cap on each wait also notices a server that dies without creating anything.
        let ms = left.as_millis().min(100) as u16;
        let mut fds = [PollFd::new(
            std::os::fd::AsFd::as_fd(&ino),
            PollFlags::POLLIN,
        )];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(SocketWait::Failed("poll", e)),
        }
        // The events only wake us: the socket's existence is checked by path.
        match ino.read_events() {
            Ok(_) | Err(nix::errno::Errno::EAGAIN) => {}
            Err(e) => return Err(SocketWait::Failed("reading inotify events", e)),
        }
    }
}
