//! The sandbox: one file per mechanism, started by [`init`] in a re-exec of the
//! binary, and the exec that gets there ([`start`]): it writes a [`Plan`] to
//! `sandmux __init` over a pipe and reads back what each layer did
//! ([`report`]). What the host does around it (the runtime directory, the
//! cgroup, freezing, the namespace signal) is `crate::supervisor`; the
//! supervisor's confinement of itself is `crate::confine`.

pub(crate) mod beneath;
pub(crate) mod caps;
pub(crate) mod cgroup;
pub(crate) mod container;
pub(crate) mod env;
mod fds;
mod hostview;
pub(crate) mod init;
mod keyring;
pub(crate) mod landlock;
pub(crate) mod limits;
pub(crate) mod mounts;
pub(crate) mod namespaces;
pub(crate) mod net;
pub(crate) mod observe;
pub(crate) mod pane;
mod payload;
mod pid1;
pub(crate) mod plan;
pub(crate) mod procfs;
mod reap;
pub(crate) mod report;
pub(crate) mod seccomp;
pub(crate) mod syscalls;
pub(crate) mod uid;
pub(crate) mod view;

use crate::profile::{Layer, Policy};
use report::{Message, Refusal};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// Exit status: invalid profile or arguments.
pub(crate) const EXIT_USAGE: i32 = 2;
/// Exit status: a layer the profile requires is unavailable (fail closed).
pub(crate) const EXIT_LAYER: i32 = 3;
/// Exit status: sandmux itself failed.
pub(crate) const EXIT_INTERNAL: i32 = 125;

/// What runs inside.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Payload {
    /// One command (`sandmux run`).
    Command {
        /// argv; argv[0] is looked up in the sandbox's PATH.
        argv: Vec<OsString>,
        /// Working directory inside.
        cwd: PathBuf,
        /// No `sandmux:` line on stderr naming the dropped layers.
        #[serde(default)]
        quiet: bool,
    },
    /// A fresh tmux server in the foreground.
    Tmux {
        /// The tmux binary (inside a read-only tree of the profile).
        tmux: PathBuf,
    },
}

/// Everything `sandmux __init` needs, sent as JSON on fd 3: the compiled
/// [`plan::Blueprint`] and this start's facts on the host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Plan {
    /// The policy, compiled (with tmux mode's host view, if it may need one).
    pub blueprint: plan::Blueprint,
    /// This instance's private runtime directory on the host.
    pub rundir: PathBuf,
    /// The supervisor's pid (the init checks it is still its parent).
    pub supervisor_pid: i32,
    /// Caller's uid on the host.
    pub host_uid: u32,
    /// Caller's gid on the host.
    pub host_gid: u32,
    /// The cgroup to join, or why there is none.
    pub cgroup: cgroup::Placement,
    /// Files for `/run/sandmux`.
    pub run_files: mounts::RunFiles,
    /// What to run.
    pub payload: Payload,
    /// The payload's environment, built from the supervisor's by the profile's
    /// rules (`sandmux __init` itself runs with an empty environment).
    pub env: Vec<(OsString, OsString)>,
    /// The most verbose level of `__init`'s notes the supervisor logs
    /// (`off`, `debug`, `trace`): `__init` has no environment to read
    /// `SANDMUX_LOG` from, and no stderr of its own to write to.
    #[serde(default)]
    pub log: String,
}

/// The plan's payload, as the compiled plan needs it.
pub(crate) fn mode_of(payload: &Payload) -> plan::Mode {
    match payload {
        Payload::Command { .. } => plan::Mode::Run,
        Payload::Tmux { .. } => plan::Mode::Tmux,
    }
}

/// How the sandbox's standard streams are connected.
pub(crate) enum Stdio3 {
    /// Inherit the supervisor's (`sandmux run`).
    Inherit,
    /// /dev/null for all three (tmux server; the supervisor's stdout may be MCP).
    Null,
}

/// A started sandbox, as the supervisor holds it.
pub(crate) struct Started {
    /// The `sandmux __init` process.
    pub child: Child,
    /// Everything the sandbox reported during start-up.
    pub messages: Vec<Message>,
    /// The rest of the report pipe (tmux mode: closes when PID 1 finishes
    /// start-up), held so that PID 1's last writes never meet a closed pipe.
    #[allow(dead_code)]
    pub report: std::fs::File,
    /// Proxy mode: the listener made inside the sandbox's network namespace,
    /// for this process to serve (`crate::proxy`).
    pub proxy: Option<std::net::TcpListener>,
}

/// A start-up failure, with the exit status sandmux should use.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct StartError {
    /// The missing layer, if that is the cause.
    pub layer: Option<Layer>,
    /// What went wrong (and for a layer, the fix).
    pub message: String,
    /// Exit status to use instead of the default for this kind of failure.
    pub code: Option<i32>,
    /// The layers the sandbox reported before it failed (for `check`).
    pub layers: Vec<report::LayerStatus>,
}

