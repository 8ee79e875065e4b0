//! What every tool call sees: the shared state of the instance, and the
//! per-call context (deadline ceiling, progress, cancellation).

use crate::runtime::shared::Shared;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// State shared by all calls: the protocol's part here, the runtime's
/// ([`Shared`]: the server generation, the policy, the audit log, freeze,
/// approvals…) read through [`State::rt`] (and `Deref`, so `s.audit` is
/// the runtime's audit log).
pub(crate) struct State {
    /// The instance's runtime.
    pub rt: Arc<Shared>,
    /// Answers not yet written to the client.
    pub(crate) backlog: Arc<super::backlog::Backlog>,
    /// Configuration baseline for drift detection.
    pub drift: Arc<super::drift::Drift>,
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
    /// The MCP clients, once connected (for tools/list_changed).
    pub peers: Peers,
    /// `serve --http`: its URL, token file and counters, once it listens.
    pub(crate) http: std::sync::OnceLock<super::http::Info>,
    /// Long commands (`command_id`s for `wait_for_command`).
    pub commands: super::tools::commands::Commands,
    /// Held by every tool that makes a session or pane, from counting to
    /// creating (see `mcp::bounds`).
    pub creating: tokio::sync::Mutex<()>,
}

impl std::ops::Deref for State {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.rt
    }
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
    /// Waits until the instance can take calls ([`Shared::ready`]).
    pub(crate) async fn until_ready(&self) -> Result<(), super::error::ToolError> {
        Ok(self.rt.until_ready().await?)
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
