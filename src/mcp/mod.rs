//! `sandmux serve`: the MCP tool layer over one control-mode connection to
//! the instance's own tmux server (P2, P3, P4, P7).
//!
//! Start-up order: select the tools (unknown names fail here, before any
//! sandbox exists) → open the audit log → start the sandboxed tmux server on
//! this (main) thread, so the sandbox's parent-death signal is tied to a thread
//! that lives as long as sandmux → create the hidden control session → start
//! the tokio runtime → connect the hub → record the configuration baseline →
//! serve MCP over stdio. End of stdin, SIGTERM, SIGINT, SIGHUP, `sandmux stop`,
//! `kill_server` or the server's death all end in the same teardown; a signal
//! during start-up ends it at the next step ([`exit`]).

pub(crate) mod audit;
mod backlog;
pub(crate) mod bounds;
pub(crate) mod broker;
pub(crate) mod catalog;
pub(crate) mod choices;
pub(crate) mod ctx;
pub(crate) mod drift;
pub(crate) mod endpoint;
pub(crate) mod error;
pub(crate) mod exit;
pub(crate) mod freeze;
mod generation;
mod hostfiles;
pub(crate) mod http;
pub(crate) mod oom;
pub(crate) mod prompts;
mod proxy;
pub(crate) mod record;
mod refusal;
pub mod replay_filter;
pub(crate) mod resources;
pub(crate) mod reverts;
pub(crate) mod schema;
pub(crate) mod server;
pub(crate) mod stdio;
pub(crate) mod targets;
pub(crate) mod text;
pub(crate) mod tools;
pub(crate) mod toolsets;

use crate::profile::{Policy, ServerExit, MAX_RESTARTS};
use crate::tmux::hub::{Hub, HubEvent};
use crate::tmux::Instance;
use generation::{confine_self, info_of, restart, sessions};
use hostfiles::{default_audit_path, outside_agent_writable, retain};
use rmcp::ServiceExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Options of `sandmux serve`.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Tool selection flags.
    pub flags: toolsets::Flags,
    /// Where the audit log goes (default: the state directory).
    pub audit_log: Option<PathBuf>,
    /// Start without the initial "main" session.
    pub no_session: bool,
    /// Write the first session's terminal output as an asciicast v2 file.
    pub record: Option<PathBuf>,
    /// Serve over streamable HTTP instead of stdio (`--http`).
    pub http: Option<http::Flags>,
}

/// Start-up was asked to stop (a signal, see [`exit`]): ends what exists,
/// seals the audit log with status 0 and returns 0.
fn stopped(audit: &audit::Audit, inst: Option<Instance>, sig: nix::sys::signal::Signal) -> i32 {
    tracing::info!(signal = %sig, "{sig} during start-up: stopped");
    if let Some(i) = inst {
        i.stop();
    }
    audit.seal(0);
    0
}

/// A set of tool names.
type Tools = std::collections::BTreeSet<&'static str>;

/// Start-up step 1: the tools `serve` offers (the ceiling) and those enabled
/// at start (with act = "on-grant", execute-class tools wait for a grant).
fn tools(policy: &Policy, opts: &Options) -> Result<(Tools, Tools), String> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let ceiling = toolsets::select(&policy.mcp.toolsets, policy.mcp.preset, &opts.flags, &env)
        .map_err(|e| e.to_string())?;
    let enabled = if policy.mcp.act == crate::profile::Act::OnGrant {
        ceiling
            .iter()
            .copied()
            .filter(|n| {
                catalog::find(n).is_some_and(|t| t.toolset != crate::profile::Toolset::Execute)
            })
            .collect()
    } else {
        ceiling.clone()
    };
    Ok((ceiling, enabled))
}

/// Start-up step 2: the audit log and the recording, each outside every tree
/// the agent can write; the user's retention for a log at the default path.
fn host_files(
    policy: &Policy,
    opts: &Options,
    id: &str,
) -> Result<(Arc<audit::Audit>, Option<Arc<record::Recording>>), String> {
    let audit_path = match opts.audit_log.clone() {
        Some(p) => p,
        None => default_audit_path(id)?,
    };
    let audit_path = outside_agent_writable(&audit_path, policy, "the audit log", "--audit-log")?;
    let record = opts
        .record
        .as_deref()
        .map(|r| outside_agent_writable(r, policy, "the recording", "--record"))
        .transpose()?;
    let record = record
        .map(|r| record::Recording::open(&r, policy.recording.max_bytes.0))
        .transpose()
        .map_err(|e| format!("--record: {e}"))?;
    let audit = audit::Audit::open(&audit_path, policy.mcp.audit_max_bytes.0)
        .map(Arc::new)
        .map_err(|e| format!("{e} (pass --audit-log PATH)"))?;
    if opts.audit_log.is_none() {
        retain(&audit).map_err(|e| e.to_string())?;
    }
    Ok((audit, record))
}

/// What start-up made: the sandbox and what `serve` holds beside it.
struct Started {
    inst: Instance,
    broker: Arc<broker::Broker>,
    control_id: String,
    tmux_version: String,
}

