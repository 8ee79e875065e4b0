//! The operator endpoint: a Unix socket in the instance's runtime directory
//! (directory 0700, socket 0600, never visible inside the sandbox) through
//! which the human who started sandmux watches and steers it — `sandmux ps`,
//! `revoke`, `grant`, `freeze`, `thaw`, `stop`, `journal`, `metrics`, `rewind`. Only peers with sandmux's own uid are
//! served (checked with SO_PEERCRED). The protocol is one JSON object per line,
//! `{"v": 1, "op": ...}`, answered by one JSON object.
//!
//! What a request asks of the protocol above (the tools enabled, the
//! clients, `--http`'s token, the metrics) goes through [`Protocol`], which
//! `mcp` implements: this layer never names `mcp`.

use super::approvals::By;
use super::shared::Shared;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

/// Protocol version: a request of another version (a `sandmux` binary
/// other than the one that started the instance) is refused naming both.
pub(crate) const VERSION: u32 = 1;

/// What an operator command asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Op {
    /// `ps`, `attach`: the instance's status.
    Status,
    /// `stop`.
    Stop,
    /// `freeze`.
    Freeze,
    /// `thaw`.
    Thaw,
    /// `revoke` the tools selected.
    Revoke,
    /// `grant` the tools selected (within the ceiling).
    Grant,
    /// `approvals`: the open questions and the grants.
    Approvals,
    /// `approve` an open question.
    Approve,
    /// `deny` an open question.
    Deny,
    /// `expose` a port of the sandbox on the host (`runtime::expose`).
    Expose,
    /// `metrics`: the Prometheus text (`mcp::metrics`).
    Metrics,
    /// `token set`: the `serve --http --unclaimed` token (`mcp::http::router`).
    Token,
    /// `rewind` the running instance's workspace (`runtime::rewind`).
    Rewind,
}

impl Op {
    /// The command's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Status => "status",
            Op::Stop => "stop",
            Op::Freeze => "freeze",
            Op::Thaw => "thaw",
            Op::Revoke => "revoke",
            Op::Grant => "grant",
            Op::Approvals => "approvals",
            Op::Approve => "approve",
            Op::Deny => "deny",
            Op::Expose => "expose",
            Op::Metrics => "metrics",
            Op::Token => "token set",
            Op::Rewind => "rewind",
        }
    }
}

/// One operator request, as the CLI sends it and the endpoint reads it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Request {
    /// Always [`VERSION`] when made by [`Request::new`].
    v: u32,
    /// What is asked.
    pub op: Op,
    /// `revoke`/`grant`: a toolset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolset: Option<String>,
    /// `revoke`/`grant`: one tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// `revoke`/`grant`: every tool.
    #[serde(default)]
    pub all: bool,
    /// `revoke`/`grant`: one credential (`[[credentials]]`) by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// `revoke`: a name a human allowed (`scheme://host:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<String>,
    /// `approve`/`deny`: the question's number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<u64>,
    /// `approve`: for the rest of the instance, not once.
    #[serde(default)]
    pub for_instance: bool,
    /// With `revoke`: freeze once the tools are revoked.
    #[serde(default)]
    pub freeze: bool,
    /// `expose`: the port inside; `revoke`: the exposed port to end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// `expose`: the host port (none or 0: a free one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_port: Option<u16>,
    /// `expose`: the host address (none: 127.0.0.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// `rewind`: the checkpoint to rewind to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<u64>,
    /// `token set`: the token (never printed: its `Debug` hides it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
}

/// A secret in a request: serialized as itself, debugged as `<hidden>`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<hidden>")
    }
}

impl Request {
    /// A request for `op`, selecting nothing.
    pub(crate) fn new(op: Op) -> Request {
        Request {
            v: VERSION,
            op,
            credential: None,
            approval: None,
            question: None,
            for_instance: false,
            toolset: None,
            tool: None,
            all: false,
            freeze: false,
            port: None,
            host_port: None,
            address: None,
            checkpoint: None,
            token: None,
        }
    }

