//! Without a user namespace, file permissions and the grants are what keep
//! the confined processes off sandmux's own files (the runtime directory
//! with its sockets, the binary), where Landlock cannot (below ABI 9 it does
//! not mediate connecting to a pathname socket).
//!
//! - [`drop_uid`]: as root, everything confined runs as an unprivileged uid:
//!   the workspace directory's owner when that is not root (the agent's files
//!   stay the user's, the volume writable), else the profile's sandbox uid.
//! - [`withhold_writes`]: no write grant on a tree that holds the runtime
//!   directory or the binary (without a mount view a `tmpfs` entry is the
//!   host path itself, so `tmpfs = ["/tmp"]` would grant the real `/tmp`).

use super::landlock::Grant;
use super::plan::Blueprint;
use nix::unistd::{Gid, Uid};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Who the confined processes become, and why that uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// The workspace's owner (else the profile's sandbox uid).
    pub(crate) owner: bool,
}

/// The uid to drop to: the workspace's owner unless that is root.
pub(crate) fn target(bp: &Blueprint) -> Target {
    match std::fs::metadata(&bp.paths.workspace) {
        Ok(m) if m.uid() != 0 => Target {
            uid: m.uid(),
            gid: m.gid(),
            owner: true,
        },
        _ => Target {
            uid: bp.identity.uid,
            gid: bp.identity.uid,
            owner: false,
        },
    }
}

/// Why the uid could not be dropped to.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UidError {
    /// The dedicated uid is a user's.
    #[error("the sandbox uid {uid} is the user {name:?} on this system; set [sandbox] uid in the profile to a uid no user has")]
    TakenByUser { uid: u32, name: String },
    /// The ids are not mapped in this user namespace.
    #[error("uid {uid} gid {gid} are not mapped in this user namespace")]
    Unmapped { uid: u32, gid: u32 },
    /// The parent-death signal could not be read or armed again.
    #[error("{call}: {source}")]
    Prctl {
        call: &'static str,
        source: nix::Error,
    },
    /// The supplementary groups could not be emptied.
    #[error("setgroups([]): {0}")]
    Setgroups(nix::Error),
    /// The gids could not be changed.
    #[error("setresgid({gid}): {source}")]
    SetGid { gid: u32, source: nix::Error },
    /// The uids could not be changed.
    #[error("setresuid({uid}): {source}")]
    SetUid { uid: u32, source: nix::Error },
    /// A capability could not be dropped from the bounding set.
    #[error("drop {cap} from the bounding set: {source}")]
    Bounding {
        cap: caps::Capability,
        source: caps::errors::CapsError,
    },
    /// uid 0 came back after the drop.
    #[error("uid 0 could be regained after the drop")]
    Regained,
    /// The parent exited while the ids changed.
    #[error("the parent exited during the drop")]
    ParentExited,
}

/// The error of the `prctl` `call`.
fn prctl(call: &'static str) -> impl FnOnce(nix::Error) -> UidError {
    move |source| UidError::Prctl { call, source }
}

/// Whether `t` may be dropped to; returns what to report.
pub(crate) fn check(t: Target) -> Result<String, UidError> {
    // A dedicated uid must be nobody's: a user's uid would hand the sandbox
    // that user's processes and pathname sockets (an ssh-agent under
    // /run/user/N), which nothing else here mediates.
    if let (false, Some(name)) = (t.owner, user_of(t.uid)) {
        return Err(UidError::TakenByUser { uid: t.uid, name });
    }
    if !mapped(t.uid) || !mapped_in("/proc/self/gid_map", t.gid) {
        return Err(UidError::Unmapped {
            uid: t.uid,
            gid: t.gid,
        });
    }
    let who = if t.owner {
        "the workspace's owner"
    } else {
        "a dedicated uid: the workspace belongs to root"
    };
    Ok(format!(
        "confined processes run as uid {} gid {} ({who}), not root",
        t.uid, t.gid
    ))
}

/// Whether this user namespace maps `uid`.
fn mapped(uid: u32) -> bool {
    mapped_in("/proc/self/uid_map", uid)
}

fn mapped_in(map: &str, id: u32) -> bool {
    let text = std::fs::read_to_string(map).unwrap_or_default();
    text.lines().any(|l| {
        let f: Vec<u64> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        f.len() == 3 && f[0] <= u64::from(id) && u64::from(id) < f[0] + f[2]
    })
}

