//! What every tool call sees: the shared state of the instance, and the
//! per-call context (deadline ceiling, progress, cancellation).

use super::audit::Audit;
use crate::profile::Policy;
use crate::sandbox::report::LayerStatus;
use crate::tmux::hub::Hub;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Facts about the running instance.
#[derive(Debug, Clone)]
pub(crate) struct InstanceInfo {
    /// The generation id set in the server at start.
    pub generation: String,
    /// The server's pid inside the sandbox.
    pub server_pid: i32,
    /// `tmux -V`.
    pub tmux_version: String,
    /// Layers as the sandbox reported them.
    pub layers: Vec<LayerStatus>,
    /// Host pid of the sandbox init (for status).
    pub init_pid: u32,
    /// The instance's cgroup, when it has one (for OOM counts).
    pub cgroup: Option<crate::sandbox::cgroup::Cgroup>,
}

/// State shared by all calls.
pub(crate) struct State {
    /// The connection to the server (replaced when a new generation starts).
    pub hub_now: std::sync::RwLock<Arc<Hub>>,
    /// The resolved profile.
    pub policy: Policy,
    /// Instance facts (replaced when a new generation starts).
    pub info_now: std::sync::RwLock<InstanceInfo>,
    /// The audit log.
    pub audit: Arc<Audit>,
    /// Answers not yet written to the client.
    pub(crate) backlog: Arc<super::backlog::Backlog>,
    /// Configuration baseline for drift detection.
    pub drift: Arc<super::drift::Drift>,
    /// Cancelled to end the instance (kill_server, drift on a fatal scale, signals).
    pub shutdown: CancellationToken,
    /// Largest text input per call.
    pub max_input: usize,
    /// Ceiling for every wait.
    pub wait_max: Duration,
    /// Tools enabled now (changes when a human revokes or grants).
    pub enabled: std::sync::RwLock<std::collections::BTreeSet<&'static str>>,
    /// The most that may ever be enabled: what the instance started with.
    pub ceiling: std::collections::BTreeSet<&'static str>,
    /// Whether `run_command` may make the first session again once the
    /// last shell exited (not with `--no-session`, nor with
    /// `create_session` excluded by name).
    pub remake_session: bool,
    /// The `--record` recording, if any.
    pub record: Option<Arc<crate::runtime::record::Recording>>,
    /// The MCP clients, once connected (for tools/list_changed).
    pub peers: Peers,
    /// `serve --http`: its URL, token file and counters, once it listens.
    pub(crate) http: std::sync::OnceLock<super::http::Info>,
    /// Long commands (`command_id`s for `wait_for_command`).
    pub commands: super::tools::commands::Commands,
    /// The workspace guard's reverts (counted in the status, audited).
    pub reverts: Option<Arc<crate::runtime::reverts::Reverts>>,
    /// Held by every tool that makes a session or pane, from counting to
    /// creating (see `mcp::bounds`).
    pub creating: tokio::sync::Mutex<()>,
    /// Whether the operator froze the sandbox (see `mcp::freeze`).
    pub freeze: Arc<super::freeze::Freeze>,
    /// What the confined supervisor has done unconfined (`mcp::broker`).
    pub broker: Option<Arc<crate::supervisor::broker::Broker>>,
    /// Set once the first sessions, their watchers and the drift baseline
    /// exist (the MCP handshake does not wait for them; calls do).
    pub ready: tokio::sync::watch::Sender<Option<Result<(), String>>>,
    /// The allowlist proxy's last refusals (network mode `proxy`).
    pub refusals: Arc<crate::proxy::refusals::Refusals>,
    /// The credentials the proxy puts in (`[[credentials]]`).
    pub vault: Option<Arc<crate::proxy::credentials::Vault>>,
    /// The workspace's history: a checkpoint after each changing call
    /// (`supervisor::history`; None in live mode).
    pub(crate) history: Option<Arc<std::sync::Mutex<crate::supervisor::history::History>>>,
    /// Questions to a human and their grants (`[network] ask`).
    pub approvals: Arc<crate::runtime::approvals::Approvals>,
    /// Tool questions held between the rounds of a 2026-07-28 call.
    pub rounds: crate::runtime::rounds::Rounds,
    /// Ports of the sandbox exposed on the host (`sandmux expose`).
    pub exposures: super::expose::Exposures,
}