    /// Reads one line: the version first, so a request from a binary of
    /// another version is refused naming both, whatever else it holds.
    fn parse(line: &str) -> Result<Request, String> {
        #[derive(Deserialize)]
        struct Version {
            v: u32,
        }
        let Version { v } = serde_json::from_str(line).map_err(|e| format!("bad request: {e}"))?;
        if v != VERSION {
            return Err(format!(
                "this instance speaks operator protocol {VERSION} and the request is version {v}: use the sandmux binary that started the instance"
            ));
        }
        serde_json::from_str(line).map_err(|e| format!("bad request: {e}"))
    }
}

/// The protocol's facts `status` shows.
pub(crate) struct Surface {
    /// Toolsets with a tool enabled.
    pub toolsets: Vec<&'static str>,
    /// Tools enabled now.
    pub enabled: usize,
    /// The most that may ever be enabled.
    pub ceiling: usize,
    /// MCP clients connected.
    pub clients: usize,
    /// `serve --http`'s status, when it listens.
    pub http: Option<Value>,
    /// Configuration drift found, if any.
    pub drift: Option<String>,
}

/// What the endpoint asks of the MCP layer above it (`mcp::operated`
/// implements it for the protocol's state).
pub(crate) trait Protocol: Send + Sync + 'static {
    /// The runtime's state.
    fn shared(&self) -> &Arc<Shared>;
    /// The protocol's facts for `status`.
    fn surface(&self) -> Surface;
    /// The tools a `revoke`/`grant` request names (a toolset, a tool, or all).
    fn selected(&self, r: &Request) -> Result<BTreeSet<&'static str>, String>;
    /// Takes `names` out of the enabled tools, or (`grant`) puts back those
    /// within the ceiling; gives those that are not.
    fn set_enabled(
        &self,
        names: &BTreeSet<&'static str>,
        grant: bool,
    ) -> Result<Vec<&'static str>, String>;
    /// Tells every client that the tool list changed.
    fn tools_changed(&self) -> impl std::future::Future<Output = ()> + Send;
    /// The answer to `metrics`.
    fn metrics(&self) -> Value;
    /// The answer to `token set` (`serve --http --unclaimed`).
    fn set_token(&self, token: &[u8], uid: u32) -> Value;
}

/// Status of the instance, as `ps` shows it.
pub(crate) fn status(p: &impl Protocol) -> Value {
    let s = p.shared();
    let t = p.surface();
    json!({
        "ok": true,
        "profile": s.policy.name,
        "workspace": s.policy.workspace,
        "toolsets": t.toolsets,
        "tools_enabled": t.enabled,
        "tools_ceiling": t.ceiling,
        "client_connected": t.clients > 0,
        "clients": t.clients,
        "http": t.http,
        "audit_log": s.audit.path(),
        "audit": s.audit.status(),
        "drift": t.drift,
        "workspace_reverted": s.reverts.as_ref().map(|r| r.count()).unwrap_or(0),
        "frozen": s.freeze.get(),
        "questions_open": s.approvals.open_count(),
        "exposures": s.exposures.list(),
    })
}

/// A freeze or thaw, answered with the status.
async fn freezing(p: &impl Protocol, thaw: bool) -> Value {
    let s = p.shared();
    let r = if thaw {
        super::freeze::thaw(s).await
    } else {
        super::freeze::freeze(s).await
    };
    match r {
        Ok(v) => {
            let mut st = status(p);
            st["already"] = v["already"].clone();
            st
        }
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    }
}

