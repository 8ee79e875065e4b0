//! Window tools: list, describe, create, rename, select, lay out, resize,
//! move, kill.

use super::spawn::{self, Created};
use super::{dim, done, kill, Done};
use crate::mcp::bounds::Adds;
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::targets::{self, PaneRow, SessionSel, WindowSel};
use crate::mcp::text;
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `list_windows`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ListWindows {
    /// Session name (all sessions when omitted).
    pub session_name: Option<String>,
    pub session_id: Option<String>,
    /// Lookups such as {"window_name": "build"}.
    pub filters: Option<Value>,
}

/// One window.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct WindowRow {
    /// `@N`.
    pub window_id: String,
    /// Index in the session.
    pub window_index: u32,
    /// Name.
    pub window_name: String,
    /// `$N`.
    pub session_id: String,
    /// Session name.
    pub session_name: String,
    /// Number of panes.
    pub panes: usize,
    /// Columns (of the window's panes' extent).
    pub width: u32,
    /// Height in rows.
    pub height: u32,
}

/// `list_windows` result.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Windows {
    /// The windows.
    pub windows: Vec<WindowRow>,
}

fn windows_of(panes: &[PaneRow]) -> Vec<WindowRow> {
    let mut out: Vec<WindowRow> = Vec::new();
    for p in panes {
        match out
            .iter_mut()
            .find(|w| w.window_id == p.window_id && w.session_id == p.session_id)
        {
            Some(w) => {
                w.panes += 1;
                w.width = w.width.max(p.right + 1);
                w.height = w.height.max(p.bottom + 1);
            }
            None => out.push(WindowRow {
                window_id: p.window_id.clone(),
                window_index: p.window_index,
                window_name: p.window_name.clone(),
                session_id: p.session_id.clone(),
                session_name: p.session_name.clone(),
                panes: 1,
                width: p.right + 1,
                height: p.bottom + 1,
            }),
        }
    }
    out
}

/// Lists windows.
pub(crate) async fn list_windows(c: &Call<'_>, a: ListWindows) -> Result<Windows, ToolError> {
    let mut panes = targets::panes(c).await?;
    if SessionSel::new(&a.session_name, &a.session_id).given() {
        let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
        panes.retain(|p| p.session_id == s.session_id);
    }
    Ok(Windows {
        windows: targets::filter(windows_of(&panes), &a.filters)?,
    })
}

/// `get_window_info`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct WindowArgs {
    #[serde(flatten)]
    pub w: WindowSel,
}

/// One window's metadata.
pub(crate) async fn get_window_info(c: &Call<'_>, a: WindowArgs) -> Result<WindowRow, ToolError> {
    let first = targets::window(c, &a.w).await?;
    let panes = targets::panes(c).await?;
    windows_of(&panes)
        .into_iter()
        .find(|w| w.window_id == first.window_id)
        .ok_or_else(|| ToolError::not_found("window", "call list_windows"))
}

/// `create_window`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct CreateWindow {
    pub session_name: Option<String>,
    pub session_id: Option<String>,
    /// The new window's name.
    pub window_name: Option<String>,
    /// Working directory (inside the sandbox).
    pub start_directory: Option<String>,
    /// Make it the current window.
    #[serde(default)]
    pub attach: bool,
    /// Before or after the current window (default: the next free index).
    pub direction: Option<crate::mcp::choices::Beside>,
    /// A command to run instead of the shell.
    pub shell: Option<String>,
    /// Extra variables.
    pub environment: Option<Value>,
}

/// Creates a window.
pub(crate) async fn create_window(c: &Call<'_>, a: CreateWindow) -> Result<Created, ToolError> {
    let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
    let mut cmd = spawn::making("new-window");
    if !a.attach {
        cmd = cmd.flag("-d");
    }
    use crate::mcp::choices::Beside;
    match a.direction {
        None => cmd = cmd.opt("-t", format!("{}:", s.session_id)),
        Some(Beside::After) => cmd = cmd.flag("-a").opt("-t", &s.window_id),
        Some(Beside::Before) => cmd = cmd.flag("-b").opt("-t", &s.window_id),
    }
    if let Some(n) = &a.window_name {
        text::name("window_name", n)?;
        cmd = cmd.opt("-n", crate::tmux::fmt_literal(n));
    }
    let env = &a.environment;
    cmd = spawn::process(c, cmd, &a.start_directory, env, Some(&a.shell))?;
    spawn::spawn(c, cmd, Adds::Pane).await
}

/// `rename_window`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct RenameWindow {
    /// The new name.
    pub new_name: String,
    #[serde(flatten)]
    pub w: WindowSel,
}

/// Renames a window.
pub(crate) async fn rename_window(c: &Call<'_>, a: RenameWindow) -> Result<Done, ToolError> {
    text::name("new_name", &a.new_name)?;
    let w = targets::window(c, &a.w).await?;
    c.s.hub()
        .run(
            &Cmd::new("rename-window")
                .opt("-t", &w.window_id)
                .arg(crate::tmux::fmt_literal(&a.new_name)),
        )
        .await?;
    done(format!("window {} renamed", w.window_id))
}

