//! The MCP server (rmcp): tools from the catalogue, resources, prompts. Every
//! call is checked against the enabled set at call time, checked for drift,
//! and recorded in the audit log whatever its outcome.

mod answers;
mod ask;
mod audited;
mod checkpoint;
pub(crate) mod icons;
mod lists;

use super::catalog::{self, toolset_name, Class, ToolDef};
use super::ctx::{Call, State};
use super::error::ToolError;
use super::metrics;
use crate::profile::Toolset;
use crate::tmux::client::TmuxError;
use crate::tracectx::TraceContext;
pub(crate) use answers::RESPONSE_CAP;
use answers::{answer_size, described, error_result, success};
pub(crate) use audited::dispatch_nested;
use audited::{caller, request_id_text, span_of, trace_of, Audited};
use lists::Cacheable;
use rmcp::model::*;
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Value};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

/// The handler.
pub(crate) struct Server {
    /// Shared state.
    pub s: Arc<State>,
}

/// What a call names, decided ([`Server::choose`]): the tool to run and
/// how (once, for a grant of one call; progress past the question's wait),
/// or why it does not run.
struct Chosen {
    def: Option<&'static ToolDef>,
    why: Option<String>,
    once: bool,
    progress_from: f64,
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

    /// Runs one enabled tool: drift check, handler, then (after a call that
    /// can change tmux's objects or options) a full drift scan in the
    /// background that the next call waits for (see `drift`).
    async fn run(
        &self,
        def: &'static ToolDef,
        call: &Call<'_>,
        args: Value,
        once: bool,
    ) -> Result<Value, ToolError> {
        // The handshake did not wait for the sessions and the baseline; a call
        // does (and is checked again: a revoke may have come meanwhile).
        self.s.until_ready().await?;
        // `once`: a human allowed this call of a tool not enabled.
        if !once && !self.enabled(def.name) {
            return Err(ToolError::refused(self.why_absent(def.name)));
        }
        if once && call.ct.is_cancelled() {
            return Err(ToolError::refused(format!(
                "{}: the call was cancelled before it ran",
                def.name
            )));
        }
        if once && self.s.approvals.tool_revoked(def.name) {
            return Err(ToolError::refused(self.why_absent(def.name)));
        }
        // Frozen: refused before tmux is asked (a stopped server would not
        // answer); the status is the supervisor's, and ending stays possible.
        let frozen = self.s.freeze.is_frozen();
        if frozen && !def.props.while_frozen {
            if let Some(why) = self.s.freeze.get().and_then(|f| f.why) {
                return Err(ToolError::refused(why));
            }
            return Err(ToolError::Tmux(TmuxError::Frozen));
        }
        // Ending the instance stays possible whatever happened to the server.
        if !def.props.ends_instance && !frozen {
            self.s.drift.before_call(&self.s.hub()).await?;
        }
        let r = (def.handler)(call, args).await;
        // A freeze that lands while a call that changes things runs is no
        // refusal (what it did before the freeze stays done, and a command
        // tmux had may still take effect); one that only reads changed
        // nothing, so for it the freeze is the refusal it says.
        let changes = !matches!(def.class, Class::MetadataRead | Class::ContentRead);
        let r = match r {
            Err(ToolError::Tmux(e)) if e.frozen() => Err(ToolError::Tmux(if changes {
                TmuxError::FrozenInFlight
            } else {
                TmuxError::Frozen
            })),
            r => r,
        };
        // Typing into a pane changes no tmux configuration (panes cannot
        // reach the server, P2; copy-mode keys run the copy-mode bindings,
        // which the full scan compares, and what they run is logged, so the
        // next call's log check sees it): only the calls that create, change
        // or destroy tmux objects ask for a full scan before the next call.
        if !matches!(
            def.class,
            Class::MetadataRead | Class::ContentRead | Class::PaneInput
        ) && !self.s.shutdown.is_cancelled()
        {
            self.s.drift.after_call();
        }
        r
    }