/// `approve`/`deny`: the first answer wins; who answered is recorded.
fn answer(s: &Shared, r: &Request, uid: u32) -> Value {
    use super::approvals::{Answer, Grant};
    let Some(q) = r.question else {
        return json!({"ok": false, "error": "name the question (sandmux approvals ID lists them)"});
    };
    let a = match (r.op, r.for_instance) {
        (Op::Approve, false) => Answer::Allow(Grant::Once),
        (Op::Approve, true) => Answer::Allow(Grant::Instance),
        _ => Answer::Deny,
    };
    match s.approvals.answer(q, a, By::Operator { uid }) {
        Ok((name, granted)) => {
            let granted = match granted {
                Answer::Allow(Grant::Instance) => "instance",
                Answer::Allow(Grant::Once) => "once",
                Answer::Deny => "nothing",
            };
            json!({"ok": true, "question": q, "name": name, "granted": granted})
        }
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    }
}

async fn handle(p: &impl Protocol, line: &str, uid: u32) -> Value {
    let r = match Request::parse(line) {
        Ok(r) => r,
        Err(e) => return json!({"ok": false, "error": e}),
    };
    let s = p.shared();
    match r.op {
        Op::Status => status(p),
        Op::Metrics => p.metrics(),
        Op::Token => {
            let t = r.token.as_ref().map(|t| t.0.as_bytes()).unwrap_or_default();
            p.set_token(t, uid)
        }
        Op::Stop => {
            s.shutdown.cancel();
            json!({"ok": true, "stopping": true})
        }
        Op::Freeze => freezing_when_ready(p, false).await,
        Op::Rewind => super::rewind::rewind(s, r.checkpoint, uid).await,
        Op::Thaw => freezing_when_ready(p, true).await,
        Op::Approvals => json!({"ok": true, "approvals": s.approvals.list()}),
        Op::Approve | Op::Deny => answer(s, &r, uid),
        Op::Expose => expose(s, &r, uid).await,
        Op::Revoke if r.port.is_some() => {
            let port = r.port.unwrap_or_default();
            let by = format!("revoked by operator uid {uid}");
            super::expose::unexpose(s, port, &by)
                .unwrap_or_else(|e| json!({"ok": false, "error": e.to_string()}))
        }
        Op::Revoke | Op::Grant if r.credential.is_some() => credential(p, &r),
        Op::Revoke | Op::Grant if r.approval.is_some() => approval(s, &r, uid),
        Op::Revoke | Op::Grant => tools(p, &r, uid).await,
    }
}

/// `revoke --approval NAME`: a name a human allowed is allowed no more (a
/// name is allowed by answering its question, never by `grant`).
fn approval(s: &Shared, r: &Request, uid: u32) -> Value {
    let name = r.approval.as_deref().unwrap_or_default();
    if r.op == Op::Grant {
        json!({"ok": false, "error": "a name is allowed by answering its question (sandmux approve), not by grant"})
    } else if s.approvals.revoke(name, &By::Operator { uid }) {
        json!({"ok": true, "revoked": name})
    } else {
        json!({"ok": false, "error": format!("no grant for {:?} (sandmux approvals ID lists them)", crate::term::printable(name))})
    }
}

/// `revoke`/`grant` of tools (a toolset, a tool, or all), answered with the
/// status and the tools not granted (outside the ceiling).
async fn tools(p: &impl Protocol, r: &Request, uid: u32) -> Value {
    let s = p.shared();
    let names = match p.selected(r) {
        Ok(n) => n,
        Err(e) => return json!({"ok": false, "error": e}),
    };
    // A revoked tool is a standing no: not asked about, its grant
    // gone. Marked before it leaves the enabled set, so a human's
    // "for this instance" landing meanwhile (checked under the same
    // lock) cannot put it back.
    let list: Vec<&str> = names.iter().copied().collect();
    let by = By::Operator { uid };
    if r.op == Op::Revoke {
        s.approvals.tools_revoked(&list, false, &by);
    }
    let refused = match p.set_enabled(&names, r.op == Op::Grant) {
        Ok(refused) => refused,
        Err(e) => return json!({"ok": false, "error": e}),
    };
    if r.op == Op::Grant {
        s.approvals.tools_revoked(&list, true, &by);
    }
    // The client learns at once; the next call is checked against the new set.
    p.tools_changed().await;
    if r.op == Op::Revoke && r.freeze {
        let mut st = freezing_when_ready(p, false).await;
        if let Some(e) = st["error"].as_str() {
            st["error"] = json!(format!("the tools are revoked, but {e}"));
        }
        st["not_granted"] = json!(refused);
        return st;
    }
    let mut st = status(p);
    st["not_granted"] = json!(refused);
    st
}

