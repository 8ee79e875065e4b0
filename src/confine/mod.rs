//! The supervisor confines itself. Once `serve` has started its sandbox it
//! needs little of the host: its runtime directory, the audit log and the
//! recording, the workspace guard's trees and state, the instance's cgroup,
//! `/proc`, and the tmux binary with what it loads. Everything else is given
//! up, so a bug in handling agent input cannot become host access:
//!
//! - **Landlock**: the filesystem rules of [`Needs`]; every TCP bind and
//!   connect denied (ABI 4) — in network mode `proxy`, connect is allowed
//!   to the ports the allow list can reach ([`Needs::connect_tcp`]), and
//!   the resolver's files are readable, and so are the directories of the
//!   credentials' `from_file`s ([`credential_reads`]: read again after a
//!   rotation); abstract Unix sockets scoped (ABI 6). Signals are
//!   not scoped: the supervisor signals its sandbox, which is outside its
//!   domain. Landlock binds the calling thread and the threads and processes
//!   it starts later, never the threads that exist already: `serve` confines
//!   its main thread before the runtime starts any thread, the signal thread
//!   is started after it, and the workspace guard's thread, which runs from
//!   before the sandbox starts, restricts itself with its own narrower rules
//!   ([`Needs::guard`]) as its first step.
//! - **seccomp**: a denylist ([`denied`]) installed on every thread at once
//!   (`TSYNC`): namespaces, the mount API, ptrace, keyrings, bpf, module
//!   loading and the rest of the sandbox's denylist, except `setns`, which
//!   the freeze helper needs (`nssignal`); sockets of every family but unix
//!   (and, in network mode `proxy` only, inet and inet6 TCP for the proxy's
//!   upstream connections, UDP only for the host's resolver: [`Needs::inet`]);
//!   the socket configuration ioctls.
//! - **rlimits**: no core dumps (`RLIMIT_CORE` 0, soft and hard): a dump
//!   would write the supervisor's memory to disk.
//!
//! A server generation started later (`on_server_exit = "restart"`) needs
//! mounts and namespaces, which a confined process can no longer make, and
//! the signals freezer reads the sandbox's `/proc/PID/ns`, which Landlock
//! closes to another domain: the broker started before confinement does
//! both (`supervisor::broker`).
//!
//! This runs on the host, but it is a layer of its own, not part of
//! `supervisor`: the workspace guard's and the proxy's threads confine
//! themselves with it, and both sit below `supervisor` (`src/layers.rs`).

use crate::profile::{Layer, Policy};
use crate::sandbox::landlock::{abi_of, effective_abi};
use crate::sandbox::report::LayerStatus;
use crate::sandbox::seccomp::Inet;
use crate::sandbox::StartError;
use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::path::{Path, PathBuf};

mod error;
pub(crate) use error::ConfineError;

/// How the supervisor may use a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Right {
    /// Read files and list directories.
    Read,
    /// Read and execute (the tmux binary and the libraries it loads).
    Exec,
    /// Read, write and truncate existing files (the audit log, a recording,
    /// `/dev/null`); nothing is created.
    File,
    /// Every right: a tree the supervisor owns or must repair (its runtime
    /// directory, the guard's trees and state).
    Tree,
    /// A cgroup parent: read and write the control files of the cgroups below,
    /// remove them once empty.
    Cgroup,
    /// Remove an empty directory directly below (the runtime directory's base).
    RemoveBelow,
}

impl Right {
    fn access(self, abi: ABI, is_dir: bool) -> BitFlags<AccessFs> {
        let read = AccessFs::ReadFile | AccessFs::ReadDir;
        let file = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate;
        let all = AccessFs::from_all(abi);
        let a = match self {
            Right::Read => read,
            Right::Exec => read | AccessFs::Execute,
            Right::File => file,
            // Device nodes are never made (seccomp refuses mknod as well).
            Right::Tree => all & !(AccessFs::MakeChar | AccessFs::MakeBlock),
            Right::Cgroup => file | AccessFs::ReadDir | AccessFs::RemoveDir,
            Right::RemoveBelow => BitFlags::from(AccessFs::RemoveDir),
        } & all;
        if is_dir {
            a
        } else {
            a & AccessFs::from_file(abi)
        }
    }
}

/// The files in `/etc` a tmux client and the dynamic loader read.
const ETC_FILES: [&str; 8] = [
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/terminfo",
];