/// Becomes `t` for good: no supplementary groups, real, effective and saved
/// ids all changed (which also empties the capability sets). The kernel
/// clears the parent-death signal on a change of ids: it is armed again, and
/// the parent checked to be the same. Returns what to report.
pub(crate) fn drop_uid(t: Target) -> Result<String, UidError> {
    let said = check(t)?;
    let death = nix::sys::prctl::get_pdeathsig().map_err(prctl("PR_GET_PDEATHSIG"))?;
    let parent = nix::unistd::getppid();
    // The bounding set first, while CAP_SETPCAP is still there.
    if caps::has_cap(None, caps::CapSet::Effective, caps::Capability::CAP_SETPCAP).unwrap_or(false)
    {
        for cap in caps::all() {
            caps::drop(None, caps::CapSet::Bounding, cap)
                .map_err(|source| UidError::Bounding { cap, source })?;
        }
    }
    nix::unistd::setgroups(&[]).map_err(UidError::Setgroups)?;
    let (g, u) = (Gid::from_raw(t.gid), Uid::from_raw(t.uid));
    nix::unistd::setresgid(g, g, g).map_err(|source| UidError::SetGid { gid: t.gid, source })?;
    nix::unistd::setresuid(u, u, u).map_err(|source| UidError::SetUid { uid: t.uid, source })?;
    if nix::unistd::setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0)).is_ok() {
        return Err(UidError::Regained);
    }
    if let Some(sig) = death {
        nix::sys::prctl::set_pdeathsig(sig).map_err(prctl("PR_SET_PDEATHSIG"))?;
        if nix::unistd::getppid() != parent {
            return Err(UidError::ParentExited);
        }
    }
    Ok(said)
}

/// The name `/etc/passwd` gives `uid`, if any.
fn user_of(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 2 && f[2].parse() == Ok(uid)).then(|| f[0].to_string())
    })
}

/// Whether this uid 0 is the host's root: the initial user namespace's
/// identity map. A user namespace's root (a rootless container's) that cannot
/// drop (only uid 0 mapped) keeps uid 0, which is no host privilege.
pub(crate) fn host_root() -> bool {
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    map.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"]
}

/// Turns every write grant on a tree holding one of `keep` into a read
/// grant; returns the paths whose write was withheld.
pub(crate) fn withhold_writes(rules: &mut [(PathBuf, Grant)], keep: &[PathBuf]) -> Vec<PathBuf> {
    let mut withheld = Vec::new();
    for (path, grant) in rules.iter_mut() {
        let writes = matches!(grant, Grant::ReadWrite | Grant::Device);
        if writes && keep.iter().any(|k| holds(path, k)) {
            *grant = Grant::Read;
            withheld.push(path.clone());
        }
    }
    withheld
}

fn holds(tree: &Path, p: &Path) -> bool {
    p.starts_with(tree)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_on_trees_holding_sandmux_files_are_withheld_and_no_others() {
        let mut rules = vec![
            (PathBuf::from("/tmp"), Grant::ReadWrite),
            (PathBuf::from("/workspace"), Grant::ReadWrite),
            (PathBuf::from("/usr"), Grant::ReadExec),
            (PathBuf::from("/tmp/sandmux-0"), Grant::Read),
        ];
        let keep = [
            PathBuf::from("/tmp/sandmux-0/abc"),
            PathBuf::from("/usr/bin/sandmux"),
        ];
        assert_eq!(
            withhold_writes(&mut rules, &keep),
            vec![PathBuf::from("/tmp")]
        );
        assert_eq!(rules[0].1, Grant::Read);
        assert_eq!(rules[1].1, Grant::ReadWrite);
        assert_eq!(rules[2].1, Grant::ReadExec);
        // A sibling whose name merely starts alike is not a parent.
        let mut r = vec![(PathBuf::from("/tmp/sand"), Grant::ReadWrite)];
        assert!(withhold_writes(&mut r, &keep).is_empty());
    }

    #[test]
    fn a_dedicated_uid_that_a_user_has_is_refused_before_anything_changes() {
        // Every system's passwd names uid 0; the refusal comes first, so
        // this test process keeps its ids.
        let me = nix::unistd::getuid();
        let t = Target {
            uid: 0,
            gid: 0,
            owner: false,
        };
        let e = drop_uid(t).unwrap_err();
        assert!(
            matches!(&e, UidError::TakenByUser { uid: 0, name } if name == "root"),
            "{e}"
        );
        let e = e.to_string();
        assert!(e.contains("\"root\"") && e.contains("[sandbox] uid"), "{e}");
        assert_eq!(nix::unistd::getuid(), me);
        // The control: a uid no user has is not refused by this rule.
        assert_eq!(user_of(3_999_999), None);
        assert_eq!(user_of(0).as_deref(), Some("root"));
    }
}
