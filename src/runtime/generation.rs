//! Server generations as `serve` sees them: the facts tools report, the supervisor's confinement once it runs, and the
//! restart that replaces a dead server (`on_server_exit = "restart"`).

use super::shared::{InstanceInfo, Shared};
use super::{oom, record};
use crate::audit;
use crate::supervisor::{Instance, Proof};
use crate::tmux::hub::Hub;
use std::sync::Arc;

/// Why a dead server was not replaced.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GenerationError {
    /// The instance is being ended.
    #[error("the instance is ending")]
    Ending,
    /// The new sandbox did not start.
    #[error("{0}")]
    Restart(crate::sandbox::StartError),
    /// The new hub did not start.
    #[error(transparent)]
    Hub(#[from] crate::tmux::hub::HubError),
    /// Its sessions, or the drift baseline, were not made (the message).
    #[error("{0}")]
    NotReady(String),
}

/// The facts tools report about the current server generation.
pub(crate) fn info_of(inst: &Instance, tmux_version: String) -> InstanceInfo {
    InstanceInfo {
        generation: inst.generation.clone(),
        server_pid: inst.server_pid,
        tmux_version,
        layers: inst.layers(),
        init_pid: inst.init_pid(),
        cgroup: inst.rundir.cgroup.clone(),
    }
}

/// Confines the supervisor to what it uses from here on
/// (`confine`), and `reads` (the HTTP token file's directories,
/// read again when it is rotated): the main thread now, before the runtime
/// starts a thread; the guard's thread has restricted itself already.
pub(crate) fn confine_self(
    inst: &Instance,
    audit: &audit::Audit,
    record: Option<&record::Recording>,
    reads: &[std::path::PathBuf],
) -> Result<crate::sandbox::report::LayerStatus, crate::sandbox::StartError> {
    use crate::confine::{confine, status, Right};
    let mut needs = inst.supervisor_needs(audit.path(), record.map(|r| r.path()));
    needs
        .rules
        .extend(reads.iter().map(|d| (d.clone(), Right::Read)));
    // The OTLP collector's port, when export is on (`crate::otlp`).
    needs.connect_tcp.extend(crate::otlp::port());
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
/// already failed. `baseline` records the new server's configuration (the
/// protocol's drift check, `mcp::drift`).
pub(crate) async fn restart(
    state: &Shared,
    inst: &std::sync::Mutex<Option<Instance>>,
    oom: Option<&Arc<oom::Watch>>,
    no_session: bool,
    why: &str,
    n: u32,
    baseline: impl AsyncFnOnce(&Hub) -> Result<(), String>,
) -> Result<(), GenerationError> {
    state.hub().shutdown();
    if let Some(w) = oom {
        w.check();
    }
    let (tmux, socket, genesis, info) = {
        let mut g = inst.lock().unwrap_or_else(|p| p.into_inner());
        let i = g.as_mut().ok_or(GenerationError::Ending)?;
        i.restart(Proof::Hub).map_err(GenerationError::Restart)?;
        (
            i.tmux.clone(),
            i.socket(),
            i.genesis(!no_session),
            info_of(i, state.info().tmux_version),
        )
    };
    let watchers = state.policy.limits.max_sessions as usize;
    let hub = Hub::spawn(&tmux, &socket, genesis, watchers).await?;
    let ready = match hub.created().await {
        Ok(()) => baseline(&hub).await,
        Err(e) => Err(e),
    };
    if let Err(e) = ready {
        hub.shutdown();
        return Err(GenerationError::NotReady(e));
    }
    if let (Some(w), Some(cg)) = (oom, info.cgroup.clone()) {
        w.replace(cg);
    }
    let generation = info.generation.clone();
    let server_pid = info.server_pid;
    state.replace(hub, info);
    state.audit.event(audit::Entry::event("(server-restart)", Some("server_gone"), &serde_json::json!({"reason": why, "restart": n, "generation": generation, "server_pid": server_pid})));
    Ok(())
}