/// Where the tmux client and the loader find what they load, for read-only
/// trees that have a mask below them (the tree itself cannot be granted).
const LOADED: [&str; 9] = [
    "/usr/lib",
    "/usr/lib64",
    "/usr/lib32",
    "/lib",
    "/lib64",
    "/lib32",
    "/usr/share/locale",
    "/usr/share/terminfo",
    "/usr/share/zoneinfo",
];

/// Read + execute: each read-only tree of the profile with no mask below it
/// (what the sandbox sees too); of a tree with a mask below, only the tmux
/// binary and the [`LOADED`] directories with no mask below them.
fn read_exec(policy: &Policy, tmux: &Path) -> Vec<(PathBuf, Right)> {
    use crate::profile::MountKind;
    let masked: Vec<&Path> = policy
        .fs
        .iter()
        .filter(|e| e.kind == MountKind::Masked)
        .map(|e| e.path.as_path())
        .collect();
    let clear = |p: &Path| !masked.iter().any(|m| m.starts_with(p));
    let mut v = Vec::new();
    for e in policy.fs.iter().filter(|e| e.kind == MountKind::ReadOnly) {
        if clear(&e.path) {
            v.push((e.path.clone(), Right::Exec));
            continue;
        }
        let inside = LOADED.iter().map(Path::new).chain([tmux]);
        for p in inside.filter(|p| p.starts_with(&e.path) && clear(p)) {
            v.push((p.to_path_buf(), Right::Exec));
        }
    }
    v
}

/// What a confined thread may touch, as (path, right) rules.
#[derive(Debug, Clone, Default)]
pub(crate) struct Needs {
    /// The rules; paths that do not exist are skipped when applied.
    pub rules: Vec<(PathBuf, Right)>,
    /// TCP ports that may be connected to (network mode `proxy`: the
    /// allow list's); empty: none.
    pub connect_tcp: Vec<u16>,
    /// UDP sockets allowed (network mode `proxy` with a name the host's
    /// resolver must look up: one not pinned in `hosts`).
    pub udp: bool,
}

/// What the host's resolver reads (network mode `proxy`).
const RESOLVER: [&str; 6] = [
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/run/systemd/resolve",
    "/etc/services",
];

/// What the allowlist proxy dials from the supervisor (network mode
/// `proxy`; `crate::proxy::dials` says it for a policy): TCP connect to
/// these ports, and UDP when it may ask the host's resolver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Dials {
    /// Ports the proxy may connect to (empty: no inet socket at all).
    pub connect_tcp: Vec<u16>,
    /// Whether it may ask the host's name servers over UDP.
    pub udp: bool,
}

/// The inputs of [`Needs::supervisor`]: every file `serve` keeps using.
pub(crate) struct Files<'a> {
    /// The instance's runtime directory (sockets, meta, operator endpoint).
    pub rundir: &'a Path,
    /// As root: the instance's view directory, where tmux mode without a
    /// mount view keeps each generation's files (`hostview`), removed with
    /// the runtime directory.
    pub host_view: Option<&'a Path>,
    /// The tmux binary its clients run.
    pub tmux: &'a Path,
    /// The audit log.
    pub audit: &'a Path,
    /// The `--record` recording.
    pub record: Option<&'a Path>,
    /// The instance's cgroup directories (`Cgroup::instance`).
    pub cgroup: &'a [PathBuf],
    /// The workspace guard's trees and state directory.
    pub guard: Option<(&'a [PathBuf], &'a Path)>,
    /// What the proxy dials (nothing outside proxy mode).
    pub proxy: Dials,
}

impl Needs {
    /// The workspace guard's thread: its trees and state directory (it
    /// reverts, quarantines and keeps manifests there), and `/proc`.
    pub(crate) fn guard(trees: &[PathBuf], state: &Path) -> Needs {
        let mut rules: Vec<(PathBuf, Right)> =
            trees.iter().map(|t| (t.clone(), Right::Tree)).collect();
        rules.push((state.to_path_buf(), Right::Tree));
        rules.push(("/proc".into(), Right::Read));
        Needs {
            rules,
            connect_tcp: vec![],
            udp: false,
        }
    }

