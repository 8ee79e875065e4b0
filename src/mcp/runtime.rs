//! `serve`'s runtime part: the hub, the state, the watchers (drift, OOM
//! kills, reverts, the server's death, the operator endpoint), then MCP
//! over stdio or HTTP until the stop.

use super::generation::restart;
use super::{backlog, ctx, endpoint, http, oom, server, stdio, Leftovers};
use crate::profile::{ServerExit, MAX_RESTARTS};
use crate::tmux::hub::{Hub, HubEvent};
use crate::tmux::Instance;
use rmcp::ServiceExt;
use std::path::PathBuf;
use std::sync::Arc;

/// How `run` reaches the first server generation.
pub(super) struct Conn {
    pub(super) tmux: PathBuf,
    pub(super) socket: PathBuf,
    pub(super) control_id: String,
    pub(super) rundir: PathBuf,
    pub(super) no_session: bool,
    /// Hub watchers: the profile's session limit.
    pub(super) watchers: usize,
    /// The allowlist proxy's listener and configuration (network mode `proxy`).
    pub(super) proxy: Option<(std::net::TcpListener, crate::proxy::Config)>,
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
        left.flood.start(l, cfg);
    }
    let hub = match Hub::connect(&c.tmux, &c.socket, &c.control_id, c.watchers).await {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("{e}");
            return (stopping(crate::sandbox::EXIT_INTERNAL), None);
        }
    };
    let state = make(hub.clone());
    if let Err(e) = state.drift.record(&hub).await {
        tracing::error!("{e}");
        hub.shutdown();
        return (stopping(crate::sandbox::EXIT_INTERNAL), Some(state));
    }
    let st = state.clone();
    tokio::spawn(async move { st.drift.scanner(|| st.hub()).await });
    if let Some(w) = &left.oom {
        tokio::spawn(w.clone().run());
    }
    if let Some(r) = &left.reverts {
        tokio::spawn(r.clone().run());
    }
    tokio::spawn(watch_server(
        state.clone(),
        left.inst.clone(),
        left.oom.clone(),
        c.no_session,
    ));
    // The operator endpoint, beside the socket in the private runtime directory.
    let ep = state.clone();
    let ep_path = c.rundir.join("control.sock");
    tokio::spawn(async move {
        if let Err(e) = endpoint::serve(&ep_path, ep).await {
            tracing::error!("operator endpoint: {e}");
        }
    });
    if let Some(rec) = &state.record {
        if let Err(e) = rec.start(&hub, &c.control_id).await {
            tracing::error!("--record: {e}");
            state.hub().shutdown();
            return (stopping(crate::sandbox::EXIT_USAGE), Some(state));
        }
    }
    let code = match listening {
        Some(l) => over_http(&state, l).await,
        None => over_stdio(&state).await,
    };
    shutdown.cancel();
    state.hub().shutdown();
    (stopping(code), Some(state))
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
            match restart(&st, &cell, w.as_ref(), no_session, &why, restarts).await {
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