    /// One tool call, under its caller's trace context (if any).
    async fn call(
        &self,
        mut req: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
        trace: Option<&TraceContext>,
    ) -> Result<CallToolResponse, McpError> {
        let t0 = Instant::now();
        let name = req.name.to_string();
        // Taken, not cloned: `req` keeps what a 2026-07-28 retry brings.
        let args = req
            .arguments
            .take()
            .map(Value::Object)
            .unwrap_or(Value::Null);
        let rid = request_id_text(&cx.id);
        let client = cx.peer.peer_info().map(|i| i.client_info.name.clone());
        let chosen = match self.choose(&name, &req, &args, &cx).await {
            Ok(c) => c,
            // Protocol 2026-07-28: the client answers and calls again.
            Err(input) => return Ok(input),
        };
        let Chosen {
            def,
            why,
            once,
            progress_from,
        } = chosen;
        let mut a = Audited {
            tool: &name,
            def: None,
            t0,
            request_id: rid,
            client,
            http: caller(&cx),
            trace,
            args: &args,
            checkpoint: None,
        };
        let Some(def) = def else {
            return self.refused(&name, why, &a);
        };
        // Nothing starts while the client leaves too many answers unread.
        self.s.backlog.room().await;
        // Nothing runs unless its record can be written (P7: fail closed).
        let ticket = match self.s.audit.admit(&name) {
            Ok(t) => t,
            Err(why) => {
                let e = ToolError::Unaudited(why.to_string());
                metrics::get().call(Some(def), &name, "refused", Some(e.kind()), t0.elapsed());
                return Ok(error_result(&e).into());
            }
        };
        let progress = cx.meta.get_progress_token().map(|t| (cx.peer.clone(), t));
        let call = Call {
            s: &self.s,
            progress,
            progress_from,
            ct: cx.ct.clone(),
            started: t0,
        };
        let r = self.run(def, &call, args.clone(), once).await;
        a.def = Some(def);
        a.checkpoint = self.checkpoint(def, &name, &a.request_id, &args).await;
        self.audit_admitted(Some(ticket), &a, r.as_ref().err(), None);
        let result = match r {
            Ok(v) => success(v),
            Err(e) => error_result(&e),
        };
        self.owe(&cx, answer_size(&result));
        Ok(result.into())
    }

    /// The tool a call names: enabled, or asked for and allowed (asked
    /// before anything else: a human's no is the answer); or why not. A
    /// 2026-07-28 question is the answer itself (`Err`).
    async fn choose(
        &self,
        name: &str,
        req: &CallToolRequestParams,
        args: &Value,
        cx: &RequestContext<RoleServer>,
    ) -> Result<Chosen, CallToolResponse> {
        let mut c = Chosen {
            def: catalog::find(name).filter(|d| self.enabled(d.name)),
            why: None,
            once: false,
            progress_from: 0.0,
        };
        // A tool not enabled is asked about when it is askable; one that
        // always asks, on every call, enabled or not.
        let asks = catalog::find(name).filter(|d| match c.def {
            None => self.askable(d),
            Some(_) => d.props.always_asks,
        });
        if let Some(d) = asks {
            c.def = None;
            let asked_at = Instant::now();
            match self.ask(d, req, args, cx).await {
                Ok(ask::Asked::Run(g)) => {
                    c.once = g == crate::runtime::approvals::Grant::Once;
                    c.def = Some(d);
                    c.progress_from = (asked_at.elapsed().as_secs() + 1) as f64;
                }
                Ok(ask::Asked::Input(r)) => return Err(r.into()),
                Err(w) => c.why = Some(format!("{name}: not run: {w}")),
            }
        }
        Ok(c)
    }

    /// A call of a tool that is not enabled, recorded: a refusal the agent
    /// reads in its tool result when a human was asked, else an invalid
    /// request naming `tools/list`.
    fn refused(
        &self,
        name: &str,
        why: Option<String>,
        a: &Audited<'_>,
    ) -> Result<CallToolResponse, McpError> {
        let asked = why.is_some();
        let why = why.unwrap_or_else(|| self.why_absent(name));
        let e = ToolError::refused(why.clone());
        self.audit(a, Some(&e), Some("refused"));
        if asked {
            return Ok(error_result(&e).into());
        }
        Err(McpError::invalid_params(
            why,
            Some(json!({"hint": "call tools/list for the enabled tools"})),
        ))
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
Targets: pane_id (%N), window_id (@N) or window_index, session_id ($N) or session_name; with none, a tool acts on the first pane of the first window of the first session. Every wait is clamped to the profile's ceiling (sandbox_status.limits); results say which timeout applied. Start with list_panes (or create_session); run commands with run_command (returns output and exit status; on timeout, collect it later with wait_for_command); type with send_keys (text is literal, keys are key names like C-c); wait with wait_for_text / wait_for_stable instead of sleeping; read with capture_pane or capture_since. sandbox_status shows what confines you. Every call is audited.",
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
        .with_server_info({
            let mut i = Implementation::new("sandmux", env!("CARGO_PKG_VERSION"));
            i.icons = Some(icons::icons());
            i
        })
        .with_instructions(self.instructions())
        .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
    }

