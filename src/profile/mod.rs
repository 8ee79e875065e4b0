//! Profiles: the versioned TOML policy that says what a sandbox may see and do.
//!
//! A profile is loaded only from a trusted place (P5, E30): the built-ins embedded
//! from `profiles/`, a path given on the command line, or the user's config dir.
//! Unknown keys are errors, and every error names the file, the line, the key and
//! the reason. [`Profile::resolve`] turns a profile into a [`Policy`] with the
//! `{workspace}` and `{home}` variables substituted and every path checked.

pub(crate) mod allow;
pub(crate) mod credentials;
pub(crate) mod guard;
mod layer;
mod resolve;
mod schema;
mod toolchains;
pub(crate) mod user;
mod validate;
mod workspace;

pub use layer::Layer;
pub(crate) use schema::RangedName;
#[cfg(test)]
pub(crate) use schema::MIN_RECORDING_BYTES;
pub(crate) use schema::{
    is_forbidden_env as schema_is_forbidden_env, Act, AllowEntry, Environment, Limits, McpSettings,
    NetMode, Network, Preset, Profile, RecordingSettings, SandboxSettings, ServerExit, Toolset,
    Via, MAX_RESTARTS,
};
pub(crate) use toolchains::{Lent, Toolchain, ToolchainError, Toolchains};
pub(crate) use workspace::check_workspace;
pub(crate) use workspace::{GitMode, NewRepos, OnEnd, WorkspaceMode, WorkspaceSettings};

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Built-in profiles, embedded at build time: (name, TOML source).
pub(crate) const BUILTINS: &[(&str, &str)] = &[
    ("default", include_str!("../../profiles/default.toml")),
    ("ci", include_str!("../../profiles/ci.toml")),
    ("dev", include_str!("../../profiles/dev.toml")),
    ("container", include_str!("../../profiles/container.toml")),
    ("registries", include_str!("../../profiles/registries.toml")),
];

/// The home directory every sandbox sees (a tmpfs in the built-in profiles).
pub(crate) const SANDBOX_HOME: &str = "/home/sandmux";

/// An error in a profile: always says where and why.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProfileError {
    /// No built-in, config-dir or path profile by that name.
    #[error("profile '{name}' not found: not a built-in ({builtins}), not in {config_dir}, and not a path")]
    NotFound {
        /// The name asked for.
        name: String,
        /// Comma-separated built-in names.
        builtins: String,
        /// The user's profile directory that was searched.
        config_dir: String,
    },
    /// The file could not be read.
    #[error("profile {file}: cannot read: {source}")]
    Read {
        /// The file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax, unknown key or wrong type (the TOML error carries line and key).
    #[error("profile {file}: {message}")]
    Parse {
        /// The file.
        file: String,
        /// The parser's message, with line, column and key.
        message: String,
    },
    /// A value that parses but is not acceptable.
    #[error("profile {file}, line {line}, key `{key}`: {reason}")]
    Invalid {
        /// The file.
        file: String,
        /// 1-based line of the key, 0 when unknown.
        line: usize,
        /// Dotted key, e.g. `limits.memory`.
        key: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A toolchain asked for cannot be lent (`[toolchains] lend`, `--toolchain`).
    #[error("profile {file}: {source}")]
    Toolchain {
        /// The file.
        file: String,
        /// What was searched, what is in the way, and the fix.
        source: ToolchainError,
    },
    /// The profile would be loaded from inside the workspace the agent controls.
    #[error("profile {file} is inside the workspace {workspace}: an agent could widen its own sandbox; keep profiles outside the workspace")]
    InWorkspace {
        /// The file.
        file: String,
        /// The workspace.
        workspace: String,
    },
}

/// Where a profile came from; written `builtin:NAME` or the file's absolute path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", from = "String")]
pub enum Source {
    /// Embedded at build time.
    Builtin(String),
    /// A file (given on the command line or found in the config dir).
    File(PathBuf),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Builtin(n) => write!(f, "builtin:{n}"),
            Source::File(p) => write!(f, "{}", p.display()),
        }
    }
}

