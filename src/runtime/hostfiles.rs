//! Where `serve`'s host-side files go: the audit log and the recording,
//! refused inside any tree the agent can write, and the user's retention
//! of finished instances' logs.

use crate::audit;
use crate::profile::Policy;
use std::path::PathBuf;

/// Why a host-side file is refused, or the retention failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostFileError {
    /// A relative path with no current directory to resolve it against.
    #[error("{what}: no current directory to resolve {}: {source}", path.display())]
    NoCwd {
        what: String,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A `..` below a directory that does not exist.
    #[error("{what} {} cannot be resolved (`..` below a directory that does not exist); give a plain path to {flag}", path.display())]
    Unresolvable {
        what: String,
        path: PathBuf,
        flag: String,
    },
    /// Inside a tree the agent can write (`within` names it).
    #[error("{what} {} is inside {within}, which the agent can write; choose another {flag}", path.display())]
    AgentWritable {
        what: String,
        path: PathBuf,
        within: String,
        flag: String,
    },
    /// The user's configuration could not be loaded.
    #[error("{0}")]
    Config(String),
    /// The retention could not be applied.
    #[error("{0}")]
    Retention(String),
}

/// The path to open for a host-side file sandmux writes (audit log,
/// recording), refused when the agent could rewrite it: inside the workspace
/// or another read-write tree of the profile. The longest existing ancestor
/// is resolved (symlinks, `..`) and the rest appended, so neither a relative
/// spelling, a symlinked parent nor a parent that does not exist yet gets
/// around the check; a `..` below a missing directory is refused.
pub(crate) fn outside_agent_writable(
    path: &std::path::Path,
    policy: &Policy,
    what: &str,
    flag: &str,
) -> Result<PathBuf, HostFileError> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|source| HostFileError::NoCwd {
                what: what.to_string(),
                path: path.to_path_buf(),
                source,
            })?
            .join(path)
    };
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    let resolved = loop {
        if let Ok(c) = std::fs::canonicalize(existing) {
            break rest.iter().rev().fold(c, |p: PathBuf, n| p.join(n));
        }
        match (existing.file_name(), existing.parent()) {
            (Some(n), Some(parent)) => {
                rest.push(n.to_os_string());
                existing = parent;
            }
            _ => {
                return Err(HostFileError::Unresolvable {
                    what: what.to_string(),
                    path: abs.clone(),
                    flag: flag.to_string(),
                })
            }
        }
    };
    let writable = std::iter::once(policy.workspace.clone()).chain(
        policy
            .fs
            .iter()
            .filter(|e| e.kind == crate::profile::MountKind::ReadWrite)
            .map(|e| std::fs::canonicalize(&e.path).unwrap_or_else(|_| e.path.clone())),
    );
    for root in writable {
        if resolved.starts_with(&root) {
            return Err(HostFileError::AgentWritable {
                what: what.to_string(),
                path: abs.clone(),
                within: if root == policy.workspace {
                    "the workspace".to_string()
                } else {
                    format!("the read-write tree {}", root.display())
                },
                flag: flag.to_string(),
            });
        }
    }
    Ok(resolved)
}

/// Applies the user's retention to the default audit directory (where
/// `audit` was opened), and records what it removed.
pub(crate) fn retain(audit: &audit::Audit) -> Result<(), HostFileError> {
    let keep = crate::profile::user::load()
        .map_err(|e| HostFileError::Config(e.to_string()))?
        .audit
        .keep_days;
    let Some(dir) = audit.path().parent() else {
        return Ok(());
    };
    let n = audit::retention::apply(dir, keep, std::time::SystemTime::now())
        .map_err(|e| HostFileError::Retention(e.to_string()))?;
    if n > 0 {
        audit.event(audit::Entry::event("(audit-retention)", Some("retention"), &serde_json::json!({"removed_logs": n, "keep_days": keep, "config": crate::profile::user::path()})));
    }
    Ok(())
}
