//! What the door holds back: control, not data, and names a reader could
//! misread. Version-control directories, repository shapes, the profile's
//! tool configuration and other agents' instruction files
//! (`instructions.rs`) are known by name, as the tools know them; what the
//! host tools' configuration names inside the tree is read from that
//! configuration, as the tools read it, by its words (`named.rs`); a home
//! directory's dot paths and PATH are held whole (`home.rs`). The door
//! decides on [`Why`], never on its words.

use super::diff::{Change, Trees};
use std::path::{Path, PathBuf};

/// Why a path is held back: control, not data, or not safely named. The
/// door decides on this type; the words are rendered from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Why {
    /// A name a diff reader could misread (never applied).
    UnsafeName,
    /// A part of the layer that could not be read (never applied).
    Unreadable(String),
    /// A link or a special file (never applied).
    NotAFile(&'static str),
    /// The sandmux binary that runs the door, or a directory holding it.
    SandmuxBinary,
    /// A hard link of that binary (by device and inode).
    SandmuxLink,
    /// Version-control data of any system.
    Vcs,
    /// A directory git could take for a repository.
    BareShape,
    /// The profile's tool configuration, by name.
    ToolConfig,
    /// Named by a host tool's configuration (`named.rs`).
    Named(String),
    /// Instructions for the human's coding agents (`instructions.rs`).
    Instructions,
    /// The home-directory rule (`home.rs`).
    Home(super::home::HomeWhy),
    /// The walk for tool configuration stopped at its bound: what the
    /// tree's configuration names could not all be read.
    TooLargeToRead,
}

impl Why {
    /// Never applied, even when named with `--include-control`.
    pub(crate) fn never(&self) -> bool {
        matches!(
            self,
            Why::UnsafeName
                | Why::Unreadable(_)
                | Why::NotAFile(_)
                | Why::SandmuxBinary
                | Why::SandmuxLink
        )
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use super::home::HomeWhy;
        match self {
            Why::UnsafeName => {
                f.write_str("a name with control characters, quotes or backslashes, or not UTF-8")
            }
            Why::Unreadable(why) => write!(f, "the layer could not be read here: {why}"),
            Why::NotAFile(what) => write!(f, "a {what}"),
            Why::SandmuxBinary => {
                f.write_str("the sandmux binary that runs this, or a directory holding it")
            }
            Why::SandmuxLink => f.write_str("a link of the sandmux binary that runs this"),
            Why::Vcs => f.write_str("version-control data"),
            Why::BareShape => f.write_str("a directory git could take for a repository"),
            Why::ToolConfig => f.write_str("tool configuration"),
            Why::Named(by) => write!(f, "named by {by}"),
            Why::Instructions => f.write_str("instructions for coding agents"),
            Why::Home(HomeWhy::DotPath) => f.write_str("a dot path of a home directory"),
            Why::Home(HomeWhy::OnPath) => f.write_str("in a directory on your PATH"),
            Why::TooLargeToRead => write!(
                f,
                "the workspace has more than {SCAN_MAX} entries or {FILES_MAX} files tools read by name, so not every tool's configuration in it could be read; nothing comes in unless named with --include-control"
            ),
        }
    }
}

/// What one diff or apply holds back besides the fixed rules.
pub(crate) struct Hold {
    /// The profile's tool-configuration names (at any depth).
    pub names: Vec<PathBuf>,
    /// The same, by their first component (one lookup a path component,
    /// not one comparison a name).
    by_first: std::collections::HashMap<std::ffi::OsString, Vec<PathBuf>>,
    /// Paths in the workspace that a host tool's configuration names, with
    /// whose configuration names each.
    pub configured: std::collections::HashMap<PathBuf, String>,
    /// Those of [`Hold::configured`] that exist on the host (what removing
    /// a directory would take away).
    pub configured_on_host: Vec<PathBuf>,
    /// The home-directory and PATH rule.
    home: super::home::Home,
    /// The sandmux binary that runs this, when it is in the workspace (a
    /// checkout of sandmux used as one): the next `sandmux` would run what
    /// the agent put there.
    pub exe: Option<PathBuf>,
    /// The same binary's device and inode: a hard link of it elsewhere in
    /// the workspace (cargo's `target/debug/deps/sandmux-HASH`, which the
    /// next build links back) is held back too.
    pub exe_id: Option<(u64, u64)>,
    /// The walk for nested repositories and tool files saw the whole tree.
    pub scan_complete: bool,
    /// Directories already asked about git's bare shape.
    bare_seen: std::cell::RefCell<std::collections::HashMap<PathBuf, bool>>,
}

