//! `sandbox_status`: what confines this terminal, as observed.

use super::NoArgs;
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

/// One line for `sandbox_status`: the state, its reason, the bytes used.
fn audit_state(st: &Value) -> String {
    let mut s = format!(
        "{}: {} of {} bytes",
        st["state"].as_str().unwrap_or("?"),
        st["bytes"],
        st["budget"]
    );
    if let Some(r) = st["reason"].as_str() {
        s.push_str(&format!("; {r}"));
    }
    s
}

/// `sandbox_status` result.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Status {
    /// Profile name.
    pub profile: String,
    /// Profile description.
    pub description: String,
    /// Workspace (read-write inside).
    pub workspace: String,
    /// `copy-on-write` (your writes land in a layer the human reviews: see
    /// `limits.impossible`) or `live` (the human's own tree, guarded).
    pub workspace_mode: String,
    /// Network mode.
    pub network: String,
    /// The allowlist proxy's last refusals, oldest first: name, reason, the
    /// profile key that decides.
    pub network_refusals: Vec<String>,
    /// `[[credentials]]`: each one's name, the hosts it is sent to, whether
    /// the operator revoked it, how often it was put in and how many
    /// exfiltration attempts were refused (never a value; the variable
    /// holds a placeholder the proxy replaces).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Value>")]
    pub credentials: Option<serde_json::Value>,
    /// `[network] ask`: the questions waiting for a human (a name off the
    /// allow list holds its connection until answered; silence denies) and
    /// the names a human allowed, once or for the instance.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Value>")]
    pub approvals: Option<serde_json::Value>,
    /// Every layer as the sandbox reported it while starting.
    pub layers: Vec<LayerView>,
    /// Layers dropped (best-effort).
    pub dropped: Vec<String>,
    /// Toolsets' tools enabled now.
    pub tools_enabled: usize,
    /// Where the audit log is.
    pub audit_log: String,
    /// `ok`, or `full`/`failing` and why (then calls are refused).
    pub audit_state: String,
    /// Drift status.
    pub drift: String,
    /// Pane output bytes buffered.
    pub buffered_output_bytes: usize,
    /// OOM kills in the instance's cgroup (null without one).
    pub oom_kills: Option<u64>,
    /// The workspace guard (P8): the checkout's kind, what is read-only,
    /// watched, reverted. Declared as any value: its fields name
    /// themselves, and their schema would cost every conversation 330 bytes.
    #[schemars(with = "serde_json::Value")]
    pub workspace_guard: crate::guard::View,
    /// What the agent can rely on, and what it cannot do here.
    pub limits: Limits,
    /// Sessions, panes and host tmux clients now.
    pub in_use: Option<crate::mcp::bounds::InUse>,
    /// The --record file (null without one).
    pub recording: Option<crate::runtime::record::View>,
    /// The operator froze the sandbox: other calls are refused until thawed.
    pub frozen: bool,
    /// Host toolchains lent read-only: name, where found, host paths bound,
    /// variables set. (Left out of the output schema, which counts against
    /// the `tools/list` budget; an undeclared property is valid there.)
    #[schemars(skip)]
    pub toolchains: Vec<crate::profile::Lent>,
    /// Read-only profile paths that are symlinks on the host, as resolved
    /// (not in the output schema either).
    #[schemars(skip)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub symlinks_resolved: Vec<String>,
}

/// The limits an agent meets, in one place.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Limits {
    /// Paths that persist after the instance (read-write trees).
    pub writable: Vec<String>,
    /// Paths that are writable but vanish when the instance ends (tmpfs).
    pub vanishes_at_end: Vec<String>,
    /// Longest wait any call may ask for, in seconds.
    pub wait_max_seconds: u64,
    /// Largest text a call may send, in bytes.
    pub max_input_bytes: u64,
    /// Output sandmux keeps per pane (older output is dropped; screen captures still work).
    pub output_ring_bytes: usize,
    /// Sessions that may exist at once; creating one more is refused.
    pub max_sessions: u32,
    /// Panes that may exist at once, across all sessions.
    pub max_panes: u32,
    /// tmux clients the supervisor may run on the host (`1 + max_sessions`).
    pub max_host_clients: u32,
    /// What is impossible here, by policy.
    pub impossible: Vec<String>,
}

/// A layer in the status.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct LayerView {
    /// Layer name.
    pub layer: String,
    /// In force.
    pub enforced: bool,
    /// Detail or reason.
    pub detail: String,
}

