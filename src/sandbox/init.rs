//! `sandmux __init`: the sandbox's start-up, top to bottom, in a single-threaded
//! re-exec of the binary (namespace creation and Landlock act on the calling
//! thread, so this never runs inside the supervisor's runtime).
//!
//! ```text
//! outer (this process)      join cgroup → unshare namespaces → id maps → fork
//!   └─ PID 1                mounts + pivot → hostname → loopback → rlimits → setsid
//!        │                  → close fds → fork payload → [tmux: wait for socket, hide it]
//!        │                  → drop caps, no_new_privs, seccomp → reap until the payload ends
//!        └─ payload         drop caps → no_new_privs → Landlock → seccomp → exec
//!                           (tmux -D, or the command of `sandmux run`)
//! ```
//!
//! The outer process stays outside the new pid namespace and only relays
//! signals and the exit status. Every layer is reported as it is applied; a
//! required layer that fails ends start-up with a `Fatal` report.

use super::report::{Message, Reporter};
use super::{caps, fds, keyring, landlock, limits, mounts, namespaces, net, seccomp};
use super::{Payload, Plan, EXIT_INTERNAL, EXIT_LAYER};
use crate::profile::{Layer, NetMode};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use std::ffi::{CString, OsString};
use std::io::Read;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;

/// File descriptor the plan arrives on.
pub const PLAN_FD: i32 = 3;
/// File descriptor reports leave on.
pub const REPORT_FD: i32 = 4;

/// Why start-up stopped.
struct Stop {
    layer: Option<Layer>,
    message: String,
    /// The layer is missing on this machine (as opposed to failing to apply).
    unavailable: bool,
}

/// Reports why start-up stopped and returns the exit status: `EXIT_LAYER`
/// for a layer, else `other`.
fn fatal(rep: &mut Reporter, stop: Stop, other: i32) -> i32 {
    let code = if stop.layer.is_some() {
        EXIT_LAYER
    } else {
        other
    };
    rep.send(&Message::Fatal {
        layer: stop.layer,
        message: stop.message,
        unavailable: stop.unavailable,
    });
    code
}

/// Records a layer's outcome: enforced, dropped (best-effort) or fatal.
struct Layers<'a> {
    rep: &'a mut Reporter,
    best_effort: &'a std::collections::BTreeSet<Layer>,
}

impl Layers<'_> {
    fn ok(&mut self, layer: Layer, detail: impl Into<String>) {
        self.rep.send(&Message::Enforced {
            layer,
            detail: detail.into(),
        });
    }

    fn missing(&mut self, layer: Layer, reason: impl Into<String>) -> Result<(), Stop> {
        let reason = reason.into();
        if self.best_effort.contains(&layer) {
            self.rep.send(&Message::Dropped { layer, reason });
            Ok(())
        } else {
            Err(Stop {
                unavailable: true,
                layer: Some(layer),
                message: reason,
            })
        }
    }

    fn result(&mut self, layer: Layer, r: Result<String, String>) -> Result<(), Stop> {
        match r {
            Ok(d) => {
                self.ok(layer, d);
                Ok(())
            }
            Err(e) => self.missing(layer, e),
        }
    }
}

/// Entry point of `sandmux __init`. Never returns.
pub fn main() -> ! {
    reset_signals();
    // SAFETY: the supervisor hands us fd 3 (plan) and fd 4 (report) and nothing else uses them.
    let (mut plan_in, report) = unsafe {
        (
            std::fs::File::from_raw_fd(PLAN_FD),
            std::fs::File::from_raw_fd(REPORT_FD),
        )
    };
    let mut rep = Reporter::new(report);
    let mut buf = Vec::new();
    let plan: Plan = match plan_in
        .read_to_end(&mut buf)
        .map_err(|e| e.to_string())
        .and_then(|_| serde_json::from_slice(&buf).map_err(|e| e.to_string()))
    {
        Ok(p) => p,
        Err(e) => {
            rep.send(&Message::Fatal {
                layer: None,
                message: format!("reading the plan: {e}"),
                unavailable: false,
            });
            std::process::exit(EXIT_INTERNAL);
        }
    };
    drop(plan_in);
    match outer(&plan, &mut rep) {
        Ok(code) => std::process::exit(code),
        Err(stop) => {
            std::process::exit(fatal(&mut rep, stop, EXIT_INTERNAL));
        }
    }
}

