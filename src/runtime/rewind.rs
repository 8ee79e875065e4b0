//! `sandmux rewind ID N` on a running copy-on-write instance: the
//! workspace, as the panes see it, put back to how it was after checkpoint
//! N. The instance is frozen (every process inside stopped: nothing of the
//! agent's runs while the workspace is written), the checkpoint before is
//! taken (it undoes the rewind), a rewinder the broker starts in the
//! sandbox writes through the merged view (`supervisor::rewinder`), the
//! checkpoint after is taken while still frozen (so it holds the rewind's
//! writes and nothing of the agent's) and checked against N, then the
//! instance is thawed. Audited as the door's `rewind` record, in the
//! instance's own log.

use super::shared::Shared;
use crate::supervisor::history::{Cause, History, HistoryError, Line, Node, State};
use crate::supervisor::rewinder::{self, Done, RewinderError};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Why a running instance was not rewound.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RewindError {
    /// No history to rewind to.
    #[error("this instance keeps no history (live mode, a copy workspace, or [workspace] history_bytes = 0): nothing to rewind")]
    NoHistory,
    /// The history refused (no such checkpoint, folded, a file not kept).
    #[error(transparent)]
    History(#[from] HistoryError),
    /// The freeze did not stop everything (the instance stays frozen).
    #[error("{0}; nothing was rewound")]
    Freeze(String),
    /// The rewinder failed.
    #[error(transparent)]
    Rewinder(#[from] RewinderError),
    /// The broker would not start it.
    #[error("starting the rewinder: {0}")]
    Broker(#[from] crate::supervisor::broker::BrokerError),
    /// It could not be started here (no broker: the supervisor is not
    /// confined).
    #[error("starting the rewinder: {0}")]
    Start(RewinderError),
    /// The blocking task failed.
    #[error("the rewind's task failed: {0}")]
    Task(String),
    /// After the rewind an entry of checkpoint N is not in the layer.
    #[error("after the rewind the layer does not hold {} as checkpoint {n} has it", crate::term::printable(&path.to_string_lossy()))]
    Differs { n: u64, path: PathBuf },
    /// Failed after the checkpoint before was taken: the workspace may be
    /// partly rewound.
    #[error("{source}; the workspace may be partly rewound and the instance stays frozen: `sandmux rewind {id} {before}` puts it back as it was, `sandmux thaw {id}` resumes it as it is, `sandmux stop {id}` ends it")]
    Partly {
        id: String,
        before: u64,
        source: Box<RewindError>,
    },
}

/// What a rewind did.
struct Rewound {
    before: Line,
    after: Line,
    done: Done,
}

/// What a rewind of a running instance did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Summary {
    /// The checkpoint taken before it: rewinding to it undoes this one.
    pub(crate) before: u64,
    /// The checkpoint taken after it.
    pub(crate) after: u64,
    /// Entries written.
    pub(crate) written: usize,
    /// Entries removed.
    pub(crate) removed: usize,
}

/// Rewinds the running instance to checkpoint `n` for `by` (who asked,
/// as the record names them), recorded as the door's `rewind` in the
/// instance's own log either way.
pub(crate) async fn recorded(s: &Arc<Shared>, n: u64, by: &str) -> Result<Summary, RewindError> {
    let started = std::time::Instant::now();
    // On the record before anything is frozen or written: a rewind the
    // instance's end cuts short (a stop, `kill_server`) is still seen.
    s.audit.event(crate::audit::Entry::event(
        "(door)",
        Some("rewind_started"),
        &json!({"to": n, "by": by, "running": true}),
    ));
    let r = run(s, n).await.map(|w| Summary {
        before: w.before.n,
        after: w.after.n,
        written: w.done.written,
        removed: w.done.removed,
    });
    let (code, mut args) = match &r {
        Ok(w) => (
            0,
            json!({"before": w.before, "after": w.after, "written": w.written, "removed": w.removed}),
        ),
        Err(e) => (2, json!({"error": e.to_string()})),
    };
    args["to"] = json!(n);
    args["by"] = json!(by);
    args["running"] = json!(true);
    args["exit_status"] = json!(code);
    s.audit.event(
        crate::audit::Entry::event("(door)", Some("rewind"), &args)
            .took(started.elapsed().as_millis() as u64),
    );
    r
}

/// The operator's `rewind` (`checkpoint` N): the endpoint's answer.
pub(crate) async fn rewind(s: &Arc<Shared>, n: Option<u64>, uid: u32) -> Value {
    let Some(n) = n else {
        return json!({"ok": false, "error": "name the checkpoint (sandmux log ID lists them)"});
    };
    match recorded(s, n, &format!("operator uid {uid}")).await {
        Ok(w) => json!({
            "ok": true, "to": n, "before": w.before, "after": w.after,
            "written": w.written, "removed": w.removed,
            "frozen": s.freeze.is_frozen(),
        }),
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    }
}

fn id_of(s: &Shared) -> String {
    s.policy
        .layer
        .as_deref()
        .and_then(Path::file_name)
        .map_or_else(|| "ID".into(), |n| n.to_string_lossy().into_owned())
}

async fn run(s: &Arc<Shared>, n: u64) -> Result<Rewound, RewindError> {
    let h = s.history.clone().ok_or(RewindError::NoHistory)?;
    // Refused before anything stops: no such checkpoint, or folded.
    let hc = h.clone();
    blocking(move || Ok(lock(&hc).state_at(n).map(drop)?)).await?;
    s.until_ready()
        .await
        .map_err(|e| RewindError::Freeze(e.to_string()))?;
    // One rewind at a time; the operator's thaw is refused meanwhile.
    let _one = s.freeze.rewind.lock().await;
    frozen_for(s, n, h).await
}

/// The rewind proper, the instance frozen for it: frozen now (or before,
/// by a freeze that stopped everything: one that did not is refused), and
/// thawed after unless it was frozen before, the rewind stopped half way,
/// or the layer's bound was reached meanwhile.
async fn frozen_for(
    s: &Arc<Shared>,
    n: u64,
    h: Arc<Mutex<History>>,
) -> Result<Rewound, RewindError> {
    let (before, mark) = s.freeze.rewinding().await;
    let mut was_frozen = before.is_some();
    if !was_frozen {
        let made = super::freeze::freeze_made(s)
            .await
            .map_err(|e| RewindError::Freeze(e.to_string()))?;
        // Frozen by someone else in between (the operator, the layer's
        // bound): theirs to thaw.
        was_frozen = made == super::freeze::Made::Already;
    }
    // Whoever froze it, a freeze that did not stop everything is refused:
    // the agent's processes would run while the rewinder writes.
    if let Some(e) = s.freeze.get().and_then(|f| f.error) {
        return Err(RewindError::Freeze(format!(
            "the freeze in force did not stop everything inside ({e})"
        )));
    }
    let (broker, init_pid) = (s.broker.clone(), super::freeze::target(s).init_pid);
    let workspace = s.policy.workspace.clone();
    let id = id_of(s);
    let r = blocking(move || {
        let mut h = lock(&h);
        let (before, target, current) = prepare(&mut h, n)?;
        let partly = |e: RewindError| RewindError::Partly {
            id: id.clone(),
            before: before.n,
            source: Box::new(e),
        };
        let done = write(broker, init_pid, &workspace, &h, &target, &current).map_err(|e| {
            match e {
                // Nothing written: the workspace is as before (thawed).
                RewindError::Rewinder(RewinderError::Refused(_))
                | RewindError::Broker(_)
                | RewindError::Start(_) => e,
                e => partly(e),
            }
        })?;
        let after = h
            .take_whole(&cause("(rewind)", n))
            .map_err(|e| partly(e.into()))?;
        check(n, &target, h.state()).map_err(partly)?;
        Ok(Rewound {
            before,
            after,
            done,
        })
    })
    .await;
    // A failure before anything was written thaws; a partial one stays
    // frozen, and so does an instance whose layer reached its bound.
    let partial = matches!(r, Err(RewindError::Partly { .. }));
    if !was_frozen && !partial {
        if let Err(e) = super::freeze::thaw_after_rewind(s, mark).await {
            tracing::error!("thawing after the rewind: {e}");
        }
    }
    r
}

fn lock(h: &Mutex<History>) -> std::sync::MutexGuard<'_, History> {
    h.lock().unwrap_or_else(|p| p.into_inner())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RewindError> + Send + 'static,
) -> Result<T, RewindError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(RewindError::Task(e.to_string())))
}

