//! What the door holds back: control, not data, and names a reader could
//! misread. Version-control directories, repository shapes and the
//! profile's tool configuration are known by name; the files the existing
//! repository's own configuration names inside the tree (a hooks path, a
//! filter or fsmonitor script, an included file) are read from that
//! configuration as host git reads it.

use super::diff::Change;
use std::path::{Path, PathBuf};

/// What one diff or apply holds back besides the fixed rules.
pub(crate) struct Hold {
    /// The profile's tool-configuration names (at any depth).
    pub names: Vec<PathBuf>,
    /// Paths in the workspace that the repository's configuration names,
    /// with the key that names each.
    pub configured: Vec<(PathBuf, String)>,
    /// The sandmux binary that runs this, when it is in the workspace (a
    /// checkout of sandmux used as one): the next `sandmux` would run what
    /// the agent put there.
    pub exe: Option<PathBuf>,
    /// The same binary's device and inode: a hard link of it elsewhere in
    /// the workspace (cargo's `target/debug/deps/sandmux-HASH`, which the
    /// next build links back) is held back too.
    pub exe_id: Option<(u64, u64)>,
}

impl Hold {
    /// The rules for the workspace `ws` and the profile's `names`.
    pub(crate) fn new(ws: &Path, names: Vec<PathBuf>) -> Hold {
        use std::os::unix::fs::MetadataExt;
        let running = std::env::current_exe().and_then(std::fs::canonicalize).ok();
        let exe = running
            .as_ref()
            .and_then(|e| e.strip_prefix(ws).ok().map(Path::to_path_buf));
        let exe_id = running
            .and_then(|e| std::fs::metadata(e).ok())
            .map(|m| (m.dev(), m.ino()));
        Hold {
            names,
            configured: configured(ws),
            exe,
            exe_id,
        }
    }

    /// Whether the host's entry with this status is the running binary.
    pub(crate) fn is_exe(&self, st: Option<nix::sys::stat::FileStat>) -> bool {
        st.is_some_and(|s| Some((s.st_dev, s.st_ino)) == self.exe_id)
    }
}

/// Configuration keys whose values name a program or a file that git runs
/// or reads (by their last part, lowercase), and key prefixes whose every
/// value does.
const PATH_KEYS: [&str; 20] = [
    "hookspath",
    "fsmonitor",
    "editor",
    "pager",
    "sshcommand",
    "askpass",
    "attributesfile",
    "excludesfile",
    "path",
    "clean",
    "smudge",
    "process",
    "textconv",
    "command",
    "driver",
    "program",
    "helper",
    "cmd",
    "template",
    "packobjectshook",
];
const PATH_PREFIXES: [&str; 2] = ["alias.", "pager."];

/// The paths inside `ws` that git's configuration for it names
/// ([`configured_at`] the workspace's top).
fn configured(ws: &Path) -> Vec<(PathBuf, String)> {
    configured_at(ws, ws)
}

impl Hold {
    /// Adds what the configuration of each repository nested in the
    /// workspace names, for the repositories the changed paths `rels` lie
    /// in (the nearest directory above each with a `.git` on the host).
    pub(crate) fn add_nested<'a>(&mut self, ws: &Path, rels: impl Iterator<Item = &'a Path>) {
        let mut seen: Vec<PathBuf> = Vec::new();
        let mut roots: Vec<PathBuf> = Vec::new();
        for rel in rels {
            for a in rel.ancestors().skip(1) {
                if a.as_os_str().is_empty() || seen.iter().any(|s| s == a) {
                    break;
                }
                seen.push(a.to_path_buf());
                if ws.join(a).join(".git").symlink_metadata().is_ok() {
                    roots.push(a.to_path_buf());
                }
            }
        }
        for r in roots {
            let found = configured_at(ws, &ws.join(&r));
            self.configured.extend(found);
        }
    }
}

