//! The command line's arguments, as clap parses them.

use super::profile_cmd::ProfileCmd;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "sandmux",
    version,
    about = "A terminal an AI agent cannot escape: a fresh tmux server inside a Landlock + namespaces + seccomp sandbox"
)]
pub(super) struct Cli {
    #[command(subcommand)]
    pub(super) cmd: Cmd,
    /// How diagnostics on stderr are written: text lines, or JSON lines
    /// (levels from SANDMUX_LOG, env-filter syntax; default info).
    #[arg(long, global = true, value_enum, default_value_t)]
    pub(super) log_format: crate::log::Format,
}

#[derive(clap::Args, Clone)]
pub(super) struct Target {
    /// Profile: a built-in name (default, ci, dev, registries, container), a
    /// name in ~/.config/sandmux/profiles, or a path to a TOML file.
    #[arg(long, short, default_value = "default")]
    pub(super) profile: String,
    /// The directory the sandbox may write (default: the current directory).
    #[arg(long, short)]
    pub(super) workspace: Option<PathBuf>,
    /// Where the agent's writes to the workspace land (beats the profile's
    /// `[workspace] mode`): in a layer of this instance that only
    /// `sandmux apply` brings in (copy-on-write), or in the host's tree (live).
    #[arg(long, value_enum, value_name = "MODE")]
    pub(super) workspace_mode: Option<crate::profile::WorkspaceMode>,
    /// Lend a host toolchain read-only (rust, python, node, go; repeatable;
    /// added to the profile's `[toolchains] lend`): found where its
    /// installer put it, its bin first on PATH, its caches in the sandbox's
    /// home. Not found or unreadable: sandmux does not start.
    #[arg(long = "toolchain", value_name = "NAME", value_parser = clap::builder::ValueParser::new(parse_toolchain))]
    pub(super) toolchains: Vec<crate::profile::Toolchain>,
}