impl Hold {
    /// The rules for the workspace `ws` (its layer `trees`) and the
    /// profile's `names`, with what the configuration of the workspace's
    /// repository names.
    pub(crate) fn new(
        ws: &Path,
        names: Vec<PathBuf>,
        trees: &Trees,
        facts: &super::gitask::GitFacts,
    ) -> Hold {
        use std::os::unix::fs::MetadataExt;
        let running = std::env::current_exe().and_then(std::fs::canonicalize).ok();
        let exe = running
            .as_ref()
            .and_then(|e| e.strip_prefix(ws).ok().map(Path::to_path_buf));
        let exe_id = running
            .and_then(|e| std::fs::metadata(e).ok())
            .map(|m| (m.dev(), m.ino()));
        let mut r = super::named::Reader::with(ws, Some(trees), facts);
        r.git(ws);
        read_by_name(&mut r, ws, ws, &names);
        let mut by_first: std::collections::HashMap<_, Vec<PathBuf>> = Default::default();
        for n in &names {
            if let Some(first) = n.iter().next() {
                by_first
                    .entry(first.to_os_string())
                    .or_default()
                    .push(n.clone());
            }
        }
        Hold {
            configured: collect(r.found),
            home: super::home::Home::of(ws),
            names,
            by_first,
            exe,
            exe_id,
            configured_on_host: Vec::new(),
            scan_complete: true,
            bare_seen: Default::default(),
        }
    }

    /// Whether the host's entry with this status is the running binary.
    pub(crate) fn is_exe(&self, st: Option<nix::sys::stat::FileStat>) -> bool {
        st.is_some_and(|s| Some((s.st_dev, s.st_ino)) == self.exe_id)
    }

    /// Adds what host tools' configuration names anywhere in the
    /// workspace: every repository (git, Mercurial, jj) nested in it and
    /// every file a tool reads by name (the profile's names, other agents'
    /// instruction files), found by one walk of the host's tree (no link
    /// followed, at most [`SCAN_MAX`] entries), and in the directories
    /// above each changed path `rels` (the walk's backstop). Linear in the
    /// tree and the paths.
    pub(crate) fn add_nested<'a>(
        &mut self,
        ws: &Path,
        trees: &Trees,
        facts: &super::gitask::GitFacts,
        rels: impl Iterator<Item = &'a Path>,
    ) {
        let (mut dirs, files, complete) = scan(ws, &self.names);
        self.scan_complete = complete;
        let scanned = dirs.len();
        let mut seen: std::collections::HashSet<PathBuf> = dirs.iter().cloned().collect();
        for rel in rels {
            for a in rel.ancestors().skip(1) {
                if a.as_os_str().is_empty() || !seen.insert(a.to_path_buf()) {
                    break;
                }
                dirs.push(a.to_path_buf());
            }
        }
        let mut r = super::named::Reader::with(ws, Some(trees), facts);
        for (i, d) in dirs.into_iter().enumerate() {
            let host = ws.join(&d);
            // The walk read what it found; the directories above the
            // changes are looked at by name only where it stopped short.
            if i >= scanned && complete {
                continue;
            }
            // The workspace's own repository was read by [`Hold::new`].
            if !d.as_os_str().is_empty() && host.join(".git").symlink_metadata().is_ok() {
                r.git(&host);
            }
            if host.join(".hg").symlink_metadata().is_ok() {
                r.hg(&host);
            }
            if host.join(".jj").symlink_metadata().is_ok() {
                r.jj(&host);
            }
            read_by_name(&mut r, ws, &host, &self.names);
        }
        for f in files {
            r.by_name(&ws.join(f), ws);
        }
        if ws.join(".hg").symlink_metadata().is_ok() {
            r.hg(ws);
        }
        if ws.join(".jj").symlink_metadata().is_ok() {
            r.jj(ws);
        }
        for (k, v) in collect(r.found) {
            self.configured.entry(k).or_insert(v);
        }
        self.configured_on_host = self
            .configured
            .keys()
            .filter(|p| ws.join(p).symlink_metadata().is_ok())
            .cloned()
            .collect();
    }

    /// Whether every executable file is held (PATH has the current
    /// directory).
    pub(crate) fn every_executable(&self) -> bool {
        self.home.every_executable()
    }

    /// Whether git could take `rel` for a repository, asked once.
    fn bare(&self, rel: &Path, bare: &dyn Fn(&Path) -> bool) -> bool {
        if let Some(b) = self.bare_seen.borrow().get(rel) {
            return *b;
        }
        let b = bare(rel);
        self.bare_seen.borrow_mut().insert(rel.to_path_buf(), b);
        b
    }
}

/// Entries the walk for nested repositories and tool files looks at.
const SCAN_MAX: usize = 1_000_000;
/// Files read by name that one walk may find.
const FILES_MAX: usize = 10_000;

