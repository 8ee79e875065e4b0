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

pub(crate) use crate::audit;
mod backlog;
pub(crate) mod bounds;
pub(crate) mod catalog;
pub(crate) mod choices;
pub(crate) mod ctx;
pub(crate) mod drift;
pub(crate) mod error;
pub(crate) mod http;
pub(crate) mod metrics;
mod operated;
pub(crate) mod prompts;
pub(crate) mod refusal;
pub(crate) mod resources;
mod runtime;
pub(crate) mod schema;
pub(crate) mod server;
pub(crate) mod shown;
pub(crate) mod stdio;
pub(crate) mod targets;
pub(crate) mod text;
pub(crate) mod tools;
pub(crate) mod toolsets;

use crate::profile::Policy;
use crate::runtime::generation::{confine_self, info_of};
use crate::runtime::hostfiles::{outside_agent_writable, retain};
use crate::runtime::teardown::{leftovers, teardown, Leftovers};
use crate::runtime::{exit, record, rounds};
use crate::supervisor::Instance;
use crate::tmux::hub::Hub;
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
    /// `--resume ID` / `--fork ID`: the kept layer the workspace goes on from.
    pub from: Option<crate::supervisor::layer_from::LayerFrom>,
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
        None => audit::default_path(id).map_err(|e| e.to_string())?,
    };
    let audit_path = outside_agent_writable(&audit_path, policy, "the audit log", "--audit-log")
        .map_err(|e| e.to_string())?;
    let record = opts
        .record
        .as_deref()
        .map(|r| outside_agent_writable(r, policy, "the recording", "--record"))
        .transpose()
        .map_err(|e| e.to_string())?;
    let record = record
        .map(|r| record::Recording::open(&r, policy.recording.max_bytes.0))
        .transpose()
        .map_err(|e| format!("--record: {e}"))?;
    let audit = audit::Audit::open(
        &audit_path,
        policy.mcp.audit_max_bytes.0,
        catalog::secrets(),
    )
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
    broker: Arc<crate::supervisor::broker::Broker>,
    tmux_version: String,
}

