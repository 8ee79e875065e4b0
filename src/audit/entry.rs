//! One record as its writer gives it, before the log redacts and chains it.

use serde_json::Value;

/// One call to record.
pub(crate) struct Entry<'a> {
    /// Tool name (or `resource:<uri>`).
    pub tool: &'a str,
    /// The tool's toolset, if it has one.
    pub toolset: Option<&'a str>,
    /// ok | error | refused | malformed | event.
    pub outcome: &'a str,
    /// Error kind, if any.
    pub error_type: Option<&'a str>,
    /// Duration in milliseconds.
    pub duration_ms: u64,
    /// JSON-RPC request id.
    pub request_id: String,
    /// The client's name, if it said.
    pub client_id: Option<String>,
    /// Over HTTP: the MCP session id (2025-11-25), the token's digest and
    /// the client's address (`mcp::http`); the field is absent over stdio.
    pub http: Option<Value>,
    /// The caller's W3C trace context, when it sent a valid one: the record
    /// names the trace, the call's span and its parent.
    pub trace: Option<&'a crate::tracectx::TraceContext>,
    /// The raw arguments (redacted here).
    pub args: &'a Value,
    /// The workspace's checkpoint the call ended with (`{"n", "digest"}`:
    /// `supervisor::history`), for a call that can change the workspace.
    pub checkpoint: Option<Value>,
}

impl<'a> Entry<'a> {
    /// An event sandmux records by itself (`outcome` "event"), not a
    /// client's call: `tool` names what saw it (`(door)`, `(proxy)`, …),
    /// `kind` what happened (`oom_kill`, `proxy_denied`, …).
    pub(crate) fn event(tool: &'a str, kind: Option<&'a str>, args: &'a Value) -> Entry<'a> {
        Entry {
            tool,
            toolset: None,
            outcome: "event",
            error_type: kind,
            duration_ms: 0,
            request_id: String::new(),
            client_id: None,
            http: None,
            trace: None,
            args,
            checkpoint: None,
        }
    }

    /// The same, taking `ms` milliseconds.
    pub(crate) fn took(self, ms: u64) -> Entry<'a> {
        Entry {
            duration_ms: ms,
            ..self
        }
    }
}
