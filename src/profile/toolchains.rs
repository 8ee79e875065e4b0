//! Toolchains lent to the sandbox: `[toolchains] lend = ["rust", …]` in a
//! profile, `--toolchain NAME` on the command line.
//!
//! Lending a toolchain is three things, all decided here on the host before
//! the sandbox starts: its directories (found where its installer puts them,
//! symlinks resolved) become read-only binds at their host paths; its `bin`
//! directories go first on the sandbox's `PATH`; the variables its tools need
//! point every cache and install place at the sandbox's home (a tmpfs), never
//! at the host's. Only toolchain directories are lent: never `CARGO_HOME`
//! (credentials, registry and git caches), `~/.npmrc`, `~/.pypirc` or a home
//! directory. A toolchain asked for but not found, or found where the
//! sandbox's uid cannot read it, stops start-up with what was searched and
//! how to point at it ([`ToolchainError`]).

mod find;
mod perm;

use super::{FsEntry, MountKind, SANDBOX_HOME};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A toolchain sandmux knows how to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Toolchain {
    /// rustup's default toolchain (or `RUSTUP_TOOLCHAIN`), else `rustc` on `PATH`.
    Rust,
    /// pyenv's version (or `PYENV_VERSION`), else uv's newest, else `python3` on `PATH`.
    Python,
    /// nvm's default (or the active `NVM_BIN`), else `node` on `PATH`.
    Node,
    /// `GOROOT`, else `/usr/local/go`, else `go` on `PATH`.
    Go,
}

impl Toolchain {
    /// Every toolchain, in the order they are written.
    pub(crate) const ALL: [Toolchain; 4] = [
        Toolchain::Rust,
        Toolchain::Python,
        Toolchain::Node,
        Toolchain::Go,
    ];

    /// The name used in profiles, on the command line and in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Toolchain::Rust => "rust",
            Toolchain::Python => "python",
            Toolchain::Node => "node",
            Toolchain::Go => "go",
        }
    }
}

impl std::fmt::Display for Toolchain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Toolchain {
    type Err = ToolchainError;
    fn from_str(s: &str) -> Result<Toolchain, ToolchainError> {
        Toolchain::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| ToolchainError::Unknown { name: s.into() })
    }
}

/// The toolchains sandmux lends, listed: `rust, python, node, go`.
fn known() -> String {
    let known: Vec<&str> = Toolchain::ALL.iter().map(|t| t.name()).collect();
    known.join(", ")
}

/// `[toolchains]`: what the host lends the sandbox (nothing by default).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Toolchains {
    /// Toolchains lent read-only (`rust`, `python`, `node`, `go`);
    /// `--toolchain NAME` adds to them.
    #[serde(default)]
    pub lend: Vec<Toolchain>,
}

/// A toolchain that cannot be lent: start-up stops (P5).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ToolchainError {
    /// A name sandmux does not know (`--toolchain`).
    #[error("unknown toolchain {name:?}: sandmux lends {}", known())]
    Unknown {
        /// The name given.
        name: String,
    },
    /// Asked for, found nowhere.
    #[error("toolchain '{name}' not found: {searched}; {fix}")]
    NotFound {
        /// The toolchain.
        name: Toolchain,
        /// Every place looked at, in order.
        searched: String,
        /// How to point sandmux at it.
        fix: String,
    },
    /// Found, but the sandbox's uid cannot read it.
    #[error("toolchain '{name}': {path} cannot be read by uid {uid}, which the sandbox runs as on the host ({why}); install it where uid {uid} can read it ({fix}), serve as a uid that can read it, or leave '{name}' out")]
    Unreadable {
        /// The toolchain.
        name: Toolchain,
        /// The path the sandbox would need.
        path: String,
        /// The uid of the sandbox's processes on the host.
        uid: u32,
        /// Which directory stops it, and its mode.
        why: String,
        /// The variable that points at another install.
        fix: String,
    },
    /// Found, but lending it would lend more than a toolchain.
    #[error("toolchain '{name}': will not lend {path}: {why}")]
    Refused {
        /// The toolchain.
        name: Toolchain,
        /// The directory.
        path: String,
        /// Why not.
        why: String,
    },
}

