//! The workspace guard (P8): the workspace carries data, not control.
//!
//! Host programs obey files they find in the workspace without being asked:
//! git its control plane, direnv `.envrc`, editors their folder settings,
//! build tools and coding agents their project configuration. The guard works
//! from what those programs read, in two parts:
//!
//! - **At start, by the kernel** ([`plan`], applied by the mount layer): every
//!   git control plane found in a read-write tree (the `.git` directory or
//!   file, nested repositories and bare-repository directories at any depth,
//!   the git directory a worktree or submodule `.git` file names) and every
//!   guarded name that exists is bound read-only, its parents pinned.
//! - **During and after the instance, by the supervisor** ([`watch`]): guarded
//!   names and `.git` that did not exist are watched with inotify at the top of
//!   each tree and moved into a quarantine in sandmux's state directory the
//!   moment they appear ([`quarantine`]); when the instance ends, a bounded
//!   sweep finds what appeared deeper down (new repositories, nested names).
//!   A manifest written at start lets the next start sweep after an unclean end.

pub(crate) mod commit;
pub(crate) mod git;
pub(crate) mod quarantine;
pub(crate) mod restore;
pub(crate) mod scan;
pub(crate) mod start;
pub(crate) mod sweep;
pub(crate) mod watch;

pub(crate) use crate::profile::{GitMode, NewRepos};
pub(crate) use git::Shape;
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub(crate) use crate::profile::guard::TreeGuard;

pub(crate) use crate::profile::guard::Guard;

pub(crate) use crate::profile::guard::ReadOnly;

/// Why the guard's host side could not be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GuardError {
    /// No candidate state directory is usable; each with why.
    #[error("no usable state directory for the workspace guard's quarantine ({}); set XDG_STATE_HOME to a directory of yours outside the workspace", tried.join("; "))]
    NoStateDir {
        /// `path: why`, in the order tried.
        tried: Vec<String>,
    },
    /// The watches could not be set: no inotify instance.
    #[error("inotify: {0}")]
    Inotify(nix::Error),
    /// The watches could not be set: a watched tree could not be opened.
    #[error("opening {}: {source}", root.display())]
    OpenTree {
        /// The tree.
        root: PathBuf,
        /// The error.
        source: nix::Error,
    },
    /// The watching thread, or its stop pipe, could not be made.
    #[error("the guard's thread: {0}")]
    Thread(std::io::Error),
    /// A `.git` that is neither a directory nor a file.
    #[error("{} is neither a directory nor a file (a symlink?): remove it, or set [workspace] git = \"unguarded\"", .0.display())]
    NotGitEntry(PathBuf),
    /// A `.git` file (`gitdir:`) that names no usable git directory.
    #[error("{}: {why}", dotgit.display())]
    GitFile {
        /// The `.git` file.
        dotgit: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A tree could not be walked at start.
    #[error("scanning {} for control files: {source}", root.display())]
    Scan {
        /// The tree.
        root: PathBuf,
        /// The error.
        source: nix::Error,
    },
    /// Commit mode in a workspace that is no repository of its own.
    #[error("[workspace] git = \"commit\" needs a workspace whose .git is a directory; {} is a {shape}", root.display())]
    CommitShape {
        /// The workspace.
        root: PathBuf,
        /// What it is instead.
        shape: String,
    },
    /// A file-system step (the state directory, commit mode's repository).
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Why the guard's watching thread runs without its own confinement.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ThreadConfineError {
    /// The rules could not be made or applied.
    #[error("{0}")]
    Confine(std::sync::Arc<crate::confine::ConfineError>),
    /// The thread ended before it said.
    #[error("the guard thread ended")]
    Ended,
}

/// Plans the guard for the read-write trees `roots`.
pub(crate) fn plan(
    roots: &[PathBuf],
    names: &[PathBuf],
    git: GitMode,
    new_repositories: NewRepos,
) -> Result<(Guard, ReadOnly), GuardError> {
    let mut p = Planner {
        roots,
        names,
        git,
        new_repositories,
        protected: BTreeSet::new(),
        outside: BTreeSet::new(),
    };
    let trees = roots
        .iter()
        .map(|root| p.tree(root))
        .collect::<Result<Vec<_>, _>>()?;
    // The sandmux binary itself, where a read-write tree holds it (`cargo
    // run` in a checkout used as the workspace): bound read-only with its
    // parents pinned, so the agent cannot replace what the host runs next
    // (known gap 9; without a mount view the tree's write is withheld).
    if let Ok(exe) = std::env::current_exe() {
        if roots.iter().any(|r| exe.starts_with(r)) {
            p.protected.insert(exe);
        }
    }
    let pinned = pinned_parents(&p.protected, roots);
    let guard = Guard {
        git,
        names: names.to_vec(),
        trees,
        git_outside: p.outside.into_iter().collect(),
        new_repositories,
        commit: None,
    };
    let protected = p.protected.into_iter().collect();
    Ok((guard, ReadOnly { protected, pinned }))
}