/// One walk of the host's workspace: the directories holding a
/// repository's control directory, and the files tools read by name
/// (relative); `false` when it stopped at [`SCAN_MAX`].
fn scan(ws: &Path, names: &[PathBuf]) -> (Vec<PathBuf>, Vec<PathBuf>, bool) {
    let firsts: std::collections::HashSet<&std::ffi::OsStr> =
        names.iter().filter_map(|n| n.iter().next()).collect();
    let (mut repos, mut files) = (Vec::new(), Vec::new());
    let mut stack = vec![PathBuf::new()];
    let mut seen = 0usize;
    while let Some(d) = stack.pop() {
        let Ok(listed) = crate::sandbox::beneath::entries(&ws.join(&d)) else {
            continue;
        };
        for (name, kind) in listed {
            seen += 1;
            if seen > SCAN_MAX {
                return (repos, files, false);
            }
            let rel = d.join(&name);
            if is_vcs_name(&name) {
                if !repos.contains(&d) {
                    repos.push(d.clone());
                }
                continue; // its insides are the VCS's, held whole
            }
            let named = firsts.contains(name.as_os_str())
                && names.iter().any(|n| {
                    ws.join(&d).join(n).symlink_metadata().is_ok() && n.starts_with(&name)
                });
            if named || super::instructions::is_instructions(&rel) {
                // Each is read (at most 256 KiB): their number is bounded
                // too, and past it the walk fails closed like its own bound.
                if files.len() >= FILES_MAX {
                    return (repos, files, false);
                }
                files.push(rel.clone());
            }
            if kind == Some(nix::dir::Type::Directory) {
                stack.push(rel);
            }
        }
    }
    (repos, files, true)
}

/// The files tools read by name (the profile's names that exist on the
/// host in `dir`), read for the words that name paths.
fn read_by_name(r: &mut super::named::Reader<'_>, ws: &Path, dir: &Path, names: &[PathBuf]) {
    for n in names {
        let p = dir.join(n);
        if p.symlink_metadata().is_ok() {
            r.by_name(&p, ws);
        }
    }
}

fn collect(found: Vec<super::named::Named>) -> std::collections::HashMap<PathBuf, String> {
    let mut m = std::collections::HashMap::new();
    for n in found {
        m.entry(n.rel).or_insert(n.by);
    }
    m
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

/// Files git reads from the tree as configuration: which filter, diff and
/// merge drivers run on which paths, and what a submodule is.
const GIT_TREE_FILES: [&str; 2] = [".gitattributes", ".gitmodules"];

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

pub(crate) fn held(c: &Change, hold: &Hold, bare: &dyn Fn(&Path) -> bool) -> Option<Why> {
    let rel = c.rel();
    if unsafe_name(rel) {
        return Some(Why::UnsafeName);
    }
    match c {
        Change::Unreadable { why, .. } => return Some(Why::Unreadable(why.clone())),
        Change::Added { what, .. } if *what != "file" && *what != "directory" => {
            return Some(Why::NotAFile(what))
        }
        _ => {}
    }
    if hold.exe.as_ref().is_some_and(|e| e.starts_with(rel)) {
        return Some(Why::SandmuxBinary);
    }
    let parts: Vec<&std::ffi::OsStr> = rel.iter().collect();
    if parts.iter().any(|p| is_vcs_name(p)) {
        return Some(Why::Vcs);
    }
    // A file is no repository: only the directories above it are asked.
    let file = matches!(
        c,
        Change::Added { what: "file", .. } | Change::Modified { .. }
    );
    if rel
        .ancestors()
        .skip(usize::from(file))
        .any(|a| hold.bare(a, bare))
    {
        return Some(Why::BareShape);
    }
    if super::instructions::is_instructions(rel) {
        return Some(Why::Instructions);
    }
    for i in 0..parts.len() {
        // Only the names that start with this component can match here.
        let Some(candidates) = hold.by_first.get(parts[i]) else {
            continue;
        };
        let tail: PathBuf = parts[i..].iter().collect();
        if candidates.iter().any(|n| tail.starts_with(n)) {
            return Some(Why::ToolConfig);
        }
    }
    if let Some(by) = rel.ancestors().find_map(|a| hold.configured.get(a)) {
        return Some(Why::Named(by.clone()));
    }
    // Removing what a tool is configured to run (a hook, a scanner) is
    // control too.
    if matches!(c, Change::Removed { .. }) {
        let below = hold
            .configured_on_host
            .iter()
            .find(|p| p.starts_with(rel) && !p.iter().any(is_vcs_name));
        if let Some(by) = below.and_then(|p| hold.configured.get(p)) {
            return Some(Why::Named(by.clone()));
        }
    }
    if parts
        .last()
        .is_some_and(|n| GIT_TREE_FILES.iter().any(|g| n.eq_ignore_ascii_case(g)))
    {
        return Some(Why::ToolConfig);
    }
    if let Some(h) = hold.home.why(rel) {
        return Some(Why::Home(h));
    }
    // Fail closed: where the walk could not read the whole tree, what its
    // configuration names is unknown.
    (!hold.scan_complete).then_some(Why::TooLargeToRead)
}
