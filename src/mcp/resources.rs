//! MCP resources: the tmux hierarchy (while `inspect` is enabled) and the
//! sandbox's status and journal. Every read is audited by the server.

use super::ctx::Call;
use super::error::ToolError;
use super::tools::{self, capture, panes, sessions, status, windows};
use rmcp::model::{Resource, ResourceTemplate};

/// A resource's text and mime type.
type Read = Result<(String, &'static str), ToolError>;

/// The resources (the tmux ones while `inspect` is enabled).
pub(crate) fn list(inspect_enabled: bool) -> Vec<Resource> {
    let mut v = listed(inspect_enabled);
    for r in &mut v {
        r.icons = Some(super::server::icons::icons());
    }
    v
}

fn listed(inspect_enabled: bool) -> Vec<Resource> {
    let mut v = vec![Resource::new("sandmux://status", "status")
        .with_mime_type("application/json")
        .with_description("The layers confining this terminal, as reported by the sandbox")];
    v.push(
        Resource::new("sandmux://journal", "journal")
            .with_mime_type("application/json")
            .with_description("The last 100 audit records"),
    );
    if inspect_enabled {
        v.push(Resource::new("tmux://sessions", "sessions").with_mime_type("application/json"));
    }
    v
}

/// The tmux resources' templates (offered while `inspect` is enabled).
pub(crate) fn templates() -> Vec<ResourceTemplate> {
    let mut v = template_list();
    for t in &mut v {
        t.icons = Some(super::server::icons::icons());
    }
    v
}

fn template_list() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new("tmux://sessions/{session_name}", "session")
            .with_mime_type("application/json"),
        ResourceTemplate::new("tmux://sessions/{session_name}/windows", "session windows")
            .with_mime_type("application/json"),
        ResourceTemplate::new(
            "tmux://sessions/{session_name}/windows/{window_index}",
            "window",
        )
        .with_mime_type("application/json"),
        ResourceTemplate::new("tmux://panes/{pane_id}", "pane").with_mime_type("application/json"),
        ResourceTemplate::new("tmux://panes/{pane_id}/content", "pane content")
            .with_mime_type("text/plain"),
    ]
}

/// Reads a resource: (text, mime type).
pub(crate) async fn read(c: &Call<'_>, uri: &str, inspect_enabled: bool) -> Read {
    match uri {
        "sandmux://status" => return json(status::sandbox_status(c, tools::NoArgs {}).await),
        "sandmux://journal" => {
            // The stored lines, compact, within one response's cap.
            let lines = c.s.audit.recent(100, super::server::RESPONSE_CAP - 64);
            let text = format!("{{\"records\":[{}]}}", lines.join(","));
            return Ok((text, "application/json"));
        }
        _ => {}
    }
    if !inspect_enabled {
        return Err(ToolError::refused(
            "tmux resources need the inspect toolset",
        ));
    }
    let parts: Option<Vec<&str>> = uri.strip_prefix("tmux://").map(|r| r.split('/').collect());
    match parts.as_deref() {
        Some(["panes", p, "content"]) => pane_content(c, p).await,
        Some(parts) => tmux_json(c, parts)
            .await
            .unwrap_or_else(|| Err(not_found(uri))),
        None => Err(not_found(uri)),
    }
}

fn not_found(uri: &str) -> ToolError {
    ToolError::not_found(format!("resource {uri}"), "list resources and templates")
}

/// A tool's result as pretty JSON.
fn json<T: serde::Serialize>(r: Result<T, ToolError>) -> Read {
    let v = serde_json::to_value(r?).unwrap_or_default();
    let text = serde_json::to_string_pretty(&v).unwrap_or_default();
    Ok((text, "application/json"))
}

/// The `tmux://` listings, each the result of the tool of the same name;
/// `None` for a path that names no resource.
async fn tmux_json(c: &Call<'_>, parts: &[&str]) -> Option<Read> {
    let name = |s: &str| Some(s.to_string());
    Some(match parts {
        ["sessions"] => {
            json(sessions::list_sessions(c, sessions::ListSessions { filters: None }).await)
        }
        ["sessions", s] => {
            let a = sessions::SessionArgs {
                session_id: None,
                session_name: name(s),
            };
            json(sessions::get_session_info(c, a).await)
        }
        ["sessions", s, "windows"] => {
            let a = windows::ListWindows {
                session_name: name(s),
                session_id: None,
                filters: None,
            };
            json(windows::list_windows(c, a).await)
        }
        ["sessions", s, "windows", i] => {
            let a = panes::ListPanes {
                session_name: name(s),
                session_id: None,
                window_id: None,
                window_index: name(i),
                filters: None,
            };
            json(panes::list_panes(c, a).await)
        }
        ["panes", p] => {
            let a = panes::PaneArgs { p: pane(p) };
            json(panes::get_pane_info(c, a).await)
        }
        _ => return None,
    })
}

fn pane(id: &str) -> super::targets::PaneSel {
    super::targets::PaneSel {
        pane_id: Some(id.to_string()),
        ..Default::default()
    }
}

/// `tmux://panes/ID/content`: the pane's text, with a note when cut.
async fn pane_content(c: &Call<'_>, p: &str) -> Read {
    let a = capture::Capture {
        p: pane(p),
        start: None,
        end: None,
        max_lines: None,
        max_bytes: None,
    };
    let r = capture::capture_pane(c, a).await?;
    let mut t = r.content.text;
    if r.content.truncated {
        t = format!("[truncated: {} lines cut]\n{t}", r.content.truncated_lines);
    }
    Ok((t, "text/plain"))
}