/// Start-up steps 3-4: the broker and the sandbox (the sessions are the
/// hub's, step 7). Ends what exists and gives the exit status on failure (or on
/// a stop that came meanwhile).
fn start(
    creds: crate::supervisor::launch::Credentialed,
    stop: &exit::Stop,
    audit: &audit::Audit,
    id: &str,
) -> Result<Started, i32> {
    // What the confined supervisor cannot do itself (later generations, the
    // signals freezer) is the broker's. It is started from this thread (its
    // parent-death signal follows the thread that forked it, and this one
    // lives as long as the instance), first: its start overlaps the
    // sandbox's.
    let broker = crate::supervisor::broker::Broker::spawn();
    // A start-up step that fails while a stop is pending is reported, and the
    // stop decides the status (a terminal's ^C reaches the sandbox too).
    let mut inst = Instance::start(creds, crate::supervisor::Proof::Hub, id).map_err(|e| {
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
    // The broker (started before the sandbox) works for this instance's
    // final profile: the workspace guard has added its paths.
    let broker = broker.and_then(|b| {
        b.configure(&inst.policy, &inst.rundir, &inst.tmux)
            .map(|()| b)
    });
    let broker = match broker {
        Ok(b) => Arc::new(b),
        Err(e) => {
            tracing::error!("{e}");
            inst.stop();
            audit.seal(crate::sandbox::EXIT_INTERNAL);
            return Err(crate::sandbox::EXIT_INTERNAL);
        }
    };
    inst.broker = Some(broker.clone());
    if let Some(sig) = stop.signal() {
        return Err(stopped(audit, Some(inst), sig));
    }
    let tmux_version = inst.tmux_version.clone();
    Ok(Started {
        inst,
        broker,
        tmux_version,
    })
}

/// Start-up step 5: the HTTP listener (bound while the supervisor still may)
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
        .map(|p| http::open(p, &st.inst.rundir.path, &writable(&st.inst.policy)))
        .transpose()
    {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("{e}");
            return Err(fail(st, crate::sandbox::EXIT_USAGE));
        }
    };
    let reads = listening
        .as_ref()
        .map(|l| l.reads.as_slice())
        .unwrap_or(&[]);
    match confine_self(&st.inst, audit, record, reads) {
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

/// What the sandbox can write on the host: the workspace and the profile's
/// read-write binds (a rotated token file must not be under any of them).
fn writable(policy: &crate::profile::Policy) -> Vec<std::path::PathBuf> {
    use crate::profile::MountKind;
    std::iter::once(policy.workspace.clone())
        .chain(
            policy
                .fs
                .iter()
                .filter(|e| e.kind == MountKind::ReadWrite)
                .map(|e| e.path.clone()),
        )
        .collect()
}

/// The instance's description for `sandmux ps` and `stop`.
fn write_meta(inst: &Instance, policy: &Policy, audit: &audit::Audit, l: Option<&http::Listening>) {
    use crate::supervisor::rundir::{HttpMeta, Kind, Meta};
    let mut meta = Meta::now(
        Kind::Serve,
        &inst.rundir.id,
        &policy.name,
        &policy.workspace,
    );
    meta.audit_log = Some(audit.path().to_path_buf());
    meta.http = l.map(|l| HttpMeta {
        url: l.url.clone(),
        token_file: l.token_file.clone(),
    });
    inst.rundir.write_meta(&meta);
}

/// What the host side prepared before any sandbox exists (steps 1-2).
struct Prepared {
    /// The ceiling and the tools enabled at start ([`tools`]).
    tools: (Tools, Tools),
    /// The `--http` plan, checked.
    http: Option<http::Plan>,
    /// The instance id: the rundir's, the layer's and the audit log's name.
    id: String,
    /// Whether `run_command` may make the first session again once the
    /// last shell exited: there was one, and `create_session` was not
    /// excluded by name.
    remake_session: bool,
    audit: Arc<audit::Audit>,
    record: Option<Arc<record::Recording>>,
    /// The credentials (`[[credentials]]`), read before the broker exists.
    vault: Option<Arc<crate::proxy::credentials::Vault>>,
}

/// Start-up steps 1-2, on the host before any sandbox exists: the tools,
/// the `--http` plan, the instance id and the host files.
fn prepare(policy: &Policy, opts: &Options) -> Result<Prepared, String> {
    let tools = tools(policy, opts)?;
    let http = opts.http.as_ref().map(http::plan).transpose()?;
    let id = crate::supervisor::rundir::Rundir::new_id();
    let env: Vec<(String, String)> = std::env::vars().collect();
    let remake_session =
        !opts.no_session && !toolsets::excludes(&opts.flags, &env, "create_session");
    let (audit, record) = host_files(policy, opts, &id)?;
    Ok(Prepared {
        tools,
        http,
        id,
        remake_session,
        audit,
        record,
        vault: None,
    })
}

/// Runs the server; returns the process exit status. `stop` must have been
/// installed before any thread was started ([`exit::Stop::install`]).
pub(crate) fn serve(policy: Policy, opts: Options, stop: &exit::Stop) -> i32 {
    use crate::supervisor::launch::{Credentialed, Refresh};
    // The credentials first: read (and taken out of this process's
    // environment) before any other process, the broker included, exists.
    let creds = match Credentialed::open(policy, Refresh::Confined) {
        Ok(v) => v.going_on(opts.from.clone()),
        Err(e) => {
            tracing::error!("{e}");
            if opts.http.is_none() {
                refusal::tell_client(&e.to_string(), &|| stop.signal().is_some());
            }
            return crate::sandbox::EXIT_USAGE;
        }
    };
    let policy = creds.resolved().clone();
    let vault = creds.vault().cloned();
    let mut pre = match prepare(&policy, &opts) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("{e}");
            if opts.http.is_none() {
                refusal::tell_client(&crate::term::message(&e), &|| stop.signal().is_some());
            }
            return crate::sandbox::EXIT_USAGE;
        }
    };
    pre.vault = vault;
    if let Some(sig) = stop.signal() {
        return stopped(&pre.audit, None, sig);
    }
    let started = match start(creds, stop, &pre.audit, &pre.id) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let confined = listen_and_confine(started, pre.http.take(), &pre.audit, pre.record.as_deref());
    let (st, listening) = match confined {
        Ok(l) => l,
        Err(code) => return code,
    };
    // Started after confinement, so it is confined too.
    stop.take_signals();
    if let Some(v) = &pre.vault {
        refresh_in_broker(v, &st.broker, &pre.audit);
    }
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
    write_meta(&st.inst, &policy, &pre.audit, listening.as_ref());
    crate::otlp::start(&rt, &pre.id);
    let (left, conn, make) = match hand_over(st, opts.no_session, pre, stop) {
        Ok(h) => h,
        Err(code) => return code,
    };
    let (code, state) = rt.block_on(runtime::run(make, conn, &left, listening, stop.token()));
    crate::otlp::flush(&rt);
    // stdin's reader is a blocking thread that only ends when the client
    // writes or closes: never wait for it (the process exits right after).
    rt.shutdown_background();
    if let Some(h) = state.as_ref().and_then(|s| s.http.get()) {
        h.flush(&left.audit);
    }
    teardown(left, code)
}

/// The `from_command` refresher of short-lived credentials: its commands
/// run in the broker, each refresh recorded.
fn refresh_in_broker(
    v: &Arc<crate::proxy::credentials::Vault>,
    broker: &Arc<crate::supervisor::broker::Broker>,
    audit: &Arc<audit::Audit>,
) {
    let (b, audit) = (broker.clone(), audit.clone());
    v.start(
        Arc::new(move |i| {
            b.credential(i)
                .map_err(|e| crate::proxy::credentials::FetchError::Elsewhere(Box::new(e)))
        }),
        Arc::new(move |kind, args| {
            audit.event(crate::audit::Entry::event(
                "(credentials)",
                Some(kind),
                &args,
            ));
        }),
    );
}

