//! What git ignores among the layer's changes: a venv, `target/`,
//! `node_modules/` — thousands of paths nobody reviews one by one. Review
//! shows them as one line per top directory and `apply` does not bring
//! them unless asked (`--include-ignored`), so an ignore file the agent
//! wrote can only keep its own work out of both, never hide from review
//! something `apply` brings. The rules are git's (the maintained `ignore`
//! crate's matcher): every `.gitignore` above a changed path, the layer's
//! version where the agent changed it and the host's otherwise, the
//! repository's `info/exclude` and the human's global excludes file;
//! deeper files win, and nothing below an ignored directory comes back.

use super::diff::Trees;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Bytes read of one ignore file.
const FILE_MAX: u64 = 1 << 20;

/// The ignore rules for the directories above a set of changed paths.
pub(crate) struct Ignored {
    ws: PathBuf,
    /// A directory's own `.gitignore` (relative to the workspace).
    per_dir: HashMap<PathBuf, Gitignore>,
    /// `info/exclude` and the global excludes file, for the whole tree.
    global: Gitignore,
    /// Directories already judged.
    dirs: std::cell::RefCell<HashMap<PathBuf, bool>>,
}

impl Ignored {
    /// Reads the rules for the directories above `rels`.
    pub(crate) fn new<'a>(
        ws: &Path,
        trees: &Trees,
        facts: &super::gitask::GitFacts,
        rels: impl Iterator<Item = &'a Path>,
    ) -> Ignored {
        let mut per_dir = HashMap::new();
        let mut seen = std::collections::HashSet::new();
        for rel in rels {
            for a in rel.ancestors().skip(1) {
                if !seen.insert(a.to_path_buf()) {
                    break;
                }
                if let Some(g) = dir_rules(ws, trees, a) {
                    per_dir.insert(a.to_path_buf(), g);
                }
            }
        }
        Ignored {
            ws: ws.to_path_buf(),
            per_dir,
            global: global_rules(ws, facts),
            dirs: Default::default(),
        }
    }

    /// Whether git ignores `rel` (`dir`: it is a directory), or a
    /// directory above it.
    pub(crate) fn ignores(&self, rel: &Path, dir: bool) -> bool {
        let parent = rel.parent().unwrap_or(Path::new(""));
        (!parent.as_os_str().is_empty() && self.dir_ignored(parent)) || self.own(rel, dir)
    }

    fn dir_ignored(&self, rel: &Path) -> bool {
        if let Some(b) = self.dirs.borrow().get(rel) {
            return *b;
        }
        let b = self.ignores(rel, true);
        self.dirs.borrow_mut().insert(rel.to_path_buf(), b);
        b
    }

    /// The decision of the rules for `rel` itself: the deepest file with a
    /// matching pattern wins, then the repository's and the human's.
    fn own(&self, rel: &Path, dir: bool) -> bool {
        let abs = self.ws.join(rel);
        for a in rel.ancestors().skip(1) {
            if let Some(g) = self.per_dir.get(a) {
                let m = g.matched(&abs, dir);
                if !m.is_none() {
                    return m.is_ignore();
                }
            }
        }
        self.global.matched(&abs, dir).is_ignore()
    }
}

/// The `.gitignore` of directory `rel`: the layer's where the agent wrote
/// one, else the host's (both read without following a link).
fn dir_rules(ws: &Path, trees: &Trees, rel: &Path) -> Option<Gitignore> {
    let file = rel.join(".gitignore");
    let text = trees
        .agents_bytes(&file, FILE_MAX)
        .or_else(|| super::diff::read(&trees.lower, &file, FILE_MAX))?;
    let root = ws.join(rel);
    let mut b = GitignoreBuilder::new(&root);
    for line in String::from_utf8_lossy(&text).lines() {
        let _ = b.add_line(Some(root.join(".gitignore")), line);
    }
    b.build().ok()
}

/// The repository's `info/exclude` and the human's global excludes file
/// (`core.excludesFile`, else `$XDG_CONFIG_HOME/git/ignore`), rooted at the
/// workspace, as git named them (`facts`).
fn global_rules(ws: &Path, facts: &super::gitask::GitFacts) -> Gitignore {
    let mut b = GitignoreBuilder::new(ws);
    let mut files: Vec<PathBuf> = Vec::new();
    if let Some(p) = &facts.info_exclude {
        files.push(ws.join(p));
    }
    match &facts.excludes_file {
        Some(p) => files.push(PathBuf::from(p)),
        None => {
            let base = std::env::var_os("XDG_CONFIG_HOME")
                .map(PathBuf::from)
                .or_else(|| super::home::human_home().map(|h| h.join(".config")));
            files.extend(base.map(|b| b.join("git/ignore")));
        }
    }
    for f in files {
        if let Ok(text) = std::fs::read(&f) {
            for line in String::from_utf8_lossy(&text).lines() {
                let _ = b.add_line(Some(f.clone()), line);
            }
        }
    }
    b.build().unwrap_or_else(|_| Gitignore::empty())
}