/// The paths inside `ws` that git's configuration for the repository at
/// `repo` names: the whole configuration git sees there (`git config
/// --list --includes`, with the human's global one), each word of a value
/// that names a program or a file, taken relative to `repo` and to its
/// `.git`, kept when it lies in `ws` (existing or not: the agent could
/// make it). Nothing runs: `git config` reads.
fn configured_at(ws: &Path, repo: &Path) -> Vec<(PathBuf, String)> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args([
            "-c",
            "safe.directory=*",
            "config",
            "--null",
            "--list",
            "--includes",
        ])
        .env_remove("GIT_DIR")
        .env_remove("GIT_CONFIG")
        .env_remove("GIT_CONFIG_PARAMETERS")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    let Ok(out) = out else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in out.stdout.split(|b| *b == 0) {
        let text = String::from_utf8_lossy(entry);
        let Some((key, value)) = text.split_once('\n') else {
            continue;
        };
        let key = key.to_ascii_lowercase();
        let last = key.rsplit('.').next().unwrap_or("");
        if !PATH_KEYS.contains(&last) && !PATH_PREFIXES.iter().any(|p| key.starts_with(p)) {
            continue;
        }
        for word in value.split_whitespace() {
            let word = word.trim_matches(|c| c == '"' || c == '\'' || c == '!' || c == ';');
            for base in [repo.to_path_buf(), repo.join(".git")] {
                // Whether or not it exists yet: the agent could make it.
                if let Some(rel) = inside(ws, &base.join(word)) {
                    if !rel.as_os_str().is_empty() {
                        found.push((rel, key.clone()));
                    }
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// `p` relative to `ws` when, with `.` and `..` taken lexically, it lies
/// inside it.
fn inside(ws: &Path, p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out.strip_prefix(ws).ok().map(Path::to_path_buf)
}

/// The control directories of version-control systems and repository
/// tools: what each one discovers a repository by (besides git's bare
/// shape, `Trees::bare_shape`). Compared without regard to ASCII case (a
/// case-insensitive file system would take `.GIT` for `.git`).
const VCS_DIRS: [&str; 14] = [
    ".git",
    ".hg",
    ".jj",
    ".svn",
    "_darcs",
    ".bzr",
    ".pijul",
    ".fslckout",
    "_FOSSIL_",
    "CVS",
    ".sl",
    ".repo",
    "RCS",
    "SCCS",
];

/// Whether a path component is a version-control directory's name.
pub(crate) fn is_vcs_name(n: &std::ffi::OsStr) -> bool {
    n.to_str()
        .is_some_and(|n| VCS_DIRS.iter().any(|v| v.eq_ignore_ascii_case(n)))
}

/// A path as the summary shows it: the agent's bytes escaped (a held-back
/// name can hold a newline; a safe one is shown as it is).
pub(crate) fn shown_name(rel: &Path) -> String {
    crate::term::printable(&rel.to_string_lossy())
}

/// Whether a path could be misread by a program that reads the diff
/// (`patch` ends a name at a tab, reads quoted names with escapes, and
/// starts a new file at a newline) or by a human on a terminal: control
/// characters (C0 and C1), bidirectional controls, `"`, `\`, or not UTF-8.
pub(crate) fn unsafe_name(rel: &Path) -> bool {
    let Some(s) = rel.to_str() else {
        return true;
    };
    s.chars().any(|c| {
        c.is_control()
            || c == '"'
            || c == '\\'
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    })
}

/// Why a change is held back (control, not data, or not safely named), if
/// it is: a name a diff reader could misread, a part of the layer that
/// could not be read, a link or a special file, version-control data of
/// any system, a directory git could take for a repository, or tool
/// configuration the profile names.
/// The path up to and including the first version-control name in `rel`
/// (`lib/.git` of `lib/.git/objects/ab/cd…`).
pub(crate) fn vcs_root(rel: &Path) -> Option<PathBuf> {
    let mut root = PathBuf::new();
    for part in rel.iter() {
        root.push(part);
        if is_vcs_name(part) {
            return Some(root);
        }
    }
    None
}

pub(crate) fn held(c: &Change, hold: &Hold, bare: &dyn Fn(&Path) -> bool) -> Option<String> {
    let rel = c.rel();
    let names = &hold.names;
    if unsafe_name(rel) {
        return Some("a name with control characters, quotes or backslashes, or not UTF-8".into());
    }
    match c {
        Change::Unreadable { why, .. } => {
            return Some(format!("the layer could not be read here: {why}"))
        }
        Change::Added { what, .. } if *what != "file" && *what != "directory" => {
            return Some(format!("a {what}"))
        }
        _ => {}
    }
    if hold.exe.as_ref().is_some_and(|e| e.starts_with(rel)) {
        return Some("the sandmux binary that runs this, or a directory holding it".into());
    }
    let parts: Vec<&std::ffi::OsStr> = rel.iter().collect();
    if parts.iter().any(|p| is_vcs_name(p)) {
        return Some("version-control data".into());
    }
    if rel.ancestors().any(bare) {
        return Some("a directory git could take for a repository".into());
    }
    for i in 0..parts.len() {
        let tail: PathBuf = parts[i..].iter().collect();
        if names.iter().any(|n| tail.starts_with(n)) {
            return Some("tool configuration".into());
        }
    }
    if let Some((_, key)) = hold.configured.iter().find(|(p, _)| rel.starts_with(p)) {
        return Some(format!("named by the repository's configuration ({key})"));
    }
    None
}
