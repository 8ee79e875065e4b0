//! `sandmux freeze` / `thaw` on the supervisor's side. Revoking a tool takes
//! it out of the next call; it stops nothing already running. A freeze does:
//! every process inside stops (`supervisor::freeze`), and until the thaw every
//! tool call but `sandbox_status` (answered from the supervisor's state) and
//! `kill_server` is refused at once with the `frozen` refusal, before tmux is
//! asked: a stopped server answers nothing. The hub is frozen too, so the
//! background work that talks to tmux (drift scans, pruning, resuming paused
//! panes, following long commands) waits instead of failing, and nothing
//! takes the stopped server for a dead one. Each freeze and thaw is audited as
//! an event by the operator. An instance that ends frozen is killed, never
//! thawed first.

use super::shared::Shared;
use crate::audit::Entry;
use crate::supervisor::broker::Broker;
use crate::supervisor::freeze::{self as mech, Target};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Why a freeze or thaw the operator asked for did not complete (the
/// mechanism's own error is [`mech::FreezeError`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FreezeError {
    /// Not everything inside stopped (why, as [`Frozen::error`] says it).
    #[error("{0}; the instance stays frozen (tool calls are refused): `sandmux thaw` resumes it, `sandmux stop` ends it")]
    StaysFrozen(String),
    /// The thaw failed.
    #[error("{0}; the instance stays frozen")]
    Thaw(mech::FreezeError),
    /// The thaw's blocking task did not finish.
    #[error("the thaw task failed: {0}; the instance stays frozen")]
    ThawTask(tokio::task::JoinError),
    /// A rewind runs (`sandmux rewind`, or the agent's approved one).
    #[error("a rewind of the workspace is running; the instance stays frozen until it ends (it thaws then, unless it was frozen before)")]
    Rewinding,
}

/// A freeze in force.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Frozen {
    /// Unix time of the freeze.
    pub since: u64,
    /// The freezer used.
    pub method: &'static str,
    /// Processes it stopped.
    pub processes: usize,
    /// Why not everything inside could be stopped (calls are refused all the same).
    pub error: Option<String>,
    /// Why it was frozen when the operator did not ask (the tool calls'
    /// refusal says it).
    pub why: Option<String>,
    #[serde(skip)]
    at: Option<Instant>,
}

/// The instance's freeze state.
#[derive(Default)]
pub(crate) struct Freeze {
    now: Mutex<Option<Frozen>>,
    /// One freeze or thaw at a time.
    one: tokio::sync::Mutex<()>,
    /// One rewind at a time (`runtime::rewind`), end to end.
    pub(crate) rewind: tokio::sync::Mutex<()>,
    /// A rewind runs: the operator's thaw is refused until it ends.
    rewinding: std::sync::atomic::AtomicBool,
}

