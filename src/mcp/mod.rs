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
pub mod catalog;
pub mod choices;
pub mod ctx;
pub mod drift;
pub mod endpoint;
pub mod error;
pub mod exit;
pub mod freeze;
pub mod oom;
pub mod prompts;
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
use crate::sandbox::pane::GATE_PATH;
use crate::tmux::hub::{Hub, HubEvent, CONTROL_SESSION};
use crate::tmux::Instance;
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

/// The session `serve` creates at start, so a client can run commands at once.
pub const FIRST_SESSION: &str = "main";

/// Creates the hidden control session and, unless `no_session`, the first
/// session; returns the control session's id.
fn sessions(inst: &Instance, no_session: bool) -> Result<String, String> {
    let ws = inst.policy.workspace.display().to_string();
    let control_id = inst
        .cmd(&[
            "new-session",
            "-d",
            "-P",
            "-F",
            "#{session_id}",
            "-s",
            CONTROL_SESSION,
            "-x",
            "80",
            "-y",
            "24",
            "-c",
            &ws,
            GATE_PATH,
            "--exec",
            "--",
            "cat",
            // The control pane needs no process: it is kept once dead, and ^D
            // ends `cat` (the line discipline holds it until `cat` reads).
            ";",
            "set-option",
            "-w",
            "-t",
            CONTROL_SESSION,
            "remain-on-exit",
            "on",
            ";",
            "send-keys",
            "-t",
            CONTROL_SESSION,
            "C-d",
        ])
        .map_err(|e| format!("creating the control session: {e}"))?;
    if !no_session {
        inst.cmd(&[
            "new-session",
            "-d",
            "-s",
            FIRST_SESSION,
            "-x",
            "200",
            "-y",
            "50",
            "-c",
            &ws,
            // Its window keeps this size (see tools::spawn::fixed_size).
            ";",
            "set-option",
            "-w",
            "-t",
            FIRST_SESSION,
            "window-size",
            "manual",
        ])
        .map_err(|e| format!("creating the first session: {e}"))?;
    }
    Ok(control_id.trim().to_string())
}

/// The facts tools report about the current server generation.
fn info_of(inst: &Instance, tmux_version: String) -> ctx::InstanceInfo {
    ctx::InstanceInfo {
        generation: inst.generation.clone(),
        server_pid: inst.server_pid,
        tmux_version,
        layers: inst.layers(),
        init_pid: inst.init_pid(),
        cgroup: inst.rundir.cgroup.clone(),
    }
}

/// The path to open for a host-side file sandmux writes (audit log,
/// recording), refused when the agent could rewrite it: inside the workspace
/// or another read-write tree of the profile. The longest existing ancestor
/// is resolved (symlinks, `..`) and the rest appended, so neither a relative
/// spelling, a symlinked parent nor a parent that does not exist yet gets
/// around the check; a `..` below a missing directory is refused.
fn outside_agent_writable(
    path: &std::path::Path,
    policy: &Policy,
    what: &str,
    flag: &str,
) -> Result<PathBuf, String> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| {
                format!(
                    "{what}: no current directory to resolve {}: {e}",
                    path.display()
                )
            })?
            .join(path)
    };
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    let resolved = loop {
        if let Ok(c) = std::fs::canonicalize(existing) {
            break rest.iter().rev().fold(c, |p: PathBuf, n| p.join(n));
        }
        match (existing.file_name(), existing.parent()) {
            (Some(n), Some(parent)) => {
                rest.push(n.to_os_string());
                existing = parent;
            }
            _ => {
                return Err(format!(
                    "{what} {} cannot be resolved (`..` below a directory that does not exist); give a plain path to {flag}",
                    abs.display()
                ))
            }
        }
    };
    let writable = std::iter::once(policy.workspace.clone()).chain(
        policy
            .fs
            .iter()
            .filter(|e| e.kind == crate::profile::MountKind::ReadWrite)
            .map(|e| std::fs::canonicalize(&e.path).unwrap_or_else(|_| e.path.clone())),
    );
    for root in writable {
        if resolved.starts_with(&root) {
            return Err(format!(
                "{what} {} is inside {}, which the agent can write; choose another {flag}",
                abs.display(),
                if root == policy.workspace {
                    "the workspace".to_string()
                } else {
                    format!("the read-write tree {}", root.display())
                }
            ));
        }
    }
    Ok(resolved)
}

/// The default audit log: `$XDG_STATE_HOME/sandmux/audit/<time>-<id>.jsonl`
/// (or `~/.local/state/...`).
pub fn default_audit_path(id: &str) -> Result<PathBuf, String> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .ok_or("no XDG_STATE_HOME or HOME for the audit log; pass --audit-log PATH")?;
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(base
        .join("sandmux")
        .join("audit")
        .join(format!("{secs}-{id}.jsonl")))
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

