//! The named confinement layers a profile can require or mark best-effort.

use serde::{Deserialize, Serialize};

/// One confinement layer. Every layer is required unless the profile names it in
/// `[enforcement] best_effort`; a missing required layer refuses start-up (P5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layer {
    /// User namespace (unprivileged id mapping).
    Userns,
    /// Mount namespace, new root, masks, protected paths.
    Mount,
    /// The workspace guard's git part: git's control plane read-only (P8).
    Git,
    /// PID namespace with sandmux as PID 1.
    Pid,
    /// IPC namespace.
    Ipc,
    /// UTS namespace (hostname).
    Uts,
    /// Network namespace (`none` and `loopback` modes).
    Net,
    /// Landlock filesystem rules.
    Landlock,
    /// Landlock TCP port rules (`host` network mode, ABI 4).
    LandlockNet,
    /// Landlock scopes: abstract Unix sockets and signals (ABI 6).
    LandlockScope,
    /// seccomp filter.
    Seccomp,
    /// Resource limits via setrlimit.
    Rlimits,
    /// cgroup `pids.max` / `memory.max`.
    Cgroup,
    /// Capabilities dropped and securebits locked.
    Caps,
    /// `no_new_privs`.
    NoNewPrivs,
    /// A fresh, empty session keyring.
    Keyring,
    /// The supervisor confines itself once the sandbox runs (`serve`).
    Supervisor,
}

impl Layer {
    /// Every layer, in start-up order.
    pub const ALL: [Layer; 17] = [
        Layer::Userns,
        Layer::Mount,
        Layer::Git,
        Layer::Pid,
        Layer::Ipc,
        Layer::Uts,
        Layer::Net,
        Layer::Cgroup,
        Layer::Rlimits,
        Layer::Keyring,
        Layer::Caps,
        Layer::NoNewPrivs,
        Layer::Landlock,
        Layer::LandlockNet,
        Layer::LandlockScope,
        Layer::Seccomp,
        Layer::Supervisor,
    ];

    /// The name used in profiles and reports.
    pub fn name(self) -> &'static str {
        match self {
            Layer::Userns => "userns",
            Layer::Mount => "mount",
            Layer::Git => "git",
            Layer::Pid => "pid",
            Layer::Ipc => "ipc",
            Layer::Uts => "uts",
            Layer::Net => "net",
            Layer::Landlock => "landlock",
            Layer::LandlockNet => "landlock-net",
            Layer::LandlockScope => "landlock-scope",
            Layer::Seccomp => "seccomp",
            Layer::Rlimits => "rlimits",
            Layer::Cgroup => "cgroup",
            Layer::Caps => "caps",
            Layer::NoNewPrivs => "no-new-privs",
            Layer::Keyring => "keyring",
            Layer::Supervisor => "supervisor",
        }
    }

    /// The one-line fix shown when the layer is required but missing.
    pub fn fix(self) -> &'static str {
        match self {
            Layer::Userns => "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces>0, or an AppArmor profile allowing userns), or use the 'container' profile",
            Layer::Mount | Layer::Pid | Layer::Ipc | Layer::Uts | Layer::Net => "this namespace needs user namespaces or CAP_SYS_ADMIN; enable user namespaces, or use the 'container' profile",
            Layer::Git => "git's control plane is made read-only by the mount namespace; enable user namespaces, or set [workspace] git = \"unguarded\" in a profile of your own (host git then obeys what the agent writes)",
            Layer::Landlock => "boot a kernel with Landlock enabled (CONFIG_SECURITY_LANDLOCK=y and 'landlock' in the lsm= boot parameter)",
            Layer::LandlockNet => "Landlock TCP rules need ABI 4 (Linux 6.7+); use network mode 'none' or 'loopback' instead of 'host'",
            Layer::LandlockScope => "Landlock scopes need ABI 6 (Linux 6.12+); upgrade the kernel or add \"landlock-scope\" to [enforcement] best_effort (pid/net namespaces then cover signals and abstract sockets)",
            Layer::Seccomp => "enable seccomp filtering in the kernel (CONFIG_SECCOMP_FILTER=y) and do not run under a policy that forbids it",
            Layer::Rlimits => "setrlimit failed; check the hard limits of the calling shell (ulimit -H)",
            Layer::Cgroup => "run sandmux where it can write a cgroup: a cgroup v2 subtree delegated to this user with the pids and memory controllers, or a session with a systemd user manager (sandmux then asks it for a transient scope with Delegate=yes itself), or as root; or add \"cgroup\" to [enforcement] best_effort",
            Layer::Caps => "capability dropping failed; do not run sandmux under a security module that forbids capset/prctl",
            Layer::NoNewPrivs => "prctl(PR_SET_NO_NEW_PRIVS) failed; this kernel is too old for sandmux",
            Layer::Keyring => "joining a fresh session keyring (keyctl) was refused, as a container runtime's seccomp profile does; add \"keyring\" to [enforcement] best_effort (the sandbox's own filter still denies every keyring call inside)",
            Layer::Supervisor => "`serve` confines itself with Landlock and seccomp once its sandbox runs: boot a kernel with Landlock, and run under no policy (e.g. a container runtime's seccomp profile) that refuses landlock_* or seccomp(2); or add \"supervisor\" to [enforcement] best_effort",
        }
    }
}

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
