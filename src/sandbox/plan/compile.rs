//! `plan::compile`: the policy, step by step, into the plan's mount view,
//! layers, Landlock rules and paths.

use super::*;
use crate::profile::{MountKind, Policy};
use crate::sandbox::landlock::{self, Own, RUN_DIR};
use crate::sandbox::net::Net;
use std::path::Path;

fn step(path: impl Into<PathBuf>, part: Part, op: Op, need: Need) -> Step {
    Step {
        path: path.into(),
        part,
        op,
        need,
        layer: Layer::Mount,
    }
}

fn bind(from: From, onto: Onto, attrs: Attrs) -> Op {
    Op::Bind { from, onto, attrs }
}

fn tmpfs(options: impl Into<String>, attrs: Attrs) -> Op {
    Op::Tmpfs {
        options: options.into(),
        attrs,
    }
}

/// Compiles the policy into the plan `__init` executes.
pub(crate) fn compile(policy: &Policy, mode: Mode) -> Blueprint {
    Blueprint {
        layers: layer_needs(policy),
        mounts: mount_steps(policy, mode),
        after_ready: after_ready(mode),
        landlock: role_rules(policy, &Own::default()),
        paths: paths(policy, Path::new(RUN_DIR)),
        host_view: None,
        identity: policy.sandbox.clone(),
        net: Net {
            mode: policy.network.mode,
            connect_tcp: policy.network.connect_tcp.clone(),
            bind_tcp: policy.network.bind_tcp.clone(),
        },
        landlock_abi: policy.landlock_abi,
        limits: policy.limits.clone(),
        environment: policy.environment.clone(),
        protected: policy.protected.clone(),
        needs_mount: needs_mount(policy),
        git: git_step(policy),
        counts: ViewCounts {
            entries: policy.fs.len(),
            pinned: policy.pinned.len(),
            git_outside: policy.guard.git_outside.len(),
        },
    }
}

/// The mount view's steps, in the order PID 1 takes them: the root, the
/// run directory, the profile's entries, the layer, the guard, `/dev`,
/// `/proc`, `/etc`, utempter (tmux), then both sealed read-only.
fn mount_steps(policy: &Policy, mode: Mode) -> Vec<Step> {
    let mut m = Vec::new();
    m.push(step(
        "/",
        Part::Root,
        tmpfs("size=16m,mode=0755", Attrs::NOSUID_NODEV),
        Need::Required,
    ));
    run_dir(&mut m, policy, mode);
    profile_entries(&mut m, policy);
    if let Some(layer) = overlay(policy) {
        // Over the workspace's bind: the agent's writes land in the layer.
        m.push(step(
            policy.workspace.clone(),
            Part::Layer,
            Op::Overlay { dir: layer.clone() },
            Need::Required,
        ));
    }
    guard(&mut m, policy);
    dev(&mut m, policy);
    proc(&mut m);
    etc(&mut m, policy);
    if mode == Mode::Tmux {
        utempter(&mut m);
    }
    for p in [RUN_DIR, "/"] {
        m.push(step(p, Part::Seal, Op::ReadOnly, Need::Required));
    }
    m
}

/// tmux: the socket directory's cover, once the server listens.
fn after_ready(mode: Mode) -> Vec<Step> {
    match mode {
        Mode::Tmux => vec![step(
            SOCK_DIR,
            Part::SocketCover,
            tmpfs("size=4k,mode=0", Attrs::RO_ALL),
            Need::Required,
        )],
        Mode::Run => Vec::new(),
    }
}

/// Each layer, required unless the profile lets it go.
fn layer_needs(policy: &Policy) -> Vec<LayerNeed> {
    Layer::ALL
        .into_iter()
        .map(|layer| LayerNeed {
            layer,
            need: if policy.best_effort.contains(&layer) {
                Need::BestEffort
            } else {
                Need::Required
            },
        })
        .collect()
}

/// What cannot be had without a mount namespace: the layer, or commit mode.
fn needs_mount(policy: &Policy) -> Option<MountNeed> {
    if overlay(policy).is_some() {
        Some(MountNeed::Layer)
    } else if policy.guard.git == crate::profile::GitMode::Commit && policy.guard.commit.is_some() {
        Some(MountNeed::Commit)
    } else {
        None
    }
}

