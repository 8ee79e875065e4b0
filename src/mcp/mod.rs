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

pub mod audit;
mod backlog;
pub(crate) mod bounds;
pub mod broker;
pub mod catalog;
pub mod choices;
pub mod ctx;
pub mod drift;
pub mod endpoint;
pub mod error;
pub mod exit;
pub mod freeze;
mod generation;
mod hostfiles;
pub mod oom;
pub mod prompts;
mod proxy;
pub mod record;
pub mod replay_filter;
pub mod resources;
pub mod reverts;
pub(crate) mod schema;
pub mod server;
pub mod stdio;
pub mod targets;
pub mod text;
pub mod tools;
pub mod toolsets;

use crate::profile::{Policy, ServerExit, MAX_RESTARTS};
use crate::tmux::hub::{Hub, HubEvent};
use crate::tmux::Instance;
use generation::{confine_self, info_of, restart, sessions};
use hostfiles::{default_audit_path, outside_agent_writable, retain};
use rmcp::ServiceExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of `sandmux serve`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Tool selection flags.
    pub flags: toolsets::Flags,
    /// Where the audit log goes (default: the state directory).
    pub audit_log: Option<PathBuf>,
    /// Start without the initial "main" session.
    pub no_session: bool,
    /// Write the first session's terminal output as an asciicast v2 file.
    pub record: Option<PathBuf>,
}

