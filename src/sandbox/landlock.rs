//! Landlock: filesystem rules from the profile, TCP port rules when the network
//! is shared, and scopes for abstract Unix sockets and signals.
//!
//! Two layers are stacked. The sandbox layer (PID 1's children: the tmux server,
//! or the `run` command) grants the profile's paths plus what the server needs
//! under `/run/sandmux`. Each pane gate adds a pane layer with the same profile
//! paths but nothing of `/run/sandmux` except the gate binary. Because the pane
//! domain is nested under the server's, a pane can neither signal (scope, ABI 6)
//! nor ptrace the server or PID 1 — so `/proc/<server>/{root,cwd,fd}` are closed
//! to it too (T1, T5).
//!
//! The ABI used is the kernel's best, or the profile's pin if lower. Rights a
//! lower ABI lacks are listed in the report; a required layer whose feature is
//! missing refuses start-up.

use super::net::Net;
use crate::profile::{Layer, MountKind, NetMode, Policy};
use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::path::PathBuf;

/// Where the sandbox's own files live inside (see `mounts.rs`).
pub(crate) const RUN_DIR: &str = "/run/sandmux";

/// Where the sandbox's own files are: the mount view's `/run/sandmux`, or,
/// without a mount view, the instance's host directory (`hostview`), whose
/// gate is a link to the sandmux binary, granted by its own path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Own {
    /// The directory with `bin/`, `sock/` and the configuration files.
    pub dir: PathBuf,
    /// The binary the gate links to (host view only).
    pub exe: Option<PathBuf>,
}

impl Default for Own {
    fn default() -> Own {
        Own {
            dir: RUN_DIR.into(),
            exe: None,
        }
    }
}

/// Which process the layer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Role {
    /// The tmux server (and through it, the gate before it restricts itself).
    Server,
    /// A pane, added by the gate.
    Pane,
    /// The command of `sandmux run`.
    Command,
}

/// How a path may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Grant {
    /// List directories only.
    ListOnly,
    /// Read files and list directories, no execution.
    Read,
    /// Read and execute.
    ReadExec,
    /// Everything (read, write, create, remove, execute).
    ReadWrite,
    /// Read and write files plus device ioctls (ttys).
    Device,
}

/// What the Landlock step achieved.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    /// Whether TCP rules were applied.
    pub net: bool,
    /// Whether scopes were applied.
    pub scoped: bool,
    /// Human-readable summary, including rights this ABI lacks.
    pub detail: String,
    /// Sub-layers the ABI could not provide (TCP rules, scopes).
    pub missing: Vec<(Layer, String)>,
}

/// The kernel's Landlock ABI (0: unavailable).
pub(crate) fn kernel_abi() -> u8 {
    const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns an integer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        0
    } else {
        r.min(255) as u8
    }
}

pub(crate) fn abi_of(n: u8) -> ABI {
    match n {
        0 => ABI::Unsupported,
        1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        5 => ABI::V5,
        6 => ABI::V6,
        7 => ABI::V7,
        8 => ABI::V8,
        _ => ABI::V9,
    }
}

/// The effective ABI (the kernel's, capped by the profile's pin).
pub(crate) fn effective_abi(pin: Option<u8>) -> (u8, u8) {
    let k = kernel_abi();
    let e = match pin {
        Some(pin) => k.min(pin),
        None => k,
    };
    (k, e.min(9))
}

/// What each kind of profile entry is granted.
fn grant_of(kind: &MountKind) -> Option<Grant> {
    match kind {
        MountKind::ReadOnly => Some(Grant::ReadExec),
        MountKind::ReadWrite | MountKind::Tmpfs => Some(Grant::ReadWrite),
        MountKind::Masked | MountKind::Symlink(_) => None,
    }
}

/// The device nodes every role may read, write and `ioctl`.
const DEVICES: [&str; 6] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// The rules every sandbox has whatever its profile, after the profile's.
fn fixed(role: Role, own: &Own) -> Vec<(PathBuf, Grant)> {
    let mut r: Vec<(PathBuf, Grant)> = DEVICES
        .iter()
        .map(|d| (PathBuf::from(d), Grant::Device))
        .collect();
    r.push(("/dev/pts".into(), Grant::Device));
    r.push(("/dev/shm".into(), Grant::ReadWrite));
    r.push(("/proc".into(), Grant::Read));
    let run = own.dir.as_path();
    match role {
        Role::Server => {
            r.push((run.into(), Grant::Read));
            r.push((run.join("bin"), Grant::ReadExec));
            r.push((run.join("sock"), Grant::ReadWrite));
        }
        Role::Pane => r.push((run.join("bin"), Grant::ReadExec)),
        Role::Command => return r,
    }
    if let Some(exe) = &own.exe {
        r.push((exe.clone(), Grant::ReadExec));
    }
    r
}

