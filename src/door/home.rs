//! A workspace that is, or holds, a home directory: what the human's login,
//! shells, PATH and desktop obey comes from there, by names no list keeps
//! up with. The rule, in one sentence: every dot path of a home directory
//! in the workspace, and everything in a directory on the human's PATH that
//! lies in the workspace, is held back.
//!
//! A home directory in the workspace is the human's own (`$HOME`, or the
//! home their account names), wherever it lies in the tree, or any
//! directory of the tree with a shell's start file on the host (`.bashrc`,
//! `.profile`, `.zshrc`…) — which, for the tree's top, covers another
//! user's home or a copy of one.

use std::path::{Path, PathBuf};

/// Files whose presence on the host makes a directory a home.
const START_FILES: [&str; 15] = [
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".zlogout",
    ".cshrc",
    ".tcshrc",
    ".login",
    ".logout",
    ".config/fish/config.fish",
];

/// The human's home directory, links resolved: `$HOME`, else the account's.
pub(crate) fn human_home() -> Option<PathBuf> {
    let from_env = std::env::var_os("HOME").filter(|h| !h.is_empty());
    let from_account = || {
        nix::unistd::User::from_uid(nix::unistd::getuid())
            .ok()
            .flatten()
            .map(|u| u.dir.into_os_string())
    };
    let h = from_env.or_else(from_account)?;
    std::fs::canonicalize(h).ok()
}

/// The workspace's homes and PATH directories, relative to it.
pub(crate) struct Home {
    /// Directories whose dot entries are held (`""`: the top).
    homes: Vec<PathBuf>,
    /// Directories on the human's PATH inside the workspace.
    on_path: Vec<PathBuf>,
    /// Relative PATH entries: held wherever they occur in the tree.
    relative: Vec<PathBuf>,
    /// PATH holds the current directory: every executable file is held.
    cwd: bool,
}

/// Why the home rule holds a path back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HomeWhy {
    /// A dot path of a home directory.
    DotPath,
    /// In a directory on the human's PATH.
    OnPath,
}

impl Home {
    /// Reads the host: `ws` is the workspace, links resolved.
    pub(crate) fn of(ws: &Path) -> Home {
        let mut homes = Vec::new();
        let mut accounts: Vec<PathBuf> = human_home().into_iter().collect();
        if let Ok(Some(u)) = nix::unistd::User::from_uid(nix::unistd::getuid()) {
            accounts.extend(std::fs::canonicalize(u.dir).ok());
        }
        for h in &accounts {
            if let Ok(rel) = h.strip_prefix(ws) {
                homes.push(rel.to_path_buf());
            }
        }
        if START_FILES
            .iter()
            .any(|f| ws.join(f).symlink_metadata().is_ok())
        {
            homes.push(PathBuf::new());
        }
        let (mut on_path, mut relative, mut cwd) = (Vec::new(), Vec::new(), false);
        let path = std::env::var_os("PATH").unwrap_or_default();
        for dir in std::env::split_paths(&path) {
            if dir.is_absolute() {
                let real = std::fs::canonicalize(&dir).unwrap_or(dir);
                if let Ok(rel) = real.strip_prefix(ws) {
                    on_path.push(rel.to_path_buf());
                }
                continue;
            }
            // Relative to wherever the human's shell is: anywhere in the
            // tree (`node_modules/.bin`); empty or `.`: every directory.
            let dir = super::named::normal(&dir);
            if dir.as_os_str().is_empty() {
                cwd = true;
            } else {
                relative.push(dir);
            }
        }
        for h in homes.clone() {
            on_path.push(h.join("bin"));
        }
        homes.sort();
        homes.dedup();
        Home {
            homes,
            on_path,
            relative,
            cwd,
        }
    }

    /// PATH holds the current directory (an empty or `.` entry): any
    /// executable file the human's shell stands beside is a command.
    pub(crate) fn every_executable(&self) -> bool {
        self.cwd
    }

    /// Whether the home rule holds `rel` back.
    pub(crate) fn why(&self, rel: &Path) -> Option<HomeWhy> {
        let dotted = self.homes.iter().any(|h| {
            rel.strip_prefix(h)
                .ok()
                .and_then(|r| r.iter().next())
                .is_some_and(|first| first.as_encoded_bytes().first() == Some(&b'.'))
        });
        if dotted {
            return Some(HomeWhy::DotPath);
        }
        let parts: Vec<_> = rel.iter().collect();
        let relative = self.relative.iter().any(|d| {
            let want: Vec<_> = d.iter().collect();
            parts.windows(want.len()).any(|w| w == want.as_slice())
        });
        let pathed = self.on_path.iter().any(|d| rel.starts_with(d)) || relative;
        pathed.then_some(HomeWhy::OnPath)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_home_holds_its_dot_paths_and_its_bin() {
        let h = Home {
            homes: vec![PathBuf::new(), PathBuf::from("users/me")],
            on_path: vec![PathBuf::from("tools/bin")],
            relative: vec![PathBuf::from("node_modules/.bin")],
            cwd: false,
        };
        for held in [
            "web/node_modules/.bin/tsc",
            ".bash_logout",
            ".config/environment.d/x.conf",
            "users/me/.pam_environment",
            "tools/bin/git",
        ] {
            assert!(h.why(Path::new(held)).is_some(), "{held}");
        }
        for free in ["src/main.rs", "users/me/notes.txt", "tools/readme"] {
            assert!(h.why(Path::new(free)).is_none(), "{free}");
        }
    }
}
