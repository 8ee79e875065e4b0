//! What the agent's commits would bring: every path the new commits of a
//! branch add or change (against each parent, the root commit against
//! nothing), read by the host's git from the staging repository
//! (`refs.rs`), checked with the door's own rules. A branch that would
//! bring anything the door holds back as a file — a symbolic link, a
//! submodule, version-control data, tool configuration, a name the
//! repository's configuration names — is not fetched: checking it out
//! would bring what `apply` held back.

use super::error::RefsError;
use std::path::{Path, PathBuf};

/// New commits looked at per branch; a branch with more is not fetched.
const MAX_COMMITS: usize = 10_000;

/// Drops from `refs` each branch whose commits not reachable from `tips`
/// (the host's) carry a path `check` refuses, and deletes it from the
/// staging repository `repo` (whose every branch is fetched); the reasons
/// of the drops.
pub(crate) fn refuse_held(
    repo: &Path,
    refs: &mut Vec<(String, String)>,
    tips: &[&str],
    root: &Path,
    check: super::refs::Check<'_>,
) -> Result<Vec<String>, RefsError> {
    let mut refused = Vec::new();
    let mut keep = Vec::new();
    for (name, sha) in refs.drain(..) {
        let why = match first_held(repo, &sha, tips, root, check) {
            Ok(None) => {
                keep.push((name, sha));
                continue;
            }
            Ok(Some(why)) => why,
            Err(e) => e.to_string(),
        };
        // Out of the staging repository, or nothing is fetched at all.
        super::refs::git_out(repo, &["update-ref", "-d", &format!("refs/heads/{name}")])?;
        refused.push(format!("branch {}: {why}", crate::term::printable(&name)));
    }
    *refs = keep;
    Ok(refused)
}

fn first_held(
    repo: &Path,
    sha: &str,
    tips: &[&str],
    root: &Path,
    check: super::refs::Check<'_>,
) -> Result<Option<String>, RefsError> {
    let mut args = vec!["rev-list", sha];
    if !tips.is_empty() {
        args.push("--not");
        args.extend(tips);
    }
    let commits = super::refs::git_out(repo, &args)?;
    let commits: Vec<&str> = commits.lines().collect();
    if commits.len() > MAX_COMMITS {
        return Ok(Some(format!("more than {MAX_COMMITS} new commits")));
    }
    for c in commits {
        let raw = super::refs::git_out(
            repo,
            &[
                "diff-tree",
                "-r",
                "-z",
                "-m",
                "--root",
                "--no-renames",
                "--no-commit-id",
                c,
            ],
        )?;
        let mut fields = raw.split('\0');
        while let Some(meta) = fields.next() {
            let Some(meta) = meta.strip_prefix(':') else {
                continue;
            };
            let path = fields.next().unwrap_or_default();
            let parts: Vec<&str> = meta.split(' ').collect();
            let (mode, status) = (
                parts.get(1).copied().unwrap_or(""),
                parts.get(4).copied().unwrap_or(""),
            );
            if status.starts_with('D') {
                continue;
            }
            let what = match mode {
                "120000" => "symbolic link",
                "160000" => "submodule",
                _ => "file",
            };
            let rel: PathBuf = root.join(path);
            if let Some(why) = check(&rel, what).or_else(|| bare_in(repo, c, path)) {
                return Ok(Some(format!(
                    "commit {} brings {} ({why})",
                    &c[..c.len().min(12)],
                    crate::term::printable(path)
                )));
            }
        }
    }
    Ok(None)
}

/// Names git takes, beside `HEAD`, for a repository's own directory.
const BARE: [&str; 4] = ["objects", "refs", "commondir", "gitdir"];

/// Whether `path` lies in a directory that commit `c` shapes as a bare
/// repository (`HEAD` and one of [`BARE`]): checked out, git would take it
/// for one, and obey its `config`.
fn bare_in(repo: &Path, c: &str, path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        if *part != "HEAD" && !BARE.contains(part) {
            continue;
        }
        let dir = parts[..i].join("/");
        let mut args = vec!["ls-tree", "-z", "--name-only", c, "--"];
        let spec = format!("{dir}/");
        if !dir.is_empty() {
            args.push(&spec);
        }
        // A tree git cannot list is refused, never taken for a plain one.
        let names = match super::refs::git_out(repo, &args) {
            Ok(n) => n,
            Err(e) => return Some(format!("its tree could not be read ({e})")),
        };
        let names: Vec<&str> = names
            .split('\0')
            .map(|l| l.rsplit('/').next().unwrap_or(l))
            .collect();
        if names.contains(&"HEAD") && BARE.iter().any(|b| names.contains(b)) {
            return Some("a directory git could take for a repository".into());
        }
    }
    None
}
