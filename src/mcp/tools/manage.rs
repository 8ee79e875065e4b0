//! Manage tools: names, selection, layout, copy mode, buffers.

use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::targets::{self, PaneSel, SessionSel, WindowSel};
use crate::mcp::text;
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Buffers made by sandmux start with this.
pub const BUFFER_PREFIX: &str = "sandmux_";

/// A change was made.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Done {
    /// What was done, in words.
    pub done: String,
}

fn done(s: impl Into<String>) -> Result<Done, ToolError> {
    Ok(Done { done: s.into() })
}

/// `rename_session`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct RenameSession {
    /// The new name.
    pub new_name: String,
    /// Session name.
    pub session_name: Option<String>,
    /// Session id (`$N`).
    pub session_id: Option<String>,
}

/// Renames a session.
pub async fn rename_session(c: &Call<'_>, a: RenameSession) -> Result<Done, ToolError> {
    text::session_name("new_name", &a.new_name)?;
    let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
    c.s.hub()
        .run(
            &Cmd::new("rename-session")
                .opt("-t", &s.session_id)
                .arg(text::fmt_literal(&a.new_name)),
        )
        .await?;
    done(format!("session {} renamed", s.session_id))
}

/// `rename_window`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct RenameWindow {
    /// The new name.
    pub new_name: String,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub w: WindowSel,
}

/// Renames a window.
pub async fn rename_window(c: &Call<'_>, a: RenameWindow) -> Result<Done, ToolError> {
    text::name("new_name", &a.new_name)?;
    let w = targets::window(c, &a.w).await?;
    c.s.hub()
        .run(
            &Cmd::new("rename-window")
                .opt("-t", &w.window_id)
                .arg(text::fmt_literal(&a.new_name)),
        )
        .await?;
    done(format!("window {} renamed", w.window_id))
}

/// `select_window`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SelectWindow {
    /// Window id (`@N`).
    pub window_id: Option<String>,
    /// Window index.
    pub window_index: Option<String>,
    /// Move to the next, previous or last window of the session instead.
    pub direction: Option<crate::mcp::choices::WindowStep>,
    /// Session name.
    pub session_name: Option<String>,
    /// Session id (`$N`).
    pub session_id: Option<String>,
}

/// Selects a window.
pub async fn select_window(c: &Call<'_>, a: SelectWindow) -> Result<Done, ToolError> {
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
        &WindowSel {
            window_id: a.window_id,
            window_index: a.window_index,
            s: SessionSel::new(&a.session_name, &a.session_id),
        },
    )
    .await?;
    c.s.hub()
        .run(&Cmd::new("select-window").opt("-t", &w.window_id))
        .await?;
    done(format!("window {} selected", w.window_id))
}

/// `select_layout`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SelectLayout {
    /// A preset layout.
    pub layout: crate::mcp::choices::Layout,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub w: WindowSel,
}

/// Applies a layout.
pub async fn select_layout(c: &Call<'_>, a: SelectLayout) -> Result<Done, ToolError> {
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
pub struct ResizeWindow {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub w: WindowSel,
    /// Height in rows.
    pub height: Option<u32>,
    /// Width in columns.
    pub width: Option<u32>,
}

fn dim(arg: &str, v: u32) -> Result<String, ToolError> {
    if (1..=1000).contains(&v) {
        Ok(v.to_string())
    } else {
        Err(ToolError::invalid(arg, "must be 1-1000", "e.g. 40"))
    }
}

/// Resizes a window.
pub async fn resize_window(c: &Call<'_>, a: ResizeWindow) -> Result<Done, ToolError> {
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
pub struct MoveWindow {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub w: WindowSel,
    /// New index ("" for the next free one).
    #[serde(default)]
    pub destination_index: String,
    /// Session id or name to move it to.
    pub destination_session: Option<String>,
}

/// Moves a window.
pub async fn move_window(c: &Call<'_>, a: MoveWindow) -> Result<Done, ToolError> {
    let w = targets::window(c, &a.w).await?;
    let dest = match &a.destination_session {
        Some(d) if d.starts_with('$') => targets::session(c, &SessionSel::new(&None, &Some(d.clone()))).await?,
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

/// `select_pane`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SelectPane {
    /// The pane to select.
    pub pane_id: Option<String>,
    /// Move from the active pane instead of naming one.
    pub direction: Option<crate::mcp::choices::PaneStep>,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub w: WindowSel,
}

/// Selects a pane.
pub async fn select_pane(c: &Call<'_>, a: SelectPane) -> Result<Done, ToolError> {
    if let Some(id) = &a.pane_id {
        let p = targets::explicit_pane(c, id).await?;
        c.s.hub()
            .run(&Cmd::new("select-pane").opt("-t", &p.pane_id))
            .await?;
        return done(format!("pane {} selected", p.pane_id));
    }
    let Some(d) = a.direction else {
        return Err(ToolError::invalid(
            "pane_id",
            "no pane given",
            "give pane_id or direction",
        ));
    };
    let w = targets::window(c, &a.w).await?;
    use crate::mcp::choices::PaneStep;
    let cmd = match d {
        PaneStep::Up => Cmd::new("select-pane").flag("-U"),
        PaneStep::Down => Cmd::new("select-pane").flag("-D"),
        PaneStep::Left => Cmd::new("select-pane").flag("-L"),
        PaneStep::Right => Cmd::new("select-pane").flag("-R"),
        PaneStep::Last => Cmd::new("last-pane"),
        PaneStep::Next => Cmd::new("select-pane").opt("-t", format!("{}.+", w.window_id)),
        PaneStep::Previous => Cmd::new("select-pane").opt("-t", format!("{}.-", w.window_id)),
    };
    let cmd = if matches!(d, PaneStep::Next | PaneStep::Previous) {
        cmd
    } else {
        cmd.opt("-t", &w.window_id)
    };
    c.s.hub().run(&cmd).await?;
    done(format!("moved {d}"))
}

/// `swap_pane`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SwapPane {
    /// First pane id.
    pub source_pane_id: String,
    /// Second pane id.
    pub target_pane_id: String,
}

/// Swaps panes.
pub async fn swap_pane(c: &Call<'_>, a: SwapPane) -> Result<Done, ToolError> {
    let s = targets::explicit_pane(c, &a.source_pane_id).await?;
    let t = targets::explicit_pane(c, &a.target_pane_id).await?;
    c.s.hub()
        .run(
            &Cmd::new("swap-pane")
                .opt("-s", &s.pane_id)
                .opt("-t", &t.pane_id),
        )
        .await?;
    done(format!("{} and {} swapped", s.pane_id, t.pane_id))
}

/// `resize_pane`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ResizePane {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
    /// Height in rows.
    pub height: Option<u32>,
    /// Width in columns.
    pub width: Option<u32>,
    /// Toggle zoom (not with a size).
    pub zoom: Option<bool>,
}

/// Resizes a pane.
pub async fn resize_pane(c: &Call<'_>, a: ResizePane) -> Result<Done, ToolError> {
    if a.zoom.is_some() && (a.height.is_some() || a.width.is_some()) {
        return Err(ToolError::invalid(
            "zoom",
            "cannot be combined with a size",
            "call twice",
        ));
    }
    let p = targets::pane(c, &a.p).await?;
    let mut cmd = Cmd::new("resize-pane").opt("-t", &p.pane_id);
    if a.zoom == Some(true) {
        cmd = cmd.flag("-Z");
    }
    if let Some(h) = a.height {
        cmd = cmd.opt("-y", dim("height", h)?);
    }
    if let Some(w) = a.width {
        cmd = cmd.opt("-x", dim("width", w)?);
    }
    c.s.hub().run(&cmd).await?;
    done(format!("pane {} resized", p.pane_id))
}

/// `set_pane_title`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SetTitle {
    /// The new title.
    pub title: String,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
}

