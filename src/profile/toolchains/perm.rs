//! Whether the sandbox's uid can read a directory: the permission bits of
//! the directory and of every directory above it, for that uid and its
//! groups, as the kernel checks them for a process without capabilities
//! (every process inside has none, whoever started sandmux).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Who the sandbox's processes are on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Who {
    /// The uid on the host.
    pub uid: u32,
    /// The primary gid and the supplementary groups.
    pub gids: Vec<u32>,
}

impl Who {
    /// The caller: in a user namespace the sandbox's uid inside maps to it.
    pub(crate) fn caller() -> Who {
        let mut gids = vec![nix::unistd::getegid().as_raw()];
        if let Ok(g) = nix::unistd::getgroups() {
            gids.extend(g.into_iter().map(|g| g.as_raw()));
        }
        Who {
            uid: nix::unistd::geteuid().as_raw(),
            gids,
        }
    }

    /// Whether the bits of `m` give this uid every bit of `want` (`r`=4,
    /// `x`=1, as in the `other` triple).
    fn may(&self, m: &std::fs::Metadata, want: u32) -> bool {
        let mode = m.mode();
        let bits = if m.uid() == self.uid {
            mode >> 6
        } else if self.gids.contains(&m.gid()) {
            mode >> 3
        } else {
            mode
        };
        bits & want == want
    }
}

/// `Ok` when `who` can search every directory above `dir` and read and
/// search `dir`; else the first directory in the way and why.
pub(crate) fn readable(dir: &Path, who: &Who) -> Result<(), (PathBuf, String)> {
    let mut chain: Vec<&Path> = dir.ancestors().collect();
    chain.reverse();
    let last = chain.len().saturating_sub(1);
    for (i, p) in chain.iter().enumerate() {
        let m =
            std::fs::metadata(p).map_err(|e| (p.to_path_buf(), format!("{}: {e}", p.display())))?;
        let want = if i == last { 5 } else { 1 };
        if !who.may(&m, want) {
            let need = if i == last {
                "read and search"
            } else {
                "search"
            };
            return Err((
                dir.to_path_buf(),
                format!(
                    "{} is mode {:04o}, owner uid {} group {}: uid {} may not {need} it",
                    p.display(),
                    m.mode() & 0o7777,
                    m.uid(),
                    m.gid(),
                    who.uid
                ),
            ));
        }
    }
    Ok(())
}

/// The nearest directory above `p` (or `p`) whose metadata can be read,
/// checked like [`readable`]: why a lookup under it was denied.
pub(crate) fn denied(p: &Path, who: &Who) -> (PathBuf, String) {
    for a in p.ancestors().skip(1) {
        if std::fs::metadata(a).is_ok() {
            return match readable(a, who) {
                Err(e) => (p.to_path_buf(), e.1),
                Ok(()) => (
                    p.to_path_buf(),
                    format!("{} cannot be searched", a.display()),
                ),
            };
        }
    }
    (p.to_path_buf(), "permission denied".into())
}