    /// `serve` after start-up: [`Files`], the tmux client's binary and
    /// libraries (the profile's read-only trees with nothing masked below
    /// them, and the few files of `/etc` a client and the loader read),
    /// `/proc` (the freezer, reaping, OOM counts) and `/dev/null`.
    pub(crate) fn supervisor(policy: &Policy, f: &Files) -> Needs {
        let mut n = match f.guard {
            Some((trees, state)) => Needs::guard(trees, state),
            None => Needs {
                rules: vec![("/proc".into(), Right::Read)],
                connect_tcp: vec![],
                udp: false,
            },
        };
        n.connect_tcp = f.proxy.connect_tcp.clone();
        n.udp = f.proxy.udp;
        if !n.connect_tcp.is_empty() {
            n.rules
                .extend(RESOLVER.iter().map(|p| (PathBuf::from(p), Right::Read)));
        }
        n.rules.extend(credential_reads(policy));
        n.rules.extend(read_exec(policy, f.tmux));
        n.rules
            .extend(ETC_FILES.iter().map(|p| (PathBuf::from(p), Right::Read)));
        n.rules.push(("/dev/null".into(), Right::File));
        // The copy-on-write layer: removed at the end when it holds no
        // change, or with `--on-end discard`.
        // A copy workspace's copy, wherever it is: its directory too.
        let copy = (policy.workspace_mode == crate::profile::WorkspaceMode::Copy)
            .then(|| policy.workspace.parent())
            .flatten();
        for dir in std::iter::once(f.rundir)
            .chain(f.host_view)
            .chain(policy.layer.as_deref())
            .chain(copy)
        {
            n.rules.push((dir.to_path_buf(), Right::Tree));
            if let Some(base) = dir.parent() {
                n.rules.push((base.to_path_buf(), Right::RemoveBelow));
            }
        }
        n.rules.push((f.audit.to_path_buf(), Right::File));
        if let Some(r) = f.record {
            n.rules.push((r.to_path_buf(), Right::File));
        }
        // The instance's own directories: every generation's cgroup is below.
        for d in f.cgroup {
            n.rules.push((d.clone(), Right::Cgroup));
        }
        n
    }
}

impl Needs {
    /// The inet sockets seccomp leaves to the supervisor.
    pub(crate) fn inet(&self) -> Inet {
        match (self.connect_tcp.is_empty(), self.udp) {
            (true, _) => Inet::No,
            (false, false) => Inet::Tcp,
            (false, true) => Inet::TcpUdp,
        }
    }
}

/// What the proxy reads lazily, long after confinement, of its
/// credentials: each `from_file`'s directories
/// ([`crate::secretfile::dirs`]), read again when the file is renamed over
/// or rewritten. One list for both confinements that run the proxy
/// (`serve`'s supervisor, the proxy's thread under `run` and `shell`), made
/// from the same profile entries the proxy reads, so a credential source
/// cannot be read at start and then be out of reach: a `from_command` runs
/// in the broker (or, under `run` and `shell`, outside the confined
/// thread), never here.
pub(crate) fn credential_reads(policy: &Policy) -> Vec<(PathBuf, Right)> {
    use crate::profile::credentials::From;
    policy
        .credentials
        .iter()
        .filter_map(|c| match c.from() {
            From::File(f) => crate::secretfile::dirs(f),
            _ => None,
        })
        .flatten()
        .map(|d| (d, Right::Read))
        .collect()
}

/// What the proxy's own thread under `run` and `shell` keeps (their
/// supervisor is otherwise not confined): the resolver's and the loader's
/// files, the libraries NSS loads, the credentials' files
/// ([`credential_reads`]), TCP connect to the allow list's ports, UDP only
/// when the proxy may resolve ([`Dials`]).
pub(crate) fn proxy_thread_needs(policy: &Policy, dials: Dials) -> Needs {
    let mut rules: Vec<(PathBuf, Right)> = RESOLVER
        .iter()
        .chain(ETC_FILES.iter())
        .map(|p| (PathBuf::from(p), Right::Read))
        .collect();
    rules.extend(credential_reads(policy));
    for lib in ["/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib"] {
        rules.push((lib.into(), Right::Exec));
    }
    Needs {
        rules,
        connect_tcp: dials.connect_tcp,
        udp: dials.udp,
    }
}

/// Confines the calling thread only (the proxy's, under `run` and
/// `shell`): `no_new_privs`, the Landlock ruleset `prepared` for
/// [`proxy_thread_needs`], and the supervisor's seccomp filter for this
/// thread (no `TSYNC`). Threads it starts later inherit all three.
pub(crate) fn confine_this_thread(prepared: Prepared, inet: Inet) -> Result<String, ConfineError> {
    crate::sandbox::caps::set_no_new_privs()?;
    let ll = prepared.restrict()?;
    let progs = crate::sandbox::seccomp::supervisor_programs(&denied(), inet)
        .map_err(ConfineError::Programs)?;
    for p in &progs {
        seccompiler::apply_filter(p).map_err(ConfineError::ThreadFilter)?;
    }
    Ok(ll)
}