/// [`plan`] as the profile's resolution calls it
/// (`profile::GuardPlanner`): the profile, a layer below, cannot name
/// [`GuardError`] and takes it as an error of any kind.
pub(crate) fn planner(
    roots: &[PathBuf],
    names: &[PathBuf],
    git: GitMode,
    new_repositories: NewRepos,
) -> Result<(Guard, ReadOnly), crate::profile::PlanError> {
    plan(roots, names, git, new_repositories).map_err(Into::into)
}

/// What [`plan`] gathers across the trees.
struct Planner<'a> {
    roots: &'a [PathBuf],
    names: &'a [PathBuf],
    git: GitMode,
    new_repositories: NewRepos,
    /// Paths inside read-write trees that are bound read-only.
    protected: BTreeSet<PathBuf>,
    /// Git directories outside every tree.
    outside: BTreeSet<PathBuf>,
}

impl Planner<'_> {
    fn guard_git(&self) -> bool {
        self.git != GitMode::Unguarded
    }

    /// One tree: its shape, what it holds at start, what is watched.
    fn tree(&mut self, root: &PathBuf) -> Result<TreeGuard, GuardError> {
        let shape = if self.guard_git() {
            git::shape(root)?
        } else {
            Shape::Plain
        };
        let found =
            scan::walk(root, self.names, self.guard_git()).map_err(|source| GuardError::Scan {
                root: root.clone(),
                source,
            })?;
        let workspace = root == &self.roots[0];
        if self.git == GitMode::Commit && workspace && shape != Shape::Repository {
            return Err(GuardError::CommitShape {
                root: root.clone(),
                shape: shape.describe(),
            });
        }
        if let Shape::Linked { gitdir, common, .. } = &shape {
            self.linked(gitdir, common);
        }
        for rel in found.repos.iter().chain(found.names.iter()) {
            // In commit mode the workspace's own .git is covered by the agent's
            // repository inside (the real one is bound read-only elsewhere).
            if !(self.git == GitMode::Commit && workspace && rel == Path::new(".git")) {
                self.protected.insert(root.join(rel));
            }
        }
        let mut watched: Vec<PathBuf> = self
            .names
            .iter()
            .filter(|n| !found.names.contains(*n))
            .cloned()
            .collect();
        if self.guard_git() {
            self.delegated(root, &shape, &found, &mut watched);
            if self.new_repositories == NewRepos::Quarantine
                && !found.repos.contains(Path::new(".git"))
            {
                watched.push(PathBuf::from(".git"));
            }
        }
        let mode = std::fs::symlink_metadata(root)
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::mode(&m) & 0o7777);
        Ok(TreeGuard {
            root: root.clone(),
            shape,
            at_start: found,
            watched,
            mode,
        })
    }

    /// A linked worktree's git directories: protected where a tree holds
    /// them, bound read-only from outside otherwise.
    fn linked(&mut self, gitdir: &Path, common: &Path) {
        for d in [common, gitdir] {
            if d.starts_with(common) && d != common {
                continue; // covered by the common directory
            }
            if self.roots.iter().any(|r| d.starts_with(r)) {
                self.protected.insert(d.to_path_buf());
            } else {
                self.outside.insert(d.to_path_buf());
            }
        }
    }

    /// What the repositories' own config hands control to (hooksPath,
    /// includes) is control plane too, when it lies in this tree: protected
    /// if it exists, watched if not.
    fn delegated(
        &mut self,
        root: &Path,
        shape: &Shape,
        found: &scan::Found,
        watched: &mut Vec<PathBuf>,
    ) {
        for p in configs(root, shape, found)
            .iter()
            .flat_map(|(c, w)| git::delegated(c, w.as_deref()))
        {
            match p.strip_prefix(root) {
                Ok(rel) if !rel.as_os_str().is_empty() => {
                    if std::fs::symlink_metadata(&p).is_ok() {
                        self.protected.insert(p.clone());
                    } else if !watched.iter().any(|w| w == rel) {
                        watched.push(rel.to_path_buf());
                    }
                }
                _ => {}
            }
        }
    }
}