fn cause(tool: &str, n: u64) -> Cause {
    Cause {
        tool: tool.into(),
        request_id: String::new(),
        args: json!({ "to": n, "running": true }),
    }
}

/// The checkpoint before (it undoes the rewind), the target and the
/// current state; refused when the target holds a file the history could
/// not keep (and the layer does not hold it as it is).
fn prepare(h: &mut History, n: u64) -> Result<(Line, State, State), RewindError> {
    let target = h.state_at(n)?;
    let before = h.take_whole(&cause("(before rewind)", n))?;
    let current = h.state().clone();
    if let Some((p, _)) = target
        .iter()
        .find(|(p, t)| matches!(t, Node::Unkept { .. }) && current.get(*p) != Some(*t))
    {
        return Err(HistoryError::Unkept { n, path: p.clone() }.into());
    }
    Ok((before, target, current))
}

/// Starts the rewinder (through the broker when the supervisor is
/// confined) and drives it.
fn write(
    broker: Option<Arc<crate::supervisor::broker::Broker>>,
    init_pid: u32,
    workspace: &Path,
    h: &History,
    target: &State,
    current: &State,
) -> Result<Done, RewindError> {
    let sock = match broker {
        Some(b) => std::os::unix::net::UnixStream::from(b.rewinder(init_pid)?),
        None => {
            let (sock, child) = rewinder::spawn(init_pid, workspace).map_err(RewindError::Start)?;
            rewinder::spawn::reap(child);
            sock
        }
    };
    Ok(rewinder::drive(
        sock,
        target,
        current,
        &h.dir().join("objects"),
    )?)
}

/// Every entry checkpoint N holds is in the layer as N has it (files by
/// content and mode, links by target, directories by mode, removals as
/// removed); owners are the rewinder's (the agent's uid). What the
/// rewind brought back from the workspace's own tree the rewinder checked.
fn check(n: u64, target: &State, now: &State) -> Result<(), RewindError> {
    let strip = |node: &Node| {
        let mut x = node.clone();
        if let Node::File { owner, .. } | Node::Dir { owner, .. } | Node::Link { owner, .. } =
            &mut x
        {
            *owner = None;
        }
        x
    };
    for (p, t) in target {
        let ok = match (t, now.get(p)) {
            (Node::Whiteout, None | Some(Node::Whiteout)) => true,
            (Node::Dir { .. }, None) => true,
            (Node::Dir { mode: a, .. }, Some(Node::Dir { mode: b, .. })) => a == b,
            (t, Some(x)) => strip(t) == strip(x),
            (_, None) => false,
        };
        if !ok {
            return Err(RewindError::Differs { n, path: p.clone() });
        }
    }
    Ok(())
}