/// The rules for a role, as (path, grant) pairs.
pub(crate) fn rules(policy: &Policy, role: Role, own: &Own) -> Vec<(PathBuf, Grant)> {
    let mut r: Vec<(PathBuf, Grant)> = vec![("/".into(), Grant::ListOnly)];
    for e in &policy.fs {
        if let Some(g) = grant_of(&e.kind) {
            r.push((e.path.clone(), g));
        }
    }
    // The workspace guard's read-only git directories (P8): the one a
    // worktree's `.git` file names, and commit mode's view of the real one.
    for p in &policy.guard.git_outside {
        r.push((p.clone(), Grant::Read));
    }
    if let Some(c) = &policy.guard.commit {
        r.push((c.origin.clone(), Grant::Read));
    }
    // With credentials, the instance's CA files the variables name.
    if policy.ca_pem.is_some() {
        for f in [super::plan::CA_BUNDLE, super::plan::CA] {
            r.push((own.dir.join(f), Grant::Read));
        }
    }
    r.extend(fixed(role, own));
    r
}

/// The rules by role as a markdown table (`docs/architecture.md`).
pub(crate) fn table() -> String {
    const ROLES: [Role; 3] = [Role::Server, Role::Pane, Role::Command];
    let mut t = String::from("| path (inside) | server | pane | command |\n|---|---|---|---|\n");
    let row = |path: &str, g: &dyn Fn(Role) -> Option<Grant>| {
        let cells: Vec<&str> = ROLES
            .iter()
            .map(|r| g(*r).map_or("—", Grant::describe))
            .collect();
        format!("| {path} | {} |\n", cells.join(" | "))
    };
    t.push_str(&row("`/` (inherited by every directory below)", &|_| {
        Some(Grant::ListOnly)
    }));
    for (what, kind) in [
        ("profile `read_only` entries", MountKind::ReadOnly),
        ("profile `read_write` entries", MountKind::ReadWrite),
        ("profile `tmpfs` entries", MountKind::Tmpfs),
    ] {
        t.push_str(&row(what, &|_| grant_of(&kind)));
    }
    t.push_str(&row("git directories a worktree's or submodule's `.git` names outside every tree; commit mode's `<state>/git/<id>/origin` (workspace guard)", &|_| Some(Grant::Read)));
    let mut paths: Vec<PathBuf> = Vec::new();
    for r in ROLES {
        for (p, _) in fixed(r, &Own::default()) {
            if !paths.contains(&p) {
                paths.push(p);
            }
        }
    }
    for p in paths {
        let grant = |r: Role| {
            fixed(r, &Own::default())
                .into_iter()
                .find(|(q, _)| *q == p)
                .map(|(_, g)| g)
        };
        t.push_str(&row(&format!("`{}`", p.display()), &grant));
    }
    t
}

impl Grant {
    /// The rights, in words.
    fn describe(self) -> &'static str {
        match self {
            Grant::ListOnly => "list directories",
            Grant::Read => "read",
            Grant::ReadExec => "read + execute",
            Grant::ReadWrite => "every right of the ABI",
            Grant::Device => "read, write, truncate, device ioctl",
        }
    }
}

fn access_for(grant: Grant, abi: ABI, is_dir: bool) -> BitFlags<AccessFs> {
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let all = AccessFs::from_all(abi);
    let a = match grant {
        Grant::ListOnly => BitFlags::from(AccessFs::ReadDir),
        Grant::Read => read,
        Grant::ReadExec => read | AccessFs::Execute,
        Grant::ReadWrite => all,
        Grant::Device => read | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev,
    };
    let a = a & all;
    if is_dir {
        a
    } else {
        a & AccessFs::from_file(abi)
    }
}

