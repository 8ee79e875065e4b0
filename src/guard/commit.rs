//! Commit mode (`[workspace] git = "commit"`): the agent commits, and the
//! workspace's own git directory stays read-only.
//!
//! At start sandmux makes a separate repository for the instance in its state
//! directory, `<state>/git/<id>/agent.git`: HEAD, refs and the index copied
//! from the workspace's repository, an object store of its own that borrows
//! the real objects through `objects/info/alternates` (via `<id>/origin`, a
//! link to the real git directory on the host and a read-only bind of it
//! inside), and a config and hooks that sandmux writes. Inside the sandbox it
//! is mounted over the workspace's `.git`, with `config`, `hooks`, `info` and
//! `objects/info` read-only. The human brings the work in with
//! `sandmux git fetch ID`, which refuses a repository whose shape or config
//! is not what sandmux made, then fetches (objects checked) into
//! `refs/sandmux/<id>/*` of the real repository. The repository survives the
//! instance; `--prune` removes it after a successful fetch.

use super::git::Shape;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) use crate::profile::guard::CommitRepo;

/// What commit mode's set-up and `sandmux git fetch` fail with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CommitError {
    /// Host git could not be started.
    #[error("git: {0}")]
    Spawn(std::io::Error),
    /// Host git failed (its stderr, printable).
    #[error("git {args}: {stderr}")]
    Git {
        /// Its arguments.
        args: String,
        /// What it said.
        stderr: String,
    },
    /// The fetch itself failed or could not be waited for.
    #[error("git fetch: {0}")]
    Fetch(String),
    /// The fetch ran past its time.
    #[error("git fetch did not finish within {0} s; killed")]
    Timeout(u64),
    /// The agent's repository is not what sandmux made.
    #[error("refusing to fetch from {}: {} (sandmux made this repository; only the agent could have changed it)", agent.display(), bad.join("; "))]
    Changed {
        /// The agent's repository.
        agent: PathBuf,
        /// What differs.
        bad: Vec<String>,
    },
    /// Not an instance id (printable).
    #[error("{0:?} is not an instance id (see sandmux ps)")]
    NotAnId(String),
    /// No commit-mode repository for the instance.
    #[error("no commit-mode repository for instance {id} in {}", dir.display())]
    NoRepository {
        /// The instance.
        id: String,
        /// Where it was looked for.
        dir: PathBuf,
    },
    /// The instance still runs.
    #[error("instance {0} is still running: stop it first (sandmux stop {0}), then fetch")]
    Running(String),
    /// The workspace's shape, a file-system step, the state directory.
    #[error(transparent)]
    Guard(#[from] super::GuardError),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CommitError {
    let path = path.to_path_buf();
    move |source| CommitError::Guard(super::GuardError::Io { what, path, source })
}

/// What `git fetch ID` checks against.
#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    id: String,
    workspace: PathBuf,
    real: PathBuf,
    config_sha256: String,
    alternates: String,
}

/// Top-level entries git may leave in a git directory as data.
const DATA: &[&str] = &[
    "HEAD",
    "ORIG_HEAD",
    "FETCH_HEAD",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "MERGE_RR",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "BISECT_LOG",
    "AUTO_MERGE",
    "COMMIT_EDITMSG",
    "SQUASH_MSG",
    "index",
    "index.lock",
    "packed-refs",
    "refs",
    "objects",
    "logs",
    "config",
    "hooks",
    "info",
    "description",
    "shallow",
    "rebase-merge",
    "rebase-apply",
    "sequencer",
    "rr-cache",
];

/// Whether git writes `name` at the top of a git directory as data.
pub(crate) fn is_git_data(name: &str) -> bool {
    (DATA.contains(&name) && !matches!(name, "config" | "hooks" | "info"))
        || name.ends_with(".lock")
        || matches!(name, "gc.pid" | "gc.log")
}

