//! What the host's tools are configured to read or run inside the
//! workspace, decided by the configuration's words, not by its keys.
//!
//! The principle: a tree path is control when a file a host tool reads as
//! its configuration for this workspace — found and included as that tool
//! finds it, from the tree as `apply` would leave it — names it in any word
//! of any value. For git that is every file git reads for a repository
//! (system, global, the repository's own, and their includes at any depth,
//! each relative to the file that includes it, conditional ones too), for
//! Mercurial `hgrc` and its `%include`s, for jj its repository config, and
//! for every other tool the files it reads by name (the profile's protected
//! names: `.envrc`, `.vscode/tasks.json`, `mise.toml`…) where they exist on
//! the host in the workspace or a directory above a changed path.
//!
//! A word is any run of characters a shell, an INI or a JSON reader would
//! split a value into; each is taken relative to the reading file's
//! directory, the repository's top and its control directory, and `~/` as
//! the human's home; symbolic links of the host are resolved. Over-holding
//! is the safe side: a word that names a path by chance only shows that
//! path apart in review.

use super::diff::Trees;
use super::gitask::{git_files, GitFacts};
use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

/// Bytes read from one configuration file; a larger one names nothing more.
const FILE_MAX: u64 = 256 << 10;
/// Include depth, as git's own limit (10).
const DEPTH_MAX: usize = 10;
/// Files direnv's standard library loads beside an `.envrc`.
const ENVRC_IMPLIED: [&str; 9] = [
    "flake.nix",
    "flake.lock",
    "shell.nix",
    "default.nix",
    ".env",
    "devenv.nix",
    "devenv.yaml",
    "devbox.json",
    ".envrc.local",
];
/// Files read from one protected directory (`.vscode/`…).
const DIR_FILES_MAX: usize = 64;

/// A path inside the workspace that a tool's configuration names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Named {
    /// Relative to the workspace.
    pub(crate) rel: PathBuf,
    /// Whose configuration names it, as review says it ("the
    /// repository's configuration (core.hookspath)").
    pub(crate) by: String,
}

/// Collects what is named, reading each configuration file once.
pub(crate) struct Reader<'a> {
    ws: &'a Path,
    trees: Option<&'a Trees>,
    home: Option<PathBuf>,
    /// The top of the repository the workspace lies in, when that is
    /// above it (a path relative to the top names a file of the tree too).
    top: Option<PathBuf>,
    seen: HashSet<PathBuf>,
    pub(crate) found: Vec<Named>,
    /// What git already said about the workspace's repository.
    facts: &'a GitFacts,
}