/// `select_window`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SelectWindow {
    pub window_id: Option<String>,
    pub window_index: Option<String>,
    /// Move to the next, previous or last window of the session instead.
    pub direction: Option<crate::mcp::choices::WindowStep>,
    pub session_name: Option<String>,
    pub session_id: Option<String>,
}

/// Selects a window.
pub(crate) async fn select_window(c: &Call<'_>, a: SelectWindow) -> Result<Done, ToolError> {
    if let Some(d) = a.direction {
        use crate::mcp::choices::WindowStep;
        let flag = match d {
            WindowStep::Next => "-n",
            WindowStep::Previous => "-p",
            WindowStep::Last => "-l",
        };
        let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
        c.s.hub()
            .run(
                &Cmd::new("select-window")
                    .flag(flag)
                    .opt("-t", &s.session_id),
            )
            .await?;
        return done(format!("moved to the {d} window"));
    }
    if a.window_id.is_none() && a.window_index.is_none() {
        return Err(ToolError::invalid(
            "window_id",
            "no window given",
            "give window_id, window_index or direction",
        ));
    }
    let w = targets::window(
        c,
        &WindowSel::new(a.window_id, a.window_index, &a.session_name, &a.session_id),
    )
    .await?;
    c.s.hub()
        .run(&Cmd::new("select-window").opt("-t", &w.window_id))
        .await?;
    done(format!("window {} selected", w.window_id))
}

/// `select_layout`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SelectLayout {
    /// A preset layout.
    pub layout: crate::mcp::choices::Layout,
    #[serde(flatten)]
    pub w: WindowSel,
}

/// Applies a layout.
pub(crate) async fn select_layout(c: &Call<'_>, a: SelectLayout) -> Result<Done, ToolError> {
    // Names only (an enum). tmux 3.3a's server crashes on some layout
    // strings that pass its own checksum (a caller can compute it) but not
    // its geometry, and on a layout starting with `-`; a custom layout would
    // need a full geometry check against the window's panes first.
    let layout = a.layout.to_string();
    let w = targets::window(c, &a.w).await?;
    c.s.hub()
        .run(
            &Cmd::new("select-layout")
                .opt("-t", &w.window_id)
                .arg(&layout),
        )
        .await?;
    done(format!("layout {layout} applied to {}", w.window_id))
}

/// `resize_window`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ResizeWindow {
    #[serde(flatten)]
    pub w: WindowSel,
    /// Height in rows.
    pub height: Option<u32>,
    /// Width in columns.
    pub width: Option<u32>,
}

/// Resizes a window.
pub(crate) async fn resize_window(c: &Call<'_>, a: ResizeWindow) -> Result<Done, ToolError> {
    let w = targets::window(c, &a.w).await?;
    let mut cmd = Cmd::new("resize-window").opt("-t", &w.window_id);
    if let Some(h) = a.height {
        cmd = cmd.opt("-y", dim("height", h)?);
    }
    if let Some(wd) = a.width {
        cmd = cmd.opt("-x", dim("width", wd)?);
    }
    c.s.hub().run(&cmd).await?;
    done(format!("window {} resized", w.window_id))
}

/// `move_window`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct MoveWindow {
    #[serde(flatten)]
    pub w: WindowSel,
    /// New index ("" for the next free one).
    #[serde(default)]
    pub destination_index: String,
    /// Session id or name to move it to.
    pub destination_session: Option<String>,
}

/// Moves a window.
pub(crate) async fn move_window(c: &Call<'_>, a: MoveWindow) -> Result<Done, ToolError> {
    let w = targets::window(c, &a.w).await?;
    let dest = match &a.destination_session {
        Some(d) if d.starts_with('$') => {
            targets::session(c, &SessionSel::new(&None, &Some(d.clone()))).await?
        }
        Some(d) => targets::session(c, &SessionSel::new(&Some(d.clone()), &None)).await?,
        None => w.clone(),
    };
    if !a.destination_index.is_empty() && a.destination_index.parse::<u32>().is_err() {
        return Err(ToolError::invalid(
            "destination_index",
            "is not a number",
            "e.g. \"3\"",
        ));
    }
    let target = format!("{}:{}", dest.session_id, a.destination_index);
    c.s.hub()
        .run(
            &Cmd::new("move-window")
                .opt("-s", &w.window_id)
                .opt("-t", target),
        )
        .await?;
    done(format!("window {} moved", w.window_id))
}

/// `kill_window`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct KillWindow {
    /// Window id (required).
    pub window_id: String,
}

/// Kills a window.
pub(crate) async fn kill_window(c: &Call<'_>, a: KillWindow) -> Result<Done, ToolError> {
    let w = targets::window(
        c,
        &targets::WindowSel {
            window_id: Some(a.window_id),
            ..Default::default()
        },
    )
    .await?;
    kill(c, "window", &w.window_id).await
}
