//! `[mcp] ask_toolsets`: a tool of a toolset the instance does not enable
//! is listed (its description says it asks first) and, when called, asks a
//! human: the MCP client by elicitation (a fixed-form question of sandmux's
//! own words and the tool's catalog name; the choices once, for this
//! instance, deny) and the operator (`sandmux approve`), as `[mcp] ask_via`
//! says; the first answer wins (`crate::runtime::approvals`). Once runs this
//! call only; for the instance enables the tool for the rest of it. While
//! the call waits, a client that gave a progress token is told so every
//! few seconds. On protocol 2026-07-28 (no requests from server to client)
//! the client is asked the way that protocol gives: an `input_required`
//! result carrying the elicitation, answered by calling again
//! (`crate::runtime::rounds` holds the question meanwhile).

use super::Server;
use crate::mcp::catalog::{toolset_name, ToolDef};
use crate::profile::{Act, Toolset, Via};
use crate::runtime::approvals::shown::{detail, Detail};
use crate::runtime::approvals::{Answer, ClientAnswer, Grant};
use crate::runtime::rounds;
use rmcp::model::{
    CallToolRequestParams, ElicitRequest, ElicitRequestParams, ElicitationSchema, InputRequest,
    InputRequiredResult, ProgressNotificationParam, ProtocolVersion, Tool,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::RoleServer;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// What a listed askable tool's description starts with.
pub(super) const MARK: &str = "[asks a human first: not enabled for this instance] ";

/// The three choices, as the client shows them.
const CHOICES: [&str; 3] = ["once", "for this instance", "deny"];
/// The choices for a tool that always asks (`Props::always_asks`).
const ONE_CALL: [&str; 2] = ["once", "deny"];

/// The key of sandmux's question in an `input_required` result.
const KEY: &str = "sandmux_approval";

/// How often a waiting call's client hears that it still waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What asking came to.
pub(super) enum Asked {
    /// A human allowed it: run the call.
    Run(Grant),
    /// Protocol 2026-07-28: the client is to answer and call again.
    Input(InputRequiredResult),
}

impl Server {
    /// Whether `def` is askable: not enabled, not taken away at runtime
    /// (a revoke is a human's no), and in a toolset `ask_toolsets` names.
    /// An execute tool `[mcp] act = "on-grant"` holds until a grant was
    /// not taken away: the agent may ask for it (for the instance is the
    /// grant, of that one tool).
    pub(super) fn askable(&self, def: &ToolDef) -> bool {
        let m = &self.s.policy.mcp;
        let held = m.act == Act::OnGrant && def.toolset == Toolset::Execute;
        !self.enabled(def.name)
            && (held || !self.s.ceiling.contains(def.name))
            && !self.s.approvals.tool_revoked(def.name)
            && m.ask_toolsets.contains(&def.toolset)
    }

    /// The listed form of an askable tool.
    pub(super) fn marked(t: &Tool) -> Tool {
        let mut t = t.clone();
        let d = t.description.as_deref().unwrap_or_default();
        t.description = Some(format!("{MARK}{d}").into());
        t
    }

    /// Asks about `def` for this call; the tool is enabled for the
    /// instance when a human said so.
    pub(super) async fn ask(
        &self,
        def: &'static ToolDef,
        req: &CallToolRequestParams,
        args: &Value,
        cx: &RequestContext<RoleServer>,
    ) -> Result<Asked, String> {
        let g = if stateless(cx) {
            match self.ask_in_rounds(def, req, args, cx).await? {
                Asked::Run(g) => g,
                input => return Ok(input),
            }
        } else {
            self.ask_now(def, args, cx).await?
        };
        let revoked = || Err("the operator revoked the tool while a human was asked".into());
        if g == Grant::Instance {
            // Checked and enabled under one lock: a revoke marks the tool
            // before it takes the lock, so it cannot slip in between.
            let enabled = match self.s.enabled.write() {
                Ok(mut en) if !self.s.approvals.tool_revoked(def.name) => {
                    en.insert(def.name);
                    true
                }
                _ => false,
            };
            if !enabled {
                return revoked();
            }
            // The client lists it again, without the mark.
            self.s.peers.tools_changed().await;
        } else if self.s.approvals.tool_revoked(def.name) {
            // A revoke while the human answered is a standing no all the
            // same (and `run` checks a once again before it runs).
            return revoked();
        }
        Ok(Asked::Run(g))
    }

    /// Protocols with requests from server to client: the call waits while
    /// the client (elicitation) and the operator are asked.
    async fn ask_now(
        &self,
        def: &'static ToolDef,
        args: &Value,
        cx: &RequestContext<RoleServer>,
    ) -> Result<Grant, String> {
        let via = &self.s.policy.mcp.ask_via;
        let detail = detail(args);
        let client = (via.contains(&Via::Client)
            && !cx.peer.supported_elicitation_modes().is_empty())
        .then(|| elicit(cx.peer.clone(), def, &detail));
        let call = super::request_id_text(&cx.id);
        let operator = via.contains(&Via::Operator);
        let asked = self.s.approvals.ask_tool(
            def.name,
            &call,
            &detail,
            client,
            (operator, def.props.always_asks),
        );
        self.waiting(async move { asked.await.map_err(|e| e.to_string()) }, cx)
            .await
    }

    /// Waits for `asked`, telling the client so; a call the client cancels
    /// stops asking (its question is withdrawn).
    async fn waiting<T>(
        &self,
        asked: impl std::future::Future<Output = Result<T, String>>,
        cx: &RequestContext<RoleServer>,
    ) -> Result<T, String> {
        tokio::select! {
            g = asked => g,
            () = cx.ct.cancelled() => Err("the call was cancelled while a human was asked".into()),
            () = self.tell_waiting(cx) => unreachable!("telling never ends"),
        }
    }

    /// Protocol 2026-07-28: the first round opens the question (the
    /// operator may answer it too) and answers `input_required`; the retry
    /// brings the client's answer and waits for the question's outcome.
    async fn ask_in_rounds(
        &self,
        def: &'static ToolDef,
        req: &CallToolRequestParams,
        args: &Value,
        cx: &RequestContext<RoleServer>,
    ) -> Result<Asked, String> {
        let via = &self.s.policy.mcp.ask_via;
        let elicits = cx
            .client_capabilities()
            .is_some_and(|c| c.elicitation.is_some());
        if !(via.contains(&Via::Client) && elicits) {
            // Only the operator can be asked: the call waits for them.
            return self.ask_now(def, args, cx).await.map(Asked::Run);
        }
        let digest = rounds::digest(def.name, args);
        if let Some(handle) = &req.request_state {
            let answer = req
                .input_responses
                .as_ref()
                .and_then(|r| r.get(KEY))
                .map(|v| answer_of(v.get("action"), v.get("content")));
            let waited = async {
                let (g, first) = self.s.rounds.answer(handle, def.name, digest, answer).await;
                if let (Ok(_), Some(first)) = (&g, first) {
                    let retry = super::request_id_text(&cx.id);
                    self.s.approvals.redeemed(def.name, &first, &retry);
                }
                g.map_err(|e| e.to_string())
            };
            return self.waiting(waited, cx).await.map(Asked::Run);
        }
        let ap = self.s.approvals.clone();
        let operator = via.contains(&Via::Operator);
        let call = super::request_id_text(&cx.id);
        let detail = detail(args);
        let shown = detail.clone();
        let opened = self
            .s
            .rounds
            .open(def.name, digest, &call.clone(), move |client| async move {
                ap.ask_tool(
                    def.name,
                    &call,
                    &detail,
                    Some(client),
                    (operator, def.props.always_asks),
                )
                .await
                .map_err(rounds::RoundsError::from)
            })
            .await;
        match opened {
            Ok(handle) => {
                let mut ask = rounds_request(def, &shown);
                ask.request_state = Some(handle);
                Ok(Asked::Input(ask))
            }
            Err(outcome) => outcome.map(Asked::Run).map_err(|e| e.to_string()),
        }
    }

    /// While a call waits for a human: a progress notification every few
    /// seconds to a client that gave a progress token. Never ends.
    async fn tell_waiting(&self, cx: &RequestContext<RoleServer>) {
        let Some(token) = cx.meta.get_progress_token() else {
            return std::future::pending().await;
        };
        let total = self.s.policy.mcp.ask_seconds;
        let t0 = Instant::now();
        loop {
            let waited = t0.elapsed().as_secs();
            let p = ProgressNotificationParam::new(token.clone(), waited as f64)
                .with_total(total as f64)
                .with_message(format!(
                    "waiting for a human's answer ({waited} of at most {total} s)"
                ));
            let _ = cx.peer.notify_progress(p).await;
            tokio::time::sleep(PROGRESS_EVERY).await;
        }
    }
}

/// Whether the request came on protocol 2026-07-28 or later (stateless:
/// no requests from server to client).
fn stateless(cx: &RequestContext<RoleServer>) -> bool {
    cx.protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

/// The fixed-form question: sandmux's words and the catalog's names, then,
/// last and after a line saying whose they are, the arguments as
/// [`detail`] shows them (one line of JSON, no run of spaces): nothing the
/// agent wrote stands where sandmux's words do.
fn question(def: &ToolDef, detail: &Detail) -> ElicitRequestParams {
    let cut = match detail.cut_from {
        Some(n) => format!(" (the first {} bytes of {n})", detail.text.len()),
        None => String::new(),
    };
    // A tool that always asks is never granted past this call.
    let (why, offer, choices): (&str, &str, &[&str]) = match def.props.always_asks {
        true => (
            "asks a human before every call",
            "Allow this call, or deny?",
            &ONE_CALL,
        ),
        false => (
            "this instance's profile does not enable",
            "Allow it once (this call only), for this instance, or deny?",
            &CHOICES,
        ),
    };
    let message = format!(
        "sandmux: the agent asks to use the tool {} (toolset {}), which {why}. {offer}\n\
         The call's arguments{cut}, as JSON, follow on the next line; that line is the agent's text, not sandmux's:\n{}",
        def.name,
        toolset_name(def.toolset),
        detail.text
    );
    let schema = json!({
        "type": "object",
        "properties": {"answer": {"type": "string", "title": "Answer", "enum": choices}},
        "required": ["answer"],
    });
    let Value::Object(obj) = schema else {
        unreachable!("a JSON object literal")
    };
    let requested_schema = ElicitationSchema::from_json_schema(obj)
        .expect("the fixed schema is an elicitation schema");
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema,
    }
}

/// The `input_required` result asking the question (its state added by
/// the caller).
fn rounds_request(def: &ToolDef, detail: &Detail) -> InputRequiredResult {
    let mut asks = rmcp::model::InputRequests::new();
    asks.insert(
        KEY.to_string(),
        InputRequest::Elicitation(ElicitRequest::new(question(def, detail))),
    );
    InputRequiredResult::from_input_requests(asks)
}

/// An elicitation's result as an answer: accept with a choice, or no.
fn answer_of(action: Option<&Value>, content: Option<&Value>) -> Answer {
    match (
        action.and_then(Value::as_str),
        content.and_then(|c| c["answer"].as_str()),
    ) {
        (Some("accept"), Some("once")) => Answer::Allow(Grant::Once),
        (Some("accept"), Some("for this instance")) => Answer::Allow(Grant::Instance),
        // Decline, cancel, a choice not offered, and whatever a later
        // protocol adds: no.
        _ => Answer::Deny,
    }
}

/// The client's answer, by elicitation: None when it gives none (an
/// error, a protocol without server requests).
fn elicit(peer: Peer<RoleServer>, def: &'static ToolDef, detail: &Detail) -> ClientAnswer {
    let params = question(def, detail);
    Box::pin(async move {
        let r = peer.create_elicitation(params).await.ok()?;
        // The same reading as a 2026-07-28 client's `inputResponses` entry.
        let r = serde_json::to_value(r).ok()?;
        Some(answer_of(r.get("action"), r.get("content")))
    })
}
