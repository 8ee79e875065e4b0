//! The copy-on-write workspace's layer (`[workspace] mode =
//! "copy-on-write"`), on the host: `<state>/layers/<id>/`, 0700, holding
//! `upper/` (the agent's writes as overlayfs keeps them: new and changed
//! files, whiteouts for removed ones), `work/` (overlayfs's own) and
//! `meta.json` (the workspace it overlays). It is made before the sandbox
//! starts, so the host's tree is never written while the instance runs; it
//! outlives the instance (a SIGKILL of the supervisor, a reboot) until the
//! human takes its changes (`sandmux diff ID`, `sandmux apply ID`) and
//! removes it (`sandmux discard ID`). One that holds no change is removed when the instance ends.

use super::layer_copy::{copy_of, copy_place, COPIES, COPY};
pub(crate) use super::layer_copy::{is_copy, mark_ended, writes};
use super::layer_from::LayerFrom;
use crate::profile::{OnEnd, Policy, WorkspaceMode};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a layer could not be made, found, locked or removed. Each says the
/// path or the id, and what to do where there is something to do.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LayerError {
    /// sandmux's state directory.
    #[error(transparent)]
    StateDir(#[from] crate::guard::GuardError),
    /// The user's `config.toml`.
    #[error("{0}")]
    User(String),
    /// A file-system step on the layer's directory.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Its lock could not be taken (`flock`).
    #[error("locking {}: {source}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The error.
        source: nix::Error,
    },
    /// Not an id sandmux prints.
    #[error("{0:?} is not an instance id (letters and digits, as `run` and `serve` print it)")]
    NotAnId(String),
    /// No layer of that instance.
    #[error("no layer of instance {id} in {} ({source}); only copy-on-write instances have one", dir.display())]
    NoLayer {
        /// The instance id.
        id: String,
        /// Where the layers are.
        dir: PathBuf,
        /// Why its `meta.json` could not be read.
        source: std::io::Error,
    },
    /// Its `meta.json` is not sandmux's.
    #[error("{}: {source}", path.display())]
    BadMeta {
        /// The file.
        path: PathBuf,
        /// The error.
        source: serde_json::Error,
    },
    /// Its instance still runs.
    #[error("instance {0} is still running, and its agent may still write the layer; end it first (`sandmux stop {0}`)")]
    Live(String),
    /// The kept layers are over `[workspace] kept_bytes`.
    #[error("the kept copy-on-write layers hold {total} bytes, more than [workspace] kept_bytes = {cap} of {}: see them with `sandmux ps --all`, then `sandmux apply ID` or `sandmux discard ID`", config.display())]
    OverKept {
        /// What they hold.
        total: u64,
        /// The cap.
        cap: u64,
        /// The user's `config.toml`.
        config: PathBuf,
    },
    /// The overlay probe failed (`possible`): why.
    #[error("{0}")]
    Probe(crate::supervisor::probe::ProbeError),
    /// A kept layer that `serve --resume` or `--fork` cannot start from.
    #[error("{0}")]
    From(String),
    /// A copy workspace's copy could not be made.
    #[error("the copy workspace: {0}")]
    Copy(#[from] super::copy::CopyError),
}

impl LayerError {
    /// The id the user gave is refused (`serve --resume ID`, `--fork ID`,
    /// and the door's commands): not an id, no layer of that instance, its
    /// instance still runs, or a layer or workspace mode `--resume` and
    /// `--fork` cannot go on from. The command's usage status, not
    /// sandmux failing.
    pub(crate) fn refuses_input(&self) -> bool {
        matches!(
            self,
            LayerError::NotAnId(_)
                | LayerError::NoLayer { .. }
                | LayerError::Live(_)
                | LayerError::From(_)
        )
    }
}

