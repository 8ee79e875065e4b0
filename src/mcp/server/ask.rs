//! `[mcp] ask_toolsets`: a tool of a toolset the instance does not enable
//! is listed (its description says it asks first) and, when called, asks a
//! human: the MCP client by elicitation (a fixed-form question of sandmux's
//! own words and the tool's catalog name; the choices once, for this
//! instance, deny) and the operator (`sandmux approve`), as `[mcp] ask_via`
//! says; the first answer wins (`super::super::approvals`). Once runs this
//! call only; for the instance enables the tool for the rest of it.

use super::Server;
use crate::mcp::approvals::{Answer, ClientAnswer, Grant};
use crate::mcp::catalog::{toolset_name, ToolDef};
use crate::profile::Via;
use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema, Tool};
use rmcp::service::{Peer, RequestContext};
use rmcp::RoleServer;
use serde_json::json;

/// What a listed askable tool's description starts with.
pub(super) const MARK: &str = "[asks a human first: not enabled for this instance] ";

/// The three choices, as the client shows them.
const CHOICES: [&str; 3] = ["once", "for this instance", "deny"];

impl Server {
    /// Whether `def` is askable: not enabled, not taken away at runtime
    /// (a revoke is a human's no), and in a toolset `ask_toolsets` names.
    pub(super) fn askable(&self, def: &ToolDef) -> bool {
        !self.enabled(def.name)
            && !self.s.ceiling.contains(def.name)
            && !self.s.approvals.tool_revoked(def.name)
            && self.s.policy.mcp.ask_toolsets.contains(&def.toolset)
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
        cx: &RequestContext<RoleServer>,
    ) -> Result<Grant, String> {
        let via = &self.s.policy.mcp.ask_via;
        let client = (via.contains(&Via::Client)
            && !cx.peer.supported_elicitation_modes().is_empty())
        .then(|| elicit(cx.peer.clone(), def));
        let asked = self
            .s
            .approvals
            .ask_tool(def.name, client, via.contains(&Via::Operator));
        // A call the client cancels stops asking (its question is withdrawn).
        let g = tokio::select! {
            g = asked => g?,
            () = cx.ct.cancelled() => return Err("the call was cancelled while a human was asked".into()),
        };
        if g == Grant::Instance {
            if let Ok(mut en) = self.s.enabled.write() {
                en.insert(def.name);
            }
            // The client lists it again, without the mark.
            self.s.peers.tools_changed().await;
        }
        Ok(g)
    }
}

/// The client's answer, by elicitation: None when it gives none (an
/// error, a protocol without server requests).
fn elicit(peer: Peer<RoleServer>, def: &'static ToolDef) -> ClientAnswer {
    let message = format!(
        "sandmux: the agent asks to use the tool {} (toolset {}), which this instance's profile does not enable. Allow it once, for this instance, or deny?",
        def.name,
        toolset_name(def.toolset)
    );
    Box::pin(async move {
        let schema = json!({
            "type": "object",
            "properties": {"answer": {"type": "string", "title": "Answer", "enum": CHOICES}},
            "required": ["answer"],
        });
        let serde_json::Value::Object(obj) = schema else {
            return None;
        };
        let requested_schema = ElicitationSchema::from_json_schema(obj).ok()?;
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message,
            requested_schema,
        };
        let r = peer.create_elicitation(params).await.ok()?;
        match r.action {
            ElicitationAction::Accept => {
                match r.content.as_ref().and_then(|c| c["answer"].as_str()) {
                    Some("once") => Some(Answer::Allow(Grant::Once)),
                    Some("for this instance") => Some(Answer::Allow(Grant::Instance)),
                    _ => Some(Answer::Deny),
                }
            }
            // Decline, cancel, and whatever a later protocol adds: no.
            _ => Some(Answer::Deny),
        }
    })
}