fn sha(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn git_out(dir: &Path, args: &[&str]) -> Result<String, CommitError> {
    let o = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_DIR")
        .output()
        .map_err(CommitError::Spawn)?;
    if !o.status.success() {
        return Err(CommitError::Git {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Makes the agent's repository for instance `id` of the tree at `root`.
pub(crate) fn prepare(
    state: &Path,
    id: &str,
    root: &Path,
    shape: &Shape,
) -> Result<CommitRepo, CommitError> {
    if *shape != Shape::Repository {
        return Err(super::GuardError::CommitShape {
            root: root.to_path_buf(),
            shape: shape.describe(),
        }
        .into());
    }
    let real = root.join(".git");
    let dir = state.join("git").join(id);
    let agent = dir.join("agent.git");
    make_dirs(&agent)?;
    let origin = dir.join("origin");
    std::os::unix::fs::symlink(&real, &origin).map_err(io("linking", &origin))?;
    copy_state(root, &real, &agent)?;
    let alternates = format!("{}\n", origin.join("objects").display());
    write_in(&agent, "objects/info/alternates", alternates.as_bytes())?;
    let config = agent_config(root, id);
    write_in(&agent, "config", config.as_bytes())?;
    let meta = Meta {
        id: id.into(),
        workspace: root.to_path_buf(),
        real: real.clone(),
        config_sha256: sha(config.as_bytes()),
        alternates,
    };
    std::fs::write(
        dir.join("meta.json"),
        serde_json::to_vec(&meta).unwrap_or_default(),
    )
    .map_err(io("writing", Path::new("meta.json")))?;
    Ok(CommitRepo {
        agent,
        real,
        origin,
    })
}

/// The agent repository's directories, made 0700.
fn make_dirs(agent: &Path) -> Result<(), CommitError> {
    for d in [
        "objects/info",
        "objects/pack",
        "refs/heads",
        "refs/tags",
        "hooks",
        "info",
    ] {
        let p = agent.join(d);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&p)
            .map_err(io("creating", &p))?;
    }
    Ok(())
}

/// Writes `b` to `p` inside the agent repository.
fn write_in(agent: &Path, p: &str, b: &[u8]) -> Result<(), CommitError> {
    std::fs::write(agent.join(p), b).map_err(io("writing", Path::new(p)))
}

/// The real repository's `HEAD`, refs (packed) and index, into the agent's.
fn copy_state(root: &Path, real: &Path, agent: &Path) -> Result<(), CommitError> {
    let head = std::fs::read(real.join("HEAD")).map_err(io("reading", &real.join("HEAD")))?;
    write_in(agent, "HEAD", &head)?;
    let refs = git_out(root, &["for-each-ref", "--format=%(objectname) %(refname)"])?;
    write_in(
        agent,
        "packed-refs",
        format!("# pack-refs with: sorted\n{refs}").as_bytes(),
    )?;
    if let Ok(index) = std::fs::read(real.join("index")) {
        write_in(agent, "index", &index)?;
    }
    Ok(())
}

/// The agent repository's config: the repository format and extensions the
/// real objects need (plain values only), the agent's identity; nothing else.
fn agent_config(root: &Path, id: &str) -> String {
    let ext = git_out(
        root,
        &[
            "config",
            "--local",
            "--get-regexp",
            r"^(core\.repositoryformatversion|extensions\..*)$",
        ],
    )
    .unwrap_or_default();
    let mut config = String::from("[core]\n\tbare = false\n\tlogallrefupdates = true\n");
    for l in ext.lines() {
        if let Some((k, v)) = l.split_once(' ') {
            let (sec, key) = k.split_once('.').unwrap_or((k, ""));
            if v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
            {
                config.push_str(&format!("[{sec}]\n\t{key} = {v}\n"));
            }
        }
    }
    config.push_str(&format!(
        "[user]\n\tname = sandmux agent {id}\n\temail = agent@sandmux.invalid\n"
    ));
    config
}

/// Refuses an agent repository whose shape is not what sandmux made: an
/// unknown top-level entry (`commondir`, `gitdir`, `worktrees`, …), a config
/// or alternates file that changed, a hook, or a symlink where a directory
/// must be.
fn check(agent: &Path, meta: &Meta) -> Result<(), CommitError> {
    let mut bad = Vec::new();
    let rd = std::fs::read_dir(agent).map_err(io("reading", agent))?;
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if !DATA.contains(&n.as_str()) {
            bad.push(format!("unexpected entry {}", crate::term::printable(&n)));
        }
    }
    for d in ["refs", "objects", "hooks", "info", "objects/info"] {
        match std::fs::symlink_metadata(agent.join(d)) {
            Ok(m) if m.is_dir() => {}
            _ => bad.push(format!("{d} is not a directory")),
        }
    }
    // Everything git may read in the fetch: plain files and directories only.
    // A link would let the unconfined upload-pack read another repository
    // (or any file) of the host; a FIFO would hang it.
    let mut stack = vec![agent.to_path_buf()];
    let mut seen = 0usize;
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            bad.push(format!(
                "{} cannot be read",
                crate::term::printable(&d.to_string_lossy())
            ));
            continue;
        };
        for e in rd.flatten() {
            seen += 1;
            if seen > 1_000_000 {
                bad.push("more than 1,000,000 entries".into());
                stack.clear();
                break;
            }
            let p = e.path();
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => stack.push(p),
                Ok(m) if m.is_file() => {}
                _ => bad.push(format!(
                    "{} is neither a plain file nor a directory",
                    crate::term::printable(&p.strip_prefix(agent).unwrap_or(&p).to_string_lossy())
                )),
            }
        }
    }
    bad.truncate(20);
    let config = std::fs::read(agent.join("config")).unwrap_or_default();
    if sha(&config) != meta.config_sha256 {
        bad.push("config is not the one sandmux wrote".into());
    }
    if std::fs::read_to_string(agent.join("objects/info/alternates")).unwrap_or_default()
        != meta.alternates
    {
        bad.push("objects/info/alternates changed".into());
    }
    if std::fs::read_dir(agent.join("hooks"))
        .map(|mut r| r.next().is_some())
        .unwrap_or(true)
    {
        bad.push("hooks/ is not empty".into());
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(CommitError::Changed {
            agent: agent.to_path_buf(),
            bad,
        })
    }
}