/// Start-up was asked to stop (a signal, see [`exit`]): ends what exists,
/// seals the audit log with status 0 and returns 0.
fn stopped(audit: &audit::Audit, inst: Option<Instance>, sig: nix::sys::signal::Signal) -> i32 {
    eprintln!("sandmux: {sig} during start-up: stopped");
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

/// Runs the server; returns the process exit status. `stop` must have been
/// installed before any thread was started ([`exit::Stop::install`]).
pub fn serve(policy: Policy, opts: Options, stop: &exit::Stop) -> i32 {
    let (ceiling, enabled) = match tools(&policy, &opts) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sandmux: {e}");
            return crate::sandbox::EXIT_USAGE;
        }
    };
    let id = crate::nonce::hex()[..12].to_string();
    let (audit, record) = match host_files(&policy, &opts, &id) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("sandmux: {e}");
            return crate::sandbox::EXIT_USAGE;
        }
    };
    if let Some(sig) = stop.signal() {
        return stopped(&audit, None, sig);
    }
    // A start-up step that fails while a stop is pending is reported, and the
    // stop decides the status (a terminal's ^C reaches the sandbox too).
    let mut inst = match Instance::start(policy.clone()) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("sandmux: {e}");
            return match stop.signal() {
                Some(sig) => stopped(&audit, None, sig),
                None => e.exit_code(),
            };
        }
    };
    if let Some(sig) = stop.signal() {
        return stopped(&audit, Some(inst), sig);
    }
    // What the confined supervisor cannot do itself (later generations, the
    // signals freezer) is the broker's, for this instance's final profile
    // (the workspace guard has added its paths).
    let broker = match broker::Broker::spawn(&inst.policy, &inst.rundir, &inst.tmux) {
        Ok(b) => Arc::new(b),
        Err(e) => {
            eprintln!("sandmux: {e}");
            inst.stop();
            audit.seal(crate::sandbox::EXIT_INTERNAL);
            return crate::sandbox::EXIT_INTERNAL;
        }
    };
    inst.broker = Some(broker.clone());
    let control_id = match sessions(&inst, opts.no_session) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("sandmux: {e}");
            return match stop.signal() {
                Some(sig) => stopped(&audit, Some(inst), sig),
                None => crate::sandbox::EXIT_INTERNAL,
            };
        }
    };
    if let Some(sig) = stop.signal() {
        return stopped(&audit, Some(inst), sig);
    }
    let tmux_version = std::process::Command::new(&inst.tmux)
        .arg("-V")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    match confine_self(&inst, &audit, record.as_deref()) {
        Ok(status) => inst.supervisor = Some(status),
        Err(e) => {
            eprintln!("sandmux: {e}");
            inst.stop();
            audit.seal(e.exit_code());
            return e.exit_code();
        }
    }
    // Started after confinement, so it is confined too.
    stop.take_signals();
    let info = info_of(&inst, tmux_version.clone());
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandmux: tokio: {e}");
            return crate::sandbox::EXIT_INTERNAL;
        }
    };
    let socket = inst.socket();
    let tmux = inst.tmux.clone();
    let rundir = inst.rundir.path.clone();
    inst.rundir.write_meta(&serde_json::json!({
        "kind": "serve",
        "id": inst.rundir.id,
        "profile": policy.name,
        "workspace": policy.workspace,
        "audit_log": audit.path(),
        "pid": std::process::id(),
        "started": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    }));
    let oom = info
        .cgroup
        .clone()
        .map(|cg| oom::Watch::new(audit.clone(), cg));
    let last_oom = oom.clone();
    let sealer = audit.clone();
    let reverts = inst
        .guard
        .as_ref()
        .map(|g| reverts::Reverts::new(audit.clone(), g.taken(), g.quarantine_dir()));
    let last_reverts = reverts.clone();
    let no_session = opts.no_session;
    let shutdown = stop.token();
    let frozen = Arc::new(freeze::Freeze::default());
    let last_frozen = frozen.clone();
    let listener = inst.proxy.take();
    let flood = proxy::Flood::new(audit.clone());
    let last_flood = flood.clone();
    let inst = Arc::new(std::sync::Mutex::new(Some(inst)));
    let cell = inst.clone();
    let code = rt.block_on(async move {
        // A stop that came meanwhile (the token is the signals' too) ends here.
        let stopping = |code| if shutdown.is_cancelled() { 0 } else { code };
        if shutdown.is_cancelled() {
            return 0;
        }
        if let Some(l) = listener {
            match crate::proxy::Config::of(&policy.network) {
                Ok(cfg) => flood.start(l, cfg),
                Err((k, e)) => {
                    eprintln!("sandmux: {k}: {e}");
                    return crate::sandbox::EXIT_INTERNAL;
                }
            }
        }
        let watchers = policy.limits.max_sessions as usize;
        let hub = match Hub::connect(&tmux, &socket, &control_id, watchers).await {
            Ok(h) => h,
            Err(e) => {
                eprintln!("sandmux: {e}");
                return stopping(crate::sandbox::EXIT_INTERNAL);
            }
        };
        let state = Arc::new(ctx::State {
            hub_now: std::sync::RwLock::new(hub.clone()),
            max_input: policy.mcp.max_input_bytes as usize,
            wait_max: Duration::from_secs(policy.mcp.wait_max_seconds),
            policy,
            info_now: std::sync::RwLock::new(info),
            audit,
            backlog: Default::default(),
            drift: Arc::new(drift::Drift::default()),
            shutdown: shutdown.clone(),
            enabled: std::sync::RwLock::new(enabled),
            ceiling,
            record: record.clone(),
            peer: std::sync::OnceLock::new(),
            started: Instant::now(),
            reverts: reverts.clone(),
            commands: Default::default(),
            creating: Default::default(),
            freeze: frozen,
            broker: Some(broker),
        });
        if let Err(e) = state.drift.record(&hub).await {
            eprintln!("sandmux: {e}");
            hub.shutdown();
            return stopping(crate::sandbox::EXIT_INTERNAL);
        }
        let st = state.clone();
        tokio::spawn(async move { st.drift.scanner(|| st.hub()).await });
        if let Some(w) = &oom {
            tokio::spawn(w.clone().run());
        }
        if let Some(r) = &reverts {
            tokio::spawn(r.clone().run());
        }
        // Termination signals cancel `shutdown` from the signal thread (exit.rs).
        // The server's death: end the instance, or restart as the profile says.
        let (st, sd, w) = (state.clone(), shutdown.clone(), oom.clone());
        tokio::spawn(async move {
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
                    eprintln!("sandmux: the sandboxed tmux server is gone ({why}) while frozen; ending the instance");
                    sd.cancel();
                    return;
                }
                if st.policy.mcp.on_server_exit == ServerExit::Restart && restarts < MAX_RESTARTS {
                    restarts += 1;
                    match restart(&st, &cell, w.as_ref(), no_session, &why, restarts).await {
                        Ok(()) => {
                            eprintln!("sandmux: the sandboxed tmux server is gone ({why}); restarted it ({restarts} of {MAX_RESTARTS})");
                            continue;
                        }
                        Err(e) => eprintln!("sandmux: restarting the tmux server failed: {e}"),
                    }
                }
                eprintln!("sandmux: the sandboxed tmux server is gone ({why}); ending the instance");
                sd.cancel();
                return;
            }
        });
        // The operator endpoint, beside the socket in the private runtime directory.
        let ep = state.clone();
        let ep_path = rundir.join("control.sock");
        tokio::spawn(async move {
            if let Err(e) = endpoint::serve(&ep_path, ep).await {
                eprintln!("sandmux: operator endpoint: {e}");
            }
        });
        if let Some(rec) = &record {
            if let Err(e) = rec.start(&hub, &control_id).await {
                eprintln!("sandmux: --record: {e}");
                state.hub().shutdown();
                return stopping(crate::sandbox::EXIT_USAGE);
            }
        }
        let server = server::Server { s: state.clone() };
        let running = tokio::select! {
            r = server.serve_with_ct(metered(&state), shutdown.clone()) => match r {
                Ok(r) => r,
                Err(e) => {
                    let code = stopping(1);
                    if code != 0 {
                        eprintln!("sandmux: MCP start-up: {e}");
                    }
                    shutdown.cancel();
                    state.hub().shutdown();
                    return code;
                }
            },
            _ = shutdown.cancelled() => { state.hub().shutdown(); return 0; }
        };
        let _ = state.peer.set(running.peer().clone());
        let reason = running.waiting().await;
        shutdown.cancel();
        state.hub().shutdown();
        match reason {
            Ok(_) => 0,
            Err(_) => stopping(1),
        }
    });
    // stdin's reader is a blocking thread that only ends when the client
    // writes or closes: never wait for it (the process exits right after).
    rt.shutdown_background();
    // A kill in the last second, or the one that ended the instance, is
    // recorded while the cgroup still exists.
    if let Some(w) = last_oom {
        w.check();
    }
    let last = inst.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(inst) = last {
        // A frozen sandbox is killed where it stands: nothing inside runs again.
        if last_frozen.is_frozen() {
            let t = crate::sandbox::freeze::Target {
                init_pid: inst.init_pid(),
                cgroup: inst.rundir.cgroup.clone(),
            };
            let b = inst.broker.clone();
            crate::sandbox::freeze::kill(&t, &|op, pid| freeze::signals(&b, op, pid));
        }
        let taken = inst.stop();
        if let Some(r) = last_reverts {
            r.record(&taken);
        }
    }
    last_flood.finish();
    sealer.seal(code);
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
