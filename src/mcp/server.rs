//! The MCP server (rmcp): tools from the catalogue, resources, prompts. Every
//! call is checked against the enabled set at call time, checked for drift,
//! and recorded in the audit log whatever its outcome.

use super::audit::{Admission, Entry};
use super::catalog::{self, toolset_name, Class, ToolDef};
use super::ctx::{Call, State};
use super::error::ToolError;
use crate::profile::Toolset;
use rmcp::model::*;
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Value};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

/// Largest text content of one result, in bytes.
pub(crate) const RESPONSE_CAP: usize = 1_000_000;

/// What an audit record says about the call.
struct Audited<'a> {
    tool: &'a str,
    def: Option<&'static ToolDef>,
    t0: Instant,
    request_id: String,
    client: Option<String>,
    /// Over HTTP, who sent it ([`caller`]).
    http: Option<Value>,
    args: &'a Value,
}

impl<'a> Audited<'a> {
    /// A request that is no tool call (a resource read, a prompt).
    fn request(
        tool: &'a str,
        t0: Instant,
        cx: &RequestContext<RoleServer>,
        args: &'a Value,
    ) -> Self {
        Audited {
            tool,
            def: None,
            t0,
            request_id: request_id_text(&cx.id),
            client: None,
            http: caller(cx),
            args,
        }
    }
}

/// The handler.
pub(crate) struct Server {
    /// Shared state.
    pub s: Arc<State>,
}

fn obj(v: Value) -> Arc<JsonObject> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

/// Every tool's MCP description, built once: an answer to `tools/list` then
/// holds shared schemas (about 10 KB in memory) instead of fresh JSON trees
/// (about 600 KB), which matters while answers wait for a client to read.
fn described() -> &'static [Tool] {
    static ALL: std::sync::OnceLock<Vec<Tool>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| catalog::TOOLS.iter().map(tool_of).collect())
}

/// The MCP description of a tool.
pub(crate) fn tool_of(t: &ToolDef) -> Tool {
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
    if idempotent {
        a = a.idempotent(true);
    }
    if !open {
        a = a.open_world(false);
    }
    a
}

impl Server {
    /// Why a call names a tool that is not in `tools/list` (P4): it does not
    /// exist, a human revoked it at runtime, or this instance never enabled
    /// it. Starts with "Unknown tool: NAME", as clients expect.
    fn why_absent(&self, name: &str) -> String {
        let Some(def) = catalog::find(name) else {
            return format!("Unknown tool: {}", super::text::shown(name));
        };
        let set = toolset_name(def.toolset);
        if self.s.ceiling.contains(def.name) {
            format!("Unknown tool: {name} (revoked at runtime by the operator; `sandmux grant ID --toolset {set}` or `--tool {name}` gives it back)")
        } else {
            format!("Unknown tool: {name} (not enabled for this instance: it is in the {set} toolset, which this instance's profile ({}) and flags did not enable; start serve with --toolsets including {set}, or --tools {name})", self.s.policy.name)
        }
    }

    /// An answer, its size owed to the backlog until it is written.
    fn owing<T: serde::Serialize>(&self, cx: &RequestContext<RoleServer>, answer: T) -> T {
        let n = serde_json::to_vec(&answer).map(|v| v.len()).unwrap_or(0);
        self.owe(cx, n);
        answer
    }