/// Connected MCP clients: the one over stdio, or one per HTTP session (at
/// most the session cap; closed ones are dropped as others come).
#[derive(Default)]
pub(crate) struct Peers(std::sync::Mutex<Vec<Peer<RoleServer>>>);

impl Peers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Peer<RoleServer>>> {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|p| !p.is_transport_closed());
        v
    }

    /// A client that completed its handshake.
    pub(crate) fn add(&self, p: Peer<RoleServer>) {
        self.lock().push(p);
    }

    /// How many are connected.
    pub(crate) fn connected(&self) -> usize {
        self.lock().len()
    }

    /// Tells each that the tool list changed.
    pub(crate) async fn tools_changed(&self) {
        let all: Vec<Peer<RoleServer>> = self.lock().clone();
        for p in all {
            let _ = p.notify_tool_list_changed().await;
        }
    }
}

impl State {
    /// The connection to the current server generation.
    pub(crate) fn hub(&self) -> Arc<Hub> {
        self.hub_now
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Facts about the current server generation.
    pub(crate) fn info(&self) -> InstanceInfo {
        self.info_now
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until the instance can take calls ([`State::ready`]).
    pub(crate) async fn until_ready(&self) -> Result<(), super::error::ToolError> {
        let mut rx = self.ready.subscribe();
        let r = match rx.wait_for(|r| r.is_some()).await {
            Ok(r) => r.clone().unwrap_or(Ok(())),
            Err(_) => Err("the instance is ending".into()),
        };
        r.map_err(|why| {
            crate::tmux::client::TmuxError::Closed(format!("the sandbox did not start: {why}"))
                .into()
        })
    }

    /// Switches to a new server generation.
    pub(crate) fn replace(&self, hub: Arc<Hub>, info: InstanceInfo) {
        *self.hub_now.write().unwrap_or_else(|p| p.into_inner()) = hub;
        *self.info_now.write().unwrap_or_else(|p| p.into_inner()) = info;
    }
}

/// One tool call.
pub(crate) struct Call<'a> {
    /// Shared state.
    pub s: &'a State,
    /// Progress reporting, when the client asked for it.
    pub progress: Option<(Peer<RoleServer>, ProgressToken)>,
    /// Where the call's progress starts: past what a wait for a human's
    /// answer reported on the same token (progress only ever increases).
    pub progress_from: f64,
    /// Cancelled when the client cancels the call.
    pub ct: CancellationToken,
    /// When the request arrived (a wait for a human's answer included):
    /// under `--upstream-timeout`, waits get what is left of it.
    pub started: std::time::Instant,
}

impl Call<'_> {
    /// Clamps a requested wait to the profile's ceiling.
    pub(crate) fn clamp(
        &self,
        requested_secs: Option<f64>,
        default_secs: f64,
    ) -> Result<Duration, super::error::ToolError> {
        let want = requested_secs.unwrap_or(default_secs);
        if !(want.is_finite() && want > 0.0) {
            return Err(super::error::ToolError::invalid(
                "timeout",
                "must be a positive number of seconds",
                "e.g. 10",
            ));
        }
        // Clamp before converting: a huge number does not fit a Duration.
        let ceiling = super::http::router::left(self.started, self.s.wait_max);
        Ok(Duration::from_secs_f64(want.min(ceiling.as_secs_f64())))
    }

    /// Sends a progress notification if the client gave a token.
    pub(crate) async fn progress(&self, done: f64, total: Option<f64>, message: &str) {
        if let Some((peer, token)) = &self.progress {
            let from = self.progress_from;
            let mut p = ProgressNotificationParam::new(token.clone(), from + done)
                .with_message(message.to_string());
            if let Some(t) = total {
                p = p.with_total(from + t);
            }
            let _ = peer.notify_progress(p).await;
        }
    }
}