impl<'a> Reader<'a> {
    /// For workspace `ws`; `trees`: the layer over it (an included file the
    /// agent wrote is read from there too), or None for the host alone;
    /// `facts`: what git said about the workspace's repository (its top,
    /// when that is above `ws`: a path relative to the top names a file of
    /// the tree too).
    pub(crate) fn with(ws: &'a Path, trees: Option<&'a Trees>, facts: &'a GitFacts) -> Reader<'a> {
        Reader {
            ws,
            trees,
            top: facts.top.clone().filter(|t| t != ws && ws.starts_with(t)),
            home: super::home::human_home(),
            seen: HashSet::new(),
            found: Vec::new(),
            facts,
        }
    }

    /// Everything git reads for the repository at `repo` (a directory with
    /// a `.git` on the host, or the workspace's own repository).
    pub(crate) fn git(&mut self, repo: &Path) {
        let files = match normal(repo) == normal(&self.facts.ws) {
            true => self.facts.files.clone(),
            false => git_files(repo),
        };
        for (file, entries) in files {
            self.git_file(&file, repo, 0, Some(entries));
        }
    }

    /// Mercurial's configuration for the repository at `repo`.
    pub(crate) fn hg(&mut self, repo: &Path) {
        let mut files = vec![PathBuf::from("/etc/mercurial/hgrc"), repo.join(".hg/hgrc")];
        if let Some(h) = &self.home {
            files.push(h.join(".hgrc"));
            files.push(h.join(".config/hg/hgrc"));
        }
        for f in files {
            self.hg_file(&f, repo, 0);
        }
    }

    /// jj's repository configuration at `repo`, and the human's.
    pub(crate) fn jj(&mut self, repo: &Path) {
        let mut files = vec![repo.join(".jj/repo/config.toml")];
        if let Some(h) = &self.home {
            files.push(h.join(".config/jj/config.toml"));
            files.push(h.join(".jjconfig.toml"));
        }
        for f in files {
            for text in self.versions(&f) {
                let words = words_of(&text);
                self.name_all(&words, &f, repo, "jj's configuration");
            }
        }
    }

    /// A file (or the files directly in a directory) another tool reads by
    /// name at `path`, as it is on the host.
    pub(crate) fn by_name(&mut self, path: &Path, repo: &Path) {
        let Ok(m) = path.symlink_metadata() else {
            return;
        };
        let files: Vec<PathBuf> = if m.is_dir() {
            crate::sandbox::beneath::entries(path)
                .map(|e| e.into_iter().take(DIR_FILES_MAX))
                .into_iter()
                .flatten()
                .map(|(n, _)| path.join(n))
                .collect()
        } else {
            vec![path.to_path_buf()]
        };
        let by = format!(
            "{}, which a tool reads by name",
            path.strip_prefix(self.ws).unwrap_or(path).display()
        );
        for f in files {
            for text in self.versions(&f) {
                let words = words_of(&text);
                self.name_all(&words, &f, repo, &by);
            }
        }
        // direnv loads these beside an `.envrc` without naming them
        // (`use flake`, `use nix`, `dotenv`, `use devenv`…).
        if path.file_name().is_some_and(|n| n == ".envrc") {
            let dir = path.parent().unwrap_or(self.ws);
            let by = format!("{by} (what direnv loads beside it)");
            for implied in ENVRC_IMPLIED {
                for rel in self.inside(&dir.join(implied)) {
                    self.found.push(Named {
                        rel,
                        by: by.clone(),
                    });
                }
            }
        }
    }

    /// One file git reads (`listed`: its entries as git listed them from
    /// the host, else parsed here from the host's text), and the layer's
    /// version of it; includes followed.
    fn git_file(
        &mut self,
        file: &Path,
        repo: &Path,
        depth: usize,
        listed: Option<Vec<(String, String)>>,
    ) {
        if depth > DEPTH_MAX || !self.seen.insert(file.to_path_buf()) {
            return;
        }
        let host = listed.or_else(|| self.host_text(file).map(|t| git_entries(&t)));
        let layer = self.layer_text(file).map(|t| git_entries(&t));
        for entries in host.into_iter().chain(layer) {
            for (key, value) in entries {
                let mut words = words_of(&value);
                // The whole value too: a path with a space in it.
                words.push(value.trim().to_string());
                let by = format!("the repository's configuration ({key})");
                self.name_all(&words, file, repo, &by);
                let include = key == "include.path"
                    || key.starts_with("includeif.") && key.ends_with(".path");
                if include {
                    let target = self.expand(&value, file);
                    self.git_file(&target, repo, depth + 1, None);
                }
            }
        }
    }

    fn hg_file(&mut self, file: &Path, repo: &Path, depth: usize) {
        if depth > DEPTH_MAX || !self.seen.insert(file.to_path_buf()) {
            return;
        }
        for text in self.versions(file) {
            for line in text.lines() {
                if let Some(inc) = line.strip_prefix("%include") {
                    let target = self.expand(inc.trim(), file);
                    self.hg_file(&target, repo, depth + 1);
                }
            }
            let words = words_of(&text);
            let by = format!("Mercurial's configuration ({})", file.display());
            self.name_all(&words, file, repo, &by);
        }
    }

    /// A path a configuration file gives (`~/` the human's home, else
    /// relative to the file's directory), lexically normalized.
    fn expand(&self, value: &str, file: &Path) -> PathBuf {
        let v = value.trim().trim_matches('"');
        let p = match (v.strip_prefix("~/"), &self.home) {
            (Some(rest), Some(h)) => h.join(rest),
            _ => file.parent().unwrap_or(Path::new("/")).join(v),
        };
        normal(&p)
    }

    /// The file's text on the host and, where it lies in the workspace, in
    /// the layer (either may be read by a host tool: the human's now, the
    /// agent's after an apply). Links are not followed in the layer; on
    /// the host a link is the human's own.
    fn versions(&self, file: &Path) -> Vec<String> {
        self.host_text(file)
            .into_iter()
            .chain(self.layer_text(file))
            .collect()
    }

    /// The file's text on the host (a link followed: the human's own).
    fn host_text(&self, file: &Path) -> Option<String> {
        let f = std::fs::File::open(file).ok()?;
        if !f.metadata().is_ok_and(|m| m.is_file()) {
            return None;
        }
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::Read::take(f, FILE_MAX), &mut b);
        Some(String::from_utf8_lossy(&b).into_owned())
    }

