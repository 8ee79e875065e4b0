//! `[workspace]`: how the workspace is guarded (P8): the settings and their
//! types (the guard itself is `crate::guard`).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `[workspace]`: the workspace guard (P8).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkspaceSettings {
    /// `copy-on-write` (default: the agent's writes land in a layer of this
    /// instance; the host's tree does not change; `sandmux diff ID` shows
    /// them, `sandmux apply ID` brings them in) or `live` (the agent writes
    /// the host's tree, guarded).
    #[serde(default)]
    pub mode: WorkspaceMode,
    /// `read-only` (default: git's control plane is read-only inside, new
    /// repositories are quarantined) or `unguarded` (no git guard).
    #[serde(default)]
    pub git: GitMode,
    /// Repositories the agent creates during the instance: `quarantine`
    /// (default: moved out when it ends) or `allow` (left, and listed).
    #[serde(default)]
    pub new_repositories: NewRepos,
    /// Copy-on-write: the most the layer may hold while its instance runs
    /// (bytes on disk; a copy-up of a big file counts whole) ...
    #[serde(default)]
    pub layer_bytes: LayerBytes,
    /// ... and the most entries (files, directories, whiteouts).
    #[serde(default)]
    pub layer_files: LayerFiles,
    /// Copy-on-write `serve`: the most the workspace's history (a
    /// checkpoint per changing call) keeps in file contents; past it the
    /// oldest checkpoints fold into later ones. 0: no history.
    #[serde(default)]
    pub history_bytes: HistoryBytes,
}

/// `[workspace] history_bytes` (default 1 GiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct HistoryBytes(pub super::schema::Size);

impl Default for HistoryBytes {
    fn default() -> Self {
        HistoryBytes(super::schema::Size(1 << 30))
    }
}

/// `[workspace] layer_bytes` (default 16 GiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct LayerBytes(pub super::schema::Size);

impl Default for LayerBytes {
    fn default() -> Self {
        LayerBytes(super::schema::Size(16 << 30))
    }
}

/// `[workspace] layer_files` (default 1,000,000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct LayerFiles(pub u64);

impl Default for LayerFiles {
    fn default() -> Self {
        LayerFiles(1_000_000)
    }
}

/// Where the agent's writes to the workspace land: `[workspace] mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum WorkspaceMode {
    /// In the host's tree, as they happen; the guard keeps control files
    /// read-only and takes what it finds planted.
    Live,
    /// In an overlay layer of this instance, outside the host's tree, which
    /// does not change while the instance runs (needs the mount layer; a
    /// profile that lists `mount` as best-effort falls back to a copy
    /// where there is none, and says so).
    #[default]
    CopyOnWrite,
    /// In a private copy of the workspace made at start (reflinks where
    /// the file system has them), which the agent works on at the copy's
    /// own path, confined by Landlock alone; the same door
    /// (`sandmux diff`, `apply`) brings its changes in. Needs no mount
    /// namespace.
    Copy,
}

impl WorkspaceMode {
    /// Whether the agent's writes land outside the host's tree and reach
    /// it only through the door (copy-on-write and copy).
    pub(crate) fn has_door(self) -> bool {
        self != WorkspaceMode::Live
    }

    /// What this mode does not guard, said at every start in it and in
    /// `sandbox_status` (None: copy-on-write, whose door guards it all).
    pub(crate) fn not_guarded(self) -> Option<&'static str> {
        match self {
            WorkspaceMode::CopyOnWrite | WorkspaceMode::Copy => None,
            WorkspaceMode::Live => Some(
                "live workspace: the agent writes your tree as it works; not guarded there: files host tools obey by a name not on the profile's protected list, a planted name for up to 2 s before it is reverted, ordinary files your tools run (scripts, Makefiles, package.json scripts), instructions your own coding agents read, and set-ID files you already had; copy-on-write (every built-in's default) reviews all of it at one door",
            ),
        }
    }
}