impl From<Source> for String {
    fn from(s: Source) -> String {
        s.to_string()
    }
}

impl From<String> for Source {
    fn from(s: String) -> Source {
        match s.strip_prefix("builtin:") {
            Some(n) => Source::Builtin(n.to_string()),
            None => Source::File(s.into()),
        }
    }
}

/// A profile with its name, source text and origin.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    /// Short name (built-in name or file stem).
    pub name: String,
    /// Where it came from.
    pub source: Source,
    /// The TOML text, kept so errors can point at lines.
    pub text: String,
    /// The parsed profile.
    pub profile: Profile,
}

/// The user's profile directory: `$XDG_CONFIG_HOME/sandmux/profiles` or
/// `~/.config/sandmux/profiles`.
pub(crate) fn config_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("/nonexistent"));
    base.join("sandmux").join("profiles")
}

/// Loads a profile by path (contains `/` or ends in `.toml`), built-in name, or
/// name in the user's config dir. Built-in names cannot be overridden.
pub(crate) fn load(name: &str) -> Result<Loaded, ProfileError> {
    if name.contains('/') || name.ends_with(".toml") {
        return load_file(Path::new(name));
    }
    // Built-in names always mean the built-in: a file planted in the config dir
    // (for instance by an agent whose workspace was $HOME) cannot redefine them.
    if let Some((n, text)) = BUILTINS.iter().find(|(n, _)| *n == name) {
        let file = format!("builtin:{n}");
        let profile = parse(&file, text)?;
        return Ok(Loaded {
            name: n.to_string(),
            source: Source::Builtin(n.to_string()),
            text: text.to_string(),
            profile,
        });
    }
    let user = config_dir().join(format!("{name}.toml"));
    if user.is_file() {
        return load_file(&user);
    }
    Err(ProfileError::NotFound {
        name: name.to_string(),
        builtins: BUILTINS
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", "),
        config_dir: config_dir().display().to_string(),
    })
}

/// Loads and validates a profile file.
pub(crate) fn load_file(path: &Path) -> Result<Loaded, ProfileError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
        file: file.clone(),
        source,
    })?;
    let profile = parse(&file, &text)?;
    let abs = std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf());
    Ok(Loaded {
        name: path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| file.clone()),
        source: Source::File(abs),
        text,
        profile,
    })
}

/// Parses and statically validates TOML text (`file` is used in messages only).
pub(crate) fn parse(file: &str, text: &str) -> Result<Profile, ProfileError> {
    let profile: Profile = toml::from_str(text).map_err(|e| ProfileError::Parse {
        file: file.to_string(),
        message: describe_toml_error(text, &e),
    })?;
    profile.validate(file, text)?;
    Ok(profile)
}

/// Formats a TOML error as "line N, column C: message" plus the offending line.
pub(crate) fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().trim().to_string();
    match e.span() {
        Some(span) => {
            let (line, col) = line_col(text, span.start);
            let src = text.lines().nth(line - 1).unwrap_or("").trim_end();
            format!("line {line}, column {col}: {msg}\n  | {src}")
        }
        None => msg,
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map(|i| offset - i).unwrap_or(offset + 1);
    (line, col)
}

/// Finds the 1-based line where `table.key` is set in `text` (0 if not found).
pub(crate) fn line_of(text: &str, dotted: &str) -> usize {
    let (table, key) = match dotted.rsplit_once('.') {
        Some((t, k)) => (t, k),
        None => ("", dotted),
    };
    let mut current = String::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if let Some(h) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = h.trim().trim_matches(['[', ']']).trim().to_string();
            continue;
        }
        if current == table {
            if let Some((k, _)) = line.split_once('=') {
                if k.trim() == key {
                    return i + 1;
                }
            }
        }
    }
    0
}

