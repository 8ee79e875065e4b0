//! The profile schema (version 1). Unknown keys are rejected everywhere.

use super::{Layer, WorkspaceSettings};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A sandmux profile, as written in TOML.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Profile {
    /// Schema version; only 1 exists.
    pub version: u32,
    /// One line saying what the profile is for.
    pub description: String,
    /// What the sandbox sees.
    #[serde(default)]
    pub filesystem: Filesystem,
    /// Network access.
    #[serde(default)]
    pub network: Network,
    /// Resource limits.
    #[serde(default)]
    pub limits: Limits,
    /// Environment of every process inside.
    #[serde(default)]
    pub environment: Environment,
    /// Hostname, shell and identity inside.
    #[serde(default)]
    pub sandbox: SandboxSettings,
    /// Which layers may be missing.
    #[serde(default)]
    pub enforcement: Enforcement,
    /// MCP server settings.
    #[serde(default)]
    pub mcp: McpSettings,
    /// How the workspace is guarded against becoming a way back to the host (P8).
    #[serde(default)]
    pub workspace: WorkspaceSettings,
    /// `serve --record` settings.
    #[serde(default)]
    pub recording: RecordingSettings,
    /// Host toolchains lent read-only.
    #[serde(default)]
    pub toolchains: super::Toolchains,
    /// Secrets the agent uses but never holds (`[[credentials]]`).
    #[serde(default)]
    pub credentials: Vec<super::credentials::Credential>,
}

/// `[recording]`: the `serve --record` file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RecordingSettings {
    /// Largest size of the file; at it the recording ends with a notice and
    /// a marker event (default 64MiB, at least 4KiB).
    pub max_bytes: Size,
}

/// The smallest `[recording] max_bytes`: a header and the closing lines fit.
pub(crate) const MIN_RECORDING_BYTES: u64 = 4096;

impl Default for RecordingSettings {
    fn default() -> Self {
        RecordingSettings {
            max_bytes: Size(64 << 20),
        }
    }
}

/// `[filesystem]`: paths are absolute; `{workspace}` and `{home}` are substituted;
/// a leading `?` marks a path as optional.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Filesystem {
    /// Bound read-only (and executable).
    #[serde(default)]
    pub read_only: Vec<String>,
    /// Bound read-write.
    #[serde(default)]
    pub read_write: Vec<String>,
    /// Fresh, size-limited tmpfs.
    #[serde(default)]
    pub tmpfs: Vec<String>,
    /// Covered with an empty file or directory.
    #[serde(default)]
    pub masked: Vec<String>,
    /// Tool configuration that host programs obey: relative paths kept
    /// read-only inside every read-write root, at any depth, when present, and
    /// watched and reverted when absent.
    #[serde(default)]
    pub protected: Vec<String>,
}

/// Network mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum NetMode {
    /// A new network namespace with only its own `lo` up: nothing outside
    /// the sandbox is reachable; a server and its client inside work.
    #[default]
    None,
    /// The same as `none` (the name says what is there).
    Loopback,
    /// The host's network, limited by Landlock TCP port rules.
    Host,
    /// A new network namespace with `lo` up and the supervisor's allowlist
    /// proxy on 127.0.0.1:3128 (`crate::proxy`).
    Proxy,
}

impl NetMode {
    /// The spelling used in profiles and reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            NetMode::None => "none",
            NetMode::Loopback => "loopback",
            NetMode::Host => "host",
            NetMode::Proxy => "proxy",
        }
    }
}