/// A copy-on-write workspace's layer, which is mounted over the
/// workspace (a copy workspace's is not: the copy is the workspace).
fn overlay(policy: &Policy) -> Option<&PathBuf> {
    let cow = policy.workspace_mode == crate::profile::WorkspaceMode::CopyOnWrite;
    policy.layer.as_ref().filter(|_| cow)
}

/// The workspace guard's step: its report line.
fn git_step(policy: &Policy) -> GitStep {
    if policy.guard.git == crate::profile::GitMode::Unguarded {
        return GitStep::Unguarded;
    }
    let mut said = policy.guard.describe(true);
    if policy.layer.is_some() {
        said.insert(0, "copy-on-write or copy workspace: the agent's git is its own; version-control data reaches the host only through `sandmux apply`, which holds it back".into());
    }
    GitStep::Guarded {
        said: said.join(" | "),
    }
}

/// Tmux mode's files without a mount view: in `dir` on the host, the gate a
/// link to `exe` (see `hostview`).
pub(crate) fn host_view(policy: &Policy, dir: &Path, exe: &Path) -> HostView {
    let own = Own {
        dir: dir.into(),
        exe: Some(exe.into()),
    };
    HostView {
        paths: paths(policy, dir),
        landlock: role_rules(policy, &own),
        own,
    }
}

fn role_rules(policy: &Policy, own: &Own) -> Vec<RoleRules> {
    [Role::Server, Role::Pane, Role::Command]
        .into_iter()
        .map(|role| RoleRules {
            role,
            rules: landlock::rules(policy, role, own)
                .into_iter()
                .map(|(path, grant)| Rule { path, grant })
                .collect(),
        })
        .collect()
}

/// The paths of a sandbox whose own files are in `run` (`/run/sandmux` in
/// the mount view).
fn paths(policy: &Policy, run: &Path) -> Paths {
    Paths {
        workspace: policy.workspace.clone(),
        home: crate::profile::SANDBOX_HOME.into(),
        run_dir: run.into(),
        socket: run.join("sock/tmux.sock"),
        tmux_conf: run.join("tmux.conf"),
        gate: run.join("bin/sandmux-pane"),
        gate_config: run.join("gate.json"),
    }
}

/// `/run/sandmux`: its files, the gate and the socket directory.
fn run_dir(m: &mut Vec<Step>, policy: &Policy, mode: Mode) {
    let run = Path::new(RUN_DIR);
    m.push(step(
        run,
        Part::RunDir,
        tmpfs("size=4m,mode=0755", Attrs::NOSUID_NODEV),
        Need::Required,
    ));
    let mut files = vec![
        ("empty", RunFile::Empty),
        ("passwd", RunFile::Passwd),
        ("group", RunFile::Group),
        ("gate.json", RunFile::GateJson),
    ];
    if crate::sandbox::name_files(policy).is_some() {
        files.push(("resolv.conf", RunFile::ResolvConf));
        files.push(("hosts", RunFile::Hosts));
    }
    if mode == Mode::Tmux {
        files.push(("tmux.conf", RunFile::TmuxConf));
    }
    if policy.ca_pem.is_some() {
        files.push((CA_BUNDLE, RunFile::CaBundle));
        files.push((CA, RunFile::Ca));
    }
    for (name, content) in files {
        m.push(step(
            run.join(name),
            Part::RunFile,
            Op::File { content },
            Need::Required,
        ));
    }
    m.push(step(
        GATE,
        Part::Gate,
        bind(From::Binary, Onto::Create, Attrs::RO_NOSUID_NODEV),
        Need::Required,
    ));
    let sock = Attrs::new(false, true, true, true);
    m.push(step(
        SOCK_DIR,
        Part::SocketDir,
        bind(From::RundirSock, Onto::Create, sock),
        Need::Required,
    ));
}