/// Start-up steps 3-5: the sandbox, the broker, the control and first
/// sessions. Ends what exists and gives the exit status on failure (or on
/// a stop that came meanwhile).
fn start(
    policy: &Policy,
    opts: &Options,
    stop: &exit::Stop,
    audit: &audit::Audit,
) -> Result<Started, i32> {
    // A start-up step that fails while a stop is pending is reported, and the
    // stop decides the status (a terminal's ^C reaches the sandbox too).
    let mut inst = Instance::start(policy.clone()).map_err(|e| {
        tracing::error!("{e}");
        match stop.signal() {
            Some(sig) => stopped(audit, None, sig),
            None => {
                refusal::tell_client(&e.message, &|| stop.signal().is_some());
                match stop.signal() {
                    Some(sig) => stopped(audit, None, sig),
                    None => e.exit_code(),
                }
            }
        }
    })?;
    if let Some(sig) = stop.signal() {
        return Err(stopped(audit, Some(inst), sig));
    }
    // What the confined supervisor cannot do itself (later generations, the
    // signals freezer) is the broker's, for this instance's final profile
    // (the workspace guard has added its paths).
    let broker = match broker::Broker::spawn(&inst.policy, &inst.rundir, &inst.tmux) {
        Ok(b) => Arc::new(b),
        Err(e) => {
            tracing::error!("{e}");
            inst.stop();
            audit.seal(crate::sandbox::EXIT_INTERNAL);
            return Err(crate::sandbox::EXIT_INTERNAL);
        }
    };
    inst.broker = Some(broker.clone());
    let control_id = match sessions(&inst, opts.no_session) {
        Ok(id) => id,
        Err(e) => {
            tracing::error!("{e}");
            return Err(match stop.signal() {
                Some(sig) => stopped(audit, Some(inst), sig),
                None => crate::sandbox::EXIT_INTERNAL,
            });
        }
    };
    if let Some(sig) = stop.signal() {
        return Err(stopped(audit, Some(inst), sig));
    }
    let tmux_version = std::process::Command::new(&inst.tmux)
        .arg("-V")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    Ok(Started {
        inst,
        broker,
        control_id,
        tmux_version,
    })
}

/// Start-up step 6: the HTTP listener (bound while the supervisor still may)
/// and the supervisor's confinement.
fn listen_and_confine(
    mut st: Started,
    http: Option<http::Plan>,
    audit: &audit::Audit,
    record: Option<&record::Recording>,
) -> Result<(Started, Option<http::Listening>), i32> {
    let fail = |st: Started, code: i32| {
        st.inst.stop();
        audit.seal(code);
        code
    };
    let listening = match http
        .map(|p| http::open(p, &st.inst.rundir.path))
        .transpose()
    {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("{e}");
            return Err(fail(st, crate::sandbox::EXIT_USAGE));
        }
    };
    match confine_self(&st.inst, audit, record) {
        Ok(status) => {
            tracing::debug!(layer = %status.layer, enforced = status.enforced, detail = %status.detail, "the supervisor's own layer");
            st.inst.supervisor = Some(status)
        }
        Err(e) => {
            tracing::error!("{e}");
            return Err(fail(st, e.exit_code()));
        }
    }
    Ok((st, listening))
}

/// The instance's description for `sandmux ps` and `stop`.
fn write_meta(inst: &Instance, policy: &Policy, audit: &audit::Audit, l: Option<&http::Listening>) {
    inst.rundir.write_meta(&serde_json::json!({
        "kind": "serve",
        "id": inst.rundir.id,
        "profile": policy.name,
        "workspace": policy.workspace,
        "audit_log": audit.path(),
        "pid": std::process::id(),
        "started": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        "http": l.map(|l| serde_json::json!({"url": l.url, "token_file": l.token_file})),
    }));
}

/// What the teardown needs once the runtime has stopped.
struct Leftovers {
    inst: Arc<std::sync::Mutex<Option<Instance>>>,
    oom: Option<Arc<oom::Watch>>,
    reverts: Option<Arc<reverts::Reverts>>,
    frozen: Arc<freeze::Freeze>,
    audit: Arc<audit::Audit>,
    /// The allowlist proxy's decisions (network mode `proxy`).
    flood: Arc<proxy::Flood>,
}

