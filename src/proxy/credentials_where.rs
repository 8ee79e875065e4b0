//! Where a credential's source may be: never where the sandbox could read
//! it (a `from_file`) or change it (a `from_file`'s directories, a
//! `from_command`'s program and the files it names).

use crate::profile::{MountKind, Policy};
use crate::secretfile;
use std::path::PathBuf;

/// Why a credential's source is where the sandbox could reach it: each
/// says where to keep it instead.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PlaceError {
    /// A `from_command`'s program or a file it names can be written.
    #[error("from_command names {}, which the sandbox can write (profile '{profile}'): the agent would choose what runs on the host; keep the command and its files outside every tree the sandbox can write", .path.display())]
    CommandWritable { path: PathBuf, profile: String },
    /// A `from_file` without a directory of its own.
    #[error("from_file {}: keep it (and its link's target) in a directory of its own, at least two levels below / and not your home directory (e.g. /run/secrets/NAME/ or ~/.config/sandmux/secrets/NAME/): the confined supervisor keeps read access to all of that directory to read a rotated file again", .0.display())]
    FileWithoutDir(PathBuf),
    /// A `from_file` in a directory the sandbox can write.
    #[error("from_file {}: the sandbox can write {} (profile '{profile}'), so it could replace the file; keep the secret outside every tree the profile shows", .path.display(), .dir.display())]
    FileReplaceable {
        path: PathBuf,
        dir: PathBuf,
        profile: String,
    },
    /// A `from_file` the sandbox can read.
    #[error("from_file {} is visible inside the sandbox (profile '{profile}' binds it); keep the secret outside every tree the profile shows", .path.display())]
    FileVisible { path: PathBuf, profile: String },
}

/// Refuses a `from_command` whose program or a file it names (an absolute
/// argument) the sandbox could write: the agent would choose what the
/// host runs.
pub(super) fn runnable(policy: &Policy, argv: &[String]) -> Result<(), PlaceError> {
    for a in argv.iter().filter(|a| a.starts_with('/')) {
        let p = std::path::Path::new(a);
        let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        for q in [p, real.as_path()] {
            let deepest = deepest(policy, q);
            if deepest.is_some_and(|e| e.kind == MountKind::ReadWrite)
                || q.starts_with(&policy.workspace)
            {
                return Err(PlaceError::CommandWritable {
                    path: q.to_path_buf(),
                    profile: policy.name.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Refuses a `from_file` the sandbox could read (the deepest entry of the
/// view above it, or its link's target, binds the host's tree) or replace
/// (a directory it is read again from is bound read-write), and one
/// without a directory of its own ([`secretfile::dirs`]).
pub(super) fn visible(policy: &Policy, path: &std::path::Path) -> Result<(), PlaceError> {
    let dirs =
        secretfile::dirs(path).ok_or_else(|| PlaceError::FileWithoutDir(path.to_path_buf()))?;
    for d in &dirs {
        let deepest = deepest(policy, d);
        if deepest.is_some_and(|e| e.kind == MountKind::ReadWrite)
            || d.starts_with(&policy.workspace)
        {
            return Err(PlaceError::FileReplaceable {
                path: path.to_path_buf(),
                dir: d.to_path_buf(),
                profile: policy.name.clone(),
            });
        }
    }
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    for p in [path, real.as_path()] {
        let deepest = deepest(policy, p);
        let shown = deepest
            .is_some_and(|e| matches!(e.kind, MountKind::ReadOnly | MountKind::ReadWrite))
            || p.starts_with(&policy.workspace);
        if shown {
            return Err(PlaceError::FileVisible {
                path: p.to_path_buf(),
                profile: policy.name.clone(),
            });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::FsEntry;
    use std::path::Path;

    /// A source the sandbox can reach is refused, in the words the profile's
    /// author reads (`credential NAME: …`, as before the typed error);
    /// control: the same file outside every tree the profile shows is not.
    #[test]
    fn a_source_the_sandbox_reaches_is_refused_in_the_same_words() {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path().join("ws");
        let secrets = t.path().join("secrets/gh");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(&secrets).unwrap();
        let mut policy = crate::sandbox::view::sample();
        policy.name = "dev".into();
        policy.workspace = ws.clone();
        policy.fs = vec![FsEntry {
            path: ws.clone(),
            kind: MountKind::ReadWrite,
        }];
        let said = |source: PlaceError| {
            super::super::CredError::Place {
                name: "GH".into(),
                source,
            }
            .to_string()
        };
        let tool = ws.join("bin/token");
        let e = runnable(&policy, &[tool.display().to_string()]).unwrap_err();
        assert_eq!(said(e), format!("credential GH: from_command names {}, which the sandbox can write (profile 'dev'): the agent would choose what runs on the host; keep the command and its files outside every tree the sandbox can write", tool.display()));
        let inside = ws.join("token");
        let e = visible(&policy, &inside).unwrap_err();
        assert!(said(e).starts_with(&format!(
            "credential GH: from_file {}: the sandbox can write ",
            inside.display()
        )),);
        let e = visible(&policy, Path::new("/token")).unwrap_err();
        assert_eq!(said(e), "credential GH: from_file /token: keep it (and its link's target) in a directory of its own, at least two levels below / and not your home directory (e.g. /run/secrets/NAME/ or ~/.config/sandmux/secrets/NAME/): the confined supervisor keeps read access to all of that directory to read a rotated file again");
        let outside = secrets.join("token");
        policy.fs.push(FsEntry {
            path: t.path().join("secrets"),
            kind: MountKind::ReadOnly,
        });
        let e = visible(&policy, &outside).unwrap_err();
        assert_eq!(said(e), format!("credential GH: from_file {} is visible inside the sandbox (profile 'dev' binds it); keep the secret outside every tree the profile shows", outside.display()));
        // Control: shown nowhere, the same file and command are accepted.
        policy.fs.pop();
        visible(&policy, &outside).unwrap();
        runnable(&policy, &[outside.display().to_string()]).unwrap();
    }
}