/// Paths and variables a profile is resolved against.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    /// The workspace on the host (absolute, canonical, not a symlink).
    pub workspace: PathBuf,
    /// `--workspace-mode`, which beats the profile's `[workspace] mode`.
    pub mode: Option<WorkspaceMode>,
    /// Why copy-on-write cannot be had here (no mount namespace, no
    /// overlay), when the caller looked; a profile with `mount` best-effort
    /// then runs live, any other refuses to start.
    pub no_overlay: Option<String>,
    /// The workspace guard's planner (`crate::guard::planner`): it reads the
    /// host's trees, a layer above the profile, so the caller hands it in.
    pub plan_guard: GuardPlanner,
    /// `--on-end`: what happens to the layer when the instance ends.
    pub on_end: OnEnd,
    /// `serve --upstream-timeout`: the ceiling, in seconds, of every wait
    /// (`[mcp] wait_max_seconds`) and of a wait for a human (`ask_seconds`,
    /// at least 5), so no call outlives the proxy in front.
    pub wait_cap: Option<u64>,
}

/// Plans the workspace guard of the read-write trees `roots` with the
/// guarded `names` (`crate::guard::planner`).
pub(crate) type GuardPlanner = fn(
    roots: &[PathBuf],
    names: &[PathBuf],
    git: GitMode,
    new_repositories: NewRepos,
) -> Result<(guard::Guard, guard::ReadOnly), PlanError>;

/// Why the guard could not be planned: the planner's own error (the guard,
/// a layer above, is not named here).
pub(crate) type PlanError = Box<dyn std::error::Error + Send + Sync>;

impl Context {
    /// A workspace, with the profile's mode, its guard planned by `plan_guard`.
    pub(crate) fn of(workspace: PathBuf, plan_guard: GuardPlanner) -> Context {
        Context {
            workspace,
            mode: None,
            no_overlay: None,
            plan_guard,
            on_end: OnEnd::default(),
            wait_cap: None,
        }
    }
}

/// A mount the sandbox makes, in the order it is made.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum MountKind {
    /// Read-only bind of the same host path.
    ReadOnly,
    /// Read-write bind of the same host path.
    ReadWrite,
    /// A fresh tmpfs.
    Tmpfs,
    /// An empty file or directory over a host path (E9).
    Masked,
    /// The host path is a symlink: recreate it inside (merged-/usr systems).
    Symlink(PathBuf),
}

/// One filesystem entry of a resolved policy, written `{path, kind, target}`
/// (`kind` one of `read-only`, `read-write`, `tmpfs`, `masked`, `symlink`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "FsEntryRepr", try_from = "FsEntryRepr")]
pub(crate) struct FsEntry {
    /// The path, identical inside and outside.
    pub path: PathBuf,
    /// What is mounted there.
    pub kind: MountKind,
}

/// How an [`FsEntry`] is written: no enum tags.
#[derive(serde::Serialize, serde::Deserialize)]
struct FsEntryRepr {
    path: PathBuf,
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<PathBuf>,
}

impl From<FsEntry> for FsEntryRepr {
    fn from(e: FsEntry) -> FsEntryRepr {
        let (kind, target) = match e.kind {
            MountKind::ReadOnly => ("read-only", None),
            MountKind::ReadWrite => ("read-write", None),
            MountKind::Tmpfs => ("tmpfs", None),
            MountKind::Masked => ("masked", None),
            MountKind::Symlink(t) => ("symlink", Some(t)),
        };
        FsEntryRepr {
            path: e.path,
            kind: kind.into(),
            target,
        }
    }
}

/// A filesystem entry of a kind sandmux does not write (a policy read back).
#[derive(Debug, thiserror::Error)]
#[error("filesystem entry kind {0:?} (or its target)")]
pub(crate) struct FsKindError(String);

impl TryFrom<FsEntryRepr> for FsEntry {
    type Error = FsKindError;
    fn try_from(r: FsEntryRepr) -> Result<FsEntry, FsKindError> {
        let kind = match (r.kind.as_str(), r.target) {
            ("read-only", None) => MountKind::ReadOnly,
            ("read-write", None) => MountKind::ReadWrite,
            ("tmpfs", None) => MountKind::Tmpfs,
            ("masked", None) => MountKind::Masked,
            ("symlink", Some(t)) => MountKind::Symlink(t),
            (k, _) => return Err(FsKindError(k.to_string())),
        };
        Ok(FsEntry { path: r.path, kind })
    }
}