impl Freeze {
    /// The freeze in force, if any.
    pub(crate) fn get(&self) -> Option<Frozen> {
        self.now.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the instance is frozen (also while the freeze is under way).
    pub(crate) fn is_frozen(&self) -> bool {
        self.now.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Marks a rewind as running, once any freeze or thaw under way has
    /// settled: the freeze in force then, if any, and the mark, which
    /// ends when dropped (however the rewind ends).
    pub(crate) async fn rewinding(&self) -> (Option<Frozen>, Rewinding<'_>) {
        let _one = self.one.lock().await;
        self.rewinding
            .store(true, std::sync::atomic::Ordering::SeqCst);
        (self.get(), Rewinding(self))
    }

    fn set(&self, f: Option<Frozen>) {
        *self.now.lock().unwrap_or_else(|p| p.into_inner()) = f;
    }
}

/// A rewind runs (the operator's thaw is refused) while this lives.
pub(crate) struct Rewinding<'a>(&'a Freeze);

impl Drop for Rewinding<'_> {
    fn drop(&mut self) {
        self.0
            .rewinding
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The signals freezer, run by the broker: it reads the sandbox's
/// `/proc/PID/ns`, which Landlock closes to the confined supervisor.
pub(crate) fn signals(
    b: &Option<Arc<Broker>>,
    op: mech::Op,
    init_pid: u32,
) -> Result<usize, mech::FreezeError> {
    match b {
        Some(b) => Ok(b.signals(op, init_pid)?),
        None => mech::by_signals(op, init_pid),
    }
}

/// The sandbox a freeze acts on (the current server generation).
pub(crate) fn target(s: &Shared) -> Target {
    let info = s.info();
    Target {
        init_pid: info.init_pid,
        cgroup: info.cgroup,
    }
}

fn event(s: &Shared, tool: &str, args: &Value) {
    s.audit.event(Entry::event(tool, None, args));
}

/// Freezes the instance: calls are refused from the first moment, then
/// everything inside is stopped. A freeze that cannot stop everything stays
/// in force (fail closed) and says why.
pub(crate) async fn freeze(s: &Shared) -> Result<Value, FreezeError> {
    freeze_for(s, None).await.map(|(f, made)| match made {
        Made::Now => json!({"frozen": f}),
        Made::Already => json!({"already": true, "frozen": f}),
    })
}

/// Whether a freeze asked for was made now or was already in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Made {
    Now,
    Already,
}

/// Freezes the instance as [`freeze`] does, for a rewind: whether this
/// call made the freeze (then it is the rewind's to thaw).
pub(crate) async fn freeze_made(s: &Shared) -> Result<Made, FreezeError> {
    freeze_for(s, None).await.map(|(_, made)| made)
}

/// The copy-on-write layer went over its bound (`supervisor::bound`):
/// frozen as by the operator, the reason in the audit log and in every
/// refused call; the operator decides (`sandmux stop`, or `thaw`: the
/// bound freezes once per instance, so a thawed instance runs on over it,
/// which is the operator's choice).
pub(crate) fn watch_layer(
    s: &std::sync::Arc<Shared>,
) -> Option<crate::supervisor::bound::Watching> {
    let layer = s.policy.layer.clone()?;
    let st = s.clone();
    let rt = tokio::runtime::Handle::current();
    Some(crate::supervisor::bound::watch(
        layer,
        s.policy.layer_bound,
        move |why| {
            tracing::error!("{why}: the instance is frozen");
            let why = format!("{why}: the sandbox is frozen (the operator ends it with `sandmux stop`; the layer is kept)");
            rt.spawn(async move {
                let _ = freeze_for(&st, Some(why)).await;
            });
        },
    ))
}

async fn freeze_for(s: &Shared, why: Option<String>) -> Result<(Frozen, Made), FreezeError> {
    let _one = s.freeze.one.lock().await;
    if let Some(mut f) = s.freeze.get() {
        // A bound reached while frozen (by the operator, or for a rewind)
        // is kept on the freeze in force: no thaw but the operator's
        // lifts it.
        if why.is_some() && f.why.is_none() {
            f.why = why.clone();
            s.freeze.set(Some(f.clone()));
            event(
                s,
                "(freeze)",
                &json!({"by": "layer bound", "why": why, "already": true}),
            );
        }
        return Ok((f, Made::Already));
    }
    let t = target(s);
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut f = Frozen {
        since,
        method: t.freezer().name(),
        processes: 0,
        error: None,
        why: why.clone(),
        at: Some(Instant::now()),
    };
    s.freeze.set(Some(f.clone()));
    s.hub().set_frozen(true);
    // A frozen instance asks nothing; what was waiting is denied.
    s.approvals.close("the instance is frozen");
    // An answer a 2026-07-28 client has yet to collect is not carried past
    // the freeze either: it asks again after the thaw.
    s.rounds.clear();
    let b = s.broker.clone();
    let r = tokio::task::spawn_blocking(move || {
        mech::freeze(&t, &|op, pid| signals(&b, op, pid)).map_err(|e| e.to_string())
    })
    .await
    .unwrap_or_else(|e| Err(format!("the freeze task failed: {e}")));
    match r {
        Ok(d) => f.processes = d.processes,
        Err(e) => f.error = Some(e),
    }
    s.freeze.set(Some(f.clone()));
    event(
        s,
        "(freeze)",
        &json!({"by": if why.is_some() { "layer bound" } else { "operator" }, "why": why, "method": f.method, "processes": f.processes, "error": f.error}),
    );
    match &f.error {
        None => Ok((f, Made::Now)),
        Some(e) => Err(FreezeError::StaysFrozen(e.clone())),
    }
}

/// Thaws the instance: everything inside runs again, then calls are served.
pub(crate) async fn thaw(s: &Shared) -> Result<Value, FreezeError> {
    let _one = s.freeze.one.lock().await;
    if s.freeze.rewinding.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(FreezeError::Rewinding);
    }
    let Some(f) = s.freeze.get() else {
        return Ok(json!({"already": true, "frozen": null}));
    };
    thawed(s, f).await
}

/// The thaw at a rewind's end (`mark` ends with it): under the same lock
/// as every freeze, so a layer bound reached up to this moment keeps the
/// instance frozen (its reason is on the freeze in force); Ok(false) then.
pub(crate) async fn thaw_after_rewind(
    s: &Shared,
    mark: Rewinding<'_>,
) -> Result<bool, FreezeError> {
    let _one = s.freeze.one.lock().await;
    drop(mark);
    match s.freeze.get() {
        Some(f) if f.why.is_none() => thawed(s, f).await.map(|_| true),
        _ => Ok(false),
    }
}

/// Thaws the freeze `f` in force (the caller holds `one`).
async fn thawed(s: &Shared, f: Frozen) -> Result<Value, FreezeError> {
    let t = target(s);
    let b = s.broker.clone();
    let thawed =
        tokio::task::spawn_blocking(move || mech::thaw(&t, &|op, pid| signals(&b, op, pid))).await;
    let d = match thawed {
        Ok(r) => r.map_err(FreezeError::Thaw)?,
        Err(e) => return Err(FreezeError::ThawTask(e)),
    };
    s.freeze.set(None);
    s.approvals.reopen();
    let hub = s.hub();
    hub.set_frozen(false);
    // A watcher that timed out under the freeze is replaced.
    tokio::spawn(async move {
        let _ = hub.sync_watchers().await;
    });
    let secs = f.at.map(|a| a.elapsed().as_secs_f64()).unwrap_or(0.0);
    event(
        s,
        "(thaw)",
        &json!({"by": "operator", "method": d.method, "processes": d.processes, "frozen_seconds": (secs * 10.0).round() / 10.0}),
    );
    Ok(json!({"frozen": null, "thawed": d}))
}