/// `[network]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Network {
    /// none | loopback | host | proxy.
    #[serde(default)]
    pub mode: NetMode,
    /// TCP ports that may be connected to (host mode).
    #[serde(default)]
    pub connect_tcp: Vec<u16>,
    /// TCP ports that may be bound (host mode).
    #[serde(default)]
    pub bind_tcp: Vec<u16>,
    /// Proxy mode: the names that may be reached (`name`, `*.suffix`, either
    /// with `:port`; without one CONNECT goes to 443, plain HTTP to 80), each
    /// alone or with the refused ranges its addresses may be in.
    #[serde(default)]
    pub allow: Vec<AllowEntry>,
    /// Proxy mode: address ranges (CIDR) the proxy may dial although they
    /// are loopback, private, link-local or otherwise refused by default.
    #[serde(default)]
    pub allow_private: Vec<String>,
    /// Proxy mode: names pinned to an address (never resolved).
    #[serde(default)]
    pub hosts: std::collections::BTreeMap<String, String>,
    /// Proxy mode: connections served at once; more are refused (503).
    pub proxy_connections: u32,
    /// Proxy mode: a connection with no traffic for this long is closed.
    pub proxy_idle_seconds: u64,
    /// Proxy mode: the largest request head, in bytes.
    pub proxy_header_bytes: u32,
    /// Proxy mode: extra roots (PEM files on the host) the proxy trusts for
    /// the upstream of an intercepted connection, beside the host's own.
    #[serde(default)]
    pub upstream_ca: Vec<std::path::PathBuf>,
    /// Proxy mode: a name not on the allow list is held and the operator
    /// asked (`sandmux approvals`), instead of refused at once.
    #[serde(default)]
    pub ask: bool,
    /// Proxy mode with `ask`: the ports a question may be about (443 and
    /// 80 unless listed); a name off the list on another port is refused
    /// without a question. The supervisor may dial exactly these besides
    /// the allow list's.
    pub ask_ports: Vec<u16>,
}

/// One `[network] allow` entry: a name, or a name with the address ranges
/// it may resolve to although the proxy refuses them by default (a mirror on
/// a private or reserved range): `{ name = "mirror.example", ranges =
/// ["10.20.0.0/16"] }`. The ranges apply to that entry's name only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    untagged,
    expecting = "a name (\"host\", \"*.suffix\", either with \":port\") or a table { name = \"host\", ranges = [\"CIDR\", …] }"
)]
pub(crate) enum AllowEntry {
    /// `"name"`.
    Name(String),
    /// `{ name = "…", ranges = [ "CIDR", … ] }`.
    Ranged(RangedName),
}

/// A name with the ranges its addresses may be in (see [`AllowEntry`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RangedName {
    /// The name, as a plain entry writes it.
    pub name: String,
    /// CIDR ranges, each one the proxy refuses by default.
    #[serde(default)]
    pub ranges: Vec<String>,
}

impl AllowEntry {
    /// The name as written (with `*.` and `:port` when given).
    pub(crate) fn name(&self) -> &str {
        match self {
            AllowEntry::Name(n) => n,
            AllowEntry::Ranged(r) => &r.name,
        }
    }

    /// The ranges written for this name (none for a plain name).
    pub(crate) fn ranges(&self) -> &[String] {
        match self {
            AllowEntry::Name(_) => &[],
            AllowEntry::Ranged(r) => &r.ranges,
        }
    }
}

impl Default for Network {
    fn default() -> Self {
        Network {
            mode: NetMode::None,
            connect_tcp: vec![],
            bind_tcp: vec![],
            allow: vec![],
            allow_private: vec![],
            hosts: Default::default(),
            proxy_connections: 64,
            proxy_idle_seconds: 30,
            proxy_header_bytes: 16 * 1024,
            upstream_ca: vec![],
            ask: false,
            ask_ports: vec![443, 80],
        }
    }
}

/// `[limits]`. Sizes are strings like "4GiB" or plain byte counts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Limits {
    /// RLIMIT_NOFILE.
    pub nofile: u64,
    /// cgroup pids.max and the RLIMIT_NPROC backstop.
    pub processes: u64,
    /// cgroup memory.max.
    pub memory: Size,
    /// RLIMIT_FSIZE.
    pub file_size: Size,
    /// RLIMIT_CORE (0: no core dumps).
    #[serde(default)]
    pub core: u64,
    /// Size of each tmpfs the sandbox mounts.
    pub tmpfs_size: Size,
    /// Sessions the agent may have at once (besides sandmux's own control
    /// session); each costs one tmux client on the host.
    pub max_sessions: u32,
    /// Panes the agent may have at once, across all its sessions.
    pub max_panes: u32,
    /// inotify watches the sandbox's processes may hold together, set in
    /// its user namespace (`/proc/sys/user/max_inotify_watches`): they count
    /// against the host user's too, which the workspace guard needs.
    pub inotify_watches: u64,
    /// inotify instances, the same way (`max_inotify_instances`).
    pub inotify_instances: u64,
}