/// A `--toolchain` name; an unknown one lists the known.
fn parse_toolchain(s: &str) -> Result<crate::profile::Toolchain, crate::profile::ToolchainError> {
    s.parse()
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process; boxing buys nothing
pub(super) enum Cmd {
    /// Run one command confined by the profile (no tmux); exits with its status.
    Run {
        #[command(flatten)]
        target: Target,
        /// Quiet: no `sandmux:` line on stderr naming the layers dropped or
        /// saying that `--on-end apply` brought everything in (what it left
        /// for you is still said).
        #[arg(long, short)]
        quiet: bool,
        /// Copy-on-write: what happens to the agent's changes when the
        /// command ends (apply: through the door, as `sandmux apply` does,
        /// so a CI loop keeps its build output; what is held back stays in
        /// the layer).
        #[arg(long, value_enum, default_value = "apply", value_name = "WHAT")]
        on_end: crate::profile::OnEnd,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, required = true, num_args = 1..)]
        command: Vec<std::ffi::OsString>,
    },
    /// Start a fresh confined tmux server and attach this terminal to it.
    Shell {
        #[command(flatten)]
        target: Target,
        /// Copy-on-write: what happens to the agent's changes when the
        /// shell ends (keep: for `sandmux diff` and `sandmux apply`).
        #[arg(long, value_enum, default_value = "keep", value_name = "WHAT")]
        on_end: crate::profile::OnEnd,
    },
    /// Serve MCP over stdio (or streamable HTTP, --http) against a fresh confined tmux server.
    Serve {
        #[command(flatten)]
        target: Target,
        /// Copy-on-write: what happens to the agent's changes when the
        /// instance ends (keep: the human reviews them with `sandmux diff`).
        #[arg(long, value_enum, default_value = "keep", value_name = "WHAT")]
        on_end: crate::profile::OnEnd,
        /// Comma-separated toolsets (inspect, manage, execute, teardown, history), or
        /// the preset `core` (the ten tools of an agent's daily work); default
        /// from the profile.
        #[arg(long)]
        toolsets: Option<String>,
        /// Extra tools to enable by exact name.
        #[arg(long)]
        tools: Option<String>,
        /// Tools to disable by exact name (beats every enable).
        #[arg(long)]
        exclude_tools: Option<String>,
        /// The audit log (default: ~/.local/state/sandmux/audit/).
        #[arg(long)]
        audit_log: Option<PathBuf>,
        /// Start without the initial session "main".
        #[arg(long)]
        no_session: bool,
        /// Record the first session's terminal output as an asciicast v2 file.
        #[arg(long)]
        record: Option<PathBuf>,
        /// Serve MCP over streamable HTTP at http://IP:PORT/mcp instead of stdio.
        #[arg(long, value_name = "IP:PORT")]
        http: Option<String>,
        /// The Bearer token's file (0400/0600; required unless --http is
        /// loopback or --unclaimed).
        #[arg(long, requires = "http", conflicts_with = "unclaimed")]
        token_file: Option<PathBuf>,
        /// Start without a token (a warm pool's pod): every MCP request is
        /// refused until `sandmux token set ID` gives it one.
        #[arg(long, requires = "http")]
        unclaimed: bool,
        /// The header the token comes in, as `Bearer TOKEN`, instead of
        /// Authorization (which a router in front may strip or consume).
        #[arg(long, requires = "http", value_name = "NAME")]
        token_header: Option<String>,
        /// What a request may take before the proxy in front gives up
        /// (seconds): every wait a tool does ends 10 s before it, and says so.
        #[arg(long, requires = "http", value_name = "SECONDS")]
        upstream_timeout: Option<u64>,
        /// Also write every audit record to stdout as it is logged (the
        /// cluster's log pipeline keeps it after the pod is gone).
        #[arg(long, requires = "http")]
        audit_stdout: bool,
        /// A further name a Host or Origin header may carry (repeatable).
        #[arg(long, requires = "http", value_name = "NAME")]
        allowed_host: Vec<String>,
        /// Go on in the kept layer of instance ID (copy-on-write): the
        /// workspace continues, panes and processes do not; the layer moves
        /// to this instance.
        #[arg(long, value_name = "ID", conflicts_with = "fork")]
        resume: Option<String>,
        /// Start on a copy of the kept layer of instance ID, which stays as
        /// it was.
        #[arg(long, value_name = "ID")]
        fork: Option<String>,
        /// Export a span per traced call to this OTLP/HTTP collector
        /// (http://HOST:PORT; /v1/traces is appended). Default: the
        /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT
        /// variable; neither: no export.
        #[arg(long, value_name = "URL")]
        otlp_endpoint: Option<String>,
    },
    /// List this user's running instances (and with --all the kept copy-on-write layers).
    Ps {
        /// JSON output.
        #[arg(long)]
        json: bool,
        /// Also the copy-on-write layers instances left (kind "layer").
        #[arg(long)]
        all: bool,
    },
    /// Attach this terminal to an instance's tmux server (read-only by default).
    Attach {
        /// Instance id (or a unique prefix).
        id: String,
        /// Allow typing.
        #[arg(long, conflicts_with = "read_only")]
        read_write: bool,
        /// Watch only (the default).
        #[arg(long)]
        read_only: bool,
    },
    /// Take tools away from a running `serve` instance (effective on the next
    /// call; processes already running go on: see `freeze`).
    Revoke {
        #[command(flatten)]
        sel: Selection,
        /// Then freeze the instance (`sandmux freeze`).
        #[arg(long)]
        freeze: bool,
    },
    /// Make a port the sandbox listens on reachable from the host: on
    /// 127.0.0.1 (a free port unless --host-port), until `revoke --expose`
    /// or the instance's end. Inbound only: the agent reaches nothing new.
    Expose {
        /// Instance id (or a unique prefix).
        id: String,
        /// The port inside the sandbox (its 127.0.0.1), 1024 or above.
        port: u16,
        /// The host port to listen on (default: a free one, printed).
        #[arg(long)]
        host_port: Option<u16>,
        /// Listen on this host address instead of 127.0.0.1 (e.g. 0.0.0.0:
        /// every interface, reachable from other machines).
        #[arg(long)]
        address: Option<String>,
    },
    /// Give back tools the instance started with (never more).
    Grant {
        #[command(flatten)]
        sel: Selection,
    },
    /// Show an instance's audit records.
    Journal {
        /// Instance id.
        id: String,
        /// Keep printing new records until the instance ends.
        #[arg(long)]
        follow: bool,
        /// Raw JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// The token of a `serve --http --unclaimed` instance.
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
    /// A `serve` instance's metrics in the Prometheus text format (the
    /// same text as `GET /metrics` on `serve --http`).
    Metrics {
        /// Instance id (or a unique prefix).
        id: String,
    },
    /// The questions a `serve` instance holds for a human (`[network] ask`)
    /// and what was granted.
    Approvals {
        /// Instance id (or a unique prefix).
        id: String,
        /// Raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Allow what an open question asks: once (that connection, and the
    /// next ones to the name for 10 s), or for the rest of the instance.
    Approve {
        /// Instance id (or a unique prefix).
        id: String,
        /// The question's number (`sandmux approvals ID`).
        question: u64,
        /// For the rest of the instance, not once.
        #[arg(long)]
        for_instance: bool,
    },
    /// Refuse what an open question asks.
    Deny {
        /// Instance id (or a unique prefix).
        id: String,
        /// The question's number (`sandmux approvals ID`).
        question: u64,
    },
    /// Stop every process in a `serve` instance's sandbox (the tmux server and
    /// PID 1 included) and refuse tool calls until `thaw`.
    Freeze {
        /// Instance id (or a unique prefix).
        id: String,
    },
    /// Let a frozen instance run again.
    Thaw {
        /// Instance id (or a unique prefix).
        id: String,
    },
    /// End an instance cleanly.
    Stop {
        /// Instance id.
        id: String,
    },
    /// Copy-on-write mode: what an instance changed in the workspace (exit 0: nothing, 1: changes).
    Diff {
        /// Instance id (as `run` and `serve` print it).
        id: String,
        /// Only these paths (relative to the workspace) and what is below them.
        paths: Vec<std::path::PathBuf>,
        /// Only one line per changed path, no text.
        #[arg(long)]
        names_only: bool,
        /// Show what git ignores path by path, not as one line per top directory.
        #[arg(long)]
        include_ignored: bool,
        /// What tool call N changed in the layer (`sandmux log ID` lists them).
        #[arg(long, value_name = "N", conflicts_with_all = ["paths", "since", "names_only", "include_ignored"])]
        call: Option<u64>,
        /// What changed in the layer after tool call N.
        #[arg(long, value_name = "N", conflicts_with_all = ["paths", "names_only", "include_ignored"])]
        since: Option<u64>,
        /// Review the work up to tool call N only, as `apply --upto N` would bring it (with its digest).
        #[arg(long, value_name = "N", conflicts_with_all = ["call", "since"])]
        upto: Option<u64>,
    },
    /// Copy-on-write mode: the workspace's history, a checkpoint per tool call that can change it.
    Log {
        /// Instance id.
        id: String,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Copy-on-write mode: put an instance's workspace back to how it was after tool call N (a running instance is frozen meanwhile; undone by rewinding to the checkpoint it names).
    Rewind {
        /// Instance id.
        id: String,
        /// The checkpoint (`sandmux log ID`).
        n: u64,
    },
    /// Copy-on-write mode: bring an instance's changes into the workspace (exit 0 applied, 1 nothing to do, 3 conflicts, 2 refused).
    Apply {
        /// Instance id.
        id: String,
        /// Only these paths (relative to the workspace) and what is below them.
        paths: Vec<std::path::PathBuf>,
        /// Apply held-back paths too, where PATHS names them.
        #[arg(long)]
        include_control: bool,
        /// Bring what git ignores too (a venv, `target/`…).
        #[arg(long)]
        include_ignored: bool,
        /// Bring exactly what `sandmux diff` showed with this digest, or nothing.
        #[arg(long, value_name = "DIGEST")]
        expect: Option<String>,
        /// Reverse the last applies (from the layer's journal).
        #[arg(long, conflicts_with_all = ["paths", "include_control", "include_ignored", "expect"])]
        undo: bool,
        /// Bring the work up to tool call N only (`sandmux log ID`), through the same door; with --undo, reverse what it brought.
        #[arg(long, value_name = "N")]
        upto: Option<u64>,
    },
    /// Copy-on-write mode: remove an instance's layer (its changes are gone).
    Discard {
        /// Instance id.
        id: String,
    },
    /// Commit mode (`[workspace] git = "commit"`): the agent's commits.
    Git {
        #[command(subcommand)]
        cmd: GitCmd,
    },
    /// Audit log tools.
    Audit {
        #[command(subcommand)]
        cmd: AuditCmd,
    },
    /// Report what this machine enforces for a profile, observed from inside a live pane.
    Check {
        #[command(flatten)]
        target: Target,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List, show and validate profiles.
    Profile {
        #[command(subcommand)]
        cmd: ProfileCmd,
    },
    #[command(name = "__init", hide = true)]
    Init,
    #[command(name = "__broker", hide = true)]
    Broker,
    /// The rewinder of a running instance (started by the broker).
    #[command(name = "__rewind", hide = true)]
    Rewinder {
        /// The workspace (the same path inside).
        workspace: PathBuf,
        /// The sandbox has a user namespace of its own (descriptor 6).
        #[arg(long)]
        userns: bool,
    },
    #[command(name = "__probe-userns", hide = true)]
    ProbeUserns {
        /// Try an overlay of LOWER UPPER WORK in a mount namespace too.
        #[arg(long, num_args = 3)]
        overlay: Vec<PathBuf>,
    },
    /// Print the MCP tool table (markdown) generated from the catalogue.
    #[command(name = "__tools-doc", hide = true)]
    ToolsDoc,
    /// Print one of docs/architecture.md's generated tables.
    #[command(name = "__tables-doc", hide = true)]
    TablesDoc {
        /// The table's name (seccomp-denied, layers).
        name: String,
    },
    /// Test harness: start an instance, print its socket as JSON, stop at stdin EOF.
    #[command(name = "__instance", hide = true)]
    Instance {
        #[command(flatten)]
        target: Target,
    },
}

#[derive(clap::Args, Clone)]
pub(super) struct Selection {
    /// Instance id (or a unique prefix).
    pub(super) id: String,
    /// A toolset: inspect, manage, execute, teardown, history.
    #[arg(long)]
    pub(super) toolset: Option<String>,
    /// One tool by name.
    #[arg(long)]
    pub(super) tool: Option<String>,
    /// Every tool.
    #[arg(long)]
    pub(super) all: bool,
    /// One credential (`[[credentials]]`) by name: revoked, later requests
    /// carrying its placeholder are refused; granted, they are served again.
    #[arg(long, conflicts_with_all = ["toolset", "tool", "all"])]
    pub(super) credential: Option<String>,
    /// A name a human allowed (`[network] ask`), as `sandmux approvals`
    /// lists it (`https://host:port`): taken back (revoke only).
    #[arg(long, conflicts_with_all = ["toolset", "tool", "all", "credential"])]
    pub(super) approval: Option<String>,
    /// A port exposed with `sandmux expose`: its host listener closes and
    /// its connections drop (revoke only).
    #[arg(long, conflicts_with_all = ["toolset", "tool", "all", "credential", "approval"])]
    pub(super) expose: Option<u16>,
}

#[derive(Subcommand)]
pub(super) enum GitCmd {
    /// Fetch an instance's branches into refs/sandmux/ID/* of its workspace's
    /// repository (refused if its repository is not as sandmux made it).
    Fetch {
        /// The instance id (printed at its end; see `sandmux ps`).
        id: String,
        /// Remove the instance's repository after a successful fetch.
        #[arg(long)]
        prune: bool,
    },
}

#[derive(Subcommand)]
pub(super) enum TokenCmd {
    /// Put the token read from stdin in force (first: the instance is
    /// claimed; again: the old token is refused from then on). Never printed.
    Set {
        /// Instance id (or a unique prefix).
        id: String,
    },
}

#[derive(Subcommand)]
pub(super) enum AuditCmd {
    /// Check a log's hash chain and seal: exit status 0 intact and sealed,
    /// 1 names the first bad (edited, removed, reordered, torn) line, 3
    /// intact but not sealed.
    Verify {
        /// The log.
        path: PathBuf,
    },
}