pub(super) fn io<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> LayerError + 'a {
    move |source| LayerError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// What `meta.json` says of a layer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Meta {
    /// The instance's id.
    pub id: String,
    /// The workspace the layer overlays (absolute, canonical).
    pub workspace: PathBuf,
    /// The profile it was made under.
    pub profile: String,
    /// When it was made (RFC 3339).
    pub created: String,
    /// The same, in nanoseconds since the epoch: a workspace entry whose
    /// ctime is later was changed on the host since (`apply`'s conflicts).
    #[serde(default)]
    pub created_ns: i128,
    /// The profile's tool-configuration names (`[filesystem] protected`):
    /// `diff` holds them back at any depth.
    #[serde(default)]
    pub held_names: Vec<PathBuf>,
    /// A copy workspace's copy: absolute, or relative to the layer's
    /// directory (None: an overlay's layer, `upper/`).
    #[serde(default)]
    pub copy: Option<PathBuf>,
    /// `serve --resume` / `--fork`: the instance whose layer this one
    /// continues, and how (`resumed`, `forked`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<(String, String)>,
}

/// Where the layers are: `<state>/layers`, made 0700 if missing; never in
/// one of `forbidden` (the trees the agent can write).
fn base(forbidden: &[PathBuf]) -> Result<PathBuf, LayerError> {
    let state = crate::guard::quarantine::state_dir(forbidden)?;
    let dir = state.join("layers");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&dir)
        .map_err(io("creating", &dir))?;
    Ok(dir)
}

/// Whether this machine can give `workspace` a copy-on-write layer: a
/// child with namespaces of its own mounts the overlay on an empty layer
/// in the layers' directory (where the real one will be), which is then
/// removed. `Err`: why not.
pub(crate) fn possible(workspace: &Path) -> Result<(), LayerError> {
    let dir = base(&[workspace.to_path_buf()])?.join(format!(".probe-{}", crate::nonce::hex()));
    let made = ["", "upper", "work"].iter().try_for_each(|n| {
        let p = dir.join(n);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&p)
            .map_err(io("creating", &p))
    });
    let tried = made.and_then(|()| {
        crate::supervisor::probe::overlay(workspace, &dir.join("upper"), &dir.join("work"))
            .map_err(LayerError::Probe)
    });
    let _ = remove(&dir);
    tried
}

/// Removes a layer directory of an ended instance (or a probe's): the
/// owner's rights back on every directory first, since overlayfs leaves
/// `work/work` with mode 0 and the agent may have taken its own rights on
/// its directories (nothing is followed).
fn remove(dir: &Path) -> std::io::Result<()> {
    let copy = copy_of(dir).filter(|c| !c.starts_with(dir));
    let outside = copy
        .as_deref()
        .and_then(Path::parent)
        .map(Path::to_path_buf);
    let outside = outside.or_else(|| {
        // A staging layer's copy, made before its `meta.json`: only one
        // that is root's, as made.
        let id = dir.file_name()?.to_str()?.strip_prefix(STAGING)?;
        let p = Path::new(COPIES).join(id);
        let m = std::fs::symlink_metadata(&p).ok()?;
        (!id.is_empty() && m.is_dir() && m.uid() == 0).then_some(p)
    });
    if let Some(o) = outside.filter(|_| nix::unistd::geteuid().is_root()) {
        remove_tree(&o)?;
    }
    remove_tree(dir)
}

/// Removes the tree at `dir`, its owner's rights given back first.
pub(crate) fn remove_tree(dir: &Path) -> std::io::Result<()> {
    use crate::sandbox::beneath::{entries, open_root, unlock_dir};
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        // Through the parent's descriptor: a link is never followed.
        if let (Some(parent), Some(name)) = (d.parent(), d.file_name()) {
            if let Ok(p) = open_root(parent) {
                unlock_dir(&p, Path::new(name));
            }
        }
        for (name, t) in entries(&d).into_iter().flatten() {
            if t == Some(nix::dir::Type::Directory) {
                stack.push(d.join(name));
            }
        }
    }
    std::fs::remove_dir_all(dir)
}