    /// The file's text in the layer, where it lies in the workspace (no
    /// link followed).
    fn layer_text(&self, file: &Path) -> Option<String> {
        let rel = file.strip_prefix(self.ws).ok()?;
        let b = super::diff::read(&self.trees?.upper, rel, FILE_MAX)?;
        Some(String::from_utf8_lossy(&b).into_owned())
    }

    /// Records every word of `words` that names a path in the workspace,
    /// relative to the reading file `file`, the repository `repo` and its
    /// control directory.
    fn name_all(&mut self, words: &[String], file: &Path, repo: &Path, by: &str) {
        let dir = file.parent().unwrap_or(Path::new("/"));
        let top = self.top.clone();
        for w in words.iter().flat_map(|w| forms(w)) {
            let w = w.trim_start_matches("./");
            // `.`, `..`, `/`: a word of dots names no file of its own (a
            // tracking branch's remote is `.`).
            if w.chars().all(|c| c == '.' || c == '/') {
                continue;
            }
            let mut bases: Vec<PathBuf> = Vec::new();
            match (w.strip_prefix("~/"), &self.home) {
                (Some(rest), Some(h)) => bases.push(h.join(rest)),
                _ if w.starts_with('/') => bases.push(PathBuf::from(w)),
                _ => {
                    let roots = [
                        Some(dir),
                        Some(repo),
                        Some(&repo.join(".git")),
                        Some(self.ws),
                        top.as_deref(),
                    ];
                    for b in roots.into_iter().flatten() {
                        bases.push(b.join(w));
                    }
                }
            }
            for p in bases {
                for rel in self.inside(&p) {
                    self.found.push(Named {
                        rel,
                        by: by.to_string(),
                    });
                }
            }
        }
    }

    /// `p` relative to the workspace, lexically and through the host's
    /// links of its longest existing ancestor (a hooks path that is a link
    /// names what it points to too): each form that lies inside it.
    fn inside(&self, p: &Path) -> Vec<PathBuf> {
        let p = normal(p);
        let mut out = Vec::new();
        for form in [Some(p.clone()), resolved(&p)].into_iter().flatten() {
            if let Ok(rel) = form.strip_prefix(self.ws) {
                if !rel.as_os_str().is_empty() && !out.iter().any(|o: &PathBuf| o == rel) {
                    out.push(rel.to_path_buf());
                }
            }
        }
        out
    }
}

/// The forms a word may name a path in: itself; without a leading `/` (a
/// `$(git rev-parse --show-toplevel)/x` or `$HOME/x` leaves `/x`); without
/// an option's letters (`-Itools/lib`, `--path=x` is split at `=`
/// already); without `~user/`.
fn forms(w: &str) -> Vec<&str> {
    let mut out = vec![w];
    if let Some(rest) = w.strip_prefix('/') {
        out.push(rest);
    }
    if w.starts_with('-') {
        let bare = w.trim_start_matches('-');
        out.push(bare);
        if bare.len() > 1 && bare.is_char_boundary(1) {
            out.push(&bare[1..]);
        }
    }
    if w.starts_with('~') && !w.starts_with("~/") {
        if let Some((_, rest)) = w.split_once('/') {
            out.push(rest);
        }
    }
    // `$PWD/x`, `$HOME/x`, `${GIT_DIR}/x` leave `PWD/x`…: a variable's
    // name (capitals, digits, `_`) as the first part stands for a place.
    if let Some((var, rest)) = w.split_once('/') {
        let is_var = !var.is_empty()
            && var
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if is_var {
            out.push(rest);
        }
    }
    out
}

/// The entries of one git configuration file's text, as git itself parses
/// it (keys lowercased but for subsections), includes not followed.
fn git_entries(text: &str) -> Vec<(String, String)> {
    use std::io::Write;
    let child = std::process::Command::new("git")
        .args(["config", "--no-includes", "--file", "-", "--list", "--null"])
        .env_remove("GIT_DIR")
        .env_remove("GIT_CONFIG_PARAMETERS")
        .env_remove("GIT_CONFIG_COUNT")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return Vec::new();
    };
    if let Some(mut i) = child.stdin.take() {
        let _ = i.write_all(text.as_bytes());
    }
    let Ok(out) = child.wait_with_output() else {
        return Vec::new();
    };
    let mut entries: Vec<(String, String)> = out
        .stdout
        .split(|b| *b == 0)
        .filter_map(|e| {
            let e = String::from_utf8_lossy(e);
            let (k, v) = e.split_once('\n').unwrap_or((&e, ""));
            (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
        })
        .collect();
    if !out.status.success() {
        // A file git refuses is still words: every one counts.
        entries.push((String::new(), text.to_string()));
    }
    entries
}

