//! The start-up plan: the resolved policy compiled, on the supervisor's side,
//! into every step the sandbox takes — the whole mount view in order (`/dev`,
//! `/proc`, `/run/sandmux` and `/etc` included), each step marked required,
//! if-present or best-effort; each layer's requirement; the Landlock rules per
//! role; and the paths inside. `sandmux __init` only executes it, one loop per
//! kind (`mounts::execute`), and `sandmux profile show --resolved` prints it.
//!
//! A container fallback is one entry here, not a special case in the
//! executor: a step marked `best-effort` with the layer it reports under is
//! skipped and reported as that layer dropped when the profile lets the layer
//! go, and ends start-up (as that layer) when it does not.

use super::landlock::{self, Grant, Role, RUN_DIR};
use crate::profile::{Layer, MountKind, Policy};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The tmux socket's directory inside (a bind of `<rundir>/sock`).
pub const SOCK_DIR: &str = "/run/sandmux/sock";
/// The pane gate inside (the sandmux binary, read-only).
pub const GATE: &str = "/run/sandmux/bin/sandmux-pane";
/// The tmux configuration inside (tmux mode).
pub const TMUX_CONF: &str = "/run/sandmux/tmux.conf";
/// The gate's configuration inside.
pub const GATE_CONFIG: &str = "/run/sandmux/gate.json";
/// The empty file that masks files.
pub const EMPTY: &str = "/run/sandmux/empty";

/// Everything the sandbox will be, compiled from a policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blueprint {
    /// Each layer and whether the profile requires it.
    pub layers: Vec<LayerNeed>,
    /// The mount view, built by PID 1 on a fresh tmpfs, in this order, before
    /// `pivot_root`.
    pub mounts: Vec<Step>,
    /// Mounts made once the tmux server listens (tmux mode only).
    pub after_ready: Vec<Step>,
    /// The Landlock rules of each role.
    pub landlock: Vec<RoleRules>,
    /// Paths inside the sandbox.
    pub paths: Paths,
}

/// A layer and its requirement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerNeed {
    /// The layer.
    pub layer: Layer,
    /// `required` or `best-effort`.
    pub need: Need,
}

/// What a failing step (or a missing layer) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Need {
    /// Failure ends start-up.
    Required,
    /// Skipped when its path is absent (on the host or in the view); any
    /// other failure ends start-up.
    IfPresent,
    /// Failure is reported as the step's layer dropped when the profile lists
    /// that layer as best-effort; otherwise it ends start-up.
    BestEffort,
}

/// One mount step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// The path inside.
    pub path: PathBuf,
    /// What the step is for.
    pub part: Part,
    /// What is done.
    #[serde(flatten)]
    pub op: Op,
    /// What a failure means.
    pub need: Need,
    /// The layer a failure is reported under.
    pub layer: Layer,
}

/// What a step is for: names the step in reports, errors and the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    /// The fresh root.
    Root,
    /// `/run/sandmux`, the sandbox's own files.
    RunDir,
    /// A file in `/run/sandmux`.
    RunFile,
    /// The pane gate binary.
    Gate,
    /// The tmux socket's directory.
    SocketDir,
    /// A profile `read_only`, `read_write` or `tmpfs` entry.
    Profile,
    /// A profile `read_only` entry that is a symlink on the host.
    Symlink,
    /// A profile `masked` entry.
    Mask,
    /// Commit mode: the agent's repository over the workspace's `.git`.
    AgentRepo,
    /// Commit mode: the real git directory, read-only.
    GitOrigin,
    /// A parent of a protected path, bound onto itself.
    Pin,
    /// A protected path, read-only.
    Protect,
    /// A git directory outside every tree a `.git` file names.
    GitOutside,
    /// `/dev`.
    Dev,
    /// A device node bound from the host.
    Device,
    /// `/dev/pts`.
    Devpts,
    /// `/dev/shm`.
    Shm,
    /// A symlink in `/dev`.
    DevLink,
    /// `/proc`.
    Proc,
    /// A `/proc` file that would list the caller's keys, emptied.
    ProcMask,
    /// A `/proc` entry that reaches the host kernel, read-only.
    ProcCover,
    /// An `/etc` file replaced by the sandbox's own.
    Etc,
    /// A mount made read-only once its contents are in place.
    Seal,
    /// The socket directory covered once the server listens.
    SocketCover,
}