/// The layer's lock, held (`flock`) by the supervisor while the instance
/// lives: `apply` and `discard` refuse a layer the agent may still write.
pub(crate) struct Live(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

fn lock(dir: &Path, wait: bool) -> Result<nix::fcntl::Flock<std::fs::File>, LayerError> {
    use nix::fcntl::{Flock, FlockArg};
    let path = dir.join("lock");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io("opening", &path))?;
    let how = if wait {
        FlockArg::LockExclusive
    } else {
        FlockArg::LockExclusiveNonblock
    };
    Flock::lock(f, how).map_err(|(_, source)| LayerError::Lock { path, source })
}

/// A layer made for an instance: where it is, a copy workspace's copy, and
/// its held lock (`supervisor::launch` names the first two in the policy
/// the sandbox is built from).
pub(crate) struct Made {
    /// The layer's directory.
    pub(crate) dir: PathBuf,
    /// A copy workspace's copy (None: an overlay's layer).
    pub(crate) copy: Option<PathBuf>,
    /// The layer's lock, held while the instance lives.
    pub(crate) live: Live,
}

/// Makes this instance's layer when the profile asks for one: a fresh
/// one, or one that goes on from a kept layer (`from`: `serve --resume`,
/// `--fork`).
pub(crate) fn create(
    policy: &Policy,
    id: &str,
    from: Option<&LayerFrom>,
) -> Result<Option<Made>, LayerError> {
    if !policy.workspace_mode.has_door() {
        return match from {
            None => Ok(None),
            Some(f) => Err(LayerError::From(format!(
                "serve --{}: only a copy-on-write workspace has a layer to go on from, and this one is live; drop --workspace-mode live",
                f.flag()
            ))),
        };
    }
    // The source's lock is held from here: nothing removes it meanwhile.
    let source = match from {
        Some(f) if policy.workspace_mode == WorkspaceMode::Copy => {
            return Err(LayerError::From(format!(
                "a copy workspace cannot be {}: run copy-on-write",
                f.word()
            )))
        }
        Some(f) => Some((f, super::layer_from::source(f, &policy.workspace)?)),
        None => None,
    };
    let user = crate::profile::user::load().map_err(|e| LayerError::User(e.to_string()))?;
    let kept = &user.workspace;
    for line in super::kept::make_room(kept.keep_days, kept.kept_bytes.0)? {
        tracing::info!("{line}");
    }
    let layers = base(std::slice::from_ref(&policy.workspace))?;
    sweep_staging(&layers);
    // Made under a staging name that listing skips, with its lock held from
    // the start, and renamed whole (the held lock moves with it): a start
    // running at the same time never finds it half made, unlocked and
    // empty, and removes it as a leftover.
    let staging = layers.join(format!("{STAGING}{id}"));
    let dir = layers.join(id);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(io("creating", &staging))?;
    let filled = match &source {
        Some((f, (src, old, _))) => super::layer_from::fill_from(policy, id, &staging, f, src, old),
        None => fill(policy, id, &staging),
    };
    let made = filled.and_then(|live| {
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            &staging,
            nix::fcntl::AT_FDCWD,
            &dir,
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        )
        .map_err(|e| io("renaming", &staging)(e.into()))?;
        Ok(live)
    });
    match made {
        Ok(live) => {
            if let Some((LayerFrom::Resume(old), (src, ..))) = &source {
                // Its upper directory and history are this layer's now.
                if let Err(e) = remove(src) {
                    tracing::warn!("the resumed layer {old}'s directory was left: {e}");
                }
            }
            let copy = (policy.workspace_mode == WorkspaceMode::Copy)
                .then(|| copy_of(&dir).unwrap_or_else(|| dir.join(COPY)));
            Ok(Some(Made { dir, copy, live }))
        }
        Err(e) => {
            if let Some((LayerFrom::Resume(_), (src, ..))) = &source {
                super::layer_from::undo(src, &staging);
            }
            let _ = remove(&staging);
            Err(e)
        }
    }
}

