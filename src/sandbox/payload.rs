//! The payload: PID 1's child confines itself (capabilities, no_new_privs,
//! Landlock with its role's rules from the plan, seccomp) and execs the tmux
//! server or the command of `sandmux run`.

use super::init::{Layers, Stop};
use super::plan::{Blueprint, HostView};
use super::report::Message;
use super::{caps, landlock, seccomp, Payload, Plan};
use crate::profile::{Layer, NetMode};
use nix::sys::signal::{SigSet, Signal};
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// What the payload execs, where, and with which Landlock rules.
pub(super) struct Job<'a> {
    argv: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: PathBuf,
    rules: Vec<(PathBuf, landlock::Grant)>,
    /// PID 1 drops privileges and installs the filter before the fork (run mode).
    pub(super) pre_confined: bool,
    /// Say on stderr which layers were dropped, before the command starts.
    say_dropped: bool,
    /// Without a user namespace, as root: the uid the payload child drops
    /// to (tmux mode; in `run` mode PID 1 drops before the fork).
    pub(super) drop_to: Option<super::uid::Target>,
    /// Tmux mode without a mount view: its files on the host.
    pub(super) host_view: Option<&'a HostView>,
}

impl<'a> Job<'a> {
    /// The job of a plan, with its files in the mount view or `host_view`.
    pub(super) fn of(plan: &Plan, bp: &'a Blueprint, host_view: Option<&'a HostView>) -> Job<'a> {
        let (paths, landlock) = match host_view {
            Some(h) => (&h.paths, &h.landlock),
            None => (&bp.paths, &bp.landlock),
        };
        let (argv, role, cwd) = match &plan.payload {
            Payload::Command { argv, cwd, .. } => {
                (argv.clone(), landlock::Role::Command, cwd.clone())
            }
            Payload::Tmux { tmux, .. } => (
                vec![
                    tmux.clone().into_os_string(),
                    "-D".into(),
                    "-f".into(),
                    paths.tmux_conf.clone().into_os_string(),
                    "-S".into(),
                    paths.socket.clone().into_os_string(),
                ],
                landlock::Role::Server,
                bp.paths.workspace.clone(),
            ),
        };
        let rules = landlock
            .iter()
            .filter(|r| r.role == role)
            .flat_map(|r| r.rules.iter().map(|x| (x.path.clone(), x.grant)))
            .collect();
        Job {
            argv,
            env: plan.env.clone(),
            cwd,
            rules,
            pre_confined: matches!(plan.payload, Payload::Command { .. }),
            say_dropped: matches!(plan.payload, Payload::Command { quiet: false, .. }),
            drop_to: None,
            host_view,
        }
    }
}

impl Job<'_> {
    /// Without a mount view: no write grant on a tree holding `keep`
    /// (returns the trees whose write was withheld).
    pub(super) fn withhold_writes(&mut self, keep: &[PathBuf]) -> Vec<PathBuf> {
        super::uid::withhold_writes(&mut self.rules, keep)
    }
}

/// The payload child's inputs.
pub(super) struct Exec<'a> {
    pub(super) job: &'a Job<'a>,
    pub(super) filters: &'a seccomp::Filters,
    pub(super) net_isolated: bool,
}

/// Capabilities, then `no_new_privs` (which Landlock and seccomp need).
pub(super) fn drop_privileges(layers: &mut Layers<'_>) -> Result<(), Stop> {
    layers.result(Layer::Caps, caps::drop_all())?;
    match caps::set_no_new_privs() {
        Ok(()) => layers.ok(Layer::NoNewPrivs, "set"),
        Err(e) => layers.missing(Layer::NoNewPrivs, e.to_string())?,
    }
    Ok(())
}