fn internal(what: &str) -> impl FnOnce(String) -> Stop + '_ {
    move |e| Stop {
        unavailable: false,
        layer: None,
        message: format!("{what}: {e}"),
    }
}

fn outer(plan: &Plan, rep: &mut Reporter) -> Result<i32, Stop> {
    let policy = &plan.policy;
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| internal("PR_SET_PDEATHSIG")(e.to_string()))?;
    if nix::unistd::getppid().as_raw() != plan.supervisor_pid {
        return Err(internal("start-up")("the supervisor exited".into()));
    }
    let mut layers = Layers {
        rep,
        best_effort: &policy.best_effort,
    };

    // 1. cgroup (created by the supervisor): join before any namespace exists.
    match &plan.cgroup {
        Ok(cg) => {
            cg.join_self().map_err(|e| Stop {
                unavailable: false,
                layer: Some(Layer::Cgroup),
                message: format!("joining {}: {e}", cg.dirs[0].display()),
            })?;
            layers.ok(
                Layer::Cgroup,
                format!(
                    "{} pids.max={} memory={}",
                    cg.place(),
                    policy.limits.processes,
                    policy.limits.memory.0
                ),
            );
        }
        Err(reason) => layers.missing(Layer::Cgroup, reason.clone())?,
    }

    // 2. Namespaces, in one unshare; then the single-id user mapping.
    let ns = namespaces::create(policy.network.mode);
    for (layer, why) in &ns.missing {
        layers.missing(*layer, why.clone())?;
    }
    if policy.network.mode == NetMode::Host {
        // The profile chose this: reported as dropped whatever best_effort says.
        layers.rep.send(&Message::Dropped {
            layer: Layer::Net,
            reason: "network mode 'host': the host's network is shared; only Landlock TCP port rules limit it (UDP is not limited)".into(),
        });
    }
    if ns.has(Layer::Userns) {
        namespaces::write_id_maps(policy.sandbox.uid, plan.host_uid, plan.host_gid).map_err(
            |e| Stop {
                unavailable: false,
                layer: Some(Layer::Userns),
                message: format!("writing the id maps: {e}"),
            },
        )?;
        layers.ok(
            Layer::Userns,
            format!(
                "host uid {} → uid {} inside, nothing else mapped",
                plan.host_uid, policy.sandbox.uid
            ),
        );
    }
    for l in [Layer::Pid, Layer::Ipc, Layer::Uts, Layer::Net] {
        if ns.has(l) {
            layers.ok(l, "new namespace");
        }
    }

    // 3. Fork: the child is PID 1 of the new pid namespace.
    // SAFETY: this process is single-threaded (a fresh exec), so fork is sound.
    match unsafe { fork() }.map_err(|e| internal("fork PID 1")(e.to_string()))? {
        ForkResult::Child => {
            let code = match pid1(plan, &ns, layers.rep) {
                Ok(c) => c,
                Err(stop) => fatal(layers.rep, stop, EXIT_INTERNAL),
            };
            std::process::exit(code)
        }
        ForkResult::Parent { child } => {
            // The relay keeps no privilege in the new user namespace either.
            if let Err(e) = caps::drop_all() {
                let _ = kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                return Err(Stop {
                    unavailable: false,
                    layer: Some(Layer::Caps),
                    message: format!("the relay outside PID 1: {e}"),
                });
            }
            layers.rep.close();
            Ok(relay(child))
        }
    }
}

/// Starts from a clean signal state: nothing blocked, every disposition default
/// (the supervisor may block or ignore signals, and both survive exec).
fn reset_signals() {
    use nix::sys::signal::{signal, SigHandler};
    let _ = SigSet::all().thread_unblock();
    for s in Signal::iterator() {
        if s != Signal::SIGKILL && s != Signal::SIGSTOP {
            // SAFETY: installing SIG_DFL runs no handler code.
            let _ = unsafe { signal(s, SigHandler::SigDfl) };
        }
    }
}

/// The outer process: relay termination signals to PID 1 and return its status.
fn relay(child: Pid) -> i32 {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        set.add(s);
    }
    let _ = set.thread_block();
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, c)) => return c,
            Ok(WaitStatus::Signaled(_, s, _)) => return 128 + s as i32,
            Err(_) => return EXIT_INTERNAL,
            _ => {}
        }
        match set.wait() {
            Ok(Signal::SIGCHLD) | Err(_) => {}
            Ok(s) => {
                let _ = kill(child, s);
            }
        }
    }
}