impl StartError {
    /// Exit status for this failure.
    pub(crate) fn exit_code(&self) -> i32 {
        if let Some(c) = self.code {
            c
        } else if self.layer.is_some() {
            EXIT_LAYER
        } else {
            EXIT_INTERNAL
        }
    }

    /// An error of sandmux itself (no layer), exit status 125.
    pub(crate) fn internal(message: String) -> Self {
        StartError {
            layer: None,
            code: None,
            message,
            layers: vec![],
        }
    }

    /// Builds the error for a layer, naming the fix.
    pub(crate) fn layer(layer: Layer, reason: &str) -> Self {
        Self::refused(layer, reason, None)
    }

    /// [`Self::layer`], for a layer refused by `refused` (whose fix in a
    /// container may differ).
    fn refused(layer: Layer, reason: &str, refused: Option<Refusal>) -> Self {
        StartError {
            layer: Some(layer),
            code: None,
            layers: vec![],
            message: format!(
                "required layer '{layer}' is unavailable: {reason}\n  fix{}\n  (or, to run without it, add \"{layer}\" to [enforcement] best_effort in a profile of your own)",
                in_container(container::unavailable_fix(layer, refused)).unwrap_or(format!(": {}", layer.fix()))
            ),
        }
    }
}

/// The layers reported before a failure, the failing one (if a layer is
/// the cause) marked not in force with the failure.
pub(crate) fn reported_before(
    mut v: Vec<report::LayerStatus>,
    failed: Option<Layer>,
    why: &str,
) -> Vec<report::LayerStatus> {
    if let Some(l) = failed {
        v.retain(|s| s.layer != l);
        v.push(report::LayerStatus {
            layer: l,
            enforced: false,
            detail: why.lines().next().unwrap_or_default().to_string(),
        });
        v.sort_by_key(|s| Layer::ALL.iter().position(|x| *x == s.layer));
    }
    v
}

/// A container's own fix, introduced by what says it is a container (` (in
/// a container: /.dockerenv): …`); None outside one or without such a fix.
fn in_container(fix: Option<String>) -> Option<String> {
    let mark = container::detected()?;
    fix.map(|f| format!(" (in a container: {mark}): {f}"))
}

fn internal(e: impl std::fmt::Display) -> StartError {
    StartError {
        layer: None,
        message: e.to_string(),
        code: None,
        layers: vec![],
    }
}

/// The `/etc/resolv.conf` and `/etc/hosts` shown inside when the sandbox
/// has no host network: they say why names do not resolve.
pub(crate) fn name_files(policy: &Policy) -> Option<(String, String)> {
    use crate::profile::NetMode;
    let mode = policy.network.mode;
    if mode == NetMode::Host {
        return None;
    }
    let why = match mode {
        NetMode::None | NetMode::Loopback => "only the sandbox's own loopback (127.0.0.1, ::1) is reachable: a server started here answers there, and nothing outside does",
        NetMode::Proxy => "names resolve through the proxy only (http://127.0.0.1:3128, set in http_proxy, https_proxy and the other proxy variables); it reaches the profile's [network] allow list and nothing else, and a program that ignores the proxy variables has no route",
        NetMode::Host => unreachable!("returned above"),
    };
    let resolv = format!(
        "# sandmux: no DNS here. The profile '{}' sets [network] mode = \"{}\": {why}.\n# Names other than localhost do not resolve, by policy; this is not a fault.\n# A profile with another network mode decides otherwise (sandmux profile show {}).\n",
        policy.name,
        mode.name(),
        policy.name
    );
    let hosts = format!(
        "# sandmux: [network] mode = \"{}\" ({why}); only these names resolve.\n127.0.0.1\tlocalhost {host}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        mode.name(),
        host = policy.sandbox.hostname
    );
    Some((resolv, hosts))
}

/// The `/etc/passwd` and `/etc/group` shown inside.
pub(crate) fn identity_files(policy: &Policy) -> (String, String) {
    let uid = policy.sandbox.uid;
    let home = policy
        .environment
        .set
        .get("HOME")
        .cloned()
        .unwrap_or_else(|| crate::profile::SANDBOX_HOME.into());
    let passwd = format!(
        "root:x:0:0:root:/root:/usr/sbin/nologin\nsandmux:x:{uid}:{uid}:sandmux:{home}:{}\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        policy.sandbox.shell
    );
    let group = format!("root:x:0:\nsandmux:x:{uid}:\nnogroup:x:65534:\n");
    (passwd, group)
}