/// A Landlock ruleset built on one thread and applied on another.
pub(crate) struct Prepared {
    ruleset: RulesetCreated,
    ports: Vec<u16>,
    abi: u8,
    kernel: u8,
    rules: usize,
}

/// Builds the ruleset for `needs` at the profile's Landlock ABI.
pub(crate) fn prepare(policy: &Policy, needs: &Needs) -> Result<Prepared, ConfineError> {
    let (kernel, eff) = effective_abi(policy.landlock_abi);
    if eff == 0 {
        return Err(ConfineError::NoLandlock);
    }
    if eff < 4 && !needs.connect_tcp.is_empty() {
        // seccomp lets the supervisor make TCP sockets in proxy mode; only
        // Landlock's port rules (ABI 4) keep them to the allow list's ports.
        return Err(ConfineError::NoPortRules {
            abi: eff,
            capped: if kernel > eff {
                ", capped by [enforcement] landlock_abi"
            } else {
                ""
            },
        });
    }
    let abi = abi_of(eff);
    let e = ConfineError::Ruleset;
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(e)?;
    if eff >= 4 {
        rs = rs.handle_access(AccessNet::from_all(abi)).map_err(e)?;
    }
    if eff >= 6 {
        rs = rs.scope(Scope::AbstractUnixSocket).map_err(e)?;
    }
    let mut ruleset = rs.create().map_err(e)?;
    let mut rules = 0;
    for (path, right) in &needs.rules {
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        let access = right.access(abi, meta.is_dir());
        let fd = PathFd::new(path).map_err(|source| ConfineError::Path {
            path: path.clone(),
            source,
        })?;
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|source| ConfineError::Rule {
                path: path.clone(),
                source,
            })?;
        rules += 1;
    }
    if eff >= 4 {
        for &port in &needs.connect_tcp {
            ruleset = ruleset
                .add_rule(landlock::NetPort::new(port, AccessNet::ConnectTcp))
                .map_err(|source| ConfineError::Port { port, source })?;
        }
    }
    let ports = needs.connect_tcp.clone();
    Ok(Prepared {
        ruleset,
        abi: eff,
        kernel,
        rules,
        ports,
    })
}

impl Prepared {
    /// Restricts the calling thread (and what it starts from now on).
    pub(crate) fn restrict(self) -> Result<String, ConfineError> {
        let (abi, kernel, rules) = (self.abi, self.kernel, self.rules);
        let tcp = match (abi >= 4, self.ports.is_empty()) {
            (false, _) => String::new(),
            (true, true) => ", no TCP".to_string(),
            (true, false) => format!(
                ", no TCP bind, TCP connect only to ports {:?} (the proxy's upstreams, the OTLP collector)",
                self.ports
            ),
        };
        let status = self
            .ruleset
            .restrict_self()
            .map_err(ConfineError::Ruleset)?;
        if status.ruleset != RulesetStatus::FullyEnforced {
            return Err(ConfineError::NotEnforced(status.ruleset));
        }
        Ok(format!(
            "Landlock ABI {abi} (the kernel has {kernel}): {rules} path rules{tcp}"
        ))
    }
}

/// The calls the supervisor's filter refuses with `EPERM`: the sandbox's
/// denylist but `setns`, plus `ptrace`.
pub(crate) fn denied() -> Vec<(&'static str, i64)> {
    let mut v: Vec<(&'static str, i64)> = crate::sandbox::syscalls::DENIED
        .iter()
        .flat_map(|(_, g)| g.iter().copied())
        .filter(|(n, _)| *n != "setns")
        .collect();
    v.extend([
        ("ptrace", libc::SYS_ptrace),
        // Device nodes and fifos: never needed, and a node in a writable
        // tree would reach a device Landlock does not name.
        ("mknod", libc::SYS_mknod),
        ("mknodat", libc::SYS_mknodat),
        // File capabilities on a binary in the workspace.
        ("setxattr", libc::SYS_setxattr),
        ("lsetxattr", libc::SYS_lsetxattr),
        ("fsetxattr", libc::SYS_fsetxattr),
        ("setxattrat", 463),
    ]);
    v
}

/// Installs the supervisor's seccomp filter on every thread (TSYNC); returns
/// how many calls it denies. `inet`: which inet and inet6 sockets stay
/// allowed (network mode `proxy`).
pub(crate) fn seccomp_all_threads(inet: Inet) -> Result<usize, ConfineError> {
    let progs = crate::sandbox::seccomp::supervisor_programs(&denied(), inet)
        .map_err(ConfineError::Programs)?;
    for p in &progs {
        seccompiler::apply_filter_all_threads(p).map_err(ConfineError::AllThreads)?;
    }
    Ok(denied().len())
}

/// No core dumps, ever (soft and hard limit 0).
pub(crate) fn no_core() -> Result<(), ConfineError> {
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)
        .map_err(ConfineError::NoCore)
}