/// The parents of `protected` paths below their tree's root, parents first.
fn pinned_parents(protected: &BTreeSet<PathBuf>, roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut pinned = BTreeSet::new();
    for p in protected {
        let Some(root) = roots.iter().find(|r| p.starts_with(r)) else {
            continue;
        };
        let mut a = p.parent();
        while let Some(dir) = a {
            if dir == root || !dir.starts_with(root) {
                break;
            }
            pinned.insert(dir.to_path_buf());
            a = dir.parent();
        }
    }
    let mut pinned: Vec<PathBuf> = pinned.into_iter().collect();
    pinned.sort_by_key(|p| p.components().count());
    pinned
}

/// The config files of the repositories in a tree (at most 64), each with
/// the directory its hooks run in.
fn configs(root: &Path, shape: &Shape, found: &scan::Found) -> Vec<(PathBuf, Option<PathBuf>)> {
    let mut out = Vec::new();
    match shape {
        Shape::Linked { gitdir, common, .. } => {
            out.push((common.join("config"), Some(root.to_path_buf())));
            out.push((gitdir.join("config.worktree"), Some(root.to_path_buf())));
        }
        Shape::Repository => out.push((root.join(".git/config"), Some(root.to_path_buf()))),
        _ => {}
    }
    for rel in &found.repos {
        let dir = root.join(rel);
        if rel == Path::new(".git") || !dir.is_dir() {
            continue;
        }
        let worktree = (rel.file_name() == Some(std::ffi::OsStr::new(".git")))
            .then(|| dir.parent().map(Path::to_path_buf))
            .flatten();
        out.push((dir.join("config"), worktree));
    }
    out.truncate(64);
    out
}

/// The guard as `sandbox_status` and `sandmux://status` show it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct View {
    /// `read-only` or `unguarded` (`[workspace] git`).
    pub git: String,
    /// Whether git's control plane is read-only by the kernel (the `git`
    /// layer is in force), rather than only watched.
    pub git_kernel_enforced: bool,
    /// One entry per read-write tree.
    pub trees: Vec<TreeView>,
    /// Entries the guard took out of the workspace so far.
    pub reverted: usize,
    /// Where they are kept (sandmux's state directory, outside the sandbox).
    pub quarantine: String,
}

/// One read-write tree in [`View`].
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct TreeView {
    /// The tree (the workspace, or another read-write root).
    pub root: String,
    /// What kind of checkout it is.
    pub kind: String,
    /// Control files found at start, read-only inside (relative paths; at most 64 listed).
    pub read_only: Vec<String>,
    /// Guarded names that were absent: watched, and reverted when created.
    pub watched: usize,
    /// False when the walk at start stopped at its bound (deeper paths unguarded).
    pub walk_complete: bool,
}

impl Guard {
    /// The view for status reports.
    pub(crate) fn view(
        &self,
        git_kernel_enforced: bool,
        reverted: usize,
        quarantine: &Path,
    ) -> View {
        let trees = self
            .trees
            .iter()
            .map(|t| {
                let all: Vec<&PathBuf> = match self.git {
                    GitMode::ReadOnly | GitMode::Commit => t
                        .at_start
                        .repos
                        .iter()
                        .chain(t.at_start.names.iter())
                        .collect(),
                    GitMode::Unguarded => t.at_start.names.iter().collect(),
                };
                let mut read_only: Vec<String> = all
                    .iter()
                    .take(64)
                    .map(|p| printable(&p.to_string_lossy()))
                    .collect();
                if all.len() > 64 {
                    read_only.push(format!("... and {} more", all.len() - 64));
                }
                TreeView {
                    root: printable(&t.root.to_string_lossy()),
                    kind: t.shape.describe(),
                    read_only,
                    watched: t.watched.len(),
                    walk_complete: t.at_start.complete,
                }
            })
            .collect();
        View {
            git: self.git.name().into(),
            git_kernel_enforced,
            trees,
            reverted,
            quarantine: quarantine.display().to_string(),
        }
    }
}

use crate::term::printable;