    /// 2026-07-28's `server/discover`: the capabilities less
    /// `tools.listChanged`, which a stateless client could only hear on a
    /// `subscriptions/listen` stream sandmux does not serve (a 2025-11-25
    /// session, which gets the notification, still sees it declared).
    async fn discover(&self, _cx: RequestContext<RoleServer>) -> Result<DiscoverResult, McpError> {
        let mut info = self.get_info();
        if let Some(t) = info.capabilities.tools.as_mut() {
            t.list_changed = None;
        }
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            info,
        ))
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
                    .filter_map(|(t, d)| {
                        if self.enabled(t.name) {
                            Some(d.clone())
                        } else if self.askable(t) {
                            Some(Self::marked(d))
                        } else {
                            None
                        }
                    })
                    .collect(),
            )
            .cached(&cx, 0, CacheScope::Private),
        ))
    }

    async fn call_tool(
        &self,
        req: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // A caller's trace context gives the call a span: its log lines and
        // audit record name the trace (no span, no cost, without one).
        let trace = trace_of(&cx);
        let span = span_of(trace.as_ref());
        let call = self.call(req, cx, trace.as_ref()).instrument(span);
        crate::tracectx::CURRENT.scope(trace.clone(), call).await
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
        self.audit_malformed(&req, &cx);
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
        let v = super::resources::list(self.inspect_enabled());
        let r = ListResourcesResult::with_all_items(v).cached(&cx, 0, CacheScope::Private);
        Ok(self.owing(&cx, r))
    }

    async fn list_resource_templates(
        &self,
        _: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        self.s.backlog.room().await;
        let v = if self.inspect_enabled() {
            super::resources::templates()
        } else {
            vec![]
        };
        let r = ListResourceTemplatesResult::with_all_items(v).cached(&cx, 0, CacheScope::Private);
        Ok(self.owing(&cx, r))
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
        let ticket = self.s.audit.admit(&tool).map_err(|why| {
            McpError::invalid_params(ToolError::Unaudited(why.to_string()).to_string(), None)
        })?;
        let call = Call {
            s: &self.s,
            progress: None,
            progress_from: 0.0,
            ct: cx.ct.clone(),
            started: t0,
        };
        let r = match self.s.drift.tripped() {
            Some(why) if uri != "sandmux://status" && uri != "sandmux://journal" => {
                Err(ToolError::Drift(why))
            }
            _ => match self.s.until_ready().await {
                Ok(()) => super::resources::read(&call, &uri, self.inspect_enabled()).await,
                Err(e) => Err(e),
            },
        };
        let args = json!({"uri": uri});
        let trace = trace_of(&cx);
        let a = Audited::request(&tool, t0, &cx, &args, trace.as_ref());
        self.audit_admitted(Some(ticket), &a, r.as_ref().err(), None);
        match r {
            Ok((text, mime)) => {
                self.owe(&cx, text.len());
                Ok(ReadResourceResult::new(vec![
                    ResourceContents::text(text, uri).with_mime_type(mime)
                ])
                .cached(&cx, 0, CacheScope::Private)
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
            ListPromptsResult::with_all_items(super::prompts::list()).cached(
                &cx,
                lists::PROMPTS_TTL_MS,
                CacheScope::Public,
            ),
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
        let ticket = self.s.audit.admit(&tool).map_err(|why| {
            McpError::invalid_params(ToolError::Unaudited(why.to_string()).to_string(), None)
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
        let trace = trace_of(&cx);
        let a = Audited::request(&tool, t0, &cx, &args, trace.as_ref());
        self.audit_admitted(Some(ticket), &a, err.as_ref(), None);
        r.map(|p| self.owing(&cx, p).into())
            .map_err(|e| McpError::invalid_params(e, None))
    }
}
