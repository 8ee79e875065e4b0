//! Git's repository layout, as far as the guard needs it: what kind of
//! checkout a tree is, and where the directories git reads as control plane
//! live (gitrepository-layout(5), git-worktree(1), gitsubmodules(7)).
//!
//! Everything git reads from a git directory is treated as control plane
//! (config, hooks, `commondir`, `gitdir`, alternates, worktrees, modules): the
//! guard binds the whole directory read-only instead of naming its parts.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::GuardError;
pub(crate) use crate::profile::guard::Shape;

/// Reads a small file without following a symlink at its last component.
fn read_small(p: &Path) -> std::io::Result<String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)?;
    let mut s = String::new();
    f.take(4096).read_to_string(&mut s)?;
    Ok(s)
}

/// Resolves a path written in a git file, relative to the file's directory.
fn resolve_in(base: &Path, written: &str) -> std::io::Result<PathBuf> {
    let p = Path::new(written.trim_end_matches(['\n', '\r']));
    std::fs::canonicalize(base.join(p))
}

/// Classifies the tree at `root` (a real, canonical directory).
pub(crate) fn shape(root: &Path) -> Result<Shape, GuardError> {
    let dotgit = root.join(".git");
    match std::fs::symlink_metadata(&dotgit) {
        Ok(m) if m.is_dir() => return Ok(Shape::Repository),
        Ok(m) if m.is_file() => return linked(root, &dotgit),
        Ok(_) => return Err(GuardError::NotGitEntry(dotgit)),
        Err(_) => {}
    }
    let mut up = root.parent();
    while let Some(d) = up {
        if std::fs::symlink_metadata(d.join(".git")).is_ok() {
            return Ok(Shape::Inside {
                toplevel: d.to_path_buf(),
            });
        }
        up = d.parent();
    }
    Ok(Shape::Plain)
}

fn linked(root: &Path, dotgit: &Path) -> Result<Shape, GuardError> {
    let bad = |why: String| GuardError::GitFile {
        dotgit: dotgit.to_path_buf(),
        why,
    };
    let text = read_small(dotgit).map_err(|e| bad(e.to_string()))?;
    let written = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("gitdir:"))
        .map(str::trim)
        .ok_or_else(|| bad("not a 'gitdir:' file".into()))?;
    let gitdir = resolve_in(root, written)
        .map_err(|e| bad(format!("the git directory it names ({written}): {e}")))?;
    if !gitdir.is_dir() {
        return Err(bad(format!("{} is not a directory", gitdir.display())));
    }
    let (link, common) = match read_small(&gitdir.join("commondir")) {
        Ok(c) => (
            "worktree",
            resolve_in(&gitdir, c.trim())
                .map_err(|e| bad(format!("its commondir ({}): {e}", c.trim())))?,
        ),
        Err(_) => ("separate", gitdir.clone()),
    };
    Ok(Shape::Linked {
        link: link.into(),
        gitdir,
        common,
    })
}

/// Lexically normal form of an absolute path (`.` and `..` resolved
/// without touching the file system: the path may not exist).
fn normal(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// Paths a repository's config hands control to (`core.hooksPath`,
/// `include.path`, `includeIf.*.path`), absolute: the guard treats them as
/// control plane too, wherever they point. `worktree` is where hooks run
/// (`None` for a bare repository). Read with the host's git, which only parses
/// the one file (`--file` does not follow includes); without git on the host
/// there is nothing to obey them.
pub(crate) fn delegated(config: &Path, worktree: Option<&Path>) -> Vec<PathBuf> {
    if !config.is_file() {
        return Vec::new();
    }
    let Ok(out) = std::process::Command::new("git")
        .args(["config", "--null", "--file"])
        .arg(config)
        .args([
            "--get-regexp",
            r"^(core\.hookspath|include\.path|includeif\..*\.path)$",
        ])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_DIR")
        .env_remove("GIT_CONFIG")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    let dir = config.parent().unwrap_or(Path::new("/"));
    let mut paths = Vec::new();
    for item in out.stdout.split(|b| *b == 0) {
        let text = String::from_utf8_lossy(item);
        let Some((key, value)) = text.split_once('\n') else {
            continue;
        };
        if value.is_empty() || value.starts_with('~') {
            continue; // empty, or in the user's home: not the agent's
        }
        let base = if key == "core.hookspath" {
            worktree.unwrap_or(dir)
        } else {
            dir
        };
        paths.push(normal(&base.join(value)));
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let t = tempfile::tempdir().unwrap();
        let r = std::fs::canonicalize(t.path()).unwrap();
        let plain = r.join("plain");
        std::fs::create_dir(&plain).unwrap();
        assert_eq!(shape(&plain).unwrap(), Shape::Plain);
        std::fs::create_dir_all(r.join("repo/.git/worktrees/wt")).unwrap();
        std::fs::create_dir_all(r.join("repo/sub")).unwrap();
        assert_eq!(shape(&r.join("repo")).unwrap(), Shape::Repository);
        assert_eq!(
            shape(&r.join("repo/sub")).unwrap(),
            Shape::Inside {
                toplevel: r.join("repo")
            }
        );
        std::fs::write(r.join("repo/.git/worktrees/wt/commondir"), "../..\n").unwrap();
        std::fs::create_dir(r.join("wt")).unwrap();
        std::fs::write(
            r.join("wt/.git"),
            format!("gitdir: {}\n", r.join("repo/.git/worktrees/wt").display()),
        )
        .unwrap();
        match shape(&r.join("wt")).unwrap() {
            Shape::Linked { link, common, .. } => {
                assert_eq!(link, "worktree");
                assert_eq!(common, r.join("repo/.git"));
            }
            s => panic!("{s:?}"),
        }
        std::fs::create_dir_all(r.join("repo/.git/modules/m")).unwrap();
        std::fs::write(r.join("repo/sub/.git"), "gitdir: ../.git/modules/m\n").unwrap();
        match shape(&r.join("repo/sub")).unwrap() {
            Shape::Linked { link, common, .. } => {
                assert_eq!(link, "separate");
                assert_eq!(common, r.join("repo/.git/modules/m"));
            }
            s => panic!("{s:?}"),
        }
        std::fs::write(r.join("plain/.git"), "nonsense").unwrap();
        assert!(shape(&plain).is_err());
    }

    #[test]
    fn delegated_paths_are_read_with_git() {
        let t = tempfile::tempdir().unwrap();
        let cfg = t.path().join("config");
        std::fs::write(
            &cfg,
            "[core]\n\thooksPath = tools/hooks\n[include]\n\tpath = ../shared.cfg\n\tpath = ~/x\n",
        )
        .unwrap();
        let wt = Path::new("/w");
        let got = delegated(&cfg, Some(wt));
        assert_eq!(
            got,
            vec![
                PathBuf::from("/w/tools/hooks"),
                normal(&t.path().join("../shared.cfg"))
            ]
        );
    }
}
