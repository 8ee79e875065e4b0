//! Starting processes. Every process starts through the pane gate: commands
//! are always passed to tmux as one shell string (tmux then runs
//! `default-shell -c STRING`, and `default-shell` is the gate), never as argv
//! words tmux would exec directly.

use crate::mcp::bounds::{self, Adds};
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::text;
use crate::profile::MountKind;
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;
use std::path::Path;

/// Where a spawn landed.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Created {
    /// `$N`.
    pub session_id: String,
    /// Session name.
    pub session_name: String,
    /// `@N`.
    pub window_id: String,
    /// `%N`.
    pub pane_id: String,
}

pub(crate) fn start_dir(c: &Call<'_>, d: &Option<String>) -> Result<String, ToolError> {
    let Some(d) = d else {
        // tmux expands `-c` as a format: a `#` in the workspace is literal.
        return Ok(crate::tmux::fmt_literal(
            &c.s.policy.workspace.display().to_string(),
        ));
    };
    let p = Path::new(d);
    let inside = c.s.policy.fs.iter().any(|e| {
        !matches!(e.kind, MountKind::Masked | MountKind::Symlink(_)) && p.starts_with(&e.path)
    }) || p.starts_with("/tmp");
    if !p.is_absolute()
        || d.contains('#')
        || p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        || d.chars().any(char::is_control)
        || !inside
    {
        return Err(ToolError::invalid(
            "start_directory",
            "must be an absolute path without '..' or '#', inside the sandbox's view",
            &format!("e.g. {}", c.s.policy.workspace.display()),
        ));
    }
    Ok(d.clone())
}

fn env_args(c: &Call<'_>, mut cmd: Cmd, env: &Option<Value>) -> Result<Cmd, ToolError> {
    let map = match env {
        None => return Ok(cmd),
        Some(Value::String(s)) => serde_json::from_str::<Value>(s).map_err(|e| {
            ToolError::invalid(
                "environment",
                &format!("not JSON: {e}"),
                "pass an object {\"NAME\": \"value\"}",
            )
        })?,
        Some(v) => v.clone(),
    };
    let obj = map.as_object().ok_or_else(|| {
        ToolError::invalid(
            "environment",
            "must be an object",
            "e.g. {\"RUST_LOG\": \"debug\"}",
        )
    })?;
    for (k, v) in obj {
        text::env_name("environment", k, &c.s.policy)?;
        let v = v.as_str().ok_or_else(|| {
            ToolError::invalid(
                "environment",
                &format!("the value of {k} is not a string"),
                "quote it",
            )
        })?;
        text::env_value("environment", v, c.s.max_input)?;
        cmd = cmd.opt("-e", format!("{k}={v}"));
    }
    Ok(cmd)
}

fn shell_arg(c: &Call<'_>, cmd: Cmd, shell: &Option<String>) -> Result<Cmd, ToolError> {
    match shell {
        None => Ok(cmd),
        Some(s) => {
            text::input("shell", s, c.s.max_input)?;
            if s.trim().is_empty() {
                return Err(ToolError::invalid(
                    "shell",
                    "is empty",
                    "give a command, or omit shell for the default shell",
                ));
            }
            // One argument: tmux runs default-shell (the gate) -c STRING.
            Ok(cmd.arg(s))
        }
    }
}

/// What `new-session`, `new-window` and `split-window` print with `-P -F`:
/// the ids of the new pane, and the session's name (`#{q:}`-escaped) last.
const CREATED_FORMAT: &str = "#{pane_id} #{window_id} #{session_id} #{q:session_name}";

/// Reads the `-P` reply. The ids come from tmux at creation, not from a
/// later lookup: a short-lived command may have ended (and its pane closed)
/// before the reply is read, and the call must not report a failure then.
async fn created(c: &Call<'_>, reply: Vec<Vec<u8>>) -> Result<Created, ToolError> {
    let line = reply.first().cloned().unwrap_or_default();
    let mut f = line.splitn(4, |b| *b == b' ');
    let mut next = || f.next().map(|x| String::from_utf8_lossy(x).into_owned());
    let (Some(pane_id), Some(window_id), Some(session_id), Some(name)) =
        (next(), next(), next(), next())
    else {
        return Err(ToolError::Internal(format!(
            "tmux printed no ids for the new pane: {:?}",
            String::from_utf8_lossy(&line)
        )));
    };
    c.s.hub()
        .sync_watchers()
        .await
        .map_err(|e| ToolError::Internal(e.to_string()))?;
    Ok(Created {
        session_id,
        session_name: String::from_utf8_lossy(&crate::tmux::control::unquote_q(name.as_bytes()))
            .into_owned(),
        window_id,
        pane_id,
    })
}

/// A command that makes a pane (`new-session`, `new-window`,
/// `split-window`) and prints where it landed.
pub(crate) fn making(what: &str) -> Cmd {
    Cmd::new(what).flag("-P").opt("-F", CREATED_FORMAT)
}

/// The process parts of a spawn: its working directory, its extra
/// variables and, for a tool that takes one, its command (`shell`).
pub(crate) fn process(
    c: &Call<'_>,
    cmd: Cmd,
    dir: &Option<String>,
    env: &Option<Value>,
    shell: Option<&Option<String>>,
) -> Result<Cmd, ToolError> {
    let cmd = env_args(c, cmd.opt("-c", start_dir(c, dir)?), env)?;
    match shell {
        Some(s) => shell_arg(c, cmd, s),
        None => Ok(cmd),
    }
}

/// Runs a [`making`] command that `adds` a session or a pane (within the
/// profile's bounds) and says where the new pane landed. A new window keeps
/// its size ([`fixed_size`]).
pub(crate) async fn spawn(c: &Call<'_>, cmd: Cmd, adds: Adds) -> Result<Created, ToolError> {
    let new_window = cmd.name() != "split-window";
    let _admitted = bounds::admit(c, adds).await?;
    let r = c.s.hub().run(&cmd).await?;
    let made = created(c, r).await?;
    if new_window {
        fixed_size(c, &made.window_id).await?;
    }
    Ok(made)
}

/// Keeps a window at the size sandmux gave it: no client's terminal changes
/// it (a human's `attach --read-only` resized the agent's window to the
/// human's terminal, and it stayed so after the detach, because every other
/// client of the server ignores its size); `resize_window` still does.
/// Per window: tmux 3.3a's server crashes on `new-session -x/-y` while the
/// global `window-size` is `manual`.
/// (A window whose command already ended is gone: nothing to keep.)
pub(crate) async fn fixed_size(c: &Call<'_>, window_id: &str) -> Result<(), ToolError> {
    let set = Cmd::new("set-option")
        .flag("-w")
        .opt("-t", window_id)
        .arg("window-size")
        .arg("manual");
    match c.s.hub().run(&set).await {
        Ok(_) | Err(crate::tmux::client::TmuxError::Command(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