/// One toolchain as lent: in the resolved policy and every report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lent {
    /// `rust`, `python`, `node`, `go`.
    pub name: Toolchain,
    /// How it was found (installer, variable, version).
    pub found: String,
    /// Host directories bound read-only at the same path inside (resolved:
    /// no symlink in them).
    pub paths: Vec<PathBuf>,
    /// Host directories it uses that the profile's view already shows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub visible: Vec<PathBuf>,
    /// Variables set inside (`PATH` as prepended).
    pub env: BTreeMap<String, String>,
}

impl Lent {
    /// One line: the name, where it came from, what is bound and set.
    pub(crate) fn said(&self) -> String {
        let list = |v: &[PathBuf]| {
            v.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut s = format!("{}: {}", self.name, self.found);
        if !self.paths.is_empty() {
            s.push_str(&format!("; bound read-only: {}", list(&self.paths)));
        }
        if !self.visible.is_empty() {
            s.push_str(&format!("; in the view already: {}", list(&self.visible)));
        }
        let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if !env.is_empty() {
            s.push_str(&format!("; set: {}", env.join(" ")));
        }
        s
    }
}

/// A toolchain found on the host, before it is checked and lent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// How it was found.
    pub found: String,
    /// Its root directory (resolved).
    pub root: PathBuf,
    /// Directories to put first on `PATH` (inside `root`, or in the home).
    pub path: Vec<PathBuf>,
    /// Other variables to set.
    pub env: BTreeMap<String, String>,
}

/// The host side a toolchain is found from: variables and who reads.
pub(crate) struct Host<'a> {
    /// A variable of the caller's environment.
    pub var: &'a dyn Fn(&str) -> Option<String>,
    /// The uid and groups the sandbox's processes have on the host.
    pub who: perm::Who,
}

impl Host<'_> {
    /// The caller's environment and identity.
    pub(crate) fn of_caller(var: &dyn Fn(&str) -> Option<String>) -> Host<'_> {
        Host {
            var,
            who: perm::Who::caller(),
        }
    }

    /// A variable, unless unset or empty.
    fn get(&self, name: &str) -> Option<String> {
        (self.var)(name).filter(|v| !v.is_empty())
    }

    /// `$HOME`, for the installers' defaults.
    fn home(&self) -> Option<PathBuf> {
        self.get("HOME").map(PathBuf::from)
    }

    /// Where uv keeps its pythons: `UV_PYTHON_INSTALL_DIR`, else
    /// `$XDG_DATA_HOME/uv/python`, else `~/.local/share/uv/python`.
    fn uv_pythons(&self) -> Option<PathBuf> {
        match self.get("UV_PYTHON_INSTALL_DIR") {
            Some(d) => Some(PathBuf::from(d)),
            None => self
                .get("XDG_DATA_HOME")
                .map(PathBuf::from)
                .or_else(|| self.home().map(|h| h.join(".local/share")))
                .map(|d| d.join("uv/python")),
        }
    }
}

/// Finds and checks `names` (a name given twice is lent once) against the
/// profile's view `fs`: what each toolchain became ([`apply`] adds it).
pub(crate) fn lend(
    names: &[Toolchain],
    fs: &[FsEntry],
    workspace: &Path,
    host: &Host<'_>,
) -> Result<Vec<Lent>, ToolchainError> {
    let mut out: Vec<Lent> = Vec::new();
    for &name in names {
        if out.iter().any(|l| l.name == name) {
            continue;
        }
        sources_outside(name, host, workspace)?;
        let f = find::find(name, host)?;
        out.push(lent(name, f, fs, workspace, host)?);
    }
    Ok(out)
}