fn pid1(plan: &Plan, ns: &namespaces::Created, rep: &mut Reporter) -> Result<i32, Stop> {
    let policy = &plan.policy;
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    let mut layers = Layers {
        rep,
        best_effort: &policy.best_effort,
    };

    // 4. Mounts: the new root, then pivot into it.
    if ns.has(Layer::Mount) {
        let built = mounts::build_and_pivot(
            policy,
            &plan.rundir.join("root"),
            &plan.rundir.join("sock"),
            &plan.run_files,
        )
        .map_err(|e| Stop {
            unavailable: false,
            layer: Some(Layer::Mount),
            message: e.to_string(),
        })?;
        layers.ok(
            Layer::Mount,
            format!(
                "fresh root; {} entries, {} masked, {} protected paths read-only ({} parents pinned), {} git directories outside bound read-only",
                policy.fs.len(),
                built.masked.len(),
                built.protected.len(),
                policy.pinned.len(),
                policy.guard.git_outside.len(),
            ),
        );
    }
    // 4b. The git guard rides on the mount view (P8).
    if policy.guard.git == crate::guard::GitMode::Unguarded {
        layers.rep.send(&Message::Dropped {
            layer: Layer::Git,
            reason: "UNGUARDED by the profile ([workspace] git = \"unguarded\"): the agent can change what host git obeys".into(),
        });
    } else if policy.guard.commit.is_some() && !ns.has(Layer::Mount) {
        return Err(Stop {
            unavailable: true,
            layer: Some(Layer::Git),
            message: "git = \"commit\" needs a mount namespace (the agent's repository is mounted over .git); use git = \"read-only\" here".into(),
        });
    } else {
        if ns.has(Layer::Mount) {
            layers.ok(Layer::Git, policy.guard.describe(true).join(" | "));
        } else {
            layers.missing(
                Layer::Git,
                "no mount namespace: git's control plane cannot be made read-only inside a writable workspace (only watched and reverted)",
            )?;
        }
    }

    // 5. Hostname and loopback.
    if ns.has(Layer::Uts) {
        namespaces::set_hostname(&policy.sandbox.hostname).map_err(|e| Stop {
            unavailable: false,
            layer: Some(Layer::Uts),
            message: format!("sethostname: {e}"),
        })?;
    }
    if ns.has(Layer::Net) && policy.network.mode == NetMode::Loopback {
        net::loopback_up().map_err(|e| Stop {
            unavailable: false,
            layer: Some(Layer::Net),
            message: format!("bringing lo up: {e}"),
        })?;
    }

    // 6. rlimits (inherited by everything below). The kernel never applies
    // RLIMIT_NPROC to host uid 0, so for root only the cgroup limits processes.
    let rl = limits::apply(&policy.limits).map(|d| {
        if plan.host_uid == 0 {
            format!("{d} (nproc is not enforced for host root: the cgroup layer limits processes)")
        } else {
            d
        }
    });
    layers.result(Layer::Rlimits, rl)?;

    // A fresh, empty session keyring: keys of the caller's session stay outside (E8).
    layers.result(Layer::Keyring, keyring::fresh_session())?;

    // 7. A new session: no controlling terminal from the host.
    nix::unistd::setsid().map_err(|e| internal("setsid")(e.to_string()))?;

    // 8. Every inherited descriptor above stderr closes at exec (the report pipe too).
    fds::cloexec_above_stderr().map_err(internal("inherited descriptors"))?;

    let filters = seccomp::build().map_err(|e| Stop {
        unavailable: false,
        layer: Some(Layer::Seccomp),
        message: e.to_string(),
    })?;
    let (argv, role) = match &plan.payload {
        Payload::Command { argv, .. } => (argv.clone(), landlock::Role::Command),
        Payload::Tmux { tmux, .. } => (
            vec![
                tmux.clone().into_os_string(),
                "-D".into(),
                "-f".into(),
                "/run/sandmux/tmux.conf".into(),
                "-S".into(),
                super::SOCKET_INSIDE.into(),
            ],
            landlock::Role::Server,
        ),
    };
    let env = plan.env.clone();
    let cwd = match &plan.payload {
        Payload::Command { cwd, .. } => cwd.clone(),
        Payload::Tmux { .. } => policy.workspace.clone(),
    };

    // In `run` mode PID 1 needs no privilege after the fork: it drops it and
    // installs the filter once, and the payload inherits both (the filter is
    // costly to install, so this keeps it off the command's start-up path).
    // The tmux server's PID 1 still has a mount to make after the fork.
    let pre_confined = matches!(plan.payload, Payload::Command { .. });
    if pre_confined {
        drop_privileges(&mut layers)?;
        caps::set_nondumpable().map_err(internal("PR_SET_DUMPABLE"))?;
        filter(&mut layers, &filters)?;
    }

    // 9. The payload: confine, then exec.
    // SAFETY: PID 1 is single-threaded, so fork is sound.
    let payload =
        match unsafe { fork() }.map_err(|e| internal("fork the payload")(e.to_string()))? {
            ForkResult::Child => {
                let code = match confine_and_exec(
                    plan,
                    Exec {
                        role,
                        filters: &filters,
                        argv: &argv,
                        env: &env,
                        cwd: &cwd,
                        net_isolated: ns.has(Layer::Net),
                        pre_confined,
                    },
                    &mut layers,
                ) {
                    Ok(never) => match never {},
                    Err(stop) => fatal(layers.rep, stop, 127),
                };
                // SAFETY: _exit in a forked child skips the parent's atexit handlers.
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => child,
        };

    // 10. tmux: once the server listens, hide its socket directory from everyone inside.
    if let Payload::Tmux { .. } = &plan.payload {
        wait_for_socket(payload).map_err(internal("waiting for the tmux server"))?;
        if ns.has(Layer::Mount) {
            mounts::hide_socket_dir().map_err(|e| Stop {
                unavailable: false,
                layer: Some(Layer::Mount),
                message: e.to_string(),
            })?;
        }
    }

    // 11. PID 1 itself: no capabilities, no new privileges, the same syscall filter.
    // A failure here ends the sandbox like any other (PID 1 outlives everything inside).
    // A layer the profile lets go (best_effort) was already reported dropped by
    // the payload, which met the same kernel; PID 1 goes without it too.
    let harden = if pre_confined {
        Ok(())
    } else {
        let optional = |l: Layer, r: Result<(), String>| match r {
            Err(_) if layers.best_effort.contains(&l) => Ok(()),
            Err(e) => Err((l, e)),
            Ok(()) => Ok(()),
        };
        optional(Layer::Caps, caps::drop_all().map(drop))
            .and_then(|_| optional(Layer::NoNewPrivs, caps::set_no_new_privs()))
            .and_then(|_| caps::set_nondumpable().map_err(|e| (Layer::Caps, e)))
            .and_then(|_| {
                optional(
                    Layer::Seccomp,
                    seccomp::install(&filters).map_err(|e| e.to_string()),
                )
            })
    };
    if let Err((layer, e)) = harden {
        let _ = kill(payload, Signal::SIGKILL);
        return Err(Stop {
            unavailable: true,
            layer: Some(layer),
            message: format!("confining PID 1: {e}"),
        });
    }
    if let Payload::Tmux { .. } = &plan.payload {
        layers.rep.send(&Message::Ready {
            server_pid: payload.as_raw(),
        });
    }
    layers.rep.close();
    Ok(reap(payload))
}

type Never = std::convert::Infallible;

/// What the payload child execs, and how it is confined.
struct Exec<'a> {
    role: landlock::Role,
    filters: &'a seccomp::Filters,
    argv: &'a [OsString],
    env: &'a [(OsString, OsString)],
    cwd: &'a std::path::Path,
    net_isolated: bool,
    /// PID 1 already dropped privileges and installed the filter (run mode).
    pre_confined: bool,
}

