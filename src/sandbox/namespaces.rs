//! Namespaces: user, mount, pid, ipc, uts and net, created in one `unshare`.
//!
//! The user namespace maps exactly one id: the caller's host uid/gid appear as
//! the profile's uid (1000 by default) inside, never as 0. When sandmux is started
//! as root this is still the mapping: nothing inside holds a capability over the
//! host, and the securebits are locked (see `caps.rs`).

use crate::profile::{Layer, NetMode};
use nix::sched::{unshare, CloneFlags};
use std::io::Write;

/// What the namespace step achieved.
#[derive(Debug, Clone, Default)]
pub(crate) struct Created {
    /// Layers created.
    pub created: Vec<Layer>,
    /// Layers that could not be created, with the reason.
    pub missing: Vec<(Layer, String)>,
}

impl Created {
    /// Whether `layer` was created.
    pub(crate) fn has(&self, layer: Layer) -> bool {
        self.created.contains(&layer)
    }
}

fn flags_for(net: NetMode, with_user: bool) -> (CloneFlags, Vec<Layer>) {
    let mut f = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    let mut layers = vec![Layer::Mount, Layer::Pid, Layer::Ipc, Layer::Uts];
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

/// Creates the namespaces. Tries with a user namespace first; without one (only
/// possible for a caller holding CAP_SYS_ADMIN) the other namespaces are tried
/// alone. The caller decides whether what is missing is acceptable.
pub(crate) fn create(net: NetMode) -> Created {
    let (flags, layers) = flags_for(net, true);
    match unshare(flags) {
        Ok(()) => Created {
            created: layers,
            missing: vec![],
        },
        Err(user_err) => {
            let why = format!("unshare(CLONE_NEWUSER|...) failed: {user_err}");
            let (flags, layers) = flags_for(net, false);
            match unshare(flags) {
                Ok(()) => Created {
                    created: layers,
                    missing: vec![(Layer::Userns, why)],
                },
                Err(e) => {
                    let mut missing = vec![(Layer::Userns, why)];
                    for l in layers {
                        missing.push((l, format!("unshare without a user namespace failed: {e}")));
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
