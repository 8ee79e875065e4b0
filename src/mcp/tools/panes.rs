//! Pane tools: list, describe, find, split, respawn, select, swap, resize,
//! title, copy mode, kill, clear.

use super::spawn::{self, Created};
use super::{dim, done, kill, Done};
use crate::mcp::bounds::Adds;
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::targets::{self, OnePane, PaneRow, PaneSel, SessionSel, WindowSel};
use crate::mcp::text;
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `list_panes`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ListPanes {
    pub session_name: Option<String>,
    pub session_id: Option<String>,
    pub window_id: Option<String>,
    /// Window index (with a session).
    pub window_index: Option<String>,
    /// Lookups such as {"current_command": "bash"}.
    pub filters: Option<Value>,
}

/// `list_panes` result.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Panes {
    /// The panes.
    pub panes: Vec<PaneRow>,
}

/// Lists panes.
pub(crate) async fn list_panes(c: &Call<'_>, a: ListPanes) -> Result<Panes, ToolError> {
    let mut panes = targets::panes(c).await?;
    if a.window_id.is_some() || a.window_index.is_some() {
        let w = targets::window(
            c,
            &WindowSel::new(a.window_id, a.window_index, &a.session_name, &a.session_id),
        )
        .await?;
        panes.retain(|p| p.window_id == w.window_id);
    } else if SessionSel::new(&a.session_name, &a.session_id).given() {
        let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
        panes.retain(|p| p.session_id == s.session_id);
    }
    Ok(Panes {
        panes: targets::filter(panes, &a.filters)?,
    })
}

/// Pane target only.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct PaneArgs {
    #[serde(flatten)]
    pub p: PaneSel,
}

/// One pane's metadata.
pub(crate) async fn get_pane_info(c: &Call<'_>, a: PaneArgs) -> Result<OnePane, ToolError> {
    targets::pane(c, &a.p).await.map(OnePane)
}

/// `find_pane_by_position`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct FindPane {
    /// Which corner.
    pub corner: crate::mcp::choices::Corner,
    #[serde(flatten)]
    pub w: WindowSel,
}

/// The pane at a window corner.
pub(crate) async fn find_pane_by_position(c: &Call<'_>, a: FindPane) -> Result<OnePane, ToolError> {
    let w = targets::window(c, &a.w).await?;
    let panes: Vec<PaneRow> = targets::panes(c)
        .await?
        .into_iter()
        .filter(|p| p.window_id == w.window_id)
        .collect();
    use crate::mcp::choices::Corner;
    let key = |p: &PaneRow| -> (i64, i64) {
        match a.corner {
            Corner::TopLeft => (p.top as i64, p.left as i64),
            Corner::TopRight => (p.top as i64, -(p.right as i64)),
            Corner::BottomLeft => (-(p.bottom as i64), p.left as i64),
            Corner::BottomRight => (-(p.bottom as i64), -(p.right as i64)),
        }
    };
    panes
        .into_iter()
        .min_by_key(key)
        .map(OnePane)
        .ok_or_else(|| ToolError::not_found("pane", "call list_panes"))
}

/// `split_window`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SplitWindow {
    #[serde(flatten)]
    pub p: PaneSel,
    /// Where the new pane goes (default below).
    pub direction: Option<crate::mcp::choices::Split>,
    /// Size: lines/columns, or a percentage like "30%".
    pub size: Option<Value>,
    /// Working directory (inside the sandbox).
    pub start_directory: Option<String>,
    /// A command to run instead of the shell.
    pub shell: Option<String>,
    /// Extra variables.
    pub environment: Option<Value>,
}

/// Splits a pane.
pub(crate) async fn split_window(c: &Call<'_>, a: SplitWindow) -> Result<Created, ToolError> {
    let p = targets::pane(c, &a.p).await?;
    let mut cmd = spawn::making("split-window")
        .flag("-d")
        .opt("-t", &p.pane_id);
    use crate::mcp::choices::Split;
    cmd = match a.direction.unwrap_or_default() {
        Split::Below => cmd.flag("-v"),
        Split::Above => cmd.flag("-v").flag("-b"),
        Split::Right => cmd.flag("-h"),
        Split::Left => cmd.flag("-h").flag("-b"),
    };
    if let Some(sz) = &a.size {
        let s = match sz {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            _ => String::new(),
        };
        let ok = !s.is_empty() && s.trim_end_matches('%').parse::<u32>().is_ok();
        if !ok {
            return Err(ToolError::invalid(
                "size",
                "is not a size",
                "use a number of lines/columns or a percentage like \"30%\"",
            ));
        }
        cmd = cmd.opt("-l", s);
    }
    let env = &a.environment;
    cmd = spawn::process(c, cmd, &a.start_directory, env, Some(&a.shell))?;
    spawn::spawn(c, cmd, Adds::Pane).await
}