/// Runs the server; returns the process exit status. `stop` must have been
/// installed before any thread was started ([`exit::Stop::install`]).
pub fn serve(policy: Policy, opts: Options, stop: &exit::Stop) -> i32 {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let ceiling = match toolsets::select(&policy.mcp.toolsets, policy.mcp.preset, &opts.flags, &env)
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("sandmux: {e}");
            return crate::sandbox::EXIT_USAGE;
        }
    };
    // With act = "on-grant", execute-class tools wait for a human's grant.
    let enabled: std::collections::BTreeSet<&'static str> =
        if policy.mcp.act == crate::profile::Act::OnGrant {
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
    let id = crate::nonce::hex()[..12].to_string();
    let audit_path = match opts
        .audit_log
        .clone()
        .map(Ok)
        .unwrap_or_else(|| default_audit_path(&id))
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sandmux: {e}");
            return crate::sandbox::EXIT_USAGE;
        }
    };
    let audit_path =
        match outside_agent_writable(&audit_path, &policy, "the audit log", "--audit-log") {
            Ok(p) => p,
            Err(e) => {
                eprintln!("sandmux: {e}");
                return crate::sandbox::EXIT_USAGE;
            }
        };
    let record = match opts
        .record
        .as_deref()
        .map(|r| outside_agent_writable(r, &policy, "the recording", "--record"))
        .transpose()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sandmux: {e}");
            return crate::sandbox::EXIT_USAGE;
        }
    };
    let record = match record
        .map(|r| record::Recording::open(&r, policy.recording.max_bytes.0))
        .transpose()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sandmux: --record: {e}");
            return crate::sandbox::EXIT_USAGE;
        }
    };
    let audit = match audit::Audit::open(&audit_path, policy.mcp.audit_max_bytes.0) {
        Ok(a) => Arc::new(a),
        Err(e) => {
            eprintln!("sandmux: {e} (pass --audit-log PATH)");
            return crate::sandbox::EXIT_USAGE;
        }
    };
    if opts.audit_log.is_none() {
        if let Err(e) = retain(&audit) {
            eprintln!("sandmux: {e}");
            return crate::sandbox::EXIT_USAGE;
        }
    }
    if let Some(sig) = stop.signal() {
        return stopped(&audit, None, sig);
    }
    // A start-up step that fails while a stop is pending is reported, and the
    // stop decides the status (a terminal's ^C reaches the sandbox too).
    let inst = match Instance::start(policy.clone()) {
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
    let inst = Arc::new(std::sync::Mutex::new(Some(inst)));
    let cell = inst.clone();
    let code = rt.block_on(async move {
        // A stop that came meanwhile (the token is the signals' too) ends here.
        let stopping = |code| if shutdown.is_cancelled() { 0 } else { code };
        if shutdown.is_cancelled() {
            return 0;
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
            crate::sandbox::freeze::kill(&crate::sandbox::freeze::Target {
                init_pid: inst.init_pid(),
                cgroup: inst.rundir.cgroup.clone(),
            });
        }
        let taken = inst.stop();
        if let Some(r) = last_reverts {
            r.record(&taken);
        }
    }
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

/// Applies the user's retention to the default audit directory (where
/// `audit` was opened), and records what it removed.
fn retain(audit: &audit::Audit) -> Result<(), String> {
    let keep = crate::profile::user::load()?.audit.keep_days;
    let Some(dir) = audit.path().parent() else {
        return Ok(());
    };
    let n = audit::retention::apply(dir, keep, std::time::SystemTime::now())?;
    if n > 0 {
        audit.event(audit::Entry {
            tool: "(audit-retention)",
            toolset: None,
            outcome: "event",
            error_type: Some("retention"),
            duration_ms: 0,
            request_id: String::new(),
            client_id: None,
            args: &serde_json::json!({"removed_logs": n, "keep_days": keep, "config": crate::profile::user::path()}),
        });
    }
    Ok(())
}

/// Replaces a dead tmux server with a fresh generation (`on_server_exit =
/// "restart"`): a new sandbox in the same runtime directory, the control and
/// first sessions, a new hub, a new drift baseline (drift found earlier
/// stays found), and an audit record. Pending calls on the old server have
/// already failed.
async fn restart(
    state: &ctx::State,
    inst: &std::sync::Mutex<Option<Instance>>,
    oom: Option<&Arc<oom::Watch>>,
    no_session: bool,
    why: &str,
    n: u32,
) -> Result<(), String> {
    state.hub().shutdown();
    if let Some(w) = oom {
        w.check();
    }
    let (tmux, socket, control_id, info) = {
        let mut g = inst.lock().unwrap_or_else(|p| p.into_inner());
        let i = g.as_mut().ok_or("the instance is ending")?;
        i.restart().map_err(|e| e.to_string())?;
        let control_id = sessions(i, no_session)?;
        (
            i.tmux.clone(),
            i.socket(),
            control_id,
            info_of(i, state.info().tmux_version),
        )
    };
    let watchers = state.policy.limits.max_sessions as usize;
    let hub = Hub::connect(&tmux, &socket, &control_id, watchers).await?;
    state.drift.record(&hub).await.map_err(|e| e.to_string())?;
    if let (Some(w), Some(cg)) = (oom, info.cgroup.clone()) {
        w.replace(cg);
    }
    let generation = info.generation.clone();
    let server_pid = info.server_pid;
    state.replace(hub, info);
    state.audit.event(audit::Entry {
            tool: "(server-restart)",
            toolset: None,
            outcome: "event",
            error_type: Some("server_gone"),
            duration_ms: 0,
            request_id: String::new(),
            client_id: None,
            args: &serde_json::json!({"reason": why, "restart": n, "generation": generation, "server_pid": server_pid}),
        });
    Ok(())
}