fn limits(p: &crate::profile::Policy) -> Limits {
    use crate::profile::{MountKind, NetMode};
    let of = |k: MountKind| -> Vec<String> {
        p.fs.iter()
            .filter(|e| e.kind == k)
            .map(|e| e.path.display().to_string())
            .collect()
    };
    let mut impossible = vec![
        "reaching the host's tmux servers or any other tmux socket".to_string(),
        "gaining privileges (no capabilities, no_new_privs, no setuid)".into(),
    ];
    let live = p.workspace_mode == crate::profile::WorkspaceMode::Live;
    if let Some(id) = p.layer.as_ref().and_then(|l| l.file_name()) {
        let id = id.to_string_lossy();
        let (how, land) = match p.workspace_mode {
            crate::profile::WorkspaceMode::Copy => {
                ("a private copy", "in a copy of it made at start, here")
            }
            _ => ("copy-on-write", "in a layer"),
        };
        impossible.push(format!(
            "changing the host's copy of the workspace while you work ({how}): your writes land {land}; after this instance the human reviews it with `sandmux diff {id}` and brings it in with `sandmux apply {id}`: files, your commits as refs/sandmux/{id}/*, new repositories as repositories; version-control data and tool configuration held back. git init, hooks and config work here"
        ));
        if let Some((old, how)) = p.layer.as_deref().and_then(going_on_from) {
            impossible.push(format!(
                "going on with what ran before: this instance {how} the layer of instance {old}, so the workspace is as that agent left it, but its panes, processes and shell history did not come with it"
            ));
        }
    }
    if let Some(c) = p.guard.commit.as_ref().filter(|_| live) {
        let id = c.agent.parent().and_then(|d| d.file_name());
        let id = id.map(|i| i.to_string_lossy()).unwrap_or_default();
        impossible.push(format!(
            "changing the workspace's own .git (commit mode): your commits go to a repository of your own; after this instance the human brings them in with `sandmux git fetch {id}` (your branches as refs/sandmux/{id}/*; your edits are already in their working tree)"
        ));
    } else if live && p.guard.git != crate::profile::GitMode::Unguarded {
        impossible
            .push("changing git's control plane in the workspace (history is readable)".into());
    }
    if live && !p.guard.names.is_empty() {
        impossible.push("leaving tool configuration host programs obey (.envrc, .vscode, …): it is read-only or reverted".into());
    }
    impossible.push(format!(
        "more than {} sessions or {} panes at once (creating one more is refused)",
        p.limits.max_sessions, p.limits.max_panes
    ));
    impossible.push(match p.network.mode {
        NetMode::None | NetMode::Loopback => {
            "any network beyond the sandbox's own loopback, DNS included".into()
        }
        NetMode::Host => "TCP to ports the profile does not list".into(),
        NetMode::Proxy => format!(
            "any network but these names, through the proxy {} (no DNS, no UDP, no address by number): {}",
            crate::proxy::url(),
            crate::proxy::Config::of(&p.network)
                .map(|c| c.list().join(", "))
                .unwrap_or_default()
        ),
    });
    Limits {
        writable: of(MountKind::ReadWrite),
        vanishes_at_end: of(MountKind::Tmpfs),
        wait_max_seconds: p.mcp.wait_max_seconds,
        max_input_bytes: p.mcp.max_input_bytes,
        output_ring_bytes: crate::tmux::hub::RING_BYTES,
        max_sessions: p.limits.max_sessions,
        max_panes: p.limits.max_panes,
        max_host_clients: 1 + p.limits.max_sessions,
        impossible,
    }
}

/// The status.
pub(crate) async fn sandbox_status(c: &Call<'_>, _: NoArgs) -> Result<Status, ToolError> {
    let layers: Vec<LayerView> =
        c.s.info()
            .layers
            .iter()
            .map(|l| LayerView {
                layer: l.layer.name().into(),
                enforced: l.enforced,
                detail: l.detail.clone(),
            })
            .collect();
    let git_kernel = layers.iter().any(|l| l.layer == "git" && l.enforced);
    Ok(Status {
        profile: c.s.policy.name.clone(),
        description: c.s.policy.description.clone(),
        workspace: c.s.policy.workspace.display().to_string(),
        workspace_mode: match c.s.policy.workspace_mode {
            crate::profile::WorkspaceMode::Live => "live".into(),
            crate::profile::WorkspaceMode::CopyOnWrite => "copy-on-write".into(),
            crate::profile::WorkspaceMode::Copy => "copy".into(),
        },
        network: c.s.policy.network.mode.name().into(),
        network_refusals: c.s.refusals.since(0).0,
        credentials: c.s.vault.as_ref().map(|v| v.status()),
        approvals: (c.s.policy.network.ask || !c.s.policy.mcp.ask_toolsets.is_empty())
            .then(|| c.s.approvals.list()),
        dropped: layers
            .iter()
            .filter(|l| !l.enforced)
            .map(|l| l.layer.clone())
            .chain(
                c.s.policy
                    .workspace_fallback
                    .as_ref()
                    .map(|why| format!("workspace: {why}")),
            )
            .chain(c.s.policy.workspace_mode.not_guarded().map(str::to_string))
            .collect(),
        layers,
        tools_enabled: c.s.enabled.read().map(|e| e.len()).unwrap_or(0),
        audit_log: c.s.audit.path().display().to_string(),
        audit_state: audit_state(&c.s.audit.status()),
        drift: c.s.drift.tripped().unwrap_or_else(|| "none".into()),
        buffered_output_bytes: c.s.hub().buffered_bytes(),
        oom_kills: c.s.info().cgroup.as_ref().map(|cg| cg.oom_kills()),
        limits: limits(&c.s.policy),
        in_use: crate::mcp::bounds::in_use(&c.s.hub()).await.ok(),
        recording: c.s.record.as_ref().map(|r| r.view()),
        frozen: c.s.freeze.is_frozen(),
        toolchains: c.s.policy.toolchains.clone(),
        symlinks_resolved: crate::profile::links_said(&c.s.policy),
        workspace_guard: c.s.policy.guard.view(
            git_kernel,
            c.s.reverts.as_ref().map(|r| r.count()).unwrap_or(0),
            &c.s.reverts
                .as_ref()
                .map(|r| r.quarantine.clone())
                .unwrap_or_default(),
        ),
    })
}

/// `serve --resume` / `--fork`: the instance the layer at `dir` goes on
/// from, and how (`resumed`, `forked`), as its `meta.json` says.
fn going_on_from(dir: &std::path::Path) -> Option<(String, String)> {
    let text = std::fs::read(dir.join("meta.json")).ok()?;
    let meta: crate::supervisor::layer::Meta = serde_json::from_slice(&text).ok()?;
    meta.from
}
