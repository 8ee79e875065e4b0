//! `serve --resume ID` and `serve --fork ID`: a fresh instance on a kept
//! copy-on-write layer. The workspace goes on where the agent left it; its
//! panes and processes do not (they ended with the instance). `--resume`
//! moves the layer (with its history) to the new instance; `--fork` copies
//! it and leaves the original as it was. Both start a layer like any
//! other: the same door, the same hold-backs, the same bound.

use super::layer::{find, LayerError, Live, Meta};
use crate::profile::Policy;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::process::Command;

/// Where a new instance's layer comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LayerFrom {
    /// The kept layer of this instance, moved.
    Resume(String),
    /// The kept layer of this instance, copied.
    Fork(String),
}

impl LayerFrom {
    fn id(&self) -> &str {
        match self {
            LayerFrom::Resume(id) | LayerFrom::Fork(id) => id,
        }
    }

    /// The option that asked for it (`resume`, `fork`).
    pub(crate) fn flag(&self) -> &'static str {
        match self {
            LayerFrom::Resume(_) => "resume",
            LayerFrom::Fork(_) => "fork",
        }
    }

    /// `resumed` or `forked`, as `meta.json` and `sandbox_status` say it.
    pub(crate) fn word(&self) -> &'static str {
        match self {
            LayerFrom::Resume(_) => "resumed",
            LayerFrom::Fork(_) => "forked",
        }
    }
}

fn refuse(msg: String) -> LayerError {
    LayerError::From(msg)
}

/// The kept layer `from` names, checked: an overlay's layer of this
/// workspace, whose instance has ended, that no apply has touched. Its
/// lock is returned held.
pub(crate) fn source(
    from: &LayerFrom,
    workspace: &Path,
) -> Result<(std::path::PathBuf, Meta, nix::fcntl::Flock<std::fs::File>), LayerError> {
    let id = from.id();
    let (dir, meta) = find(id)?;
    if meta.copy.is_some() {
        return Err(refuse(format!(
            "layer {id} is a copy workspace's: only a copy-on-write layer can be {}",
            from.word()
        )));
    }
    if meta.workspace != workspace {
        return Err(refuse(format!(
            "layer {id} is of the workspace {}, not {}: serve it with -w {}",
            crate::term::printable(&meta.workspace.to_string_lossy()),
            crate::term::printable(&workspace.to_string_lossy()),
            crate::term::printable(&meta.workspace.to_string_lossy()),
        )));
    }
    let lock = super::layer::ended(&dir, id)?;
    if dir.join("apply.jsonl").exists()
        || dir.join("taken").exists()
        || super::history::views::applied(&dir)
    {
        return Err(refuse(format!(
            "an apply ran on layer {id}: what it brought is in the workspace now, and the layer no longer says what the agent left; start afresh, or `sandmux apply {id} --undo` first"
        )));
    }
    Ok((dir, meta, lock))
}

/// Fills `staging` (the new layer, its lock held) from the source layer at
/// `src`: its upper directory and history moved (resume) or copied (fork),
/// a fresh `work/`. Returns what the new `meta.json` keeps of the old:
/// its creation time (the host's changes since are still conflicts).
pub(crate) fn fill(from: &LayerFrom, src: &Path, staging: &Path) -> Result<(), LayerError> {
    let io = |what: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source: std::io::Error| LayerError::Io {
            what,
            path: p,
            source,
        }
    };
    for part in ["upper", "history"] {
        let (a, b) = (src.join(part), staging.join(part));
        if !a.exists() {
            if part == "upper" {
                return Err(refuse(format!(
                    "{} is missing: the layer holds no work to go on from",
                    a.display()
                )));
            }
            continue;
        }
        match from {
            LayerFrom::Resume(_) => std::fs::rename(&a, &b).map_err(io("moving", &a))?,
            LayerFrom::Fork(_) => copy_tree(&a, &b)?,
        }
    }
    let work = staging.join("work");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&work)
        .map_err(io("creating", &work))
}

/// Copies a layer's tree as overlayfs keeps it: links as links, whiteouts
/// (`c 0 0`), `user.overlay.*` marks, modes and times (`cp -a`, which
/// never follows a link inside the tree).
fn copy_tree(a: &Path, b: &Path) -> Result<(), LayerError> {
    let out = Command::new("cp")
        .args([
            "-a",
            "--no-dereference",
            "--preserve=all",
            "--reflink=auto",
            "--",
        ])
        .arg(a)
        .arg(b)
        .output()
        .map_err(|source| LayerError::Io {
            what: "copying",
            path: a.to_path_buf(),
            source,
        })?;
    if !out.status.success() {
        return Err(refuse(format!(
            "copying {}: {}",
            a.display(),
            crate::term::printable(String::from_utf8_lossy(&out.stderr).trim())
        )));
    }
    Ok(())
}

/// `layer::fill` for a layer that goes on from the kept layer at `src` (whose
/// `meta.json` said `old`): its creation time is kept (the host's changes
/// since are still conflicts for `apply`), and `from` names it.
pub(super) fn fill_from(
    policy: &Policy,
    id: &str,
    dir: &Path,
    from: &LayerFrom,
    src: &Path,
    old: &Meta,
) -> Result<Live, LayerError> {
    let live = super::layer::locked(dir)?;
    fill(from, src, dir)?;
    let meta = Meta {
        id: id.to_string(),
        workspace: policy.workspace.clone(),
        profile: policy.name.clone(),
        // The names held back under the old profile too: a profile that
        // protects fewer does not let through what was written under it.
        held_names: {
            let mut n = old.held_names.clone();
            n.extend(policy.guard.names.iter().cloned());
            n.sort();
            n.dedup();
            n
        },
        copy: None,
        from: Some((old.id.clone(), from.word().to_string())),
        ..old.clone()
    };
    super::layer::write_meta(dir, &meta)?;
    Ok(live)
}

/// A resume that failed after it moved the source's parts into `staging`:
/// they go back, so the kept work is never removed with the staging.
pub(crate) fn undo(src: &Path, staging: &Path) {
    for part in ["upper", "history"] {
        let (a, b) = (staging.join(part), src.join(part));
        if a.exists() && !b.exists() {
            if let Err(e) = std::fs::rename(&a, &b) {
                tracing::error!(
                    "the resumed layer's {part} could not be put back in {}: {e}; it is in {}",
                    b.display(),
                    a.display()
                );
            }
        }
    }
}