/// What happens to a copy-on-write layer when its instance ends
/// (`--on-end` of `run`, `shell` and `serve`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum OnEnd {
    /// Brought into the workspace through the door (`sandmux apply`):
    /// what it holds back or finds in conflict stays in the kept layer.
    Apply,
    /// Kept for the human (`sandmux diff`, `apply`, `discard`).
    #[default]
    Keep,
    /// Removed: the agent's changes are gone.
    Discard,
}

/// How git is guarded: `[workspace] git` in a profile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum GitMode {
    /// Git's control plane is read-only inside (kernel-enforced by mounts);
    /// repositories created during the instance are quarantined at its end.
    #[default]
    ReadOnly,
    /// The agent commits into a repository of its own in sandmux's state
    /// directory (mounted over `.git` inside); the workspace's `.git` stays
    /// read-only and the human fetches with `sandmux git fetch ID`.
    Commit,
    /// No git guard at all (the behaviour before it existed), reported loudly.
    Unguarded,
}

impl GitMode {
    /// The spelling used in profiles and reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            GitMode::ReadOnly => "read-only",
            GitMode::Commit => "commit",
            GitMode::Unguarded => "unguarded",
        }
    }
}

/// What happens to repositories the agent creates (`[workspace] new_repositories`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum NewRepos {
    /// Moved into the quarantine when the instance ends (`.git` at the top at once).
    #[default]
    Quarantine,
    /// Left where they are, and listed when the instance ends.
    Allow,
}

/// Why a workspace argument was refused (the fix is in the message).
#[derive(Debug, thiserror::Error)]
pub(crate) enum WorkspaceError {
    /// A relative path, and no current directory to resolve it against.
    #[error("cannot read the current directory: {0}")]
    Cwd(#[source] std::io::Error),
    /// It cannot be looked at.
    #[error("workspace {}: {source}", path.display())]
    Stat {
        path: PathBuf,
        source: std::io::Error,
    },
    /// It is a link; `target` is where it leads, or "dangling".
    #[error("workspace {} is a symlink; pass the real directory ({target})", path.display())]
    Symlink { path: PathBuf, target: String },
    /// A file, a device.
    #[error("workspace {} is not a directory", path.display())]
    NotDirectory { path: PathBuf },
    /// A link on the way to it.
    #[error("workspace {} goes through a symlink (it resolves to {}); pass the resolved path", path.display(), resolved.display())]
    ThroughLink { path: PathBuf, resolved: PathBuf },
    /// The whole file system.
    #[error("the workspace cannot be /")]
    Root,
    /// Under a directory the sandbox mounts its own over.
    #[error("workspace {} is under {inner}, which the sandbox replaces with its own; use a directory elsewhere", path.display())]
    Replaced { path: PathBuf, inner: &'static str },
}

/// Checks a workspace argument: it must exist, be a directory, and contain no
/// symlink anywhere in its path (setup must never follow a planted link).
pub(crate) fn check_workspace(arg: &Path) -> Result<PathBuf, WorkspaceError> {
    let abs = if arg.is_absolute() {
        arg.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(WorkspaceError::Cwd)?
            .join(arg)
    };
    let stat = |source| WorkspaceError::Stat {
        path: abs.clone(),
        source,
    };
    let meta = std::fs::symlink_metadata(&abs).map_err(stat)?;
    if meta.file_type().is_symlink() {
        let target = std::fs::canonicalize(&abs)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "dangling".into());
        return Err(WorkspaceError::Symlink { path: abs, target });
    }
    if !meta.is_dir() {
        return Err(WorkspaceError::NotDirectory { path: abs });
    }
    let canon = std::fs::canonicalize(&abs).map_err(stat)?;
    let normal: PathBuf = abs.components().collect();
    if canon != normal {
        return Err(WorkspaceError::ThroughLink {
            path: abs,
            resolved: canon,
        });
    }
    if canon == Path::new("/") {
        return Err(WorkspaceError::Root);
    }
    // The sandbox mounts its own /dev, /proc and /run/sandmux over these.
    for inner in ["/dev", "/proc", "/sys", "/run/sandmux"] {
        if canon.starts_with(inner) {
            return Err(WorkspaceError::Replaced { path: canon, inner });
        }
    }
    Ok(canon)
}
