//! Where a credential's source may be: never where the sandbox could read
//! it (a `from_file`) or change it (a `from_file`'s directories, a
//! `from_command`'s program and the files it names).

use crate::profile::{MountKind, Policy};
use crate::secretfile;

/// Refuses a `from_command` whose program or a file it names (an absolute
/// argument) the sandbox could write: the agent would choose what the
/// host runs.
pub(super) fn runnable(policy: &Policy, argv: &[String]) -> Result<(), String> {
    for a in argv.iter().filter(|a| a.starts_with('/')) {
        let p = std::path::Path::new(a);
        let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        for q in [p, real.as_path()] {
            let deepest = deepest(policy, q);
            if deepest.is_some_and(|e| e.kind == MountKind::ReadWrite)
                || q.starts_with(&policy.workspace)
            {
                return Err(format!("from_command names {}, which the sandbox can write (profile '{}'): the agent would choose what runs on the host; keep the command and its files outside every tree the sandbox can write", q.display(), policy.name));
            }
        }
    }
    Ok(())
}

/// Refuses a `from_file` the sandbox could read (the deepest entry of the
/// view above it, or its link's target, binds the host's tree) or replace
/// (a directory it is read again from is bound read-write), and one
/// without a directory of its own ([`secretfile::dirs`]).
pub(super) fn visible(policy: &Policy, path: &std::path::Path) -> Result<(), String> {
    let dirs = secretfile::dirs(path).ok_or_else(|| format!("from_file {}: keep it (and its link's target) in a directory of its own, at least two levels below / and not your home directory (e.g. /run/secrets/NAME/ or ~/.config/sandmux/secrets/NAME/): the confined supervisor keeps read access to all of that directory to read a rotated file again", path.display()))?;
    for d in &dirs {
        let deepest = deepest(policy, d);
        if deepest.is_some_and(|e| e.kind == MountKind::ReadWrite)
            || d.starts_with(&policy.workspace)
        {
            return Err(format!("from_file {}: the sandbox can write {} (profile '{}'), so it could replace the file; keep the secret outside every tree the profile shows", path.display(), d.display(), policy.name));
        }
    }
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    for p in [path, real.as_path()] {
        let deepest = deepest(policy, p);
        let shown = deepest
            .is_some_and(|e| matches!(e.kind, MountKind::ReadOnly | MountKind::ReadWrite))
            || p.starts_with(&policy.workspace);
        if shown {
            return Err(format!("from_file {} is visible inside the sandbox (profile '{}' binds it); keep the secret outside every tree the profile shows", p.display(), policy.name));
        }
    }
    Ok(())
}

/// The deepest entry of the profile's view above `p` (the one that decides
/// what the sandbox sees there).
fn deepest<'a>(policy: &'a Policy, p: &std::path::Path) -> Option<&'a crate::profile::FsEntry> {
    policy
        .fs
        .iter()
        .filter(|e| p.starts_with(&e.path))
        .max_by_key(|e| e.path.components().count())
}
