//! The operator endpoint: a Unix socket in the instance's runtime directory
//! (directory 0700, socket 0600, never visible inside the sandbox) through
//! which the human who started sandmux watches and steers it — `sandmux ps`,
//! `revoke`, `grant`, `freeze`, `thaw`, `stop`, `journal`. Only peers with sandmux's own uid are
//! served (checked with SO_PEERCRED). The protocol is one JSON object per line,
//! `{"v": 1, "op": ...}`, answered by one JSON object.

use super::catalog::{toolset_named, toolset_names, TOOLS, TOOLSETS};
use super::ctx::State;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

/// Protocol version.
pub(crate) const VERSION: u32 = 1;

#[derive(Debug, Deserialize)]
struct Req {
    v: u32,
    op: String,
    toolset: Option<String>,
    tool: Option<String>,
    #[serde(default)]
    all: bool,
    /// With `revoke`: freeze once the tools are revoked.
    #[serde(default)]
    freeze: bool,
}

/// The tools a request names (a toolset, a tool, or all).
fn selected(r: &Req) -> Result<BTreeSet<&'static str>, String> {
    if r.all {
        return Ok(TOOLS.iter().map(|t| t.name).collect());
    }
    if let Some(ts) = &r.toolset {
        let ts = toolset_named(ts)
            .ok_or_else(|| format!("unknown toolset {ts:?}; valid: {}", toolset_names()))?;
        return Ok(TOOLS
            .iter()
            .filter(|t| t.toolset == ts)
            .map(|t| t.name)
            .collect());
    }
    if let Some(t) = &r.tool {
        return TOOLS
            .iter()
            .find(|d| d.name == t)
            .map(|d| [d.name].into())
            .ok_or_else(|| format!("unknown tool {t:?}"));
    }
    Err("name --toolset, --tool or --all".into())
}

/// Status of the instance, as `ps` shows it.
pub(crate) fn status(s: &State) -> Value {
    let enabled = s.enabled.read().map(|e| e.clone()).unwrap_or_default();
    let toolsets: Vec<&str> = TOOLSETS
        .iter()
        .filter(|(ts, _)| {
            TOOLS
                .iter()
                .any(|t| t.toolset == *ts && enabled.contains(t.name))
        })
        .map(|(_, n)| *n)
        .collect();
    json!({
        "ok": true,
        "profile": s.policy.name,
        "workspace": s.policy.workspace,
        "toolsets": toolsets,
        "tools_enabled": enabled.len(),
        "tools_ceiling": s.ceiling.len(),
        "client_connected": s.peers.connected() > 0,
        "clients": s.peers.connected(),
        "http": s.http.get().map(|h| h.status()),
        "audit_log": s.audit.path(),
        "audit": s.audit.status(),
        "drift": s.drift.tripped(),
        "workspace_reverted": s.reverts.as_ref().map(|r| r.count()).unwrap_or(0),
        "frozen": s.freeze.get(),
    })
}

/// A freeze or thaw, answered with the status.
async fn freezing(s: &State, thaw: bool) -> Value {
    let r = if thaw {
        super::freeze::thaw(s).await
    } else {
        super::freeze::freeze(s).await
    };
    match r {
        Ok(v) => {
            let mut st = status(s);
            st["already"] = v["already"].clone();
            st
        }
        Err(e) => json!({"ok": false, "error": e}),
    }
}

async fn handle(s: &Arc<State>, line: &str) -> Value {
    let r: Req = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => return json!({"ok": false, "error": format!("bad request: {e}")}),
    };
    if r.v != VERSION {
        return json!({"ok": false, "error": format!("protocol version {} is not {VERSION}", r.v)});
    }
    match r.op.as_str() {
        "status" => status(s),
        "stop" => {
            s.shutdown.cancel();
            json!({"ok": true, "stopping": true})
        }
        "freeze" => freezing_when_ready(s, false).await,
        "thaw" => freezing_when_ready(s, true).await,
        "revoke" | "grant" => {
            let names = match selected(&r) {
                Ok(n) => n,
                Err(e) => return json!({"ok": false, "error": e}),
            };
            let mut refused = Vec::new();
            {
                let Ok(mut en) = s.enabled.write() else {
                    return json!({"ok": false, "error": "state poisoned"});
                };
                for n in &names {
                    if r.op == "revoke" {
                        en.remove(n);
                    } else if s.ceiling.contains(n) {
                        en.insert(n);
                    } else {
                        refused.push(*n);
                    }
                }
            }
            // The client learns at once; the next call is checked against the new set.
            s.peers.tools_changed().await;
            if r.op == "revoke" && r.freeze {
                let mut st = freezing_when_ready(s, false).await;
                if let Some(e) = st["error"].as_str() {
                    st["error"] = json!(format!("the tools are revoked, but {e}"));
                }
                st["not_granted"] = json!(refused);
                return st;
            }
            let mut st = status(s);
            st["not_granted"] = json!(refused);
            st
        }
        other => json!({"ok": false, "error": format!("unknown op {other:?}")}),
    }
}

/// The endpoint is bound before the first sessions exist: `stop`, `status`,
/// `revoke` and `grant` act at once; a freeze or thaw waits for them (the
/// sandbox stopped while they are made would end the instance).
async fn freezing_when_ready(s: &Arc<State>, thaw: bool) -> Value {
    match s.until_ready().await {
        Ok(()) => freezing(s, thaw).await,
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    }
}

/// Binds the endpoint (0600, in the private runtime directory).
pub(crate) fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Answers the operator on `listener` ([`bind`]) until the instance ends.
pub(crate) async fn serve(listener: UnixListener, s: Arc<State>) -> std::io::Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => r?,
            _ = s.shutdown.cancelled() => return Ok(()),
        };
        let uid = stream.peer_cred().map(|c| c.uid()).unwrap_or(u32::MAX);
        let s = s.clone();
        tokio::spawn(async move {
            let (rd, mut wr) = stream.into_split();
            let mut lines = BufReader::new(rd).lines();
            if uid != me {
                // Answer the first request with a refusal, act on nothing.
                let _ = tokio::time::timeout(std::time::Duration::from_secs(2), lines.next_line())
                    .await;
                let _ = wr.write_all(format!("{}\n", json!({"ok": false, "error": format!("uid {uid} may not control this instance")})).as_bytes()).await;
                return;
            }
            while let Ok(Some(line)) = lines.next_line().await {
                let reply = handle(&s, &line).await;
                if wr.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
                    break;
                }
            }
        });
    }
}