/// Highest `inotify_watches` a profile may set.
pub(super) const MAX_INOTIFY_WATCHES: u64 = 1 << 20;
/// Highest `inotify_instances` a profile may set.
pub(super) const MAX_INOTIFY_INSTANCES: u64 = 1024;

/// Highest `max_sessions` a profile may set (each session is a host process).
pub(super) const MAX_SESSIONS_CEILING: u32 = 256;
/// Highest `max_panes` a profile may set (each pane has a ring in the supervisor).
pub(super) const MAX_PANES_CEILING: u32 = 4096;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            nofile: 4096,
            processes: 512,
            memory: Size(4 << 30),
            file_size: Size(8 << 30),
            core: 0,
            tmpfs_size: Size(1 << 30),
            max_sessions: 16,
            max_panes: 128,
            inotify_watches: 16384,
            inotify_instances: 16,
        }
    }
}

/// A byte size; parsed from "512MiB", "4GiB", "100kB" or an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub(crate) struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Size(n)),
            Raw::S(s) => parse_size(&s).map(Size).map_err(serde::de::Error::custom),
        }
    }
}

/// Why a size does not parse; each message quotes it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SizeError {
    /// No number in front.
    #[error(
        "invalid size {0:?}: expected a number followed by B, KiB, MiB, GiB, TiB (or kB, MB, GB)"
    )]
    NotNumber(String),
    /// A unit sandmux does not know.
    #[error(
        "invalid size {size:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB, TiB, kB, MB or GB)"
    )]
    Unit { size: String, unit: String },
    /// More than 64 bits of bytes.
    #[error("size {0:?} is too large")]
    TooLarge(String),
}

/// Parses "4GiB", "512 MiB", "100kB", "123".
pub(crate) fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| SizeError::NotNumber(s.into()))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "TiB" | "T" => 1 << 40,
        "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(SizeError::Unit {
                size: s.into(),
                unit: other.into(),
            })
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| SizeError::TooLarge(s.into()))
}

/// `[environment]`: what every process inside sees.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Environment {
    /// Names kept from the caller's environment; a trailing `*` matches a prefix.
    #[serde(default)]
    pub keep: Vec<String>,
    /// Variables set (after `keep`).
    #[serde(default)]
    pub set: BTreeMap<String, String>,
}

/// `[sandbox]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct SandboxSettings {
    /// Hostname in the UTS namespace.
    pub hostname: String,
    /// The shell panes run (must be inside a read-only tree).
    pub shell: String,
    /// The uid (and gid) processes have inside; never 0.
    pub uid: u32,
}

impl Default for SandboxSettings {
    fn default() -> Self {
        SandboxSettings {
            hostname: "sandmux".into(),
            shell: "/bin/bash".into(),
            uid: 1000,
        }
    }
}

/// `[enforcement]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Enforcement {
    /// Layers allowed to be missing, by name; empty means all are required.
    #[serde(default)]
    pub best_effort: Vec<Layer>,
    /// Use at most this Landlock ABI (for testing older kernels' behaviour).
    #[serde(default)]
    pub landlock_abi: Option<u8>,
}

/// An MCP toolset (same meaning as libtmux-mcp's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Toolset {
    /// Read-only tools.
    Inspect,
    /// Layout and naming tools.
    Manage,
    /// Tools that run or type things.
    Execute,
    /// Tools that destroy things.
    Teardown,
    /// The workspace's history (`workspace_history`): not on by default.
    History,
}

/// A named selection of tools (see `mcp::toolsets::CORE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Preset {
    /// Ten tools that cover an agent's daily work.
    Core,
}