/// Capabilities, then `no_new_privs` (which Landlock and seccomp need).
fn drop_privileges(layers: &mut Layers<'_>) -> Result<(), Stop> {
    layers.result(Layer::Caps, caps::drop_all())?;
    match caps::set_no_new_privs() {
        Ok(()) => layers.ok(Layer::NoNewPrivs, "set"),
        Err(e) => layers.missing(Layer::NoNewPrivs, e)?,
    }
    Ok(())
}

/// The syscall filter.
fn filter(layers: &mut Layers<'_>, filters: &seccomp::Filters) -> Result<(), Stop> {
    match seccomp::install(filters) {
        Ok(()) => layers.ok(
            Layer::Seccomp,
            format!(
                "{} filters: x32 guard, allowlist (ENOSYS), denylist (EPERM)",
                filters.count()
            ),
        ),
        Err(e) => layers.missing(Layer::Seccomp, e.to_string())?,
    }
    Ok(())
}

fn confine_and_exec(plan: &Plan, x: Exec<'_>, layers: &mut Layers<'_>) -> Result<Never, Stop> {
    let Exec {
        role,
        filters,
        argv,
        env,
        cwd,
        net_isolated,
        pre_confined,
    } = x;
    let policy = &plan.policy;
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    let mut set = SigSet::empty();
    set.add(Signal::SIGCHLD);
    let _ = set.thread_unblock();

    if !pre_confined {
        drop_privileges(layers)?;
    }
    match landlock::restrict(policy, role, net_isolated) {
        Ok(o) => {
            layers.ok(Layer::Landlock, o.detail.clone());
            if policy.network.mode == NetMode::Host && o.net {
                let ports = |v: &[u16]| {
                    v.iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                };
                layers.ok(
                    Layer::LandlockNet,
                    format!(
                        "connect tcp [{}], bind tcp [{}]",
                        ports(&policy.network.connect_tcp),
                        ports(&policy.network.bind_tcp)
                    ),
                );
            }
            if o.scoped {
                layers.ok(
                    Layer::LandlockScope,
                    "signals and abstract unix sockets scoped to the sandbox",
                );
            }
            for (l, why) in o.missing {
                layers.missing(l, why)?;
            }
        }
        Err((layer, why)) => {
            layers.missing(layer, why.clone())?;
            if layer == Layer::Landlock {
                layers.missing(Layer::LandlockScope, "Landlock unavailable")?;
                if policy.network.mode == NetMode::Host {
                    layers.missing(Layer::LandlockNet, "Landlock unavailable")?;
                }
            }
        }
    }
    if !pre_confined {
        filter(layers, filters)?;
    }

    nix::unistd::chdir(cwd).map_err(|e| Stop {
        unavailable: false,
        layer: None,
        message: format!("chdir {}: {e}", cwd.display()),
    })?;
    let c = |s: &OsString| {
        CString::new(s.as_bytes()).map_err(|_| Stop {
            unavailable: false,
            layer: None,
            message: "argument contains a NUL byte".into(),
        })
    };
    let args: Vec<CString> = argv.iter().map(c).collect::<Result<_, _>>()?;
    let envp: Vec<CString> = env
        .iter()
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).map_err(|_| Stop {
                unavailable: false,
                layer: None,
                message: "environment contains a NUL byte".into(),
            })
        })
        .collect::<Result<_, _>>()?;
    if args.is_empty() {
        return Err(Stop {
            unavailable: false,
            layer: None,
            message: "no command given".into(),
        });
    }
    // PATH lookup uses the sandbox's PATH, not the caller's.
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone());
    if let Some(p) = path {
        std::env::set_var("PATH", p);
    }
    let e = nix::unistd::execvpe(&args[0], &args, &envp).unwrap_err();
    let code = if e == nix::errno::Errno::ENOENT {
        127
    } else {
        126
    };
    layers.rep.send(&Message::ExecFailed {
        message: format!("cannot run {:?}: {}", args[0], e.desc()),
        code,
    });
    // SAFETY: _exit in a forked child skips the parent's atexit handlers.
    unsafe { libc::_exit(code) }
}

