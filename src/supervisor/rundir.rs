//! Runtime directories: one private directory (0700) per instance, under
//! `$XDG_RUNTIME_DIR/sandmux` or `/tmp/sandmux-<uid>`, holding the tmux socket
//! directory and the mount point of the new root. Directories whose owning
//! supervisor is gone (it was SIGKILLed) are removed at the next start (P6).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Which command runs an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    /// `sandmux run`.
    Run,
    /// `sandmux shell`.
    Shell,
    /// `sandmux serve`: the only kind with an operator endpoint.
    Serve,
}

/// What an instance's `meta.json` says of it (`sandmux ps`, `stop`,
/// `journal`, `attach`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Meta {
    /// The command running it.
    pub kind: Kind,
    /// The instance id.
    pub id: String,
    /// The profile's name.
    pub profile: String,
    /// The workspace.
    pub workspace: PathBuf,
    /// The supervisor's process id.
    pub pid: u32,
    /// When it started, in seconds since the epoch.
    pub started: u64,
    /// Its audit log (`serve` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_log: Option<PathBuf>,
    /// Its HTTP endpoint (`serve --http` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpMeta>,
}

/// Where a `serve --http` instance listens.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct HttpMeta {
    /// The URL clients use.
    pub url: String,
    /// The file holding its bearer token.
    pub token_file: PathBuf,
}

impl Meta {
    /// This process's instance `id` of `kind`, started now.
    pub(crate) fn now(kind: Kind, id: &str, profile: &str, workspace: &Path) -> Meta {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Meta {
            kind,
            id: id.to_string(),
            profile: profile.to_string(),
            workspace: workspace.to_path_buf(),
            pid: std::process::id(),
            started,
            audit_log: None,
            http: None,
        }
    }
}

/// A runtime directory owned by this process; removed on drop.
#[derive(Debug)]
pub(crate) struct Rundir {
    /// The directory.
    pub path: PathBuf,
    /// Random instance id (hex).
    pub id: String,
    /// cgroup directories to remove with it.
    pub cgroup: Option<super::cgroup::Cgroup>,
}

/// Why the runtime directory could not be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RundirError {
    /// The base directory could not be made.
    #[error("cannot create {}: {source}", path.display())]
    CreateBase {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The base directory could not be looked at.
    #[error("{}: {source}", path.display())]
    Stat {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The base directory is not this user's private directory.
    #[error("{} must be a directory owned by uid {uid} with mode 0700 (it is not: refusing to use it)", path.display())]
    Unsafe { path: PathBuf, uid: u32 },
    /// The instance's directory could not be filled.
    #[error("prepare {}: {source}", path.display())]
    Prepare {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The base directory for this user's instances, created 0700 and checked.
pub(crate) fn base() -> Result<PathBuf, RundirError> {
    let uid = nix::unistd::geteuid().as_raw();
    let candidate = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| {
            p.is_absolute()
                && std::fs::metadata(p)
                    .map(|m| m.is_dir() && m.uid() == uid)
                    .unwrap_or(false)
        })
        .map(|p| p.join("sandmux"))
        .unwrap_or_else(|| std::env::temp_dir().join(format!("sandmux-{uid}")));
    match std::fs::DirBuilder::new().mode(0o700).create(&candidate) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(RundirError::CreateBase {
                path: candidate,
                source,
            })
        }
    }
    let m = match std::fs::symlink_metadata(&candidate) {
        Ok(m) => m,
        Err(source) => {
            return Err(RundirError::Stat {
                path: candidate,
                source,
            })
        }
    };
    if m.file_type().is_symlink()
        || !m.is_dir()
        || m.uid() != uid
        || m.permissions().mode() & 0o077 != 0
    {
        return Err(RundirError::Unsafe {
            path: candidate,
            uid,
        });
    }
    Ok(candidate)
}

fn start_time(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(19).map(str::to_string)
}

/// Whether the supervisor that owns `dir` is still running.
pub(crate) fn owner_alive(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("owner")) else {
        return false;
    };
    let mut it = text.split_whitespace();
    let (Some(pid), Some(st)) = (it.next().and_then(|p| p.parse::<i32>().ok()), it.next()) else {
        return false;
    };
    start_time(pid).as_deref() == Some(st)
}

/// Removes directories left by supervisors that no longer run.
pub(crate) fn clean_stale(base: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(rd) = std::fs::read_dir(base) else {
        return removed;
    };
    for e in rd.flatten() {
        let p = e.path();
        if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) || owner_alive(&p) {
            continue;
        }
        let age = e
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok());
        if e.file_name().to_string_lossy().starts_with(".new-")
            && age.is_some_and(|a| a.as_secs() < 3600)
        {
            continue; // another start is still preparing it
        }
        // Claimed by an atomic rename first: of several starts cleaning at
        // once, exactly one removes each directory (two `remove_dir_all`s on
        // one tree can both stop half-way on each other's ENOENTs).
        let claimed = base.join(format!(".del-{}", &crate::nonce::hex()[..12]));
        if std::fs::rename(&p, &claimed).is_err() {
            continue; // someone else claimed it
        }
        // Recorded cgroup directories go first (they are empty once the sandbox died).
        if let Ok(t) = std::fs::read_to_string(claimed.join("cgroup.json")) {
            if let Ok(cg) = serde_json::from_str::<super::cgroup::Cgroup>(&t) {
                cg.remove();
                cg.remove_instance();
            }
        }
        if std::fs::remove_dir_all(&claimed).is_ok() {
            if let Some(id) = p.file_name().and_then(|n| n.to_str()) {
                remove_view_base(id);
            }
            removed.push(p);
        }
    }
    removed
}