/// The prefix of a layer being made ([`create`]); `list` skips it.
const STAGING: &str = ".new-";

/// A staging directory older than this, whose lock nobody holds, was left
/// by a supervisor killed while it made its layer.
const STAGING_STALE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes staging directories left by killed supervisors.
fn sweep_staging(layers: &Path) {
    let Ok(rd) = std::fs::read_dir(layers) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let dir_entry = e.file_type().is_ok_and(|t| t.is_dir());
        if !dir_entry || !name.to_string_lossy().starts_with(STAGING) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STAGING_STALE);
        let dir = layers.join(&name);
        if old {
            if let Ok(_held) = lock(&dir, false) {
                let _ = remove(&dir);
            }
        }
    }
}

/// Fills the staging directory `dir` of layer `id`: its lock (taken first),
/// `upper` with the workspace's mode, `work` and `meta.json`.
fn fill(policy: &Policy, id: &str, dir: &Path) -> Result<Live, LayerError> {
    let live = Live(lock(dir, true)?);
    // Before a copy is made: a host entry changed while it is made is
    // changed since, for `apply`.
    let created_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0);
    let mk = |p: &Path| {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(p)
            .map_err(io("creating", p))
    };
    let copy = policy.workspace_mode == WorkspaceMode::Copy;
    let ws = std::fs::metadata(&policy.workspace).map_err(io("reading", &policy.workspace))?;
    // The group of the uid the agent runs as without a user namespace:
    // the workspace's owner's, else the profile's sandbox uid (`uid.rs`).
    let gid = if ws.uid() != 0 {
        ws.gid()
    } else {
        policy.sandbox.uid
    };
    let upper = match copy {
        true => copy_place(dir, id, gid)?,
        false => dir.join("upper"),
    };
    mk(&upper)?;
    if !copy {
        mk(&dir.join("work"))?;
    }
    // The overlay's top shows the upper directory's mode: the workspace's.
    let mode = nix::sys::stat::Mode::from_bits_truncate(ws.mode() & 0o777);
    if copy {
        let made = super::copy::make(&policy.workspace, dir, &upper, policy.layer_bound)?;
        tracing::debug!(
            "the copy workspace: {} entries, {} bytes copied{}",
            made.entries - made.left_out,
            made.bytes,
            match made.left_out {
                0 => String::new(),
                n => format!(" ({n} special or unreadable entries left out)"),
            }
        );
    }
    crate::sandbox::beneath::open_root(&upper)
        .and_then(|up| {
            if copy && nix::unistd::geteuid().is_root() {
                // The copy is the workspace's owner's, as the workspace is.
                let (u, g) = (ws.uid().into(), ws.gid().into());
                nix::unistd::fchown(&up, Some(u), Some(g))?;
            }
            nix::sys::stat::fchmod(&up, mode)
        })
        .map_err(std::io::Error::from)
        .map_err(io("setting the mode of", &upper))?;
    let meta = Meta {
        id: id.to_string(),
        workspace: policy.workspace.clone(),
        profile: policy.name.clone(),
        created: crate::log::now_rfc3339(),
        created_ns,
        held_names: policy.guard.names.clone(),
        // In the layer: by its name there (the layer is renamed whole).
        copy: copy.then(|| upper.strip_prefix(dir).unwrap_or(&upper).to_path_buf()),
        from: None,
    };
    write_meta(dir, &meta)?;
    Ok(live)
}

/// Writes the layer's `meta.json`.
pub(super) fn write_meta(dir: &Path, meta: &Meta) -> Result<(), LayerError> {
    let path = dir.join("meta.json");
    let text = serde_json::to_vec_pretty(meta).map_err(|source| LayerError::BadMeta {
        path: path.clone(),
        source,
    })?;
    std::fs::write(&path, text).map_err(io("writing", &path))
}