/// Waits (event-driven, inotify) until the tmux socket exists, or the server dies.
fn wait_for_socket(server: Pid) -> Result<(), String> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let sock = std::path::Path::new(super::SOCKET_INSIDE);
    let ino =
        Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).map_err(|e| e.to_string())?;
    ino.add_watch(sock.parent().unwrap_or(sock), AddWatchFlags::IN_CREATE)
        .map_err(|e| e.to_string())?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if sock.exists() {
            return Ok(());
        }
        if let Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) =
            waitpid(server, Some(WaitPidFlag::WNOHANG))
        {
            return Err("the tmux server exited before it listened".into());
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err("the tmux server did not create its socket within 10 s".into());
        }
        // A short cap on each wait also notices a server that dies without creating anything.
        let ms = left.as_millis().min(100) as u16;
        let mut fds = [PollFd::new(
            std::os::fd::AsFd::as_fd(&ino),
            PollFlags::POLLIN,
        )];
        let _ = poll(&mut fds, PollTimeout::from(ms));
        let _ = ino.read_events();
    }
}

/// PID 1's last job: reap every child; forward termination to the payload;
/// return when the payload ends (the kernel then kills the whole namespace).
fn reap(payload: Pid) -> i32 {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        set.add(s);
    }
    let _ = set.thread_block();
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
            Ok(s) => {
                let _ = kill(payload, s);
            }
        }
    }
}
