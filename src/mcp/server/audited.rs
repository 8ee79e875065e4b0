//! What the audit log says of each request: who sent it and its outcome,
//! also for the requests that never reach a handler (lines that did not
//! parse, parameters that did not parse, calls nested in a read batch).

use super::Server;
use crate::audit::{Admission, Entry};
use crate::mcp::catalog::{self, toolset_name, ToolDef};
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::metrics;
use crate::tracectx::TraceContext;
use rmcp::model::CustomRequest;
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde_json::{json, Value};
use std::time::Instant;

/// What an audit record says about the call.
pub(super) struct Audited<'a> {
    pub(super) tool: &'a str,
    pub(super) def: Option<&'static ToolDef>,
    pub(super) t0: Instant,
    pub(super) request_id: String,
    pub(super) client: Option<String>,
    /// Over HTTP, who sent it ([`caller`]).
    pub(super) http: Option<Value>,
    /// The caller's trace context ([`trace_of`]), if valid.
    pub(super) trace: Option<&'a TraceContext>,
    pub(super) args: &'a Value,
    /// The workspace's checkpoint after a changing call (`{"n", "digest"}`).
    pub(super) checkpoint: Option<Value>,
}

impl<'a> Audited<'a> {
    /// A request that is no tool call (a resource read, a prompt).
    pub(super) fn request(
        tool: &'a str,
        t0: Instant,
        cx: &RequestContext<RoleServer>,
        args: &'a Value,
        trace: Option<&'a TraceContext>,
    ) -> Self {
        Audited {
            tool,
            def: None,
            t0,
            request_id: request_id_text(&cx.id),
            client: None,
            http: caller(cx),
            trace,
            args,
            checkpoint: None,
        }
    }
}

impl Server {
    pub(super) fn audit(
        &self,
        a: &Audited<'_>,
        err: Option<&ToolError>,
        outcome_override: Option<&str>,
    ) {
        self.audit_admitted(None, a, err, outcome_override)
    }

    /// Records a call; an admitted one into the room its admission holds.
    pub(super) fn audit_admitted(
        &self,
        ticket: Option<Admission<'_>>,
        a: &Audited<'_>,
        err: Option<&ToolError>,
        outcome_override: Option<&str>,
    ) {
        let outcome = outcome_override.unwrap_or_else(|| err.map_or("ok", ToolError::outcome));
        if let (Some(e), "refused") = (err, outcome) {
            // Refusals name tools, targets and limits, never an argument's value.
            tracing::debug!(tool = a.tool, kind = e.kind(), reason = %e, "tool call refused");
        }
        let took = a.t0.elapsed();
        let kind = err.map(ToolError::kind);
        metrics::get().call(a.def, a.tool, outcome, kind, took);
        let e = Entry {
            tool: a.tool,
            toolset: a.def.map(|d| toolset_name(d.toolset)),
            outcome,
            error_type: kind,
            duration_ms: took.as_millis() as u64,
            request_id: a.request_id.clone(),
            client_id: a.client.clone(),
            http: a.http.clone(),
            trace: a.trace,
            args: a.args,
            checkpoint: a.checkpoint.clone(),
        };
        match ticket {
            Some(t) => t.record(e),
            None => {
                self.s.audit.record(e);
            }
        }
    }

    /// Audits a line that did not parse (no tool, no arguments: its size,
    /// a digest and the parser's complaint).
    pub(super) fn audit_unparseable(&self, raw: &Value, request_id: String) {
        let e = ToolError::invalid("message", "is not JSON", "send valid JSON");
        self.audit(
            &Audited {
                tool: "(unparseable)",
                def: None,
                t0: Instant::now(),
                request_id,
                client: None,
                http: None,
                trace: None,
                args: raw,
                checkpoint: None,
            },
            Some(&e),
            Some("malformed"),
        );
    }

    /// Known methods reach `on_custom_request` only when their parameters
    /// did not parse: a malformed call, recorded as one (P7) with its
    /// parameters digested.
    pub(super) fn audit_malformed(&self, req: &CustomRequest, cx: &RequestContext<RoleServer>) {
        let Some(what) = (match req.method.as_str() {
            "tools/call" => Some("tools/call parameters did not parse"),
            "resources/read" => Some("resources/read parameters did not parse"),
            "prompts/get" => Some("prompts/get parameters did not parse"),
            _ => None,
        }) else {
            return;
        };
        let raw = req.params.clone().unwrap_or(Value::Null);
        let name = match req.method.as_str() {
            "tools/call" => raw
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("(malformed)")
                .to_string(),
            m => format!("({m})"),
        };
        let e = ToolError::invalid("params", what, "check the types against the schema");
        self.audit(
            &Audited {
                tool: &name,
                def: None,
                t0: Instant::now(),
                request_id: request_id_text(&cx.id),
                client: None,
                http: caller(cx),
                trace: None,
                args: &raw,
                checkpoint: None,
            },
            Some(&e),
            Some("malformed"),
        );
    }
}