/// Takes the lock of the layer being made at `dir`.
pub(super) fn locked(dir: &Path) -> Result<Live, LayerError> {
    Ok(Live(lock(dir, true)?))
}

/// Refuses a layer whose instance still runs (its lock is held); the lock
/// is kept while the caller works on the layer.
pub(crate) fn ended(dir: &Path, id: &str) -> Result<nix::fcntl::Flock<std::fs::File>, LayerError> {
    lock(dir, false).map_err(|_| LayerError::Live(id.to_string()))
}

/// When the instance has ended: removes a layer that holds no change and
/// says nothing; otherwise does what `--on-end` says and returns the line
/// that tells the human (for `apply`, the caller applies after this and
/// says what it did: None).
pub(crate) fn finish(
    policy: &Policy,
    id: &str,
    live: Option<Live>,
    on_end: OnEnd,
) -> Option<String> {
    drop(live);
    let dir = policy.layer.as_ref()?;
    mark_ended(dir);
    let empty = if is_copy(dir) {
        super::copy::untouched_all(dir)
    } else {
        crate::sandbox::beneath::entries(&dir.join("upper")).is_ok_and(|e| e.is_empty())
            && !super::history::store::changed_ever(dir)
    };
    if empty {
        let _ = discard(id);
        return None;
    }
    match on_end {
        OnEnd::Apply => None,
        OnEnd::Keep => Some(kept(id)),
        OnEnd::Discard => Some(match discard(id) {
            Ok(_) => format!(
                "the changes made in the sandbox were discarded with layer {id} (--on-end discard)"
            ),
            Err(e) => format!("layer {id} could not be discarded ({e}): {}", kept(id)),
        }),
    }
}

/// The line that says where a kept layer is, and what to do with it.
pub(crate) fn kept(id: &str) -> String {
    // In a container the layer is in the container's own file system
    // unless the state directory (and root's copies) are volumes.
    let here = match crate::sandbox::container::detected() {
        Some(mark) => format!(
            "; in a container ({mark}), it goes with the container unless {} and {COPIES} are volumes of their own: run `diff` and `apply` with the same volumes",
            crate::guard::quarantine::existing_state_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_else(|_| "the state directory".into())
        ),
        None => String::new(),
    };
    format!(
        "the changes made in the sandbox are in layer {id}, not in the workspace: `sandmux diff {id}` shows them, `sandmux apply {id}` brings them in (control held back), `sandmux discard {id}` removes them{here}"
    )
}

/// Finds the layer of instance `id` (for `diff` and `discard`), with what
/// its `meta.json` says.
pub(crate) fn find(id: &str) -> Result<(PathBuf, Meta), LayerError> {
    let state = crate::guard::quarantine::existing_state_dir()?;
    find_in(&state, id)
}

/// [`find`] in the state directory `state`, already checked (listing every
/// layer checks it once, not once a layer).
pub(crate) fn find_in(state: &Path, id: &str) -> Result<(PathBuf, Meta), LayerError> {
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(LayerError::NotAnId(crate::term::printable(id)));
    }
    let layers = state.join("layers");
    let dir = layers.join(id);
    let path = dir.join("meta.json");
    let text = std::fs::read(&path).map_err(|source| LayerError::NoLayer {
        id: id.to_string(),
        dir: layers,
        source,
    })?;
    let meta: Meta =
        serde_json::from_slice(&text).map_err(|source| LayerError::BadMeta { path, source })?;
    Ok((dir, meta))
}

/// Removes the layer of instance `id`.
pub(crate) fn discard(id: &str) -> Result<PathBuf, LayerError> {
    let (dir, _) = find(id)?;
    let _held = ended(&dir, id)?;
    remove(&dir).map_err(io("removing", &dir))?;
    Ok(dir)
}
