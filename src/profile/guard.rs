//! The workspace guard's plan, as data: what kind of checkout each
//! read-write tree is, what its walk at start found, what is bound
//! read-only and what is watched. The planner (`crate::guard::plan`, which
//! reads the host's trees) is handed to [`super::Context`] by its caller, so
//! the profile names no layer above it; the guard, the mount layer and the
//! reports read these types from here.

use super::{GitMode, NewRepos};
use crate::term::printable;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Entries the guard's walk visits before it stops (and says it stopped).
pub(crate) const MAX_ENTRIES: usize = 1_000_000;

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

impl Shape {
    /// One phrase for reports.
    pub(crate) fn describe(&self) -> String {
        match self {
            Shape::Plain => "plain directory (no git repository)".into(),
            Shape::Repository => "git repository (.git is a directory)".into(),
            Shape::Linked {
                link,
                gitdir,
                common,
            } => {
                let what = if link == "worktree" {
                    "linked worktree"
                } else {
                    "checkout with a separate git directory (submodule or --separate-git-dir)"
                };
                format!(
                    "{what}: .git is a file naming {} (common directory {})",
                    gitdir.display(),
                    common.display()
                )
            }
            Shape::Inside { toplevel } => format!(
                "subdirectory of the repository at {} (its .git is outside the view)",
                toplevel.display()
            ),
        }
    }
}

impl Guard {
    /// One line per tree for reports: its kind and how each part is guarded.
    pub(crate) fn describe(&self, kernel: bool) -> Vec<String> {
        let how_ro = if kernel {
            "read-only (kernel: bind mount)"
        } else {
            "NOT kernel-enforced (no mount namespace)"
        };
        let mut out = Vec::new();
        for t in &self.trees {
            let mut parts = vec![format!(
                "{}: {}",
                printable(&t.root.to_string_lossy()),
                t.shape.describe()
            )];
            match self.git {
                GitMode::Unguarded => parts.push("git: UNGUARDED (the profile opts out: the agent can change what host git obeys)".into()),
                GitMode::Commit | GitMode::ReadOnly => {
                    if let Some(c) = self.commit.as_ref().filter(|_| t.root == self.trees[0].root) {
                        parts.push(format!(
                            "commit mode: the agent commits into {} (its config, hooks and info read-only); {} {how_ro}; bring commits in with `sandmux git fetch ID`",
                            printable(&c.agent.to_string_lossy()),
                            printable(&c.real.to_string_lossy())
                        ));
                    }
                    if !t.at_start.repos.is_empty() {
                        parts.push(format!("git control plane {how_ro}: {}", list(&t.at_start.repos)));
                    }
                    if !self.git_outside.is_empty() {
                        parts.push(format!("git directories outside the tree {how_ro}: {}", list(&self.git_outside)));
                    }
                    parts.push(match self.new_repositories {
                        NewRepos::Quarantine => "new repositories: quarantined when the instance ends; .git at the top: watched and reverted".into(),
                        NewRepos::Allow => "new repositories: ALLOWED by the profile (left in place, listed at the end; host git obeys their config)".into(),
                    });
                }
            }
            if !t.at_start.names.is_empty() {
                parts.push(format!(
                    "tool configuration {how_ro}: {}",
                    list(&t.at_start.names)
                ));
            }
            if !t.watched.is_empty() {
                parts.push(format!(
                    "{} guarded names absent: watched and reverted when created (at the top at once, deeper when the instance ends)",
                    t.watched.len()
                ));
            }
            if !t.at_start.unreadable.is_empty() {
                parts.push(format!(
                    "directories that could not be read (not guarded below): {}",
                    list(t.at_start.unreadable.iter())
                ));
            }
            if !t.at_start.complete {
                parts.push(format!(
                    "the walk stopped after {} entries: deeper paths are not guarded",
                    MAX_ENTRIES
                ));
            }
            out.push(parts.join("; "));
        }
        out
    }
}

/// At most this many paths named in one report line (a monorepo can hold
/// thousands of nested repositories; `sandbox_status` lists 64).
const LISTED_IN_LINE: usize = 20;

fn list<'a>(it: impl IntoIterator<Item = &'a PathBuf>) -> String {
    let all: Vec<&PathBuf> = it.into_iter().collect();
    let mut v: Vec<String> = all
        .iter()
        .take(LISTED_IN_LINE)
        .map(|p| {
            if p.as_os_str().is_empty() {
                ".".into()
            } else {
                printable(&p.to_string_lossy())
            }
        })
        .collect();
    if all.len() > LISTED_IN_LINE {
        v.push(format!("and {} more", all.len() - LISTED_IN_LINE));
    }
    v.join(", ")
}
