//! Which of the human's files an `--on-end apply` may replace or remove
//! without keeping a copy: those git can give back — tracked and clean —
//! and what lies in a directory git ignores whole under a name tools build
//! into (`target/`, `node_modules/`: [`BUILT`]), in the workspace's repository, read
//! before anything is applied (the tree is then the human's alone). Any
//! other file replaced or removed — untracked, changed, or ignored by name
//! (`.env`) — is the human's only copy: the layer is kept with it in
//! `taken/`, for `apply --undo`. Without a repository, every file is
//! precious.

use std::path::{Path, PathBuf};

/// The workspace's files git cannot give back.
pub(crate) enum Precious {
    /// Not a repository (or git could not say): every file.
    All,
    /// Changed, untracked or ignored by name; `generated`: directories
    /// git ignores whole (relative to the workspace).
    Only {
        dirty: Vec<PathBuf>,
        generated: Vec<PathBuf>,
    },
}

impl Precious {
    /// Reads the workspace `ws` with the host's git (its own configuration;
    /// nothing of the layer's).
    pub(crate) fn of(ws: &Path) -> Precious {
        // Paths come relative to the repository's top; the workspace may
        // be a directory below it.
        let Ok(prefix) = super::refs::git_out(ws, &["rev-parse", "--show-prefix"]) else {
            return Precious::All;
        };
        let prefix = prefix.trim_end_matches('\n').to_string();
        let args = [
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--ignored=matching",
            "--no-renames",
            "--",
            ".",
        ];
        let Ok(out) = super::refs::git_out(ws, &args) else {
            return Precious::All;
        };
        let (mut dirty, mut generated) = (Vec::new(), Vec::new());
        for entry in out.split('\0').filter(|e| e.len() > 3) {
            let (xy, path) = entry.split_at(3);
            let Some(rel) = path.strip_prefix(prefix.as_str()) else {
                continue;
            };
            match xy {
                "!! " if rel.ends_with('/') && built(rel) => generated.push(PathBuf::from(rel)),
                _ => dirty.push(PathBuf::from(rel)),
            }
        }
        Precious::Only { dirty, generated }
    }

    /// Whether `rel` (or anything below it) may be the human's only copy.
    pub(crate) fn holds(&self, rel: &Path) -> bool {
        match self {
            Precious::All => true,
            Precious::Only { dirty, generated } => {
                if generated.iter().any(|g| rel.starts_with(g)) {
                    return false;
                }
                dirty
                    .iter()
                    .any(|d| d.starts_with(rel) || rel.starts_with(d))
            }
        }
    }
}

/// Directory names tools build into. An ignored directory counts as build
/// output only under one of these names: ignore rules are files in the
/// tree, which an earlier instance's agent may have written (a
/// `notes/.gitignore` of `*` must not make the human's notes disposable).
const BUILT: [&str; 18] = [
    "target",
    "node_modules",
    "build",
    "dist",
    "out",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
    ".venv",
    "venv",
    ".gradle",
    ".next",
    ".cache",
    "coverage",
    ".nyc_output",
];

/// Whether the ignored directory `rel` (ending in `/`) is build output.
fn built(rel: &str) -> bool {
    rel.trim_end_matches('/')
        .rsplit('/')
        .next()
        .is_some_and(|n| BUILT.contains(&n))
}