/// `revoke --credential` / `grant --credential`: later requests carrying
/// its placeholder are refused (or substituted again); audited.
fn credential(p: &impl Protocol, r: &Request) -> Value {
    let s = p.shared();
    let name = r.credential.as_deref().unwrap_or_default();
    let on = r.op == Op::Grant;
    let Some(v) = &s.vault else {
        return json!({"ok": false, "error": "this instance has no credentials ([[credentials]] in its profile)"});
    };
    if !v.set_granted(name, on) {
        return json!({"ok": false, "error": format!("no credential named {:?} in this instance", crate::term::printable(name))});
    }
    let kind = if on {
        "credential_granted"
    } else {
        "credential_revoked"
    };
    s.audit.event(crate::audit::Entry::event(
        "(credentials)",
        Some(kind),
        &json!({"name": name}),
    ));
    let mut st = status(p);
    st["credentials"] = v.status();
    st
}

/// `expose`: the request checked, then the port exposed.
async fn expose(s: &Arc<Shared>, r: &Request, uid: u32) -> Value {
    let Some(port) = r.port else {
        return json!({"ok": false, "error": "name the port inside"});
    };
    let by = format!("operator uid {uid}");
    let host = match super::expose::checked(port, r.host_port, r.address.as_deref()) {
        Ok(host) => host,
        Err(e) => return json!({"ok": false, "error": e}),
    };
    super::expose::expose(s, port, host, &by)
        .await
        .unwrap_or_else(|e| json!({"ok": false, "error": e.to_string()}))
}

/// The endpoint is bound before the first sessions exist: `stop`, `status`,
/// `revoke` and `grant` act at once; a freeze or thaw waits for them (the
/// sandbox stopped while they are made would end the instance).
async fn freezing_when_ready(p: &impl Protocol, thaw: bool) -> Value {
    match p.shared().until_ready().await {
        Ok(()) => freezing(p, thaw).await,
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
pub(crate) async fn serve<P: Protocol>(listener: UnixListener, p: Arc<P>) -> std::io::Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => r?,
            _ = p.shared().shutdown.cancelled() => return Ok(()),
        };
        let uid = stream.peer_cred().map(|c| c.uid()).unwrap_or(u32::MAX);
        let p = p.clone();
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
                let reply = handle(&*p, &line, uid).await;
                if wr.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
                    break;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_read_version_first() {
        let e = Request::parse(r#"{"v":2,"op":"nuke"}"#).unwrap_err();
        assert!(e.contains("protocol 1") && e.contains("version 2"), "{e}");
        let e = Request::parse(r#"{"v":1,"op":"nuke"}"#).unwrap_err();
        assert!(e.contains("unknown variant") && e.contains("thaw"), "{e}");
        assert!(Request::parse(r#"{"op":"stop"}"#).is_err());
        let mut r = Request::new(Op::Grant);
        r.toolset = Some("execute".into());
        let back = Request::parse(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(
            (back.op, back.toolset.as_deref()),
            (Op::Grant, Some("execute"))
        );
        for op in [
            Op::Status,
            Op::Stop,
            Op::Freeze,
            Op::Thaw,
            Op::Revoke,
            Op::Grant,
        ] {
            let line = serde_json::to_string(&Request::new(op)).unwrap();
            assert!(
                line.contains(&format!("\"op\":\"{}\"", op.name())),
                "{line}"
            );
        }
    }
}