/// Refuses a place a toolchain is looked up in (its variable's, or the
/// installer's default under `$HOME`) that lies in the workspace: the agent
/// writes there, so its files (rustup's `settings.toml`, a symlink in
/// `toolchains/`) would choose which host directory is lent.
fn sources_outside(
    name: Toolchain,
    host: &Host<'_>,
    workspace: &Path,
) -> Result<(), ToolchainError> {
    let places: &[(&str, &str)] = match name {
        Toolchain::Rust => &[("RUSTUP_HOME", ".rustup")],
        Toolchain::Python => &[("PYENV_ROOT", ".pyenv")],
        Toolchain::Node => &[("NVM_DIR", ".nvm"), ("NVM_BIN", "")],
        Toolchain::Go => &[("GOROOT", "")],
    };
    // uv's pythons, where `find` looks for them (its default follows
    // XDG_DATA_HOME).
    let uv = (name == Toolchain::Python)
        .then(|| host.uv_pythons())
        .flatten()
        .map(|p| ("UV_PYTHON_INSTALL_DIR (or XDG_DATA_HOME)", p));
    let named = places.iter().filter_map(|(var, rel)| {
        let at = match host.get(var) {
            Some(v) => PathBuf::from(v),
            None if !rel.is_empty() => host.home()?.join(rel),
            None => return None,
        };
        Some((*var, at))
    });
    for (var, at) in named.chain(uv) {
        let real = std::fs::canonicalize(&at).unwrap_or_else(|_| at.clone());
        if at.starts_with(workspace) || real.starts_with(workspace) {
            return Err(ToolchainError::Refused {
                name,
                path: at.display().to_string(),
                why: format!(
                    "{var} lies in the workspace {}, which the agent writes: its files would choose what is lent; install the toolchain outside it",
                    workspace.display()
                ),
            });
        }
    }
    Ok(())
}

/// A found toolchain checked (readable, not a home, not the workspace) and
/// split into what the view already shows and what must be bound.
fn lent(
    name: Toolchain,
    f: Found,
    fs: &[FsEntry],
    workspace: &Path,
    host: &Host<'_>,
) -> Result<Lent, ToolchainError> {
    let shown = fs
        .iter()
        .any(|e| e.kind == MountKind::ReadOnly && f.root.starts_with(&e.path));
    // A root the view shows already exposes nothing new; one to bind must
    // be a toolchain's own.
    if !shown {
        refuse_wide(name, &f.root, workspace, host)?;
    }
    perm::readable(&f.root, &host.who).map_err(|(path, why)| ToolchainError::Unreadable {
        name,
        path: path.display().to_string(),
        uid: host.who.uid,
        why,
        fix: find::fix(name).into(),
    })?;
    let (paths, visible) = if shown {
        (Vec::new(), vec![f.root.clone()])
    } else {
        (vec![f.root.clone()], Vec::new())
    };
    let mut env = f.env;
    if !f.path.is_empty() {
        let dirs: Vec<String> = f.path.iter().map(|p| p.display().to_string()).collect();
        env.insert("PATH".into(), dirs.join(":"));
    }
    Ok(Lent {
        name,
        found: f.found,
        paths,
        visible,
        env,
    })
}

/// Why `real` (a resolved directory) is never shown read-only inside, or
/// None: the root, what the sandbox replaces with its own, and the places
/// where services keep their sockets and users their scratch files (a
/// socket connects through a read-only mount: a host service's would be a
/// way out). For a lent toolchain and a profile path's symlink target alike.
pub(crate) fn never_shown(real: &Path, runtime_dir: Option<&str>) -> Option<String> {
    if real == Path::new("/") {
        return Some("it is the root directory".into());
    }
    let replaced = ["/dev", "/proc", "/sys", "/run/sandmux"];
    if let Some(d) = replaced.iter().find(|d| real.starts_with(d)) {
        return Some(format!(
            "it is under {d}, which the sandbox replaces with its own"
        ));
    }
    let sockets = ["/run", "/var/run", "/dev/shm"];
    let runtime = runtime_dir.filter(|d| d.starts_with('/')).map(Path::new);
    if let Some(d) = sockets
        .iter()
        .map(Path::new)
        .chain(runtime)
        .find(|d| real.starts_with(d))
    {
        return Some(format!(
            "it is under {}, where services keep their sockets (one connects through a read-only mount)",
            d.display()
        ));
    }
    // The scratch directories themselves hold users' sockets (tmux's
    // `/tmp/tmux-UID`, X's `/tmp/.X11-unix`); a directory of one's own in
    // them is the caller's choice.
    if ["/tmp", "/var/tmp"].iter().any(|d| real == Path::new(d)) {
        return Some(format!(
            "it is {}, where users keep their sockets (one connects through a read-only mount)",
            real.display()
        ));
    }
    None
}