/// For a `pre_exec` hook: the child gets SIGKILL when the thread that
/// spawned it ends (async-signal-safe: one prctl).
pub(crate) fn die_with_parent() -> std::io::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets this process's death signal.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Spawns `sandmux __init` with the plan and reads its report until the
/// payload runs (`run`) or the tmux server is ready (`tmux`).
///
/// Call this from a thread that lives as long as the sandbox should: the child
/// gets `PR_SET_PDEATHSIG`, which fires when the *spawning thread* exits.
pub(crate) fn start(plan: &Plan, stdio: Stdio3) -> Result<Started, StartError> {
    let exe = std::env::current_exe().map_err(internal)?;
    let (plan_r, plan_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(internal)?;
    let (rep_r, rep_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(internal)?;
    let chan = if plan.blueprint.net.mode == crate::profile::NetMode::Proxy {
        Some(std::os::unix::net::UnixStream::pair().map_err(internal)?)
    } else {
        None
    };
    let theirs = chan.as_ref().map(|(_, t)| t.as_raw_fd());
    let child = spawn_init(&exe, stdio, plan_r.as_raw_fd(), rep_w.as_raw_fd(), theirs)?;
    crate::log::step("start: __init spawned");
    drop((plan_r, rep_w));
    let chan = chan.map(|(ours, _theirs)| ours);
    send_plan(plan, plan_w)?;
    let report = std::fs::File::from(rep_r);
    let messages = report::read_until_done(&report);
    crate::log::step("start: the report read (the payload runs)");
    report::log(&messages);
    if let Some(e) = failure(&messages) {
        return Err(e);
    }
    let proxy = match &chan {
        Some(c) => Some(net::recv_listener(c).map_err(|e| internal(format!("proxy mode: {e}")))?),
        None => None,
    };
    Ok(Started {
        child,
        messages,
        report,
        proxy,
    })
}

/// `sandmux __init` with no environment (loader variables and secrets of
/// the caller never reach the process that holds capabilities in the new
/// namespaces), the plan on fd 3, the report on fd 4, the proxy's channel
/// on fd 5.
fn spawn_init(
    exe: &std::path::Path,
    stdio: Stdio3,
    pr: i32,
    rw: i32,
    proxy: Option<i32>,
) -> Result<Child, StartError> {
    let mut cmd = Command::new(exe);
    cmd.arg0("sandmux-init").arg("__init").env_clear();
    if let Stdio3::Null = stdio {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    }
    let px = proxy.unwrap_or(-1);
    // SAFETY: only async-signal-safe calls (fcntl, dup2, prctl) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Move all out of the way first: any may already sit on 3, 4 or 5.
            let a = libc::fcntl(pr, libc::F_DUPFD_CLOEXEC, 10);
            let b = libc::fcntl(rw, libc::F_DUPFD_CLOEXEC, 10);
            let c = if px < 0 {
                -1
            } else {
                libc::fcntl(px, libc::F_DUPFD_CLOEXEC, 10)
            };
            if a < 0
                || b < 0
                || (px >= 0 && c < 0)
                || libc::dup2(a, init::PLAN_FD) < 0
                || libc::dup2(b, init::REPORT_FD) < 0
                || (c >= 0 && libc::dup2(c, net::PROXY_FD) < 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            die_with_parent()
        });
    }
    cmd.spawn()
        .map_err(|e| internal(format!("starting sandmux __init: {e}")))
}

/// The plan, as JSON on the plan pipe.
fn send_plan(plan: &Plan, w: std::os::fd::OwnedFd) -> Result<(), StartError> {
    let json = serde_json::to_vec(plan).map_err(internal)?;
    std::fs::File::from(w)
        .write_all(&json)
        .map_err(|e| internal(format!("sending the plan: {e}")))
}

/// A layer that could not be applied, with the fix its refusal calls for.
fn not_applied(l: Layer, message: &str, refused: Option<Refusal>) -> StartError {
    StartError {
        layer: Some(l),
        message: format!(
            "layer '{l}' could not be applied: {message}{}",
            in_container(container::applying_fix(l, refused))
                .or_else(|| container::layer_fix(refused).map(|f| format!(": {f}")))
                .map(|f| format!("\n  fix{f}"))
                .unwrap_or_default()
        ),
        code: None,
        layers: vec![],
    }
}

/// The start-up failure the report ends with, if it ends with one.
fn failure(messages: &[Message]) -> Option<StartError> {
    match messages.last()? {
        Message::ExecFailed { message, code } => Some(StartError {
            layer: None,
            message: message.clone(),
            code: Some(*code),
            layers: report::layers(messages),
        }),
        Message::Fatal {
            layer,
            message,
            unavailable,
            refused,
        } => {
            let e = match layer {
                Some(l) if *unavailable => StartError::refused(*l, message, *refused),
                Some(l) => not_applied(*l, message, *refused),
                None => internal(format!("sandbox start-up failed: {message}")),
            };
            Some(StartError {
                layers: reported_before(report::layers(messages), e.layer, &e.message),
                ..e
            })
        }
        _ => None,
    }
}
