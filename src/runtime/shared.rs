//! What the running instance shares with every caller: the current server
//! generation, the resolved profile, the audit log and the runtime's parts
//! (freeze, approvals, exposures, reverts, recording). The protocol's state
//! (`mcp::ctx::State`: the tools enabled, the clients, the transports) holds
//! one and reads through to it.

use crate::audit::Audit;
use crate::profile::Policy;
use crate::sandbox::report::LayerStatus;
use crate::tmux::client::TmuxError;
use crate::tmux::hub::Hub;
use std::sync::Arc;
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

/// The runtime's state, shared by all calls and the operator endpoint.
pub(crate) struct Shared {
    /// The connection to the server (replaced when a new generation starts).
    pub hub_now: std::sync::RwLock<Arc<Hub>>,
    /// The resolved profile.
    pub policy: Policy,
    /// Instance facts (replaced when a new generation starts).
    pub info_now: std::sync::RwLock<InstanceInfo>,
    /// The audit log.
    pub audit: Arc<Audit>,
    /// Cancelled to end the instance (kill_server, drift on a fatal scale, signals).
    pub shutdown: CancellationToken,
    /// The `--record` recording, if any.
    pub record: Option<Arc<super::record::Recording>>,
    /// The workspace guard's reverts (counted in the status, audited).
    pub reverts: Option<Arc<super::reverts::Reverts>>,
    /// Whether the operator froze the sandbox (see `runtime::freeze`).
    pub freeze: Arc<super::freeze::Freeze>,
    /// What the confined supervisor has done unconfined (`supervisor::broker`).
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
    pub approvals: Arc<super::approvals::Approvals>,
    /// Tool questions held between the rounds of a 2026-07-28 call.
    pub rounds: super::rounds::Rounds,
    /// Ports of the sandbox exposed on the host (`sandmux expose`).
    pub exposures: super::expose::Exposures,
}

impl Shared {
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

    /// Waits until the instance can take calls ([`Shared::ready`]).
    pub(crate) async fn until_ready(&self) -> Result<(), TmuxError> {
        let mut rx = self.ready.subscribe();
        let r = match rx.wait_for(|r| r.is_some()).await {
            Ok(r) => r.clone().unwrap_or(Ok(())),
            Err(_) => Err("the instance is ending".into()),
        };
        r.map_err(|why| TmuxError::Closed(crate::tmux::closing::Closing::NotStarted(why)))
    }

    /// Switches to a new server generation.
    pub(crate) fn replace(&self, hub: Arc<Hub>, info: InstanceInfo) {
        *self.hub_now.write().unwrap_or_else(|p| p.into_inner()) = hub;
        *self.info_now.write().unwrap_or_else(|p| p.into_inner()) = info;
    }
}
