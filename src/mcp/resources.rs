//! MCP resources: the tmux hierarchy (while `inspect` is enabled) and the
//! sandbox's status and journal. Every read is audited by the server.

use super::ctx::Call;
use super::error::ToolError;
use super::tools::{self, capture, panes, sessions, status, windows};

/// Reads a resource: (text, mime type).
pub async fn read(
    c: &Call<'_>,
    uri: &str,
    inspect_enabled: bool,
) -> Result<(String, &'static str), ToolError> {
    let js = |v: serde_json::Value| {
        Ok((
            serde_json::to_string_pretty(&v).unwrap_or_default(),
            "application/json",
        ))
    };
    match uri {
        "sandmux://status" => {
            return js(
                serde_json::to_value(status::sandbox_status(c, tools::NoArgs {}).await?)
                    .unwrap_or_default(),
            )
        }
        "sandmux://journal" => {
            // The stored lines, compact, within one response's cap.
            let lines = c.s.audit.recent(100, super::server::RESPONSE_CAP - 64);
            return Ok((
                format!("{{\"records\":[{}]}}", lines.join(",")),
                "application/json",
            ));
        }
        _ => {}
    }
    if !inspect_enabled {
        return Err(ToolError::refused(
            "tmux resources need the inspect toolset",
        ));
    }
    let rest = uri.strip_prefix("tmux://").ok_or_else(|| {
        ToolError::not_found(format!("resource {uri}"), "list resources and templates")
    })?;
    let parts: Vec<&str> = rest.split('/').collect();
    let name = |s: &str| Some(s.to_string());
    match parts.as_slice() {
        ["sessions"] => js(serde_json::to_value(
            sessions::list_sessions(c, sessions::ListSessions { filters: None }).await?,
        )
        .unwrap_or_default()),
        ["sessions", s] => js(serde_json::to_value(
            sessions::get_session_info(
                c,
                sessions::SessionArgs {
                    session_id: None,
                    session_name: name(s),
                },
            )
            .await?,
        )
        .unwrap_or_default()),
        ["sessions", s, "windows"] => js(serde_json::to_value(
            windows::list_windows(
                c,
                windows::ListWindows {
                    session_name: name(s),
                    session_id: None,
                    filters: None,
                },
            )
            .await?,
        )
        .unwrap_or_default()),
        ["sessions", s, "windows", i] => js(serde_json::to_value(
            panes::list_panes(
                c,
                panes::ListPanes {
                    session_name: name(s),
                    session_id: None,
                    window_id: None,
                    window_index: name(i),
                    filters: None,
                },
            )
            .await?,
        )
        .unwrap_or_default()),
        ["panes", p] => js(serde_json::to_value(
            panes::get_pane_info(
                c,
                panes::PaneArgs {
                    p: super::targets::PaneSel {
                        pane_id: name(p),
                        ..Default::default()
                    },
                },
            )
            .await?,
        )
        .unwrap_or_default()),
        ["panes", p, "content"] => {
            let r = capture::capture_pane(
                c,
                capture::Capture {
                    p: super::targets::PaneSel {
                        pane_id: name(p),
                        ..Default::default()
                    },
                    start: None,
                    end: None,
                    max_lines: None,
                    max_bytes: None,
                },
            )
            .await?;
            let mut t = r.content.text;
            if r.content.truncated {
                t = format!("[truncated: {} lines cut]\n{t}", r.content.truncated_lines);
            }
            Ok((t, "text/plain"))
        }
        _ => Err(ToolError::not_found(
            format!("resource {uri}"),
            "list resources and templates",
        )),
    }
}
