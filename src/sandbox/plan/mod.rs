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

mod compile;
mod gate;
pub(crate) use compile::{compile, host_view, CA, CA_BUNDLE, SYSTEM_BUNDLES};
pub(crate) use gate::GateConfig;

use super::landlock::{Grant, Role};
use super::net::Net;
use crate::profile::{Environment, Layer, Limits, SandboxSettings};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The tmux socket's directory inside (a bind of `<rundir>/sock`).
pub(crate) const SOCK_DIR: &str = "/run/sandmux/sock";
/// The pane gate inside (the sandmux binary, read-only).
pub(crate) const GATE: &str = "/run/sandmux/bin/sandmux-pane";
/// The empty file that masks files.
pub(crate) const EMPTY: &str = "/run/sandmux/empty";

/// Everything the sandbox will be, compiled from a policy: the one value
/// that crosses into it. PID 1, the payload and the pane gate act on this
/// and never read the profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Blueprint {
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
    /// Tmux mode without a mount view: where its files are instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_view: Option<HostView>,
    /// Who runs inside: the uid, the hostname and the panes' shell.
    pub identity: SandboxSettings,
    /// The network mode and Landlock's TCP ports.
    pub net: Net,
    /// The highest Landlock ABI the profile lets the sandbox use.
    pub landlock_abi: Option<u8>,
    /// rlimits, and the limits the cgroup line reports.
    pub limits: Limits,
    /// What the pane gate keeps of a pane's environment and sets in it.
    pub environment: Environment,
    /// Paths kept read-only inside read-write trees (the self-test checks).
    pub protected: Vec<PathBuf>,
    /// What needs a mount namespace: without one PID 1 stops, whatever
    /// the git guard's mode (a copy-on-write workspace with no overlay would
    /// be the host's tree, written live and unguarded).
    pub needs_mount: Option<MountNeed>,
    /// The workspace guard's step in PID 1 (P8).
    pub git: GitStep,
    /// What the mount view's report line counts.
    pub counts: ViewCounts,
}

/// The workspace guard's step in PID 1, compiled from the policy's guard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum GitStep {
    /// `[workspace] git = "unguarded"`: reported as dropped.
    Unguarded,
    /// Guarded by the mount view.
    Guarded {
        /// The report line, with a mount namespace.
        said: String,
    },
}

/// What of the workspace guard cannot be had without a mount namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum MountNeed {
    /// The copy-on-write layer (an overlay over the workspace).
    Layer,
    /// Commit mode (the agent's repository mounted over `.git`).
    Commit,
}

/// What the mount view's report line counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ViewCounts {
    /// The profile's filesystem entries.
    pub entries: usize,
    /// Parents of protected paths bound onto themselves.
    pub pinned: usize,
    /// Git directories outside every tree, bound read-only.
    pub git_outside: usize,
}

/// Tmux mode without a mount namespace (root with no user namespace: a
/// container runtime's defaults): the sandbox's own files in a host
/// directory of this instance that no confined process can write
/// (`sandbox::hostview`), and the Landlock rules that name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HostView {
    /// The paths, on the host.
    pub paths: Paths,
    /// The directory and the binary the gate links to.
    pub own: super::landlock::Own,
    /// The Landlock rules of each role, with those paths.
    pub landlock: Vec<RoleRules>,
}

/// A layer and its requirement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LayerNeed {
    /// The layer.
    pub layer: Layer,
    /// `required` or `best-effort`.
    pub need: Need,
}

/// What a failing step (or a missing layer) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Need {
    /// Failure ends start-up.
    Required,
    /// Skipped when its path is absent (on the host or in the view); any
    /// other failure ends start-up.
    IfPresent,
    /// Failure is reported as the step's layer dropped when the profile lists
    /// that layer as best-effort; otherwise it ends start-up.
    BestEffort,
    /// A fallback: runs only when the step before it was dropped (its
    /// failure then ends start-up); skipped when that step succeeded.
    IfDropped,
}

/// One mount step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Step {
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
pub(crate) enum Part {
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
    /// The copy-on-write workspace: an overlay over the workspace's bind.
    Layer,
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
    /// `/proc` when a fresh procfs is refused: the existing one, read-only.
    ProcFallback,
    /// A `/proc` file that would list the caller's keys, emptied.
    ProcMask,
    /// A `/proc` entry that reaches the host kernel, read-only.
    ProcCover,
    /// An `/etc` file replaced by the sandbox's own.
    Etc,
    /// The utempter helper tmux runs for each pane, emptied (tmux mode).
    Utempter,
    /// A mount made read-only once its contents are in place.
    Seal,
    /// The socket directory covered once the server listens.
    SocketCover,
}

/// What a step does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub(crate) enum Op {
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
    /// An overlayfs over what is mounted at the path (its lower layer),
    /// its writes in `<layer>/upper` (`<layer>/work` its work directory), on
    /// the host.
    Overlay {
        /// The layer directory on the host (named `dir`: a step's `layer`
        /// is the layer it reports under).
        dir: PathBuf,
    },
}

/// Where a bind's tree comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub(crate) enum From {
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
pub(crate) enum Onto {
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
pub(crate) enum RunFile {
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
    /// With credentials: the host's roots and the instance's CA.
    CaBundle,
    /// With credentials: the instance's CA alone.
    Ca,
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
    pub(crate) const fn new(ro: bool, nosuid: bool, nodev: bool, noexec: bool) -> Attrs {
        Attrs {
            ro,
            nosuid,
            nodev,
            noexec,
        }
    }
    pub(crate) const NOSUID_NODEV: Attrs = Attrs::new(false, true, true, false);
    pub(crate) const RO_NOSUID_NODEV: Attrs = Attrs::new(true, true, true, false);
    pub(crate) const RO_ALL: Attrs = Attrs::new(true, true, true, true);
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

/// A mount attribute the plan does not know (`pub`: the error of
/// `Attrs`'s `TryFrom`).
#[derive(Debug, thiserror::Error)]
#[error("unknown mount attribute {0:?}")]
pub struct UnknownAttr(String);

impl TryFrom<String> for Attrs {
    type Error = UnknownAttr;
    fn try_from(s: String) -> Result<Attrs, UnknownAttr> {
        let mut a = Attrs::new(false, false, false, false);
        for w in s.split(',') {
            match w {
                "ro" => a.ro = true,
                "nosuid" => a.nosuid = true,
                "nodev" => a.nodev = true,
                "noexec" => a.noexec = true,
                "rw" => {}
                _ => return Err(UnknownAttr(w.to_string())),
            }
        }
        Ok(a)
    }
}

/// The Landlock rules of one role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RoleRules {
    /// The role.
    pub role: Role,
    /// Its rules, in the order they are added.
    pub rules: Vec<Rule>,
}

/// One Landlock rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Rule {
    /// The path inside (skipped when it does not exist).
    pub path: PathBuf,
    /// What is granted beneath it.
    pub grant: Grant,
}

/// Paths inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Paths {
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
pub(crate) enum Mode {
    /// `sandmux run`: one command.
    Run,
    /// A tmux server (`serve`, `shell`, `check`).
    Tmux,
}

impl Blueprint {
    /// The layers the profile lets go.
    pub(crate) fn best_effort(&self) -> std::collections::BTreeSet<Layer> {
        self.layers
            .iter()
            .filter(|l| l.need == Need::BestEffort)
            .map(|l| l.layer)
            .collect()
    }
}