    /// `n` bytes of answer owed: over HTTP as the request's debt, which its
    /// response body pays (in full if the connection goes away).
    fn owe(&self, cx: &RequestContext<RoleServer>, n: usize) {
        let debt = cx
            .extensions
            .get::<hyper::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Arc<super::backlog::Debt>>());
        match debt {
            Some(d) => d.owe(n),
            None => self.s.backlog.owe(n),
        }
    }

    fn enabled(&self, name: &str) -> bool {
        self.s
            .enabled
            .read()
            .map(|e| e.contains(name))
            .unwrap_or(false)
    }

    fn inspect_enabled(&self) -> bool {
        catalog::TOOLS
            .iter()
            .any(|t| t.toolset == Toolset::Inspect && self.enabled(t.name))
    }

    fn audit(&self, a: &Audited<'_>, err: Option<&ToolError>, outcome_override: Option<&str>) {
        self.audit_admitted(None, a, err, outcome_override)
    }

    /// Records a call; an admitted one into the room its admission holds.
    fn audit_admitted(
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
        let e = Entry {
            tool: a.tool,
            toolset: a.def.map(|d| toolset_name(d.toolset)),
            outcome,
            error_type: err.map(ToolError::kind),
            duration_ms: a.t0.elapsed().as_millis() as u64,
            request_id: a.request_id.clone(),
            client_id: a.client.clone(),
            http: a.http.clone(),
            args: a.args,
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
    fn audit_unparseable(&self, raw: &Value, request_id: String) {
        let e = ToolError::invalid("message", "is not JSON", "send valid JSON");
        self.audit(
            &Audited {
                tool: "(unparseable)",
                def: None,
                t0: Instant::now(),
                request_id,
                client: None,
                http: None,
                args: raw,
            },
            Some(&e),
            Some("malformed"),
        );
    }

    /// Runs one enabled tool: drift check, handler, then (after a call that
    /// can change tmux's objects or options) a full drift scan in the
    /// background that the next call waits for (see `drift`).
    async fn run(
        &self,
        def: &'static ToolDef,
        call: &Call<'_>,
        args: Value,
    ) -> Result<Value, ToolError> {
        // Frozen: refused before tmux is asked (a stopped server would not
        // answer); the status is the supervisor's, and ending stays possible.
        let frozen = self.s.freeze.is_frozen();
        if frozen && !def.props.while_frozen {
            return Err(ToolError::Tmux(crate::tmux::client::TmuxError::Frozen));
        }
        // Ending the instance stays possible whatever happened to the server.
        if !def.props.ends_instance && !frozen {
            self.s.drift.before_call(&self.s.hub()).await?;
        }
        let r = (def.handler)(call, args).await;
        // Typing into a pane changes no tmux configuration (panes cannot
        // reach the server, P2, and copy-mode keys run no command that
        // could): only the calls that create, change or destroy tmux
        // objects ask for a full scan before the next call.
        if !matches!(
            def.class,
            Class::MetadataRead | Class::ContentRead | Class::PaneInput
        ) && !self.s.shutdown.is_cancelled()
        {
            self.s.drift.after_call();
        }
        r
    }

    fn instructions(&self) -> String {
        let enabled: Vec<String> = catalog::TOOLSETS
            .iter()
            .filter(|(ts, _)| {
                catalog::TOOLS
                    .iter()
                    .any(|t| t.toolset == *ts && self.enabled(t.name))
            })
            .map(|(_, name)| name.to_string())
            .collect();
        let dropped: Vec<String> = self
            .s
            .info()
            .layers
            .iter()
            .filter(|l| !l.enforced)
            .map(|l| l.layer.name().to_string())
            .collect();
        let mut s = format!(
            "sandmux: a confined terminal. One private tmux server inside a sandbox (profile '{}': {}). Workspace {} is writable; the rest of the system is read-only or absent; network: {}. Toolsets: {}. Layers dropped: {}. \
Targets: pane_id (%N), window_id (@N), session_id ($N) or session_name; with none, a tool acts on the first pane of the first window of the first session. Every wait is clamped to the profile's ceiling (sandbox_status.limits); results say which timeout applied. Start with list_panes (or create_session); run commands with run_command (returns output and exit status; on timeout, collect it later with wait_for_command); type with send_keys (text is literal, keys are key names like C-c); wait with wait_for_text / wait_for_stable instead of sleeping; read with capture_pane or capture_since. sandbox_status shows what confines you. Every call is audited.",
            self.s.policy.name,
            self.s.policy.description,
            self.s.policy.workspace.display(),
            self.s.policy.network.mode.name(),
            if enabled.is_empty() { "none".to_string() } else { enabled.join(", ") },
            if dropped.is_empty() { "none".to_string() } else { dropped.join(", ") },
        );
        s.truncate(2048);
        s
    }
}

/// Over HTTP, who sent a request: the MCP session id (protocol 2025-11-25;
/// none in the stateless 2026-07-28), the token's digest and the client's
/// address. `None` over stdio.
fn caller(cx: &RequestContext<RoleServer>) -> Option<Value> {
    let parts = cx.extensions.get::<hyper::http::request::Parts>()?;
    let c = parts.extensions.get::<super::http::front::Caller>();
    let session = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(super::text::shown);
    Some(json!({
        "session": session,
        "token": c.map(|c| c.token.clone()),
        "client": c.map(|c| c.addr.to_string()),
    }))
}

/// A JSON-RPC request id as text: `2` or `abc`, never a Rust spelling
/// such as `Number(2)`.
fn request_id_text(id: &impl serde::Serialize) -> String {
    match serde_json::to_value(id) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(_) => String::new(),
    }
}

fn error_result(e: &ToolError) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(e.to_string())]);
    r.structured_content = None;
    r
}