/// Runs the server; returns the process exit status. `stop` must have been
/// installed before any thread was started ([`exit::Stop::install`]).
pub(crate) fn serve(policy: Policy, opts: Options, stop: &exit::Stop) -> i32 {
    let (ceiling, enabled) = match tools(&policy, &opts) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("{e}");
            return crate::sandbox::EXIT_USAGE;
        }
    };
    let plan = match opts.http.as_ref().map(http::plan).transpose() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("{e}");
            return crate::sandbox::EXIT_USAGE;
        }
    };
    let id = crate::nonce::hex()[..12].to_string();
    let (audit, record) = match host_files(&policy, &opts, &id) {
        Ok(f) => f,
        Err(e) => {
            tracing::error!("{e}");
            return crate::sandbox::EXIT_USAGE;
        }
    };
    if let Some(sig) = stop.signal() {
        return stopped(&audit, None, sig);
    }
    let started = match start(&policy, &opts, stop, &audit) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let (mut st, listening) = match listen_and_confine(started, plan, &audit, record.as_deref()) {
        Ok(l) => l,
        Err(code) => return code,
    };
    // Started after confinement, so it is confined too.
    stop.take_signals();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("tokio: {e}");
            return crate::sandbox::EXIT_INTERNAL;
        }
    };
    write_meta(&st.inst, &policy, &audit, listening.as_ref());
    let info = info_of(&st.inst, st.tmux_version.clone());
    let left = Leftovers {
        oom: info
            .cgroup
            .clone()
            .map(|cg| oom::Watch::new(audit.clone(), cg)),
        reverts: st
            .inst
            .guard
            .as_ref()
            .map(|g| reverts::Reverts::new(audit.clone(), g.taken(), g.quarantine_dir())),
        frozen: Arc::new(freeze::Freeze::default()),
        flood: proxy::Flood::new(audit.clone()),
        audit: audit.clone(),
        inst: Arc::new(std::sync::Mutex::new(None)),
    };
    // The allowlist proxy's listener, made in the sandbox's network namespace.
    let proxy = match st
        .inst
        .proxy
        .take()
        .map(|l| crate::proxy::Config::of(&policy.network).map(|c| (l, c)))
    {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err((k, e))) => {
            tracing::error!("{k}: {e}");
            return crate::sandbox::EXIT_INTERNAL;
        }
    };
    let watchers = policy.limits.max_sessions as usize;
    let (socket, tmux, rundir) = (
        st.inst.socket(),
        st.inst.tmux.clone(),
        st.inst.rundir.path.clone(),
    );
    let (control_id, broker) = (st.control_id.clone(), st.broker.clone());
    *left.inst.lock().unwrap_or_else(|p| p.into_inner()) = Some(st.inst);
    let shutdown = stop.token();
    let (reverts, frozen) = (left.reverts.clone(), left.frozen.clone());
    let make = move |hub: Arc<Hub>| {
        Arc::new(ctx::State {
            hub_now: std::sync::RwLock::new(hub),
            max_input: policy.mcp.max_input_bytes as usize,
            wait_max: Duration::from_secs(policy.mcp.wait_max_seconds),
            policy,
            info_now: std::sync::RwLock::new(info),
            audit,
            backlog: Default::default(),
            drift: Arc::new(drift::Drift::default()),
            shutdown,
            enabled: std::sync::RwLock::new(enabled),
            ceiling,
            record,
            peers: Default::default(),
            http: Default::default(),
            reverts,
            commands: Default::default(),
            creating: Default::default(),
            freeze: frozen,
            broker: Some(broker),
        })
    };
    let conn = Conn {
        tmux,
        socket,
        control_id,
        rundir,
        no_session: opts.no_session,
        watchers,
        proxy,
    };
    let (code, state) = rt.block_on(run(make, conn, &left, listening, stop.token()));
    // stdin's reader is a blocking thread that only ends when the client
    // writes or closes: never wait for it (the process exits right after).
    rt.shutdown_background();
    if let Some(h) = state.as_ref().and_then(|s| s.http.get()) {
        h.flush(&left.audit);
    }
    teardown(left, code)
}

/// How `run` reaches the first server generation.
struct Conn {
    tmux: PathBuf,
    socket: PathBuf,
    control_id: String,
    rundir: PathBuf,
    no_session: bool,
    /// Hub watchers: the profile's session limit.
    watchers: usize,
    /// The allowlist proxy's listener and configuration (network mode `proxy`).
    proxy: Option<(std::net::TcpListener, crate::proxy::Config)>,
}

/// The runtime's part: the hub, the state, the watchers, then MCP over
/// stdio or HTTP until the stop. Returns the status and the state.
async fn run(
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

/// The last step: a last OOM check, the sandbox ended (killed where it
/// stands if frozen), the reverts recorded, the audit log sealed.
fn teardown(left: Leftovers, code: i32) -> i32 {
    // A kill in the last second, or the one that ended the instance, is
    // recorded while the cgroup still exists.
    if let Some(w) = &left.oom {
        w.check();
    }
    let last = left.inst.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(inst) = last {
        // A frozen sandbox is killed where it stands: nothing inside runs again.
        if left.frozen.is_frozen() {
            let t = crate::sandbox::freeze::Target {
                init_pid: inst.init_pid(),
                cgroup: inst.rundir.cgroup.clone(),
            };
            let b = inst.broker.clone();
            crate::sandbox::freeze::kill(&t, &|op, pid| freeze::signals(&b, op, pid));
        }
        let taken = inst.stop();
        if let Some(r) = &left.reverts {
            r.record(&taken);
        }
    }
    left.flood.finish();
    left.audit.seal(code);
    tracing::debug!(code, "shutdown: the instance ended");
    code
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