/// Names whose presence in a directory means it is not a toolchain's own:
/// lending it would lend secrets (the last three are npm's global and pip's
/// site configuration, which the tools write inside a version's prefix).
const SECRETS: &[&str] = &[
    "credentials.toml",
    "credentials",
    ".npmrc",
    ".pypirc",
    ".netrc",
    ".git-credentials",
    ".ssh",
    ".gnupg",
    "etc/npmrc",
    "pip.conf",
    "pip/pip.conf",
];

/// A root that is `/`, a home (or holds one), holds the workspace or lies
/// in it, is a place the sandbox replaces, or holds credentials.
fn refuse_wide(
    name: Toolchain,
    root: &Path,
    workspace: &Path,
    host: &Host<'_>,
) -> Result<(), ToolchainError> {
    let refuse = |why: String| ToolchainError::Refused {
        name,
        path: root.display().to_string(),
        why,
    };
    if root == Path::new("/") {
        return Err(refuse("it is the root directory".into()));
    }
    if let Some(home) = host.home().and_then(|h| std::fs::canonicalize(h).ok()) {
        if home.starts_with(root) {
            return Err(refuse(format!(
                "it holds the home directory {}; install the toolchain in a directory of its own",
                home.display()
            )));
        }
    }
    if workspace.starts_with(root) || root.starts_with(workspace) {
        return Err(refuse(format!(
            "it holds or lies in the workspace {}, which is already in the sandbox",
            workspace.display()
        )));
    }
    if let Some(why) = never_shown(root, host.get("XDG_RUNTIME_DIR").as_deref()) {
        return Err(refuse(why));
    }
    if root.join("bin/rustup").exists() {
        return Err(refuse(
            "it is cargo's home (it holds bin/rustup): its registry, git caches and config are the user's, not the toolchain's".into(),
        ));
    }
    if let Some(s) = SECRETS.iter().find(|s| root.join(s).exists()) {
        return Err(refuse(format!(
            "it holds {s}, which is not a toolchain's; lend a directory that holds the toolchain only"
        )));
    }
    Ok(())
}

/// Applies the lent toolchains to the view and the environment: their
/// roots as read-only entries (parents first again), their `PATH`
/// directories before the profile's `PATH` (those it has already are left
/// out, in the report too), their variables over the profile's.
pub(crate) fn apply(lent: &mut [Lent], fs: &mut Vec<FsEntry>, set: &mut BTreeMap<String, String>) {
    let base = set
        .get("PATH")
        .cloned()
        .unwrap_or_else(|| DEFAULT_PATH.into());
    let mut dirs: Vec<String> = Vec::new();
    for l in lent.iter_mut() {
        for p in &l.paths {
            if !fs.iter().any(|e| &e.path == p) {
                fs.push(FsEntry {
                    path: p.clone(),
                    kind: MountKind::ReadOnly,
                });
            }
        }
        let mine: Vec<String> = l
            .env
            .remove("PATH")
            .unwrap_or_default()
            .split(':')
            .filter(|d| !d.is_empty() && !base.split(':').any(|b| b == *d))
            .filter(|d| !dirs.iter().any(|x| x == d))
            .map(str::to_string)
            .collect();
        for (k, v) in &l.env {
            set.insert(k.clone(), v.clone());
        }
        if !mine.is_empty() {
            l.env.insert("PATH".into(), mine.join(":"));
            dirs.extend(mine);
        }
    }
    fs.sort_by_key(|e| e.path.components().count());
    if !dirs.is_empty() {
        set.insert("PATH".into(), format!("{}:{base}", dirs.join(":")));
    }
}

/// The `PATH` a sandbox gets when its profile sets none.
pub(crate) const DEFAULT_PATH: &str =
    "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";

/// A path in the sandbox's home (a tmpfs on the built-in profiles).
fn in_home(rel: &str) -> PathBuf {
    Path::new(SANDBOX_HOME).join(rel)
}

#[cfg(test)]
mod tests;