/// The state, made once the hub is connected.
type MakeState = Box<dyn FnOnce(Arc<Hub>) -> Arc<ctx::State>>;

/// Start-up step 6: what started passes to the runtime: the instance into
/// the teardown's keeping, its watchers, the connection's parts, and the
/// state to make once the hub is connected.
fn hand_over(
    mut st: Started,
    no_session: bool,
    pre: Prepared,
    stop: &exit::Stop,
) -> Result<(Leftovers, runtime::Conn, MakeState), i32> {
    // The instance's policy: the resolved one as the host side completed it
    // (the guard's plan, the copy-on-write layer).
    let policy = st.inst.policy.clone();
    let info = info_of(&st.inst, st.tmux_version.clone());
    let left = leftovers(&st.inst, &info, &pre.audit, metrics::get());
    let proxy = proxy_listener(&mut st.inst, &policy)?;
    let conn = runtime::Conn {
        tmux: st.inst.tmux.clone(),
        socket: st.inst.socket(),
        genesis: st.inst.genesis(!no_session),
        rundir: st.inst.rundir.path.clone(),
        no_session,
        watchers: policy.limits.max_sessions as usize,
        proxy,
        vault: pre.vault.clone(),
        ask: policy.network.ask.then(|| left.approvals.asker()),
    };
    let broker = st.broker.clone();
    *left.inst.lock().unwrap_or_else(|p| p.into_inner()) = Some(st.inst);
    let shutdown = stop.token();
    let (reverts, frozen) = (left.reverts.clone(), left.frozen.clone());
    let refusals = left.flood.refusals.clone();
    let approvals = left.approvals.clone();
    let Prepared {
        tools: (ceiling, enabled),
        audit,
        record,
        remake_session,
        vault,
        ..
    } = pre;
    let ask_seconds = policy.mcp.ask_seconds;
    let history = history_of(&policy);
    let make: MakeState = Box::new(move |hub: Arc<Hub>| {
        let max_input = policy.mcp.max_input_bytes as usize;
        let wait_max = Duration::from_secs(policy.mcp.wait_max_seconds);
        let rt = Arc::new(crate::runtime::shared::Shared {
            hub_now: std::sync::RwLock::new(hub),
            policy,
            info_now: std::sync::RwLock::new(info),
            audit,
            shutdown,
            record,
            reverts,
            freeze: frozen,
            broker: Some(broker),
            ready: tokio::sync::watch::channel(None).0,
            refusals,
            vault,
            history,
            approvals,
            rounds: rounds::Rounds::new(Duration::from_secs(ask_seconds)),
            exposures: Default::default(),
        });
        Arc::new(ctx::State {
            rt,
            max_input,
            wait_max,
            backlog: Default::default(),
            drift: Arc::new(drift::Drift::default()),
            enabled: std::sync::RwLock::new(enabled),
            ceiling,
            remake_session,
            peers: Default::default(),
            http: Default::default(),
            commands: Default::default(),
            creating: Default::default(),
        })
    });
    Ok((left, conn, make))
}

/// The workspace's history, with checkpoint 0 (the layer at the start),
/// for a copy-on-write instance whose profile keeps one (`[workspace]
/// history_bytes`; a copy workspace's copy is the whole workspace: its
/// checkpoint 0 would store all of it again); a history that cannot be
/// had is said and left out (calls then name no checkpoint).
fn history_of(
    policy: &Policy,
) -> Option<Arc<std::sync::Mutex<crate::supervisor::history::History>>> {
    use crate::supervisor::{history::History, layer};
    let dir = policy.layer.as_ref().filter(|d| !layer::is_copy(d))?;
    if policy.history_bytes == 0 {
        return None;
    }
    match History::open(dir, &layer::writes(dir), policy.history_bytes) {
        Ok(h) => Some(Arc::new(std::sync::Mutex::new(h))),
        Err(e) => {
            tracing::warn!("the workspace's history: {e}; calls name no checkpoint");
            None
        }
    }
}

/// The allowlist proxy's listener, made in the sandbox's network namespace,
/// with its configuration (network mode `proxy`).
fn proxy_listener(
    inst: &mut Instance,
    policy: &Policy,
) -> Result<Option<(std::net::TcpListener, crate::proxy::Config)>, i32> {
    match inst
        .proxy
        .take()
        .map(|l| crate::proxy::Config::of(&policy.network).map(|c| (l, c)))
    {
        None => Ok(None),
        Some(Ok(p)) => Ok(Some(p)),
        Some(Err((k, e))) => {
            tracing::error!("{k}: {e}");
            Err(crate::sandbox::EXIT_INTERNAL)
        }
    }
}