/// `[mcp]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct McpSettings {
    /// Toolsets enabled by default.
    pub toolsets: Vec<Toolset>,
    /// A preset that narrows them (`"core"`: ten tools of daily work).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<Preset>,
    /// Largest text input per call, in bytes.
    pub max_input_bytes: u64,
    /// Ceiling for every wait, in seconds (1–120).
    pub wait_max_seconds: u64,
    /// The audit log's budget for one instance (64 KiB-1 TiB); when it is
    /// spent, calls are refused.
    pub audit_max_bytes: Size,
    /// When execute-class tools are live: "always", or "on-grant" (only after
    /// a human runs `sandmux grant ID --toolset execute`).
    #[serde(default)]
    pub act: Act,
    /// What happens when the sandboxed tmux server dies: "end" the instance,
    /// or "restart" a fresh generation (at most [`MAX_RESTARTS`] times).
    #[serde(default)]
    pub on_server_exit: ServerExit,
    /// `serve --http`: end the instance after this many seconds with no
    /// request in flight (0: never; else 5-604800).
    #[serde(default)]
    pub http_idle_seconds: u64,
    /// `serve --http`: most open MCP sessions (1-256).
    pub http_max_sessions: u64,
    /// `serve --http`: most requests served at once (1-1024).
    pub http_max_requests: u64,
    /// `serve --http`: largest request body, in bytes (64 KiB-16 MiB).
    pub http_max_body_bytes: u64,
    /// How long a question to a human (`[network] ask`, `ask_toolsets`)
    /// holds the request before silence denies it, in seconds (5-600).
    pub ask_seconds: u64,
    /// Toolsets this instance does not enable whose tools are listed and,
    /// when called, ask a human first (once, for the instance, or deny).
    #[serde(default)]
    pub ask_toolsets: Vec<Toolset>,
    /// Who may answer a tool's question: the MCP client (elicitation) and
    /// the operator (`sandmux approve`); a name's question only ever goes
    /// to the operator.
    pub ask_via: Vec<Via>,
}

/// Who a question goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Via {
    /// The MCP client, by elicitation (when it declared the capability).
    Client,
    /// The operator, by `sandmux approve` / `deny`.
    Operator,
}

/// Most restarts one `serve` instance makes before it ends anyway.
pub(crate) const MAX_RESTARTS: u32 = 3;

/// What `serve` does when its tmux server dies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ServerExit {
    /// End the instance (the client sees the connection end).
    #[default]
    End,
    /// Start a fresh server generation in a fresh sandbox, under the same MCP
    /// session; pending calls still fail.
    Restart,
}

/// When the execute toolset is live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Act {
    /// From the start.
    #[default]
    Always,
    /// Only once a human grants it.
    OnGrant,
}

impl Default for McpSettings {
    fn default() -> Self {
        McpSettings {
            toolsets: vec![Toolset::Inspect, Toolset::Manage, Toolset::Execute],
            preset: None,
            max_input_bytes: 32768,
            wait_max_seconds: 300,
            audit_max_bytes: Size(256 << 20),
            act: Act::Always,
            on_server_exit: ServerExit::End,
            http_idle_seconds: 0,
            http_max_sessions: 8,
            http_max_requests: 32,
            http_max_body_bytes: 1 << 20,
            ask_seconds: 60,
            ask_toolsets: vec![],
            ask_via: vec![Via::Client, Via::Operator],
        }
    }
}

/// Variables that never enter the sandbox, whatever a profile says.
pub(crate) fn is_forbidden_env(name: &str) -> bool {
    name.starts_with("TMUX")
        || name.starts_with("SANDMUX")
        || name.starts_with("LD_")
        || name == "GLIBC_TUNABLES"
        || name.starts_with("DBUS_")
        || name.starts_with("SSH_")
        || name == "XDG_RUNTIME_DIR"
        || name == "DISPLAY"
        || name == "WAYLAND_DISPLAY"
        || name == "NOTIFY_SOCKET"
        || name.starts_with("TERM_PROGRAM")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("512 MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("100kB").unwrap(), 100_000);
        assert_eq!(parse_size("7").unwrap(), 7);
        assert!(parse_size("4 lots").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("99999999999999999999GiB").is_err());
    }

    #[test]
    fn forbidden_env() {
        for n in [
            "TMUX",
            "TMUX_PANE",
            "LD_PRELOAD",
            "GLIBC_TUNABLES",
            "SANDMUX_TOOLS",
            "SSH_AUTH_SOCK",
        ] {
            assert!(is_forbidden_env(n), "{n}");
        }
        assert!(!is_forbidden_env("PATH"));
    }
}