/// A profile resolved against a workspace: concrete, checked paths.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Policy {
    /// Profile name.
    pub name: String,
    /// Where it came from.
    pub source: Source,
    /// The profile's own description.
    pub description: String,
    /// Filesystem entries, parents before children.
    pub fs: Vec<FsEntry>,
    /// Paths (absolute) that stay read-only inside read-write roots.
    pub protected: Vec<PathBuf>,
    /// The workspace guard (P8): what kind of checkout each read-write tree
    /// is, what is bound read-only, and what is watched.
    pub guard: guard::Guard,
    /// Directories between a read-write root and a protected path, bound onto
    /// themselves so they cannot be renamed away, parents first.
    pub pinned: Vec<PathBuf>,
    /// Network settings.
    pub network: Network,
    /// Resource limits.
    pub limits: Limits,
    /// Environment allowlist and settings, with variables substituted.
    pub environment: Environment,
    /// Hostname, shell, uid.
    pub sandbox: SandboxSettings,
    /// Layers allowed to be missing.
    pub best_effort: BTreeSet<Layer>,
    /// Highest Landlock ABI to use (None: the kernel's best).
    pub landlock_abi: Option<u8>,
    /// The workspace.
    pub workspace: PathBuf,
    /// `[workspace] mode = "copy-on-write"`: the layer directory the agent's
    /// writes to the workspace land in (`upper/`, `work/`), made by the host
    /// side when the instance starts (None until then, and in live mode).
    #[serde(default)]
    pub layer: Option<PathBuf>,
    /// `[workspace] mode`, or `--workspace-mode`, as it will be (a
    /// best-effort mount layer that cannot be had makes it live).
    #[serde(default)]
    pub workspace_mode: WorkspaceMode,
    /// Why the workspace is live though the profile asked for
    /// copy-on-write (no mount namespace here), for every report.
    #[serde(default)]
    pub workspace_fallback: Option<String>,
    /// What happens to the layer when the instance ends.
    #[serde(default)]
    pub on_end: OnEnd,
    /// `[workspace] layer_bytes` and `layer_files`: the layer's bound while
    /// the instance runs.
    #[serde(default)]
    pub layer_bound: (u64, u64),
    /// `[workspace] history_bytes`: the history's bound (0: none kept).
    #[serde(default)]
    pub history_bytes: u64,
    /// Toolchains lent read-only (`[toolchains] lend`, `--toolchain`): what
    /// was found where, bound and set.
    #[serde(default)]
    pub toolchains: Vec<Lent>,
    /// `[filesystem]` entries that are symlinks on the host, as resolved:
    /// (the path, its target on the host).
    #[serde(default)]
    pub links: Vec<(PathBuf, PathBuf)>,
    /// MCP settings (used by `serve`).
    pub mcp: McpSettings,
    /// `serve --record` settings.
    pub recording: RecordingSettings,
    /// `[[credentials]]`: where each secret comes from and where it may go
    /// (never its value).
    #[serde(default)]
    pub credentials: Vec<credentials::Credential>,
    /// The instance's own CA certificate (PEM, public), made by the host
    /// side when the instance starts with credentials: the sandbox trusts it.
    #[serde(default)]
    pub ca_pem: Option<String>,
}

/// The read-only entries that are symlinks on the host, one line each:
/// what is inside, and whether the target is bound for it.
pub(crate) fn links_said(p: &Policy) -> Vec<String> {
    p.links
        .iter()
        .map(|(path, real)| {
            let own =
                p.fs.iter()
                    .any(|e| &e.path == real && e.kind == MountKind::ReadOnly);
            format!(
                "{} → {} ({})",
                path.display(),
                real.display(),
                if own {
                    "the target is bound read-only for it"
                } else {
                    "the target is in the view"
                }
            )
        })
        .collect()
}

#[cfg(test)]
mod tests;
