//! Namespaces: user, mount, pid, ipc, uts and net, created in one `unshare`.
//!
//! The user namespace maps exactly one id: the caller's host uid/gid appear as
//! the profile's uid (1000 by default) inside, never as 0. When sandmux is started
//! as root this is still the mapping: nothing inside holds a capability over the
//! host, and the securebits are locked (see `caps.rs`).

use super::report::Refusal;
use crate::profile::{Layer, NetMode};
use nix::sched::{unshare, CloneFlags};
use std::io::Write;

/// What the namespace step achieved.
#[derive(Debug, Clone, Default)]
pub(crate) struct Created {
    /// Layers created.
    pub created: Vec<Layer>,
    /// Layers that could not be created, with the reason.
    pub missing: Vec<Missing>,
}

/// A namespace that could not be created.
#[derive(Debug, Clone)]
pub(crate) struct Missing {
    /// Its layer.
    pub layer: Layer,
    /// Why, as the kernel answered.
    pub why: String,
    /// `unshare` answered EPERM (a container's seccomp profile).
    pub refused: Option<Refusal>,
}

impl Missing {
    fn new(layer: Layer, why: String, errno: Option<nix::errno::Errno>) -> Missing {
        let refused = (errno == Some(nix::errno::Errno::EPERM)).then_some(Refusal::NamespacesEperm);
        Missing {
            layer,
            why,
            refused,
        }
    }
}

impl Created {
    /// Whether `layer` was created.
    pub(crate) fn has(&self, layer: Layer) -> bool {
        self.created.contains(&layer)
    }
}

fn flags_for(net: NetMode, with_user: bool, pid: bool) -> (CloneFlags, Vec<Layer>) {
    let mut f = CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWIPC | CloneFlags::CLONE_NEWUTS;
    let mut layers = vec![Layer::Mount, Layer::Ipc, Layer::Uts];
    if pid {
        f |= CloneFlags::CLONE_NEWPID;
        layers.insert(1, Layer::Pid);
    }
    if net != NetMode::Host {
        f |= CloneFlags::CLONE_NEWNET;
        layers.push(Layer::Net);
    }
    if with_user {
        f |= CloneFlags::CLONE_NEWUSER;
        layers.insert(0, Layer::Userns);
    }
    (f, layers)
}

/// Procfs directories that are always empty: the kernel lets a fresh procfs
/// be mounted whatever is mounted on them.
const EMPTY_PROC_DIRS: [&str; 2] = ["/proc/sys/fs/binfmt_misc", "/proc/fs/nfsd"];

/// Why a fresh procfs would be refused in a new user namespace, if it would:
/// something covers part of `/proc` (a container runtime masks `/proc/kcore`
/// and makes `/proc/sys` read-only), and a fresh procfs would reveal it.
pub(crate) fn proc_covered() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let covered: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mp| mp.starts_with("/proc/") && !EMPTY_PROC_DIRS.contains(mp))
        .collect();
    let first = covered.first()?;
    Some(format!(
        "{first} and {} more paths of /proc are covered here (a container runtime's masks), so the kernel would refuse a fresh procfs: no pid namespace, whose processes the /proc of the container could not show by their pids",
        covered.len() - 1
    ))
}

/// Creates the namespaces. Tries with a user namespace first; without one (only
/// possible for a caller holding CAP_SYS_ADMIN) the other namespaces are tried
/// alone. With `no_pid` (why), no pid namespace is made with a user namespace
/// (see [`proc_covered`]). The caller decides whether what is missing is
/// acceptable.
pub(crate) fn create(net: NetMode, no_pid: Option<String>) -> Created {
    let (flags, layers) = flags_for(net, true, no_pid.is_none());
    match unshare(flags) {
        Ok(()) => Created {
            created: layers,
            missing: no_pid
                .map(|why| Missing::new(Layer::Pid, why, None))
                .into_iter()
                .collect(),
        },
        Err(user_err) => {
            let why = format!("unshare(CLONE_NEWUSER|...) failed: {user_err}");
            // In the initial user namespace a fresh procfs is never refused.
            let (flags, layers) = flags_for(net, false, true);
            match unshare(flags) {
                Ok(()) => Created {
                    created: layers,
                    missing: vec![Missing::new(Layer::Userns, why, Some(user_err))],
                },
                Err(e) => {
                    let mut missing = vec![Missing::new(Layer::Userns, why, Some(user_err))];
                    for l in layers {
                        let why = format!("unshare without a user namespace failed: {e}");
                        missing.push(Missing::new(l, why, Some(e)));
                    }
                    Created {
                        created: vec![],
                        missing,
                    }
                }
            }
        }
    }
}

/// Caps what the sandbox's processes may hold of the host user's inotify
/// budget (per user, shared with the workspace guard and the human's
/// editor): the limits of this process's user namespace, which the kernel
/// checks besides every parent's (`/proc/sys/user`, writable by the
/// namespace's root).
/// Each cap is at most half the host user's own limit
/// (`/proc/sys/fs/inotify/max_user_*`), so the other half stays the
/// host's whatever the profile says. Returns the caps set.
pub(crate) fn cap_inotify(watches: u64, instances: u64) -> std::io::Result<(u64, u64)> {
    let half = |name: &str, want: u64| -> u64 {
        std::fs::read_to_string(format!("/proc/sys/fs/inotify/{name}"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .map_or(want, |host| want.min((host / 2).max(1)))
    };
    let (w, i) = (
        half("max_user_watches", watches),
        half("max_user_instances", instances),
    );
    std::fs::write("/proc/sys/user/max_inotify_watches", w.to_string())?;
    std::fs::write("/proc/sys/user/max_inotify_instances", i.to_string())?;
    Ok((w, i))
}

/// Writes the single-id maps of a fresh user namespace (from inside it).
pub(crate) fn write_id_maps(inside: u32, host_uid: u32, host_gid: u32) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/setgroups")?
        .write_all(b"deny")?;
    std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/uid_map")?
        .write_all(format!("{inside} {host_uid} 1").as_bytes())?;
    std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/gid_map")?
        .write_all(format!("{inside} {host_gid} 1").as_bytes())?;
    Ok(())
}

/// Sets the hostname of the UTS namespace.
pub(crate) fn set_hostname(name: &str) -> nix::Result<()> {
    nix::unistd::sethostname(name)
}