/// Confines the calling (main) thread with `needs` and every thread with the
/// seccomp filter. Whatever part fails makes the layer missing: refused
/// start-up, unless the profile lists `supervisor` as best effort.
pub(crate) fn confine(policy: &Policy, needs: &Needs) -> Result<LayerStatus, StartError> {
    let mut done = Vec::new();
    let mut failed = Vec::new();
    match prepare(policy, needs).and_then(Prepared::restrict) {
        Ok(d) => done.push(d),
        Err(e) => failed.push(format!("Landlock: {e}")),
    }
    let inet = needs.inet();
    match seccomp_all_threads(inet) {
        Ok(n) => done.push(format!(
            "seccomp on every thread: {n} calls, socket configuration ioctls and every socket {} denied",
            match inet {
                Inet::No => "family but unix",
                Inet::Tcp => "but unix and TCP (the proxy's upstreams, the OTLP collector)",
                Inet::TcpUdp => "but unix, TCP (the proxy's upstreams, the OTLP collector) and UDP (the host's resolver)",
            }
        )),
        Err(e) => failed.push(format!("seccomp: {e}")),
    }
    match no_core() {
        Ok(()) => done.push("RLIMIT_CORE=0".to_string()),
        Err(e) => failed.push(e.to_string()),
    }
    status(policy, done, failed)
}

/// The layer's status from what was done and what failed.
pub(crate) fn status(
    policy: &Policy,
    done: Vec<String>,
    failed: Vec<String>,
) -> Result<LayerStatus, StartError> {
    if failed.is_empty() {
        return Ok(LayerStatus {
            layer: Layer::Supervisor,
            enforced: true,
            detail: done.join("; "),
        });
    }
    let why = failed.join("; ");
    if !policy.best_effort.contains(&Layer::Supervisor) {
        return Err(StartError::layer(Layer::Supervisor, &why));
    }
    let kept = if done.is_empty() {
        "nothing".to_string()
    } else {
        done.join("; ")
    };
    Ok(LayerStatus {
        layer: Layer::Supervisor,
        enforced: false,
        detail: format!("{why} (in force: {kept})"),
    })
}

/// What `serve` would achieve here (`sandmux check`): the same Landlock
/// rules and seccomp programs, tried for real on a short-lived thread (both
/// bind only that thread without `TSYNC`), and `client` (a tmux client of
/// the instance) run under them.
pub(crate) fn probe<E: std::fmt::Display>(
    policy: &Policy,
    needs: &Needs,
    client: &(dyn Fn() -> Result<(), E> + Sync),
) -> Result<LayerStatus, StartError> {
    let (done, failed) = std::thread::scope(|s| {
        s.spawn(|| {
            let mut done = Vec::new();
            let mut failed = Vec::new();
            match prepare(policy, needs).and_then(Prepared::restrict) {
                Ok(d) => done.push(d),
                Err(e) => failed.push(format!("Landlock: {e}")),
            }
            let progs = crate::sandbox::seccomp::supervisor_programs(&denied(), needs.inet())
                .map_err(|e| e.to_string());
            match progs.and_then(|ps| {
                ps.iter()
                    .try_for_each(|p| seccompiler::apply_filter(p).map_err(|e| e.to_string()))
            }) {
                Ok(()) => done.push(format!("seccomp: {} calls denied", denied().len())),
                Err(e) => failed.push(format!("seccomp: {e}")),
            }
            match client() {
                Ok(()) => done.push("a tmux client runs under them".into()),
                Err(e) => failed.push(format!("a tmux client under these rules: {e}")),
            }
            done.push("RLIMIT_CORE=0".into());
            (done, failed)
        })
        .join()
        .unwrap_or_else(|_| (vec![], vec!["the probe thread panicked".into()]))
    });
    status(policy, done, failed)
}

#[cfg(test)]
mod tests;