/// What a step does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Op {
    /// A fresh tmpfs (a place where mount points may be created).
    Tmpfs {
        /// Mount options (`size=…,mode=…`).
        options: String,
        /// Mount attributes.
        attrs: Attrs,
    },
    /// A fresh procfs of the sandbox's pid namespace.
    Procfs {
        /// Mount attributes.
        attrs: Attrs,
    },
    /// A new devpts instance.
    Devpts {
        /// Mount options.
        options: String,
        /// Mount attributes.
        attrs: Attrs,
    },
    /// A file written into a tmpfs of ours.
    File {
        /// Its contents.
        content: RunFile,
    },
    /// A recursive bind.
    Bind {
        /// Where the tree comes from.
        from: From,
        /// How the mount point is found.
        onto: Onto,
        /// Mount attributes.
        attrs: Attrs,
    },
    /// A symlink.
    Symlink {
        /// Its target.
        target: PathBuf,
    },
    /// A masked path: an empty read-only directory or file over it.
    Mask,
    /// Bound onto itself, read-write (a mount point cannot be renamed).
    Pin,
    /// Bound onto itself read-only; a symlink here ends start-up.
    Protect,
    /// The mount made read-only (not its submounts).
    ReadOnly,
}

/// Where a bind's tree comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum From {
    /// The same path on the host (its last component not followed).
    Host,
    /// A path on the host, opened beneath `/` with no symlink anywhere.
    HostBeneath {
        /// The host path.
        path: PathBuf,
    },
    /// The sandmux binary.
    Binary,
    /// The instance's `<rundir>/sock` on the host.
    RundirSock,
    /// A path already in the view.
    Inside {
        /// The path inside.
        path: PathBuf,
    },
    /// The mount point itself.
    Itself,
}

/// How a bind's mount point is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Onto {
    /// Created on a tmpfs of ours if missing (a directory or file, as the
    /// source is); a missing one in a host tree is an error.
    Create,
    /// Must exist, a directory, not a symlink.
    Existing,
    /// Skipped when it cannot be opened.
    IfPresent,
}

/// A file of `/run/sandmux`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunFile {
    /// Empty (what masks files).
    Empty,
    /// The sandbox's `/etc/passwd`.
    Passwd,
    /// The sandbox's `/etc/group`.
    Group,
    /// The gate's configuration.
    GateJson,
    /// `/etc/resolv.conf` explaining the network mode.
    ResolvConf,
    /// `/etc/hosts` explaining the network mode.
    Hosts,
    /// The tmux configuration.
    TmuxConf,
}

/// Mount attributes, written as in `mount(8)`: `ro,nosuid,nodev,noexec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Attrs {
    /// Read-only.
    pub ro: bool,
    /// No set-uid.
    pub nosuid: bool,
    /// No devices.
    pub nodev: bool,
    /// No execution.
    pub noexec: bool,
}

impl Attrs {
    const fn new(ro: bool, nosuid: bool, nodev: bool, noexec: bool) -> Attrs {
        Attrs {
            ro,
            nosuid,
            nodev,
            noexec,
        }
    }
    const NOSUID_NODEV: Attrs = Attrs::new(false, true, true, false);
    const RO_NOSUID_NODEV: Attrs = Attrs::new(true, true, true, false);
    const RO_ALL: Attrs = Attrs::new(true, true, true, true);
}

impl std::fmt::Display for Attrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = [
            (self.ro, "ro"),
            (self.nosuid, "nosuid"),
            (self.nodev, "nodev"),
            (self.noexec, "noexec"),
        ];
        let on: Vec<&str> = names.iter().filter(|(b, _)| *b).map(|(_, n)| *n).collect();
        if on.is_empty() {
            f.write_str("rw")
        } else {
            f.write_str(&on.join(","))
        }
    }
}

impl std::convert::From<Attrs> for String {
    fn from(a: Attrs) -> String {
        a.to_string()
    }
}

impl TryFrom<String> for Attrs {
    type Error = String;
    fn try_from(s: String) -> Result<Attrs, String> {
        let mut a = Attrs::new(false, false, false, false);
        for w in s.split(',') {
            match w {
                "ro" => a.ro = true,
                "nosuid" => a.nosuid = true,
                "nodev" => a.nodev = true,
                "noexec" => a.noexec = true,
                "rw" => {}
                _ => return Err(format!("unknown mount attribute {w:?}")),
            }
        }
        Ok(a)
    }
}