/// About how many bytes a result takes on the wire: its text, and its
/// structured content (about as long).
fn answer_size(r: &CallToolResult) -> usize {
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

fn success(v: Value) -> CallToolResult {
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

/// A call made from inside `call_read_tools_batch`: inspect tools only, no
/// recursion, each audited on its own.
pub(crate) async fn dispatch_nested(
    c: &Call<'_>,
    name: &str,
    args: Value,
) -> Result<Value, ToolError> {
    let t0 = Instant::now();
    let ticket = c.s.audit.admit(name).map_err(ToolError::Unaudited)?;
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
        Some(d) => (d.handler)(c, args.clone()).await,
    };
    let err = res.as_ref().err();
    ticket.record(Entry {
        tool: name,
        toolset: def.map(|d| toolset_name(d.toolset)),
        outcome: err.map_or("ok", ToolError::outcome),
        error_type: err.map(ToolError::kind),
        duration_ms: t0.elapsed().as_millis() as u64,
        request_id: "batch".into(),
        client_id: None,
        http: None,
        args: &args,
    });
    res
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_resources()
                .enable_prompts()
                .build(),
        )
        .with_server_info(Implementation::new("sandmux", env!("CARGO_PKG_VERSION")))
        .with_instructions(self.instructions())
        .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
    }

    /// Over HTTP, each session's client is told of tool list changes (over
    /// stdio, `serve` registers its one client itself).
    async fn on_initialized(&self, cx: rmcp::service::NotificationContext<RoleServer>) {
        if cx.extensions.get::<hyper::http::request::Parts>().is_some() {
            self.s.peers.add(cx.peer);
        }
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.s.backlog.room().await;
        Ok(self.owing(
            &cx,
            ListToolsResult::with_all_items(
                catalog::TOOLS
                    .iter()
                    .zip(described())
                    .filter(|(t, _)| self.enabled(t.name))
                    .map(|(_, d)| d.clone())
                    .collect(),
            ),
        ))
    }

    async fn call_tool(
        &self,
        req: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let t0 = Instant::now();
        let name = req.name.to_string();
        let args = req.arguments.map(Value::Object).unwrap_or(Value::Null);
        let rid = request_id_text(&cx.id);
        let client = cx.peer.peer_info().map(|i| i.client_info.name.clone());
        let def = catalog::find(&name).filter(|d| self.enabled(d.name));
        let Some(def) = def else {
            let why = self.why_absent(&name);
            let e = ToolError::refused(why.clone());
            self.audit(
                &Audited {
                    tool: &name,
                    def: None,
                    t0,
                    request_id: rid,
                    client,
                    http: caller(&cx),
                    args: &args,
                },
                Some(&e),
                Some("refused"),
            );
            return Err(McpError::invalid_params(
                why,
                Some(json!({"hint": "call tools/list for the enabled tools"})),
            ));
        };
        // Nothing starts while the client leaves too many answers unread.
        self.s.backlog.room().await;
        // Nothing runs unless its record can be written (P7: fail closed).
        let ticket = match self.s.audit.admit(&name) {
            Ok(t) => t,
            Err(why) => return Ok(error_result(&ToolError::Unaudited(why)).into()),
        };
        let progress = cx.meta.get_progress_token().map(|t| (cx.peer.clone(), t));
        let call = Call {
            s: &self.s,
            progress,
            ct: cx.ct.clone(),
        };
        let r = self.run(def, &call, args.clone()).await;
        self.audit_admitted(
            Some(ticket),
            &Audited {
                tool: &name,
                def: Some(def),
                t0,
                request_id: rid,
                client,
                http: caller(&cx),
                args: &args,
            },
            r.as_ref().err(),
            None,
        );
        let result = match r {
            Ok(v) => success(v),
            Err(e) => error_result(&e),
        };
        self.owe(&cx, answer_size(&result));
        Ok(result.into())
    }

    async fn on_custom_notification(
        &self,
        n: CustomNotification,
        _: rmcp::service::NotificationContext<RoleServer>,
    ) {
        if n.method == format!("notifications/{}", super::stdio::UNPARSEABLE) {
            self.audit_unparseable(&n.params.unwrap_or(Value::Null), "none".into());
        }
    }

    async fn on_custom_request(
        &self,
        req: CustomRequest,
        cx: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        // A line that was not JSON at all (see `stdio`): answered with a parse
        // error under its own id, and audited.
        if req.method == super::stdio::UNPARSEABLE {
            let raw = req.params.clone().unwrap_or(Value::Null);
            self.audit_unparseable(&raw, request_id_text(&cx.id));
            return Err(McpError::new(
                ErrorCode::PARSE_ERROR,
                format!(
                    "parse error: {}",
                    raw.get("error")
                        .and_then(Value::as_str)
                        .unwrap_or("not JSON")
                ),
                Some(json!({"hint": "send one JSON-RPC message per line, as UTF-8 JSON"})),
            ));
        }
        // Known methods land here only when their parameters did not parse:
        // a malformed call, recorded as one (P7) with its parameters digested.
        if let Some(what) = match req.method.as_str() {
            "tools/call" => Some("tools/call parameters did not parse"),
            "resources/read" => Some("resources/read parameters did not parse"),
            "prompts/get" => Some("prompts/get parameters did not parse"),
            _ => None,
        } {
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
                    http: caller(&cx),
                    args: &raw,
                },
                Some(&e),
                Some("malformed"),
            );
        }
        match req.method.as_str() {
            "tools/call" | "prompts/get" | "resources/read" => Err(McpError::invalid_params(
                format!(
                    "invalid params for {}: check the types against the schema",
                    req.method
                ),
                None,
            )),
            m => Err(McpError::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("method not found: {}", super::text::shown(m)),
                None,
            )),
        }
    }

    async fn list_resources(
        &self,
        _: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        self.s.backlog.room().await;
        let mut v = vec![Resource::new("sandmux://status", "status")
            .with_mime_type("application/json")
            .with_description("The layers confining this terminal, as reported by the sandbox")];
        v.push(
            Resource::new("sandmux://journal", "journal")
                .with_mime_type("application/json")
                .with_description("The last 100 audit records"),
        );
        if self.inspect_enabled() {
            v.push(Resource::new("tmux://sessions", "sessions").with_mime_type("application/json"));
        }
        Ok(self.owing(&cx, ListResourcesResult::with_all_items(v)))
    }

    async fn list_resource_templates(
        &self,
        _: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        self.s.backlog.room().await;
        if !self.inspect_enabled() {
            return Ok(self.owing(&cx, ListResourceTemplatesResult::with_all_items(vec![])));
        }
        Ok(self.owing(
            &cx,
            ListResourceTemplatesResult::with_all_items(vec![
                ResourceTemplate::new("tmux://sessions/{session_name}", "session")
                    .with_mime_type("application/json"),
                ResourceTemplate::new("tmux://sessions/{session_name}/windows", "session windows")
                    .with_mime_type("application/json"),
                ResourceTemplate::new(
                    "tmux://sessions/{session_name}/windows/{window_index}",
                    "window",
                )
                .with_mime_type("application/json"),
                ResourceTemplate::new("tmux://panes/{pane_id}", "pane")
                    .with_mime_type("application/json"),
                ResourceTemplate::new("tmux://panes/{pane_id}/content", "pane content")
                    .with_mime_type("text/plain"),
            ]),
        ))
    }

    async fn read_resource(
        &self,
        req: ReadResourceRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        self.s.backlog.room().await;
        let t0 = Instant::now();
        let uri = req.uri.clone();
        let tool = format!(
            "resource:{}",
            uri.split('/').take(3).collect::<Vec<_>>().join("/")
        );
        let ticket =
            self.s.audit.admit(&tool).map_err(|why| {
                McpError::invalid_params(ToolError::Unaudited(why).to_string(), None)
            })?;
        let call = Call {
            s: &self.s,
            progress: None,
            ct: cx.ct.clone(),
        };
        let r = match self.s.drift.tripped() {
            Some(why) if uri != "sandmux://status" && uri != "sandmux://journal" => {
                Err(ToolError::Drift(why))
            }
            _ => super::resources::read(&call, &uri, self.inspect_enabled()).await,
        };
        let args = json!({"uri": uri});
        let a = Audited::request(&tool, t0, &cx, &args);
        self.audit_admitted(Some(ticket), &a, r.as_ref().err(), None);
        match r {
            Ok((text, mime)) => {
                self.owe(&cx, text.len());
                Ok(ReadResourceResult::new(vec![
                    ResourceContents::text(text, uri).with_mime_type(mime)
                ])
                .into())
            }
            Err(ToolError::NotFound { what, hint }) => Err(McpError::resource_not_found(
                format!("{what} not found ({hint})"),
                Some(json!({"uri": req.uri})),
            )),
            Err(e) => Err(McpError::invalid_params(
                e.to_string(),
                Some(json!({"uri": req.uri})),
            )),
        }
    }

    async fn list_prompts(
        &self,
        _: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        self.s.backlog.room().await;
        Ok(self.owing(
            &cx,
            ListPromptsResult::with_all_items(super::prompts::list()),
        ))
    }

    async fn get_prompt(
        &self,
        req: GetPromptRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        self.s.backlog.room().await;
        let t0 = Instant::now();
        let tool = format!("prompt:{}", req.name);
        let ticket =
            self.s.audit.admit(&tool).map_err(|why| {
                McpError::invalid_params(ToolError::Unaudited(why).to_string(), None)
            })?;
        let r = super::prompts::get(
            &req.name,
            req.arguments.as_ref(),
            self.s.wait_max.as_secs_f64(),
        );
        let err = r
            .as_ref()
            .err()
            .map(|e| ToolError::invalid("name", e, "list prompts"));
        let args = json!({"name": req.name, "arguments": req.arguments});
        let a = Audited::request(&tool, t0, &cx, &args);
        self.audit_admitted(Some(ticket), &a, err.as_ref(), None);
        r.map(|p| self.owing(&cx, p).into())
            .map_err(|e| McpError::invalid_params(e, None))
    }
}