/// The profile's entries, parents first.
fn profile_entries(m: &mut Vec<Step>, policy: &Policy) {
    for e in &policy.fs {
        let p = e.path.clone();
        m.push(match &e.kind {
            MountKind::ReadOnly => step(
                p,
                Part::Profile,
                bind(From::Host, Onto::Create, Attrs::RO_NOSUID_NODEV),
                Need::Required,
            ),
            MountKind::ReadWrite => step(
                p,
                Part::Profile,
                bind(From::Host, Onto::Create, Attrs::NOSUID_NODEV),
                Need::Required,
            ),
            MountKind::Tmpfs => {
                let mode = if p == Path::new("/tmp") {
                    "1777"
                } else {
                    "0755"
                };
                let options = format!("size={},mode={mode}", policy.limits.tmpfs_size.0);
                step(
                    p,
                    Part::Profile,
                    tmpfs(options, Attrs::NOSUID_NODEV),
                    Need::Required,
                )
            }
            MountKind::Masked => step(p, Part::Mask, Op::Mask, Need::IfPresent),
            MountKind::Symlink(target) => step(
                p,
                Part::Symlink,
                Op::Symlink {
                    target: target.clone(),
                },
                Need::Required,
            ),
        });
    }
}

/// The workspace guard (P8): commit mode's repositories, pinned parents,
/// protected paths, git directories outside every tree.
fn guard(m: &mut Vec<Step>, policy: &Policy) {
    if let Some(c) = &policy.guard.commit {
        let agent = From::HostBeneath {
            path: c.agent.clone(),
        };
        m.push(step(
            &c.real,
            Part::AgentRepo,
            bind(agent, Onto::Existing, Attrs::NOSUID_NODEV),
            Need::Required,
        ));
        let real = From::HostBeneath {
            path: c.real.clone(),
        };
        m.push(step(
            &c.origin,
            Part::GitOrigin,
            bind(real, Onto::Create, Attrs::RO_NOSUID_NODEV),
            Need::Required,
        ));
    }
    for p in &policy.pinned {
        m.push(step(p, Part::Pin, Op::Pin, Need::IfPresent));
    }
    for p in &policy.protected {
        m.push(step(p, Part::Protect, Op::Protect, Need::IfPresent));
    }
    for p in &policy.guard.git_outside {
        let from = From::HostBeneath { path: p.clone() };
        m.push(step(
            p,
            Part::GitOutside,
            bind(from, Onto::Create, Attrs::RO_NOSUID_NODEV),
            Need::Required,
        ));
    }
}

/// `/dev`: a tmpfs with host device nodes, a private devpts, `/dev/shm`.
fn dev(m: &mut Vec<Step>, policy: &Policy) {
    let nosuid_noexec = Attrs::new(false, true, false, true);
    m.push(step(
        "/dev",
        Part::Dev,
        tmpfs("size=64k,mode=0755", nosuid_noexec),
        Need::Required,
    ));
    for n in ["null", "zero", "full", "random", "urandom", "tty"] {
        m.push(step(
            Path::new("/dev").join(n),
            Part::Device,
            bind(From::Host, Onto::Create, nosuid_noexec),
            Need::Required,
        ));
    }
    let devpts = Op::Devpts {
        options: "newinstance,ptmxmode=0666,mode=0620".into(),
        attrs: nosuid_noexec,
    };
    m.push(step("/dev/pts", Part::Devpts, devpts, Need::Required));
    let shm = format!("size={},mode=1777", policy.limits.tmpfs_size.0);
    m.push(step(
        "/dev/shm",
        Part::Shm,
        tmpfs(shm, Attrs::new(false, true, true, true)),
        Need::Required,
    ));
    for (name, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let op = Op::Symlink {
            target: target.into(),
        };
        m.push(step(
            Path::new("/dev").join(name),
            Part::DevLink,
            op,
            Need::Required,
        ));
    }
    m.push(step("/dev", Part::Seal, Op::ReadOnly, Need::Required));
}

