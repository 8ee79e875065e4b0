//! Whether the human's files that an `--on-end apply` replaced or removed
//! can be had again without the layer: judged by content, never by what
//! `git status` says (skip-worktree, assume-unchanged, an ignore rule the
//! agent wrote all hide a local edit from it). A file is recoverable only
//! when its exact bytes are a blob of the human's `HEAD` or index (`git
//! hash-object --no-filters`, `git ls-files -s`, `git ls-tree -r HEAD`: git
//! reads, runs nothing of the tree's; an object merely present — one an
//! earlier agent's commits brought under `refs/sandmux/`, an unreachable
//! one — does not count); anything else — a link, a special file, any file
//! when there is no repository or git fails — is the human's only copy,
//! and the layer that keeps it in `taken/` stays until the human discards
//! it.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// How many of the entries the door set aside in `taken` (paths in the
/// layer's `taken/`; a removed directory counts by what it holds) git
/// cannot give back from the repository of the workspace `ws`.
pub(crate) fn unrecoverable(ws: &Path, taken: &[PathBuf]) -> usize {
    let (mut files, mut other) = (Vec::new(), 0usize);
    for t in taken {
        walk(t, &mut files, &mut other);
    }
    if files.is_empty() {
        return other;
    }
    // A name git's line-based input cannot carry is not asked about.
    let (asked, odd): (Vec<PathBuf>, Vec<PathBuf>) = files
        .into_iter()
        .partition(|f| !f.as_os_str().as_bytes().contains(&b'\n'));
    other + odd.len() + missing(ws, &asked).unwrap_or(asked.len())
}

/// Regular files at or below `p` (links never followed); the count of
/// anything else.
fn walk(p: &Path, files: &mut Vec<PathBuf>, other: &mut usize) {
    let Ok(m) = p.symlink_metadata() else {
        return;
    };
    if m.is_file() {
        files.push(p.to_path_buf());
    } else if m.is_dir() {
        match crate::sandbox::beneath::entries(p) {
            Ok(es) => es
                .into_iter()
                .for_each(|(n, _)| walk(&p.join(n), files, other)),
            Err(_) => *other += 1,
        }
    } else {
        *other += 1;
    }
}

/// How many of `files` have bytes that are no blob of the repository at
/// `ws`'s `HEAD` or index (the human's own: an object an earlier agent's
/// commits brought in under `refs/sandmux/`, or an unreachable one `git gc`
/// may prune, does not count); None when git cannot say.
fn missing(ws: &Path, files: &[PathBuf]) -> Option<usize> {
    let mut list = Vec::new();
    for f in files {
        list.extend_from_slice(f.as_os_str().as_bytes());
        list.push(b'\n');
    }
    let ids = git(ws, &["hash-object", "--no-filters", "--stdin-paths"], &list)?;
    let ids: Vec<&str> = ids.lines().collect();
    if ids.len() != files.len() {
        return None;
    }
    let mut have = std::collections::HashSet::new();
    let index = git(ws, &["ls-files", "-s", "-z", "--", ":/"], b"")?;
    // "MODE ID STAGE\tPATH"
    have.extend(
        index
            .split('\0')
            .filter_map(|e| e.split(' ').nth(1).map(str::to_string)),
    );
    if let Some(tree) = git(ws, &["ls-tree", "-r", "-z", "--full-tree", "HEAD"], b"") {
        // "MODE TYPE ID\tPATH"
        have.extend(
            tree.split('\0')
                .filter_map(|e| e.split(['\t', ' ']).nth(2).map(str::to_string)),
        );
    }
    Some(ids.iter().filter(|id| !have.contains(**id)).count())
}

/// The host's git in `ws` (its own configuration, nothing of the layer's),
/// `input` on its stdin; its stdout when it succeeded.
fn git(ws: &Path, args: &[&str], input: &[u8]) -> Option<String> {
    let mut child = Command::new("git")
        .arg("-C")
        .arg(ws)
        .args(["-c", "safe.directory=*"])
        .args(args)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_CONFIG_PARAMETERS")
        .env_remove("GIT_CONFIG_COUNT")
        .env_remove("GIT_OBJECT_DIRECTORY")
        .env_remove("GIT_ALTERNATE_OBJECT_DIRECTORIES")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut stdin = child.stdin.take()?;
    let input = input.to_vec();
    // Written beside the read: a long list must not fill both pipes.
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().ok()?;
    let _ = writer.join();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