/// Over HTTP, who sent a request: the MCP session id (protocol 2025-11-25;
/// none in the stateless 2026-07-28), the token's digest and the client's
/// address. `None` over stdio.
pub(super) fn caller(cx: &RequestContext<RoleServer>) -> Option<Value> {
    let parts = cx.extensions.get::<hyper::http::request::Parts>()?;
    let c = parts.extensions.get::<crate::mcp::http::front::Caller>();
    let session = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(crate::mcp::text::shown);
    Some(json!({
        "session": session,
        "token": c.map(|c| c.token.clone()),
        "client": c.map(|c| c.addr.to_string()),
    }))
}

/// The caller's W3C trace context: `traceparent` (and `tracestate`) in the
/// request's `_meta`, else (over HTTP) in its headers. An invalid one is
/// none: ignored, never an error, never kept.
pub(super) fn trace_of(cx: &RequestContext<RoleServer>) -> Option<TraceContext> {
    if let Some(p) = cx.meta.get_traceparent() {
        return TraceContext::child_of(p, cx.meta.get_tracestate());
    }
    let parts = cx.extensions.get::<hyper::http::request::Parts>()?;
    let one = |name: &str| {
        let mut v = parts.headers.get_all(name).iter();
        match (v.next(), v.next()) {
            (Some(x), None) => x.to_str().ok(),
            _ => None,
        }
    };
    TraceContext::child_of(one("traceparent")?, one("tracestate"))
}

/// The span a traced call's log lines carry (its fields name the trace).
pub(super) fn span_of(t: Option<&TraceContext>) -> tracing::Span {
    match t {
        Some(t) => tracing::info_span!(
            "call",
            trace_id = %t.trace_id(),
            span_id = %t.span_id(),
        ),
        None => tracing::Span::none(),
    }
}

/// A JSON-RPC request id as text: `2` or `abc`, never a Rust spelling
/// such as `Number(2)`.
pub(super) fn request_id_text(id: &impl serde::Serialize) -> String {
    match serde_json::to_value(id) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(_) => String::new(),
    }
}

/// A call made from inside `call_read_tools_batch`: inspect tools only, no
/// recursion, each audited on its own, in a span of its own under the
/// batch's trace context (when the batch has one).
pub(crate) async fn dispatch_nested(
    c: &Call<'_>,
    name: &str,
    args: Value,
) -> Result<Value, ToolError> {
    let t0 = Instant::now();
    let trace = crate::tracectx::current().map(|t| t.child());
    let ticket =
        c.s.audit
            .admit(name)
            .map_err(|e| ToolError::Unaudited(e.to_string()))?;
    let def = catalog::find(name).filter(|d| {
        c.s.enabled
            .read()
            .map(|e| e.contains(d.name))
            .unwrap_or(false)
    });
    let res = match def {
        None => Err(ToolError::refused(format!("Unknown tool: {name}"))),
        Some(d) if !d.in_read_batch() => Err(ToolError::refused(format!(
            "{name} cannot run inside a read batch (inspect tools only, no waits, no nesting)"
        ))),
        Some(d) => {
            use tracing::Instrument;
            let span = span_of(trace.as_ref());
            (d.handler)(c, args.clone()).instrument(span).await
        }
    };
    let err = res.as_ref().err();
    let (outcome, kind, took) = (
        err.map_or("ok", ToolError::outcome),
        err.map(ToolError::kind),
        t0.elapsed(),
    );
    metrics::get().call(def, name, outcome, kind, took);
    ticket.record(Entry {
        tool: name,
        toolset: def.map(|d| toolset_name(d.toolset)),
        outcome,
        error_type: kind,
        duration_ms: took.as_millis() as u64,
        request_id: "batch".into(),
        client_id: None,
        http: None,
        trace: trace.as_ref(),
        args: &args,
        checkpoint: None,
    });
    res
}
