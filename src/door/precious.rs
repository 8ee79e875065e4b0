//! Which of the human's files an `--on-end apply` may replace or remove
//! without keeping a copy: those git can give back — tracked and clean, or
//! ignored (build output) — in the workspace's repository, read before
//! anything is applied (the tree is then the human's alone). Any other
//! file replaced or removed is the human's only copy: the layer is kept
//! with it in `taken/`, for `apply --undo`. Without a repository, every
//! file is precious.

use std::path::{Path, PathBuf};

/// The workspace's files git cannot give back.
pub(crate) enum Precious {
    /// Not a repository (or git could not say): every file.
    All,
    /// Changed or untracked, and not ignored.
    Only {
        dirty: Vec<PathBuf>,
        ignored: Vec<PathBuf>,
    },
}

impl Precious {
    /// Reads the workspace `ws` with the host's git (its own configuration;
    /// nothing of the layer's).
    pub(crate) fn of(ws: &Path) -> Precious {
        let args = [
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--ignored=matching",
            "--no-renames",
        ];
        let Ok(out) = super::refs::git_out(ws, &args) else {
            return Precious::All;
        };
        let (mut dirty, mut ignored) = (Vec::new(), Vec::new());
        for entry in out.split('\0').filter(|e| e.len() > 3) {
            let (xy, path) = entry.split_at(3);
            match xy {
                "!! " => ignored.push(PathBuf::from(path)),
                _ => dirty.push(PathBuf::from(path)),
            }
        }
        Precious::Only { dirty, ignored }
    }

    /// Whether `rel` (or anything below it) may be the human's only copy.
    pub(crate) fn holds(&self, rel: &Path) -> bool {
        match self {
            Precious::All => true,
            Precious::Only { dirty, ignored } => {
                if ignored.iter().any(|i| rel.starts_with(i)) {
                    return false;
                }
                dirty
                    .iter()
                    .any(|d| d.starts_with(rel) || rel.starts_with(d))
            }
        }
    }
}