/// Sets a pane title (stored as text).
pub async fn set_pane_title(c: &Call<'_>, a: SetTitle) -> Result<Done, ToolError> {
    text::name("title", &a.title)?;
    let p = targets::pane(c, &a.p).await?;
    c.s.hub()
        .run(
            &Cmd::new("select-pane")
                .opt("-t", &p.pane_id)
                .opt("-T", text::fmt_literal(&a.title)),
        )
        .await?;
    done(format!("title of {} set", p.pane_id))
}

/// `enter_copy_mode`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CopyMode {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
    /// Lines to scroll up.
    pub scroll_up: Option<u32>,
}

/// Enters copy mode.
pub async fn enter_copy_mode(c: &Call<'_>, a: CopyMode) -> Result<Done, ToolError> {
    let p = targets::pane(c, &a.p).await?;
    c.s.hub()
        .run(&Cmd::new("copy-mode").opt("-t", &p.pane_id))
        .await?;
    if let Some(n) = a.scroll_up {
        c.s.hub()
            .run(
                &Cmd::new("send-keys")
                    .flag("-X")
                    .opt("-N", n.min(100_000).to_string())
                    .opt("-t", &p.pane_id)
                    .arg("scroll-up"),
            )
            .await?;
    }
    done(format!("{} in copy mode", p.pane_id))
}

/// Pane target only.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct PaneOnly {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
}

/// Leaves copy mode.
pub async fn exit_copy_mode(c: &Call<'_>, a: PaneOnly) -> Result<Done, ToolError> {
    let p = targets::pane(c, &a.p).await?;
    if p.in_mode {
        c.s.hub()
            .run(
                &Cmd::new("send-keys")
                    .flag("-X")
                    .opt("-t", &p.pane_id)
                    .arg("cancel"),
            )
            .await?;
    }
    done(format!("{} not in copy mode", p.pane_id))
}

/// `load_buffer`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct LoadBuffer {
    /// The text to store.
    pub content: String,
    /// A label ([A-Za-z0-9_.-], at most 64) that becomes part of the name.
    pub logical_name: Option<String>,
}

/// A buffer reference.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BufferRef {
    /// The buffer's name; pass it to paste_buffer, show_buffer, delete_buffer.
    pub buffer_name: String,
    /// Bytes stored.
    pub bytes: usize,
}

/// Stores text in a new buffer.
pub async fn load_buffer(c: &Call<'_>, a: LoadBuffer) -> Result<BufferRef, ToolError> {
    text::input("content", &a.content, c.s.max_input)?;
    let label = a.logical_name.unwrap_or_default();
    if label.len() > 64
        || !label
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "_.-".contains(ch))
    {
        return Err(ToolError::invalid(
            "logical_name",
            "must be [A-Za-z0-9_.-], at most 64",
            "e.g. notes",
        ));
    }
    let name = format!(
        "{BUFFER_PREFIX}{}{}{}",
        label,
        if label.is_empty() { "" } else { "_" },
        &crate::nonce::hex()[..8]
    );
    c.s.hub()
        .run(&Cmd::new("set-buffer").opt("-b", &name).arg(&a.content))
        .await?;
    Ok(BufferRef {
        buffer_name: name,
        bytes: a.content.len(),
    })
}