/// Applies a Landlock layer with `rules` (a role's, from [`rules`]) to the
/// calling thread. `Err` carries the layer that is missing; callers decide
/// whether it was required.
/// `net_isolated` says whether the sandbox has its own network namespace; without
/// one, `none` and `loopback` fall back to Landlock denying every TCP bind and
/// connect (the best Landlock can do; UDP stays open and the report says so).
pub(crate) fn restrict(
    abi_pin: Option<u8>,
    net: &Net,
    rules: &[(PathBuf, Grant)],
    net_isolated: bool,
) -> Result<Outcome, (Layer, String)> {
    let (kernel, eff) = effective_abi(abi_pin);
    if eff == 0 {
        return Err((
            Layer::Landlock,
            "Landlock is not available in this kernel (landlock_create_ruleset failed)".into(),
        ));
    }
    let abi = abi_of(eff);
    let want_net = net.mode == NetMode::Host || !net_isolated;
    let ports = net;
    let net = want_net && eff >= 4;
    let scoped = eff >= 6;
    let created = ruleset(abi, net, scoped)?;
    let created = add_paths(created, rules, abi)?;
    let created = if net {
        add_ports(created, ports)?
    } else {
        created
    };
    let status = created.restrict_self().map_err(err(Layer::Landlock))?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err((
            Layer::Landlock,
            format!("ruleset not fully enforced: {:?}", status.ruleset),
        ));
    }
    let mut missing = Vec::new();
    if want_net && !net {
        missing.push((
            Layer::LandlockNet,
            format!(
                "network mode 'host' needs Landlock ABI 4 for TCP rules; effective ABI is {eff}"
            ),
        ));
    }
    if !scoped {
        missing.push((
            Layer::LandlockScope,
            format!("scopes need Landlock ABI 6; effective ABI is {eff}"),
        ));
    }
    Ok(Outcome {
        net,
        scoped,
        detail: describe(eff, kernel, net, scoped),
        missing,
    })
}

fn err(l: Layer) -> impl Fn(landlock::RulesetError) -> (Layer, String) {
    move |e| (l, e.to_string())
}

/// A ruleset handling every filesystem right of `abi`, TCP if `net`, and
/// both scopes if `scoped`; every one a hard requirement.
fn ruleset(abi: ABI, net: bool, scoped: bool) -> Result<RulesetCreated, (Layer, String)> {
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(err(Layer::Landlock))?;
    if net {
        rs = rs
            .handle_access(AccessNet::from_all(abi))
            .map_err(err(Layer::LandlockNet))?;
    }
    if scoped {
        rs = rs
            .scope(Scope::from_all(abi))
            .map_err(err(Layer::LandlockScope))?;
    }
    rs.create().map_err(err(Layer::Landlock))
}

/// One rule per path that exists; a path that does not is skipped.
fn add_paths(
    mut created: RulesetCreated,
    rules: &[(PathBuf, Grant)],
    abi: ABI,
) -> Result<RulesetCreated, (Layer, String)> {
    for (path, grant) in rules {
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        let fd =
            PathFd::new(path).map_err(|e| (Layer::Landlock, format!("{}: {e}", path.display())))?;
        let access = access_for(*grant, abi, meta.is_dir());
        if access.is_empty() {
            continue;
        }
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| (Layer::Landlock, format!("rule for {}: {e}", path.display())))?;
    }
    Ok(created)
}

/// The profile's TCP connect and bind ports.
fn add_ports(mut created: RulesetCreated, net: &Net) -> Result<RulesetCreated, (Layer, String)> {
    for &p in &net.connect_tcp {
        created = created
            .add_rule(NetPort::new(p, AccessNet::ConnectTcp))
            .map_err(err(Layer::LandlockNet))?;
    }
    for &p in &net.bind_tcp {
        created = created
            .add_rule(NetPort::new(p, AccessNet::BindTcp))
            .map_err(err(Layer::LandlockNet))?;
    }
    Ok(created)
}

/// The report's line: the ABI, what is enforced, what this ABI cannot mediate.
fn describe(eff: u8, kernel: u8, net: bool, scoped: bool) -> String {
    let mut lacks = Vec::new();
    if eff < 2 {
        lacks.push("refer (cross-directory rename/link)");
    }
    if eff < 3 {
        lacks.push("truncate");
    }
    if eff < 5 {
        lacks.push("device ioctl");
    }
    if eff < 9 {
        lacks.push("pathname Unix socket connect (covered by the mount view, or by file permissions without one)");
    }
    format!(
        "ABI {eff} (kernel {kernel}){}{}{}",
        if net { ", TCP port rules" } else { "" },
        if scoped {
            ", scopes: signal + abstract unix"
        } else {
            ""
        },
        if lacks.is_empty() {
            String::new()
        } else {
            format!("; not mediated at this ABI: {}", lacks.join(", "))
        }
    )
}
