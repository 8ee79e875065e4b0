//! `serve`'s runtime part: the hub, the state, the watchers (drift, OOM
//! kills, reverts, the server's death, the operator endpoint), then MCP
//! over stdio or HTTP until the stop.

use super::{backlog, ctx, http, server, stdio};
use crate::profile::{ServerExit, MAX_RESTARTS};
use crate::runtime::endpoint;
use crate::runtime::generation::restart;
use crate::runtime::oom;
use crate::runtime::teardown::Leftovers;
use crate::supervisor::Instance;
use crate::tmux::hub::{Hub, HubEvent};
use rmcp::ServiceExt;
use std::path::PathBuf;
use std::sync::Arc;

/// How `run` reaches the first server generation.
pub(super) struct Conn {
    pub(super) tmux: PathBuf,
    pub(super) socket: PathBuf,
    /// What the command client makes on the server, and how it knows it.
    pub(super) genesis: crate::tmux::genesis::Genesis,
    pub(super) rundir: PathBuf,
    pub(super) no_session: bool,
    /// Hub watchers: the profile's session limit.
    pub(super) watchers: usize,
    /// The allowlist proxy's listener and configuration (network mode `proxy`).
    pub(super) proxy: Option<(std::net::TcpListener, crate::proxy::Config)>,
    /// The credentials the proxy puts in.
    pub(super) vault: Option<Arc<crate::proxy::credentials::Vault>>,
    /// `[network] ask`: who the proxy asks about a name off the list.
    pub(super) ask: Option<crate::proxy::ask::Asker>,
}

/// The runtime's part: the hub, the state, the watchers, then MCP over
/// stdio or HTTP until the stop. Returns the status and the state.
pub(super) async fn run(
    make: impl FnOnce(Arc<Hub>) -> Arc<ctx::State>,
    c: Conn,
    left: &Leftovers,
    listening: Option<http::Listening>,
    shutdown: tokio_util::sync::CancellationToken,
) -> (i32, Option<Arc<ctx::State>>) {
    // A stop that came meanwhile (the token is the signals' too) ends here.
    let stopping = |code| if shutdown.is_cancelled() { 0 } else { code };
    if shutdown.is_cancelled() {
        return (0, None);
    }
    if let Some((l, cfg)) = c.proxy {
        let hooks = crate::proxy::ask::Hooks {
            vault: c.vault.clone(),
            ask: c.ask.clone(),
        };
        left.flood.start(l, cfg, hooks);
    }
    let hub = match Hub::spawn(&c.tmux, &c.socket, c.genesis, c.watchers).await {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("{e}");
            return (stopping(crate::sandbox::EXIT_INTERNAL), None);
        }
    };
    let state = make(hub.clone());
    // The operator endpoint, beside the socket in the private runtime
    // directory, bound now: `stop`, `status`, `revoke` and `grant` act at
    // once, a freeze or thaw once the instance is ready.
    match endpoint::bind(&c.rundir.join("control.sock")) {
        Ok(l) => {
            let ep = state.clone();
            tokio::spawn(async move {
                if let Err(e) = endpoint::serve(l, ep).await {
                    tracing::error!("operator endpoint: {e}");
                }
            });
        }
        Err(e) => tracing::error!("operator endpoint: {e}"),
    }
    // The MCP handshake needs no tmux: it runs while the sessions, the
    // watchers and the drift baseline are made; calls wait for them.
    let serve = async {
        match listening {
            Some(l) => over_http(&state, l).await,
            None => over_stdio(&state).await,
        }
    };
    let ready = async {
        // A stop during start-up ends it (the status is then 0).
        let r = tokio::select! {
            r = ready_up(&state, &hub, c.no_session, left) => r,
            _ = shutdown.cancelled() => Err(("stopped while starting".to_string(), 0)),
        };
        let failed = r.as_ref().err().map(|(e, code)| {
            match code {
                0 => tracing::info!("{e}"),
                _ => tracing::error!("{e}"),
            }
            stopping(*code)
        });
        state.ready.send_replace(Some(r.map_err(|(e, _)| e)));
        if failed.is_some() {
            state.hub().shutdown();
            // The calls that waited write their error first.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            shutdown.cancel();
        }
        failed
    };
    let (code, failed) = tokio::join!(serve, ready);
    shutdown.cancel();
    state.hub().shutdown();
    (failed.unwrap_or(stopping(code)), Some(state))
}