/// The Landlock rules of one role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleRules {
    /// The role.
    pub role: Role,
    /// Its rules, in the order they are added.
    pub rules: Vec<Rule>,
}

/// One Landlock rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// The path inside (skipped when it does not exist).
    pub path: PathBuf,
    /// What is granted beneath it.
    pub grant: Grant,
}

/// Paths inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Paths {
    /// The workspace (the same path as on the host).
    pub workspace: PathBuf,
    /// The home directory.
    pub home: PathBuf,
    /// The sandbox's own files.
    pub run_dir: PathBuf,
    /// The tmux socket (hidden once the server listens).
    pub socket: PathBuf,
    /// The tmux configuration (tmux mode).
    pub tmux_conf: PathBuf,
    /// The pane gate.
    pub gate: PathBuf,
    /// The gate's configuration.
    pub gate_config: PathBuf,
}

/// Which payload the plan is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `sandmux run`: one command.
    Run,
    /// A tmux server (`serve`, `shell`, `check`).
    Tmux,
}

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
pub fn compile(policy: &Policy, mode: Mode) -> Blueprint {
    let mut m = Vec::new();
    m.push(step(
        "/",
        Part::Root,
        tmpfs("size=16m,mode=0755", Attrs::NOSUID_NODEV),
        Need::Required,
    ));
    run_dir(&mut m, policy, mode);
    profile_entries(&mut m, policy);
    guard(&mut m, policy);
    dev(&mut m, policy);
    proc(&mut m);
    etc(&mut m, policy);
    for p in [RUN_DIR, "/"] {
        m.push(step(p, Part::Seal, Op::ReadOnly, Need::Required));
    }
    let after_ready = match mode {
        Mode::Tmux => vec![step(
            SOCK_DIR,
            Part::SocketCover,
            tmpfs("size=4k,mode=0", Attrs::RO_ALL),
            Need::Required,
        )],
        Mode::Run => Vec::new(),
    };
    let layers = Layer::ALL
        .into_iter()
        .map(|layer| LayerNeed {
            layer,
            need: if policy.best_effort.contains(&layer) {
                Need::BestEffort
            } else {
                Need::Required
            },
        })
        .collect();
    let landlock = [Role::Server, Role::Pane, Role::Command]
        .into_iter()
        .map(|role| RoleRules {
            role,
            rules: landlock::rules(policy, role)
                .into_iter()
                .map(|(path, grant)| Rule { path, grant })
                .collect(),
        })
        .collect();
    Blueprint {
        layers,
        mounts: m,
        after_ready,
        landlock,
        paths: Paths {
            workspace: policy.workspace.clone(),
            home: crate::profile::SANDBOX_HOME.into(),
            run_dir: RUN_DIR.into(),
            socket: super::SOCKET_INSIDE.into(),
            tmux_conf: TMUX_CONF.into(),
            gate: GATE.into(),
            gate_config: GATE_CONFIG.into(),
        },
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
    if super::name_files(policy).is_some() {
        files.push(("resolv.conf", RunFile::ResolvConf));
        files.push(("hosts", RunFile::Hosts));
    }
    if mode == Mode::Tmux {
        files.push(("tmux.conf", RunFile::TmuxConf));
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
/// reach the host kernel.
fn proc(m: &mut Vec<Step>) {
    let attrs = Attrs::new(false, true, true, true);
    m.push(step(
        "/proc",
        Part::Proc,
        Op::Procfs { attrs },
        Need::Required,
    ));
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

/// `/etc/passwd` and `/etc/group`: the sandbox's identity only; without a
/// host network, `/etc/resolv.conf` and `/etc/hosts` say why.
fn etc(m: &mut Vec<Step>, policy: &Policy) {
    let mut names = vec!["passwd", "group"];
    if super::name_files(policy).is_some() {
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

impl Blueprint {
    /// The layers the profile lets go.
    pub fn best_effort(&self) -> std::collections::BTreeSet<Layer> {
        self.layers
            .iter()
            .filter(|l| l.need == Need::BestEffort)
            .map(|l| l.layer)
            .collect()
    }
}
