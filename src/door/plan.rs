//! What one `diff` or `apply` works on: the layer's changes under the
//! paths asked for, each with the door's verdict ([`Why`] it is held back,
//! or none), decided once by the same rules for both, so what `diff` shows
//! is what `apply` weighs.

use super::diff::{self, Change, Trees};
use super::hold::{held, Hold, Why};
use super::home::HomeWhy;
use super::ignored::Ignored;
use super::review::Manifest;
use super::DoorError;
use std::path::{Path, PathBuf};

/// One change and what the door makes of it.
pub(crate) struct Item {
    pub(crate) change: Change,
    /// Why it is held back, if it is.
    pub(crate) why: Option<Why>,
    /// Git ignores it (`ignored.rs`): summarized, not brought unless asked.
    pub(crate) ignored: bool,
}

/// The changes of one layer under the paths asked for, with verdicts.
pub(crate) struct Plan {
    pub(crate) trees: Trees,
    pub(crate) hold: Hold,
    /// In path order; only those under the paths asked for.
    pub(crate) items: Vec<Item>,
}

impl Plan {
    /// Reads the layer at `dir` over `meta`'s workspace; `paths` (relative
    /// to the workspace, without `..`) limit it, none: everything.
    pub(crate) fn open(
        dir: &Path,
        meta: &crate::supervisor::layer::Meta,
        paths: &[PathBuf],
    ) -> Result<Plan, DoorError> {
        if let Some(p) = paths
            .iter()
            .find(|p| p.is_absolute() || p.components().any(|c| c.as_os_str() == ".."))
        {
            return Err(DoorError::BadPath(p.clone()));
        }
        let trees = Trees::open(dir, &meta.workspace)?;
        // Git is asked while the layer is walked.
        let asking = super::gitask::Asking::start(&meta.workspace);
        let changes = diff::changes(&trees)?;
        let facts = asking.answers();
        // Verdicts come from every change, then PATHS choose among them:
        // naming a path never changes what is held or ignored.
        let mut hold = Hold::new(&meta.workspace, meta.held_names.clone(), &trees, &facts);
        let rels = || changes.iter().map(|c| c.rel());
        hold.add_nested(&meta.workspace, &trees, &facts, rels());
        let ignored = Ignored::new(&meta.workspace, &trees, &facts, rels());
        let bare = |p: &Path| trees.bare_shape(p);
        let items = changes
            .into_iter()
            .map(|c| {
                // Only a host file can be a link of the running binary.
                let host_file = !matches!(c, Change::Added { .. });
                let exe = host_file && hold.is_exe(trees.lower_stat(c.rel()));
                let why = if exe {
                    Some(Why::SandmuxLink)
                } else {
                    held(&c, &hold, &bare).or_else(|| {
                        let file = matches!(
                            c,
                            Change::Added { what: "file", .. } | Change::Modified { .. }
                        );
                        let x = || {
                            trees
                                .upper_stat(c.rel())
                                .is_some_and(|s| s.st_mode & 0o111 != 0)
                        };
                        (hold.every_executable() && file && x())
                            .then_some(Why::Home(HomeWhy::OnPath))
                    })
                };
                let dir = matches!(
                    c,
                    Change::Added {
                        what: "directory",
                        ..
                    }
                );
                let ignored = ignored.ignores(c.rel(), dir);
                Item {
                    change: c,
                    why,
                    ignored,
                }
            })
            .filter(|i: &Item| {
                paths.is_empty() || paths.iter().any(|p| i.change.rel().starts_with(p))
            })
            .collect();
        Ok(Plan { trees, hold, items })
    }

    /// Every change with its bytes' digest, as review covers it.
    pub(crate) fn manifest(&self) -> Manifest {
        let mut m = Manifest::default();
        for i in &self.items {
            m.add(&self.trees, &i.change, i.why.is_some(), i.ignored);
        }
        m
    }

    /// Apparent bytes of the files the changes `brought` write.
    pub(crate) fn bytes(&self, brought: &[&Change]) -> u64 {
        brought
            .iter()
            .filter(|c| {
                matches!(
                    c,
                    Change::Added { what: "file", .. } | Change::Modified { .. }
                )
            })
            .filter_map(|c| self.trees.upper_stat(c.rel()))
            .map(|s| s.st_size as u64)
            .sum()
    }
}