/// Waits for `child`, killing it past `limit`; its output is drained by
/// threads so a chatty child cannot block on a full pipe.
fn wait_bounded(
    mut child: std::process::Child,
    limit: std::time::Duration,
) -> Result<std::process::Output, CommitError> {
    use std::io::Read;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            if let Some(r) = r {
                let _ = r.take(1 << 20).read_to_end(&mut b);
            }
            b
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let t0 = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if t0.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CommitError::Timeout(limit.as_secs()));
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(e) => return Err(CommitError::Fetch(e.to_string())),
        }
    };
    Ok(std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// What to do next, when the agent moved the branch checked out: its edits
/// are already in the working tree (commit mode never keeps them out), so
/// a merge would refuse; `git reset` moves HEAD and the index to the
/// agent's commits and leaves the files as they are.
fn next_step(workspace: &Path, id: &str) -> Option<String> {
    let branch = git_out(workspace, &["symbolic-ref", "--quiet", "--short", "HEAD"]).ok()?;
    let branch = branch.trim();
    let theirs = format!("refs/sandmux/{id}/{branch}");
    let ours = git_out(workspace, &["rev-parse", "--verify", "--quiet", "HEAD"]).ok()?;
    let at = git_out(workspace, &["rev-parse", "--verify", "--quiet", &theirs]).ok()?;
    if at.trim() == ours.trim() {
        return None;
    }
    // Only a continuation of the human's history whose tree is what the
    // working tree holds: else a reset would drop the human's commits or
    // stage content the human never saw (a file committed, then deleted).
    let continues = git_out(workspace, &["merge-base", "--is-ancestor", "HEAD", &theirs]).is_ok();
    let same_tree = git_out(workspace, &["diff", "--quiet", &theirs, "--"]).is_ok();
    let line = if continues && same_tree {
        format!("next: the agent's edits are already in your working tree; `git reset {theirs}` makes its commits {branch}'s history (HEAD and the index move, your files do not)")
    } else {
        let why = if continues {
            "its commits hold content your working tree does not"
        } else {
            "it does not continue your history (it would drop commits of yours)"
        };
        format!("next: review before anything else: {theirs} is not your working tree's state: {why}; see `git log -p HEAD..{theirs}` and `git diff {theirs}`")
    };
    Some(crate::term::printable(&line))
}

/// `sandmux git fetch ID [--prune]`: the instance's commits into
/// `refs/sandmux/<id>/*` of the workspace's repository. Returns the lines to print.
pub(crate) fn fetch(id: &str, prune: bool) -> Result<Vec<String>, CommitError> {
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(CommitError::NotAnId(crate::term::printable(id)));
    }
    let state = super::quarantine::state_dir(&[])?;
    let dir = state.join("git").join(id);
    let meta: Meta = std::fs::read(dir.join("meta.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| CommitError::NoRepository {
            id: id.into(),
            dir: dir.clone(),
        })?;
    if super::watch::is_live(&state, id) {
        return Err(CommitError::Running(id.into()));
    }
    let agent = dir.join("agent.git");
    check(&agent, &meta)?;
    let spec = format!("+refs/heads/*:refs/sandmux/{id}/*");
    let child = Command::new("git")
        .arg("-C")
        .arg(&meta.workspace)
        .args([
            "-c",
            "transfer.fsckObjects=true",
            "-c",
            "protocol.file.allow=always",
            "fetch",
            "--no-tags",
            "--no-write-fetch-head",
        ])
        .arg(&agent)
        .arg(&spec)
        .env_remove("GIT_DIR")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| CommitError::Fetch(e.to_string()))?;
    let o = wait_bounded(child, std::time::Duration::from_secs(600))?;
    if !o.status.success() {
        return Err(CommitError::Fetch(crate::term::printable(
            String::from_utf8_lossy(&o.stderr).trim(),
        )));
    }
    let refs = git_out(
        &meta.workspace,
        &[
            "for-each-ref",
            "--format=%(refname) %(objectname:short) %(subject)",
            &format!("refs/sandmux/{id}/"),
        ],
    )?;
    let mut lines: Vec<String> = refs.lines().map(crate::term::printable).collect();
    if lines.is_empty() {
        lines.push(format!("instance {id} made no branch"));
    }
    lines.extend(next_step(&meta.workspace, id));
    if prune {
        std::fs::remove_dir_all(&dir).map_err(io("removing", &dir))?;
        lines.push(format!("removed {}", dir.display()));
    }
    Ok(lines)
}