/// `/proc`: fresh, its key lists emptied, read-only covers on the parts that
/// reach the host kernel. A fresh procfs is the pid layer's best-effort step
/// (a container runtime that masks parts of its `/proc` makes the kernel
/// refuse it): its fallback is the existing `/proc`, bound read-only.
fn proc(m: &mut Vec<Step>) {
    let attrs = Attrs::new(false, true, true, true);
    let mut fresh = step("/proc", Part::Proc, Op::Procfs { attrs }, Need::BestEffort);
    fresh.layer = Layer::Pid;
    m.push(fresh);
    let mut fallback = step(
        "/proc",
        Part::ProcFallback,
        bind(From::Host, Onto::Create, Attrs::RO_ALL),
        Need::IfDropped,
    );
    fallback.layer = Layer::Pid;
    m.push(fallback);
    for n in ["keys", "key-users"] {
        let empty = From::Inside { path: EMPTY.into() };
        m.push(step(
            Path::new("/proc").join(n),
            Part::ProcMask,
            bind(empty, Onto::IfPresent, Attrs::RO_ALL),
            Need::IfPresent,
        ));
    }
    for n in [
        "sys",
        "sysrq-trigger",
        "irq",
        "bus",
        "fs",
        "acpi",
        "scsi",
        "timer_list",
        "latency_stats",
        "sched_debug",
        "kcore",
    ] {
        m.push(step(
            Path::new("/proc").join(n),
            Part::ProcCover,
            bind(From::Itself, Onto::IfPresent, Attrs::RO_ALL),
            Need::IfPresent,
        ));
    }
}

/// Where distributions put libutempter's helper.
const UTEMPTER: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/utempter/utempter",
    "/usr/lib/aarch64-linux-gnu/utempter/utempter",
    "/usr/libexec/utempter/utempter",
    "/usr/lib/utempter/utempter",
];

/// tmux mode: the utempter helper, emptied. tmux forks it for every pane it
/// opens or closes and waits for it (libutempter); under no_new_privs the
/// setgid helper cannot write utmp anyway, and a failed exec costs the
/// server far less than a run of the helper.
fn utempter(m: &mut Vec<Step>) {
    for p in UTEMPTER {
        let empty = From::Inside { path: EMPTY.into() };
        m.push(step(
            p,
            Part::Utempter,
            bind(empty, Onto::IfPresent, Attrs::RO_ALL),
            Need::IfPresent,
        ));
    }
}

/// With credentials: the CA bundle (the host's roots and the instance's
/// CA), in `/run/sandmux`.
pub(crate) const CA_BUNDLE: &str = "ca-bundle.pem";
/// With credentials: the instance's CA alone, in `/run/sandmux`.
pub(crate) const CA: &str = "ca.pem";

/// Where distributions keep the system's CA bundle: with credentials, the
/// instance's bundle is bound over each one present.
pub(crate) const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];

/// `/etc/passwd` and `/etc/group`: the sandbox's identity only; without a
/// host network, `/etc/resolv.conf` and `/etc/hosts` say why; with
/// credentials, the system's CA bundle is the instance's.
fn etc(m: &mut Vec<Step>, policy: &Policy) {
    if policy.ca_pem.is_some() {
        for p in SYSTEM_BUNDLES {
            let from = From::Inside {
                path: Path::new(RUN_DIR).join(CA_BUNDLE),
            };
            m.push(step(
                p,
                Part::Etc,
                bind(from, Onto::IfPresent, Attrs::RO_NOSUID_NODEV),
                Need::IfPresent,
            ));
        }
    }
    let mut names = vec!["passwd", "group"];
    if crate::sandbox::name_files(policy).is_some() {
        names.extend(["resolv.conf", "hosts"]);
    }
    for n in names {
        let from = From::Inside {
            path: Path::new(RUN_DIR).join(n),
        };
        m.push(step(
            Path::new("/etc").join(n),
            Part::Etc,
            bind(from, Onto::IfPresent, Attrs::RO_NOSUID_NODEV),
            Need::IfPresent,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy-on-write workspace needs a mount namespace whatever git's
    /// mode: with `git = "unguarded"` too (before, only the guarded step
    /// carried the need, and a sandbox without a mount namespace would have
    /// written the host's tree, unguarded). Control: live and unguarded
    /// needs none.
    #[test]
    fn a_copy_on_write_layer_needs_a_mount_namespace_in_every_git_mode() {
        let mut policy = crate::sandbox::view::sample();
        policy.layer = Some(PathBuf::from("/state/layers/0123456789ab"));
        for git in [
            crate::profile::GitMode::Unguarded,
            crate::profile::GitMode::ReadOnly,
        ] {
            policy.guard.git = git;
            let bp = compile(&policy, Mode::Run);
            assert_eq!(bp.needs_mount, Some(MountNeed::Layer), "{git:?}");
        }
        policy.layer = None;
        policy.guard.git = crate::profile::GitMode::Unguarded;
        assert_eq!(compile(&policy, Mode::Run).needs_mount, None);
    }
}