/// `respawn_pane`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Respawn {
    pub pane_id: String,
    /// Kill the running process first (default true).
    pub kill: Option<bool>,
    /// A command string (through the pane gate).
    pub shell: Option<String>,
    /// Working directory (inside the sandbox).
    pub start_directory: Option<String>,
    /// Extra variables.
    pub environment: Option<Value>,
}

/// Respawns a pane.
pub(crate) async fn respawn_pane(c: &Call<'_>, a: Respawn) -> Result<Created, ToolError> {
    let p = targets::explicit_pane(c, &a.pane_id).await?;
    let mut cmd = Cmd::new("respawn-pane").opt("-t", &p.pane_id);
    if a.kill.unwrap_or(true) {
        cmd = cmd.flag("-k");
    }
    let env = &a.environment;
    cmd = spawn::process(c, cmd, &a.start_directory, env, Some(&a.shell))?;
    c.s.hub().run(&cmd).await?;
    Ok(Created {
        session_id: p.session_id,
        session_name: p.session_name,
        window_id: p.window_id,
        pane_id: p.pane_id,
    })
}

/// `select_pane`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SelectPane {
    pub pane_id: Option<String>,
    /// Move from the active pane instead of naming one.
    pub direction: Option<crate::mcp::choices::PaneStep>,
    #[serde(flatten)]
    pub w: WindowSel,
}

/// Selects a pane.
pub(crate) async fn select_pane(c: &Call<'_>, a: SelectPane) -> Result<Done, ToolError> {
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
pub(crate) struct SwapPane {
    /// First pane id.
    pub source_pane_id: String,
    /// Second pane id.
    pub target_pane_id: String,
}

/// Swaps panes.
pub(crate) async fn swap_pane(c: &Call<'_>, a: SwapPane) -> Result<Done, ToolError> {
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
pub(crate) struct ResizePane {
    #[serde(flatten)]
    pub p: PaneSel,
    /// Height in rows.
    pub height: Option<u32>,
    /// Width in columns.
    pub width: Option<u32>,
    /// Toggle zoom (not with a size).
    pub zoom: Option<bool>,
}

/// Resizes a pane.
pub(crate) async fn resize_pane(c: &Call<'_>, a: ResizePane) -> Result<Done, ToolError> {
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
pub(crate) struct SetTitle {
    /// The new title.
    pub title: String,
    #[serde(flatten)]
    pub p: PaneSel,
}

/// Sets a pane title (stored as text).
pub(crate) async fn set_pane_title(c: &Call<'_>, a: SetTitle) -> Result<Done, ToolError> {
    text::name("title", &a.title)?;
    let p = targets::pane(c, &a.p).await?;
    c.s.hub()
        .run(
            &Cmd::new("select-pane")
                .opt("-t", &p.pane_id)
                .opt("-T", crate::tmux::fmt_literal(&a.title)),
        )
        .await?;
    done(format!("title of {} set", p.pane_id))
}

/// `enter_copy_mode`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct CopyMode {
    #[serde(flatten)]
    pub p: PaneSel,
    /// Lines to scroll up.
    pub scroll_up: Option<u32>,
}

/// Enters copy mode.
pub(crate) async fn enter_copy_mode(c: &Call<'_>, a: CopyMode) -> Result<Done, ToolError> {
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
pub(crate) struct PaneOnly {
    #[serde(flatten)]
    pub p: PaneSel,
}

/// Leaves copy mode.
pub(crate) async fn exit_copy_mode(c: &Call<'_>, a: PaneOnly) -> Result<Done, ToolError> {
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

/// `kill_pane`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct KillPane {
    pub pane_id: String,
}

/// Kills a pane.
pub(crate) async fn kill_pane(c: &Call<'_>, a: KillPane) -> Result<Done, ToolError> {
    let p = targets::explicit_pane(c, &a.pane_id).await?;
    kill(c, "pane", &p.pane_id).await
}

/// Resets a pane and clears its history.
pub(crate) async fn clear_pane(c: &Call<'_>, a: PaneOnly) -> Result<Done, ToolError> {
    let p = targets::pane(c, &a.p).await?;
    c.s.hub()
        .run(&Cmd::new("send-keys").flag("-R").opt("-t", &p.pane_id))
        .await?;
    c.s.hub()
        .run(&Cmd::new("clear-history").opt("-t", &p.pane_id))
        .await?;
    done(format!("pane {} cleared", p.pane_id))
}
