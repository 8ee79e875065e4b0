//! The instance as a whole: its tmux server, batches of reads, replays of
//! its output, and its end.

use super::{batch_rules, done, Done, NoArgs};
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::targets::{self, PaneSel};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Instant;

/// `get_server_info` result.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ServerInfo {
    /// Always true while sandmux answers.
    pub alive: bool,
    /// tmux version.
    pub version: String,
    /// The server's pid inside the sandbox.
    pub pid: i32,
    /// The generation id sandmux set when it started this server.
    pub generation: String,
    /// Sessions (sandmux's own hidden one excluded).
    pub sessions: usize,
    /// "none", or why calls are refused.
    pub drift: String,
    /// The socket is private to sandmux; no tool takes one.
    pub socket: String,
    /// Profile name.
    pub profile: String,
}

/// The server.
pub(crate) async fn get_server_info(c: &Call<'_>, _: NoArgs) -> Result<ServerInfo, ToolError> {
    let panes = targets::panes(c).await?;
    Ok(ServerInfo {
        alive: true,
        version: c.s.info().tmux_version.clone(),
        pid: c.s.info().server_pid,
        generation: c.s.info().generation.clone(),
        sessions: panes
            .iter()
            .map(|p| &p.session_id)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        drift: c.s.drift.tripped().unwrap_or_else(|| "none".into()),
        socket: "private to this sandmux instance (not reachable from inside the sandbox)".into(),
        profile: c.s.policy.name.clone(),
    })
}

/// Ends the instance: answers first, then the server stops.
pub(crate) async fn kill_server(c: &Call<'_>, _: NoArgs) -> Result<Done, ToolError> {
    c.s.shutdown.cancel();
    done("the instance is ending: the tmux server, every process in the sandbox and the runtime directory go away after this reply; start sandmux again for a fresh one")
}

/// One operation of a read batch.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct BatchOp {
    /// An inspect tool's name.
    pub tool: String,
    /// Its arguments.
    #[serde(default)]
    pub arguments: Value,
}

/// `call_read_tools_batch`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Batch {
    /// 1–100 operations.
    pub operations: Vec<BatchOp>,
    /// After an error (default: stop).
    pub on_error: Option<crate::mcp::choices::OnError>,
}

/// One result of a batch.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct BatchItem {
    /// Position.
    pub index: usize,
    /// Tool.
    pub tool: String,
    /// Whether it succeeded.
    pub ok: bool,
    /// Its structured result.
    pub result: Option<Value>,
    /// Its error.
    pub error: Option<String>,
}

/// Batch result.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct BatchResult {
    /// Results in order.
    pub results: Vec<BatchItem>,
}

/// Runs several inspect tools (each checked and audited on its own by the server).
pub(crate) async fn call_read_tools_batch(
    c: &Call<'_>,
    a: Batch,
) -> Result<BatchResult, ToolError> {
    let stop = batch_rules(a.operations.len(), a.on_error)?;
    let deadline = Instant::now() + c.s.wait_max;
    let mut results = Vec::new();
    for (index, op) in a.operations.into_iter().enumerate() {
        if Instant::now() > deadline {
            results.push(BatchItem {
                index,
                tool: op.tool,
                ok: false,
                result: None,
                error: Some("the batch deadline passed".into()),
            });
            break;
        }
        let r = crate::mcp::server::dispatch_nested(c, &op.tool, op.arguments).await;
        let failed = r.is_err();
        results.push(match r {
            Ok(v) => BatchItem {
                index,
                tool: op.tool,
                ok: true,
                result: Some(v),
                error: None,
            },
            Err(e) => BatchItem {
                index,
                tool: op.tool,
                ok: false,
                result: None,
                error: Some(e.to_string()),
            },
        });
        if failed && stop {
            break;
        }
    }
    Ok(BatchResult { results })
}

/// Most bytes of cast one `export_replay` answer holds.
pub(crate) const REPLAY_MAX_BYTES: usize = 900_000;
/// Fewest bytes a window may ask for (every line of a cast is shorter).
const REPLAY_MIN_BYTES: usize = 65_536;

/// `export_replay`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Replay {
    #[serde(flatten)]
    pub p: PaneSel,
    /// Where in the recording to start: 0 (default) or a next_offset.
    pub offset: Option<u64>,
    /// Most bytes to return (65536-900000, default 900000).
    pub max_bytes: Option<usize>,
}

/// An asciicast v2 document, or a window of one.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ReplayResult {
    /// "recording" (the --record file so far) or "snapshot" (the pane's screen now).
    pub mode: String,
    /// Whole lines of asciicast v2 (a header at offset 0, then events).
    pub cast: String,
    /// Whether more follows.
    pub truncated: bool,
    /// Where this window starts.
    pub offset: u64,
    /// Where the next window starts (null at the end).
    pub next_offset: Option<u64>,
    /// Bytes of the whole recording (or snapshot).
    pub size: u64,
    /// Whether the recording stopped at [recording] max_bytes.
    pub cut: bool,
}

/// The instance's terminal output as asciicast v2: a window of the running
/// recording when serve has --record, else a snapshot of a pane's screen.
/// Never reads more of the file than the window.
pub(crate) async fn export_replay(c: &Call<'_>, a: Replay) -> Result<ReplayResult, ToolError> {
    let max = a.max_bytes.unwrap_or(REPLAY_MAX_BYTES);
    if !(REPLAY_MIN_BYTES..=REPLAY_MAX_BYTES).contains(&max) {
        return Err(ToolError::invalid(
            "max_bytes",
            "must be 65536-900000",
            "omit it for 900000",
        ));
    }
    let offset = a.offset.unwrap_or(0);
    if let Some(rec) = &c.s.record {
        let w = crate::runtime::record::read_window(rec.path(), offset, max).map_err(|e| {
            ToolError::invalid(
                "offset",
                &e.to_string(),
                "use 0 or the next_offset of the last answer",
            )
        })?;
        return Ok(ReplayResult {
            mode: "recording".into(),
            cast: w.text,
            truncated: w.next.is_some(),
            offset,
            next_offset: w.next,
            size: w.size,
            cut: rec.view().cut,
        });
    }
    if offset != 0 {
        return Err(ToolError::invalid(
            "offset",
            "a snapshot is made anew by each call and has no offsets",
            "omit offset (it pages through a --record recording)",
        ));
    }
    let p = targets::pane(c, &a.p).await?;
    let cast = crate::runtime::record::snapshot_cast(&c.s.hub(), &p.pane_id)
        .await
        .map_err(|e| ToolError::Internal(e.to_string()))?;
    let size = cast.len() as u64;
    let (cast, truncated) = crate::runtime::record::cut_lines(cast, max);
    Ok(ReplayResult {
        mode: "snapshot".into(),
        cast,
        truncated,
        offset: 0,
        next_offset: None,
        size,
        cut: false,
    })
}