/// What an instance runs in its sandbox: a command has no tmux socket to
/// share, so it needs no view directory ([`Rundir::host_view`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Serves {
    /// `sandmux run`: one command.
    Command,
    /// `serve` and `shell`: a tmux server.
    Tmux,
}

impl Rundir {
    /// A fresh instance id: twelve hex digits. `ps`, the layer, the audit
    /// log's file name and the quarantine all name the instance by it.
    pub(crate) fn new_id() -> String {
        crate::nonce::hex()[..12].to_string()
    }

    /// Creates instance `id`'s directory (after cleaning stale ones), and
    /// for a tmux server the view directory tmux mode may need.
    pub(crate) fn create(id: &str, serves: Serves) -> Result<Rundir, RundirError> {
        let base = base()?;
        clean_stale(&base);
        let id = id.to_string();
        crate::log::set_instance(&id);
        // Built under a staging name and renamed, so a concurrent start never sees
        // (and cleans) a directory whose owner file is not written yet.
        let staging = base.join(format!(".new-{id}"));
        let path = base.join(&id);
        let me = std::process::id() as i32;
        let owner = format!("{me} {}\n", start_time(me).unwrap_or_default());
        let fill = || -> std::io::Result<()> {
            std::fs::DirBuilder::new().mode(0o700).create(&staging)?;
            std::fs::File::create(staging.join("owner"))?.write_all(owner.as_bytes())?;
            for d in ["root", "sock"] {
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(staging.join(d))?;
            }
            if serves == Serves::Tmux {
                make_view_base(&id)?;
            }
            std::fs::rename(&staging, &path)
        };
        if let Err(source) = fill() {
            let _ = std::fs::remove_dir_all(&staging);
            remove_view_base(&id);
            return Err(RundirError::Prepare { path, source });
        }
        Ok(Rundir {
            path,
            id,
            cgroup: None,
        })
    }

    /// Records the instance's cgroup so a later start can remove it.
    pub(crate) fn set_cgroup(&mut self, cg: super::cgroup::Cgroup) {
        let _ = std::fs::write(
            self.path.join("cgroup.json"),
            serde_json::to_vec(&cg).unwrap_or_default(),
        );
        self.cgroup = Some(cg);
    }

    /// Records what runs here (for `sandmux ps`): written beside the socket.
    pub(crate) fn write_meta(&self, meta: &Meta) {
        if let Ok(text) = serde_json::to_vec(meta) {
            let _ = std::fs::write(self.path.join("meta.json"), text);
        }
    }

    /// What `meta.json` in the runtime directory `dir` says (None: not
    /// written yet, or not sandmux's).
    pub(crate) fn read_meta(dir: &Path) -> Option<Meta> {
        let text = std::fs::read(dir.join("meta.json")).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// The tmux socket on the host side (without a mount view, a link to
    /// the one in [`Rundir::host_view`]).
    pub(crate) fn socket(&self) -> PathBuf {
        self.path.join("sock").join("tmux.sock")
    }

    /// Where tmux mode keeps its files when the sandbox has no mount view
    /// (`sandbox::hostview`), which PID 1 makes only then: `v` in the
    /// instance's view directory (root's, 0755, in the temporary directory so
    /// every uid can traverse to it), which [`Rundir::create`] makes as root.
    pub(crate) fn host_view(&self) -> Option<PathBuf> {
        let base = view_base(&self.id);
        is_ours(&base).then(|| base.join("v"))
    }

    /// The instance's view directory, if it has one: the supervisor keeps
    /// the right to remove what every generation makes in it.
    pub(crate) fn view_base(&self) -> Option<PathBuf> {
        let base = view_base(&self.id);
        is_ours(&base).then_some(base)
    }

    /// Removes the host view of an earlier generation, if any.
    pub(crate) fn remove_host_view(&self) {
        if let Some(v) = self.host_view() {
            if is_ours(&v) {
                let _ = std::fs::remove_dir_all(&v);
            }
        }
    }
}

fn view_base(id: &str) -> PathBuf {
    std::env::temp_dir().join(format!("sandmux-view-{id}"))
}

/// A directory (never a link) owned by this uid.
fn is_ours(p: &Path) -> bool {
    std::fs::symlink_metadata(p)
        .is_ok_and(|m| m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw())
}

/// Removes instance `id`'s view directory, as [`Rundir::create`] made it.
fn remove_view_base(id: &str) {
    let p = view_base(id);
    if is_ours(&p) {
        let _ = std::fs::remove_dir_all(&p);
    }
}

/// As root, the instance's view directory (see [`Rundir::host_view`]).
fn make_view_base(id: &str) -> std::io::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let p = view_base(id);
    std::fs::DirBuilder::new().mode(0o755).create(&p)?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
}

impl Drop for Rundir {
    fn drop(&mut self) {
        if let Some(cg) = &self.cgroup {
            cg.remove();
            cg.remove_instance();
        }
        let _ = std::fs::remove_dir_all(&self.path);
        remove_view_base(&self.id);
    }
}
