//! Server generations as `serve` sees them: the first one's sessions, the
//! facts tools report, the supervisor's confinement once it runs, and the
//! restart that replaces a dead server (`on_server_exit = "restart"`).

use super::{audit, ctx, oom, record};
use crate::tmux::hub::{Hub, CONTROL_SESSION};
use crate::tmux::Instance;
use std::sync::Arc;

/// The session `serve` creates at start, so a client can run commands at once.
pub(super) const FIRST_SESSION: &str = "main";

/// Creates the hidden control session and, unless `no_session`, the first
/// session; returns the control session's id.
pub(super) fn sessions(inst: &Instance, no_session: bool) -> Result<String, String> {
    let ws = inst.policy.workspace.display().to_string();
    let gate = inst.gate().display().to_string();
    let mut args = vec![
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
        &gate,
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
    ];
    if !no_session {
        // In the same tmux client (one process less at start).
        args.extend([
            ";",
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
        ]);
    }
    let control_id = inst.cmd(&args).map_err(|e| {
        if no_session {
            format!("creating the control session: {e}")
        } else {
            format!("creating the control and first sessions: {e}")
        }
    })?;
    Ok(control_id.trim().to_string())
}

/// The facts tools report about the current server generation.
pub(super) fn info_of(inst: &Instance, tmux_version: String) -> ctx::InstanceInfo {
    ctx::InstanceInfo {
        generation: inst.generation.clone(),
        server_pid: inst.server_pid,
        tmux_version,
        layers: inst.layers(),
        init_pid: inst.init_pid(),
        cgroup: inst.rundir.cgroup.clone(),
    }
}

/// Confines the supervisor to what it uses from here on
/// (`sandbox::supervisor`): the main thread now, before the runtime starts a
/// thread; the guard's thread has restricted itself already.
pub(super) fn confine_self(
    inst: &Instance,
    audit: &audit::Audit,
    record: Option<&record::Recording>,
) -> Result<crate::sandbox::report::LayerStatus, crate::sandbox::StartError> {
    use crate::sandbox::supervisor::{confine, status};
    let needs = inst.supervisor_needs(audit.path(), record.map(|r| r.path()));
    let main = confine(&inst.policy, &needs)?;
    let guard = inst.guard.as_ref();
    // The guard thread's own restriction is part of the layer.
    match guard.and_then(|g| g.confined.clone()) {
        Some(Err(e)) if main.enforced => status(
            &inst.policy,
            vec![main.detail],
            vec![format!("the workspace guard's thread: {e}")],
        ),
        _ => Ok(main),
    }
}

/// Replaces a dead tmux server with a fresh generation (`on_server_exit =
/// "restart"`): a new sandbox in the same runtime directory, the control and
/// first sessions, a new hub, a new drift baseline (drift found earlier
/// stays found), and an audit record. Pending calls on the old server have
/// already failed.
pub(super) async fn restart(
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
            http: None,
            args: &serde_json::json!({"reason": why, "restart": n, "generation": generation, "server_pid": server_pid}),
        });
    Ok(())
}