/// What calls wait for: the sessions and their watchers, the drift
/// baseline, the background watchers and the recording. A failure carries the exit status.
async fn ready_up(
    state: &Arc<ctx::State>,
    hub: &Arc<Hub>,
    no_session: bool,
    left: &Leftovers,
) -> Result<(), (String, i32)> {
    let internal = |e: String| (e, crate::sandbox::EXIT_INTERNAL);
    hub.created().await.map_err(internal)?;
    state
        .drift
        .record(hub)
        .await
        .map_err(|e| internal(e.to_string()))?;
    let st = state.clone();
    tokio::spawn(async move { st.drift.scanner(|| st.hub()).await });
    if let Some(w) = &left.oom {
        tokio::spawn(w.clone().run());
    }
    if let Some(r) = &left.reverts {
        tokio::spawn(r.clone().run());
    }
    // The copy-on-write layer's bound, watched until the instance ends.
    if let Some(w) = crate::runtime::freeze::watch_layer(&state.rt) {
        let sd = state.shutdown.clone();
        tokio::spawn(async move {
            sd.cancelled().await;
            drop(w);
        });
    }
    tokio::spawn(watch_server(
        state.clone(),
        left.inst.clone(),
        left.oom.clone(),
        no_session,
    ));
    if let Some(rec) = &state.record {
        rec.start(hub, hub.control_session_id())
            .await
            .map_err(|e| (format!("--record: {e}"), crate::sandbox::EXIT_USAGE))?;
    }
    Ok(())
}

/// MCP over stdio until the client leaves or the stop.
async fn over_stdio(state: &Arc<ctx::State>) -> i32 {
    let shutdown = state.shutdown.clone();
    let server = server::Server { s: state.clone() };
    tracing::debug!(
        tools = state.enabled.read().map(|e| e.len()).unwrap_or(0),
        "serving MCP on stdio"
    );
    let running = tokio::select! {
        r = server.serve_with_ct(metered(state), shutdown.clone()) => match r {
            Ok(r) => r,
            Err(e) => {
                if !shutdown.is_cancelled() {
                    tracing::error!("MCP start-up: {e}");
                }
                return 1;
            }
        },
        _ = shutdown.cancelled() => return 0,
    };
    state.peers.add(running.peer().clone());
    match running.waiting().await {
        Ok(_) => 0,
        Err(_) => 1,
    }
}

/// MCP over HTTP until the stop (or the idle timeout); clients coming and
/// going do not end the instance.
async fn over_http(state: &Arc<ctx::State>, l: http::Listening) -> i32 {
    match http::serve(state.clone(), l, state.shutdown.clone()).await {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("--http: {e}");
            1
        }
    }
}

/// The server's death: end the instance, or restart as the profile says.
/// (Termination signals cancel `shutdown` from the signal thread, exit.rs.)
async fn watch_server(
    st: Arc<ctx::State>,
    cell: Arc<std::sync::Mutex<Option<Instance>>>,
    w: Option<Arc<oom::Watch>>,
    no_session: bool,
) {
    let sd = st.shutdown.clone();
    let mut restarts = 0;
    loop {
        let mut events = st.hub().events.subscribe();
        let why = loop {
            match events.recv().await {
                Ok(HubEvent::ServerGone(why)) => break why,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return,
            }
        };
        if sd.is_cancelled() {
            return;
        }
        // A freeze never closes the connection; a server that dies
        // frozen is not replaced by one that runs.
        if st.freeze.is_frozen() {
            tracing::warn!(why = %why, "the sandboxed tmux server is gone ({why}) while frozen; ending the instance");
            sd.cancel();
            return;
        }
        if st.policy.mcp.on_server_exit == ServerExit::Restart && restarts < MAX_RESTARTS {
            restarts += 1;
            let baseline = async |hub: &Hub| st.drift.record(hub).await.map_err(|e| e.to_string());
            match restart(&st, &cell, w.as_ref(), no_session, &why, restarts, baseline).await {
                Ok(()) => {
                    tracing::warn!(why = %why, restarts, "the sandboxed tmux server is gone ({why}); restarted it ({restarts} of {MAX_RESTARTS})");
                    continue;
                }
                Err(e) => tracing::error!("restarting the tmux server failed: {e}"),
            }
        }
        tracing::warn!(why = %why, "the sandboxed tmux server is gone ({why}); ending the instance");
        sd.cancel();
        return;
    }
}

/// stdio, its read half gated and its write half paying the backlog of
/// answers (`backlog`).
fn metered(state: &ctx::State) -> (stdio::Reader, stdio::Writer) {
    let (r, w) = stdio::transport();
    let b = &state.backlog;
    (
        Box::new(backlog::Gated::new(r, b.clone())),
        Box::new(backlog::Metered::new(w, b.clone())),
    )
}