/// Every word of `text`: split at white space, and again at the characters
/// shells, INI, TOML and JSON readers split at. Both the coarse and the
/// fine words are kept (`a=b:c` gives `a=b:c`, `a`, `b`, `c`).
pub(crate) fn words_of(text: &str) -> Vec<String> {
    const FINE: &[char] = &[
        '=', ':', ',', ';', '|', '&', '(', ')', '<', '>', '`', '$', '\'', '"', '[', ']', '{', '}',
        '!', '@', '#', '*', '?', '\\',
    ];
    let mut out = Vec::new();
    // A quoted string is one word, spaces and all (`"git hooks"`, a JSON
    // string with `\/`), and so is a whole line's value.
    for quote in ['"', '\''] {
        for (i, inner) in text.split(quote).enumerate() {
            if i % 2 == 1 && !inner.is_empty() && inner.len() < 4096 && !inner.contains('\n') {
                out.push(inner.replace("\\/", "/").replace("\\\\", "\\"));
            }
        }
    }
    for line in text.lines() {
        let value = line.split_once('=').map_or(line, |(_, v)| v).trim();
        if value.contains(' ') && value.len() < 4096 {
            out.push(value.trim_matches(|c| c == '"' || c == '\'').to_string());
        }
    }
    for coarse in text.split_whitespace() {
        let c = coarse.trim_matches(|c: char| FINE.contains(&c));
        if !c.is_empty() && c.len() < 4096 {
            out.push(c.to_string());
        }
        for fine in coarse.split(FINE) {
            if !fine.is_empty() && fine != c && fine.len() < 4096 {
                out.push(fine.to_string());
            }
        }
    }
    out
}

/// `p` with `.` and `..` taken lexically.
pub(crate) fn normal(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// `p` with its longest existing ancestor's links resolved (the host's).
fn resolved(p: &Path) -> Option<PathBuf> {
    let mut rest = Vec::new();
    let mut at = p;
    loop {
        if let Ok(real) = std::fs::canonicalize(at) {
            let mut out = real;
            out.extend(rest.iter().rev());
            return Some(out);
        }
        rest.push(at.file_name()?.to_os_string());
        at = at.parent()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_as_readers_split() {
        let w = words_of("!sh -c \"tools/x.sh --k=cfg/y\" ; PATH=bin:sbin");
        for want in ["tools/x.sh", "cfg/y", "bin", "sbin", "sh", "PATH=bin:sbin"] {
            assert!(w.iter().any(|x| x == want), "{want} not in {w:?}");
        }
        let w = words_of("{\"command\": \"my tools\\/run it.sh\"}\nhooksPath = git hooks");
        for want in ["my tools/run it.sh", "git hooks"] {
            assert!(w.iter().any(|x| x == want), "{want} not in {w:?}");
        }
        let f = forms("PWD/scripts/lint.sh");
        assert!(f.contains(&"scripts/lint.sh"), "{f:?}");
    }

    #[test]
    fn a_nested_include_is_read_from_the_including_file() {
        let ws = tempfile::tempdir().unwrap();
        let w = ws.path().canonicalize().unwrap();
        let run = |args: &[&str]| {
            let ok = std::process::Command::new("git")
                .arg("-C")
                .arg(&w)
                .args(args)
                .status()
                .unwrap()
                .success();
            assert!(ok, "git {args:?}");
        };
        run(&["init", "-q"]);
        std::fs::create_dir_all(w.join("conf/deep")).unwrap();
        run(&["config", "include.path", "../conf/a.inc"]);
        std::fs::write(w.join("conf/a.inc"), "[include]\n\tpath = deep/b.inc\n").unwrap();
        std::fs::write(
            w.join("conf/deep/b.inc"),
            "[diff]\n\texternal = tools/ext.sh\n",
        )
        .unwrap();
        let facts = super::super::gitask::Asking::start(&w).answers();
        let mut r = Reader::with(&w, None, &facts);
        r.git(&w);
        let rels: Vec<_> = r.found.iter().map(|n| n.rel.clone()).collect();
        for want in ["conf/a.inc", "conf/deep/b.inc", "tools/ext.sh"] {
            assert!(
                rels.contains(&PathBuf::from(want)),
                "{want} not in {rels:?}"
            );
        }
    }
}