/// The syscall filter.
pub(super) fn filter(layers: &mut Layers<'_>, filters: &seccomp::Filters) -> Result<(), Stop> {
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

type Never = std::convert::Infallible;

/// In the payload child: confine, then exec. Returns only on failure.
pub(super) fn confine_and_exec(
    plan: &Plan,
    x: Exec<'_>,
    layers: &mut Layers<'_>,
) -> Result<Never, Stop> {
    let bp = &plan.blueprint;
    let setup =
        |what: &'static str| move |e: nix::Error| super::init::internal(what)(e.to_string());
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(setup("PR_SET_PDEATHSIG"))?;
    let mut set = SigSet::empty();
    set.add(Signal::SIGCHLD);
    set.thread_unblock().map_err(setup("unblocking SIGCHLD"))?;

    if let Some(t) = x.job.drop_to {
        super::uid::drop_uid(t).map_err(|e| Stop::applying(Layer::Caps, e.to_string()))?;
    }
    if let Some(h) = x.job.host_view {
        super::hostview::check_reach(h).map_err(|e| Stop::applying(Layer::Mount, e.to_string()))?;
    }
    if !x.job.pre_confined {
        drop_privileges(layers)?;
    }
    restrict(bp, &x.job.rules, x.net_isolated, layers)?;
    if !x.job.pre_confined {
        filter(layers, x.filters)?;
    }
    exec(x.job, layers)
}

/// The Landlock layer and its sub-layers (TCP rules, scopes).
fn restrict(
    bp: &Blueprint,
    rules: &[(PathBuf, landlock::Grant)],
    net_isolated: bool,
    layers: &mut Layers<'_>,
) -> Result<(), Stop> {
    let host = bp.net.mode == NetMode::Host;
    match landlock::restrict(bp.landlock_abi, &bp.net, rules, net_isolated) {
        Ok(o) => {
            layers.ok(Layer::Landlock, o.detail.clone());
            if host && o.net {
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
                        ports(&bp.net.connect_tcp),
                        ports(&bp.net.bind_tcp)
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
                if host {
                    layers.missing(Layer::LandlockNet, "Landlock unavailable")?;
                }
            }
        }
    }
    Ok(())
}

fn nul(what: &str) -> Stop {
    Stop {
        unavailable: false,
        refused: None,
        layer: None,
        message: format!("{what} contains a NUL byte"),
    }
}

/// chdir and exec (argv[0] searched in the sandbox's PATH).
/// `run`: one line on stderr, before the command starts, naming the layers
/// not in force (`--quiet` silences it); nothing when every layer is.
fn say_dropped(dropped: &[Layer]) {
    if dropped.is_empty() {
        return;
    }
    let names: Vec<String> = dropped.iter().map(|l| l.to_string()).collect();
    let line = format!(
        "sandmux: running without {} (best-effort layers this system refused; `sandmux check` says why; --quiet silences this)\n",
        names.join(", ")
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

fn exec(job: &Job<'_>, layers: &mut Layers<'_>) -> Result<Never, Stop> {
    layers.rep.note(|| "payload: confined, exec".into());
    nix::unistd::chdir(&job.cwd).map_err(|e| Stop {
        unavailable: false,
        refused: None,
        layer: None,
        message: format!("chdir {}: {e}", job.cwd.display()),
    })?;
    let args: Vec<CString> = job
        .argv
        .iter()
        .map(|s| CString::new(s.as_bytes()).map_err(|_| nul("argument")))
        .collect::<Result<_, _>>()?;
    let envp: Vec<CString> = job
        .env
        .iter()
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).map_err(|_| nul("environment"))
        })
        .collect::<Result<_, _>>()?;
    if args.is_empty() {
        return Err(Stop {
            unavailable: false,
            refused: None,
            layer: None,
            message: "no command given".into(),
        });
    }
    // PATH lookup uses the sandbox's PATH, not the caller's.
    if let Some((_, p)) = job.env.iter().find(|(k, _)| k == "PATH") {
        std::env::set_var("PATH", p);
    }
    if job.say_dropped {
        say_dropped(layers.rep.dropped());
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
