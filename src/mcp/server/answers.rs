//! What the server sends back: the tools' descriptions (built once), call
//! results (their text capped), and each answer's size owed to the backlog
//! until it is written.

use super::Server;
use crate::mcp::catalog::{self, ToolDef};
use crate::mcp::error::ToolError;
use rmcp::model::*;
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde_json::Value;
use std::sync::Arc;

/// Largest text content of one result, in bytes.
pub(crate) const RESPONSE_CAP: usize = 1_000_000;

fn obj(v: Value) -> Arc<JsonObject> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

/// Every tool's MCP description, built once: an answer to `tools/list` then
/// holds shared schemas (about 10 KB in memory) instead of fresh JSON trees
/// (about 600 KB), which matters while answers wait for a client to read.
pub(super) fn described() -> &'static [Tool] {
    static ALL: std::sync::OnceLock<Vec<Tool>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| catalog::TOOLS.iter().map(tool_of).collect())
}

/// The MCP description of a tool.
fn tool_of(t: &ToolDef) -> Tool {
    let (ro, destructive, idempotent, open) = t.class.hints();
    let tool = Tool::new(t.name, t.description, obj((t.input_schema)()))
        .with_annotations(annotations(ro, destructive, idempotent, open));
    match (t.output_schema)() {
        Value::Null => tool,
        out => tool.with_raw_output_schema(obj(out)),
    }
}

/// The hints, each only where it differs from the spec's default
/// (readOnly false, destructive true, idempotent false, openWorld true).
fn annotations(ro: bool, destructive: bool, idempotent: bool, open: bool) -> ToolAnnotations {
    let mut a = ToolAnnotations::new();
    if ro {
        a = a.read_only(true);
    }
    // destructive is meaningful only when the tool is not read-only.
    if !ro && !destructive {
        a = a.destructive(false);
    }
    // So is idempotent ("meaningful only when readOnlyHint == false").
    if !ro && idempotent {
        a = a.idempotent(true);
    }
    if !open {
        a = a.open_world(false);
    }
    a
}

impl Server {
    /// An answer, its size owed to the backlog until it is written.
    pub(super) fn owing<T: serde::Serialize>(
        &self,
        cx: &RequestContext<RoleServer>,
        answer: T,
    ) -> T {
        let n = serde_json::to_vec(&answer).map(|v| v.len()).unwrap_or(0);
        self.owe(cx, n);
        answer
    }

    /// `n` bytes of answer owed: over HTTP as the request's debt, which its
    /// response body pays (in full if the connection goes away).
    pub(super) fn owe(&self, cx: &RequestContext<RoleServer>, n: usize) {
        let debt = cx
            .extensions
            .get::<hyper::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Arc<crate::mcp::backlog::Debt>>());
        match debt {
            Some(d) => d.owe(n),
            None => self.s.backlog.owe(n),
        }
    }
}

pub(super) fn error_result(e: &ToolError) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(e.to_string())]);
    r.structured_content = None;
    r
}

/// About how many bytes a result takes on the wire: its text, and its
/// structured content (about as long).
pub(super) fn answer_size(r: &CallToolResult) -> usize {
    let text: usize = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.len()))
        .sum();
    if r.structured_content.is_some() {
        2 * text
    } else {
        text
    }
}

pub(super) fn success(v: Value) -> CallToolResult {
    let mut text = serde_json::to_string(&v).unwrap_or_default();
    if text.len() > RESPONSE_CAP {
        let mut cut = RESPONSE_CAP;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("…[response cut at 1000000 bytes; the structured result is complete]");
    }
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(v);
    r
}
