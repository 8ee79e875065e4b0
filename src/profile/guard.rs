//! The workspace guard's plan, as data: what kind of checkout each
//! read-write tree is, what its walk at start found, what is bound
//! read-only and what is watched. The planner (`crate::guard::plan`, which
//! reads the host's trees) is handed to [`super::Context`] by its caller, so
//! the profile names no layer above it; the guard, the mount layer and the
//! reports read these types from here.

use super::{GitMode, NewRepos};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::PathBuf;

/// What kind of checkout a read-write tree is, at its root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub(crate) enum Shape {
    /// Not inside any git repository.
    Plain,
    /// A repository: `.git` is a directory.
    Repository,
    /// `.git` is a file naming a git directory elsewhere (`gitdir:`).
    Linked {
        /// `worktree` (the git directory has a `commondir`) or `separate`
        /// (a submodule checkout, or `git init --separate-git-dir`).
        link: String,
        /// The git directory the file names.
        gitdir: PathBuf,
        /// The common directory (config, hooks, objects): `gitdir` itself
        /// when there is no `commondir`.
        common: PathBuf,
    },
    /// A subdirectory of a repository whose `.git` is above the tree.
    Inside {
        /// The directory holding that `.git`.
        toplevel: PathBuf,
    },
}

/// What a walk found, every path relative to the tree's root.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Found {
    /// `.git` entries (directories or files) and bare-repository directories.
    pub repos: BTreeSet<PathBuf>,
    /// Guarded names that exist.
    pub names: BTreeSet<PathBuf>,
    /// Entries visited.
    pub entries: usize,
    /// False when the walk stopped at `MAX_ENTRIES` (`crate::guard::scan`).
    pub complete: bool,
    /// Directories the walk could not open (their owner took the read or
    /// search bit away): nothing below them was seen.
    #[serde(default)]
    pub unreadable: BTreeSet<PathBuf>,
    /// Sockets, FIFOs and device nodes (by the directory entry's type), at
    /// most `MAX_SPECIAL` (`crate::guard::scan`); the end sweep removes those that are new.
    #[serde(default)]
    pub special: BTreeSet<PathBuf>,
    /// More special files than `MAX_SPECIAL` (`crate::guard::scan`) were seen.
    #[serde(default)]
    pub special_overflow: bool,
}

/// The agent's repository of one instance, as the mount layer needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CommitRepo {
    /// The agent's git directory on the host (`<state>/git/<id>/agent.git`).
    pub agent: PathBuf,
    /// The real git directory (`<workspace>/.git`).
    pub real: PathBuf,
    /// Where the real git directory is seen read-only, inside and (as a link)
    /// outside: the path the alternates file names.
    pub origin: PathBuf,
}

/// The guard of one read-write tree, as planned at start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TreeGuard {
    /// The tree's root (absolute, canonical).
    pub root: PathBuf,
    /// What kind of checkout it is.
    pub shape: Shape,
    /// What the walk at start found (relative paths).
    pub at_start: Found,
    /// Guarded paths (relative) that did not exist: watched and reverted.
    pub watched: Vec<PathBuf>,
    /// The root's permission bits at start: the end sweep puts them back if
    /// the agent changed them (a world-writable workspace top would let any
    /// host user plant files in it after the instance).
    #[serde(default)]
    pub mode: Option<u32>,
}

/// The whole guard of an instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Guard {
    /// How git is guarded.
    pub git: GitMode,
    /// The guarded tool-configuration names (relative paths).
    pub names: Vec<PathBuf>,
    /// One entry per read-write tree.
    pub trees: Vec<TreeGuard>,
    /// Git directories outside every read-write tree that a `.git` file names,
    /// bound read-only at the same path so git keeps working inside.
    pub git_outside: Vec<PathBuf>,
    /// What happens to repositories created during the instance.
    #[serde(default)]
    pub new_repositories: NewRepos,
    /// Commit mode: the agent's own repository, made when the instance starts.
    #[serde(default)]
    pub commit: Option<CommitRepo>,
}

/// What the mount layer must make read-only, computed with the guard.
#[derive(Debug, Default)]
pub(crate) struct ReadOnly {
    /// Absolute paths inside read-write trees, bound read-only onto themselves.
    pub protected: Vec<PathBuf>,
    /// Their parents below each tree's root, pinned (parents first).
    pub pinned: Vec<PathBuf>,
}
