//! Execute tools: everything that starts processes or types into panes. Every
//! process starts through the pane gate: commands are always passed to tmux as
//! one shell string (tmux then runs `default-shell -c STRING`, and
//! `default-shell` is the gate), never as argv words tmux would exec directly.

use super::commands;
use super::inspect::{self, Scope};
use super::manage::Done;
use crate::mcp::bounds::{self, Adds};
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::targets::{self, PaneRow, PaneSel, SessionSel};
use crate::mcp::text;
use crate::profile::MountKind;
use crate::tmux::hub::{Cmd, Hub};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use super::wait::Wait;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where a spawn landed.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Created {
    /// `$N`.
    pub session_id: String,
    /// Session name.
    pub session_name: String,
    /// `@N`.
    pub window_id: String,
    /// `%N`.
    pub pane_id: String,
}

fn start_dir(c: &Call<'_>, d: &Option<String>) -> Result<String, ToolError> {
    let Some(d) = d else {
        return Ok(c.s.policy.workspace.display().to_string());
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
        .map_err(ToolError::Internal)?;
    Ok(Created {
        session_id,
        session_name: String::from_utf8_lossy(&crate::tmux::control::unquote_q(name.as_bytes()))
            .into_owned(),
        window_id,
        pane_id,
    })
}

/// `create_session`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateSession {
    /// Session name.
    pub session_name: Option<String>,
    /// First window's name.
    pub window_name: Option<String>,
    /// Working directory (inside the sandbox; default: the workspace).
    pub start_directory: Option<String>,
    /// Width in columns.
    pub x: Option<u32>,
    /// Height in rows.
    pub y: Option<u32>,
    /// Extra variables for the session's panes.
    pub environment: Option<Value>,
}

/// Creates a session.
pub async fn create_session(c: &Call<'_>, a: CreateSession) -> Result<Created, ToolError> {
    let mut cmd = Cmd::new("new-session")
        .flag("-d")
        .flag("-P")
        .opt("-F", CREATED_FORMAT);
    if let Some(n) = &a.session_name {
        text::session_name("session_name", n)?;
        cmd = cmd.opt("-s", text::fmt_literal(n));
    }
    if let Some(n) = &a.window_name {
        text::name("window_name", n)?;
        cmd = cmd.opt("-n", text::fmt_literal(n));
    }
    cmd = cmd.opt("-c", start_dir(c, &a.start_directory)?);
    cmd = cmd
        .opt("-x", a.x.unwrap_or(200).clamp(10, 1000).to_string())
        .opt("-y", a.y.unwrap_or(50).clamp(5, 1000).to_string());
    cmd = env_args(c, cmd, &a.environment)?;
    let _admitted = bounds::admit(c, Adds::Session).await?;
    let r = c.s.hub().run(&cmd).await?;
    let made = created(c, r).await?;
    fixed_size(c, &made.window_id).await?;
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

/// `create_window`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateWindow {
    /// Session name.
    pub session_name: Option<String>,
    /// Session id (`$N`).
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
pub async fn create_window(c: &Call<'_>, a: CreateWindow) -> Result<Created, ToolError> {
    let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
    let mut cmd = Cmd::new("new-window").flag("-P").opt("-F", CREATED_FORMAT);
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
        cmd = cmd.opt("-n", text::fmt_literal(n));
    }
    cmd = cmd.opt("-c", start_dir(c, &a.start_directory)?);
    cmd = env_args(c, cmd, &a.environment)?;
    cmd = shell_arg(c, cmd, &a.shell)?;
    let _admitted = bounds::admit(c, Adds::Pane).await?;
    let r = c.s.hub().run(&cmd).await?;
    let made = created(c, r).await?;
    fixed_size(c, &made.window_id).await?;
    Ok(made)
}

/// `split_window`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SplitWindow {
    #[serde(flatten)]
    #[allow(missing_docs)]
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
pub async fn split_window(c: &Call<'_>, a: SplitWindow) -> Result<Created, ToolError> {
    let p = targets::pane(c, &a.p).await?;
    let mut cmd = Cmd::new("split-window")
        .flag("-d")
        .flag("-P")
        .opt("-F", CREATED_FORMAT)
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
    cmd = cmd.opt("-c", start_dir(c, &a.start_directory)?);
    cmd = env_args(c, cmd, &a.environment)?;
    cmd = shell_arg(c, cmd, &a.shell)?;
    let _admitted = bounds::admit(c, Adds::Pane).await?;
    let r = c.s.hub().run(&cmd).await?;
    created(c, r).await
}

/// `respawn_pane`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Respawn {
    /// Pane id (required).
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
pub async fn respawn_pane(c: &Call<'_>, a: Respawn) -> Result<Created, ToolError> {
    let p = targets::explicit_pane(c, &a.pane_id).await?;
    let mut cmd = Cmd::new("respawn-pane").opt("-t", &p.pane_id);
    if a.kill.unwrap_or(true) {
        cmd = cmd.flag("-k");
    }
    cmd = cmd.opt("-c", start_dir(c, &a.start_directory)?);
    cmd = env_args(c, cmd, &a.environment)?;
    cmd = shell_arg(c, cmd, &a.shell)?;
    c.s.hub().run(&cmd).await?;
    Ok(Created {
        session_id: p.session_id,
        session_name: p.session_name,
        window_id: p.window_id,
        pane_id: p.pane_id,
    })
}

/// Keys: one name (or several separated by spaces), or a list of names.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
#[allow(missing_docs)]
pub enum Keys {
    One(String),
    Many(Vec<String>),
}

/// `send_keys`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendKeys {
    /// Text typed literally.
    pub text: Option<String>,
    /// Key names pressed after the text, e.g. ["C-c"] or "Escape".
    pub keys: Option<Keys>,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
    /// Press Enter after `text` (default true).
    pub enter: Option<bool>,
    /// Type a string `keys` as text (compatibility).
    #[serde(default)]
    pub literal: bool,
    /// Prefix a space (keeps the text out of shell history).
    #[serde(default)]
    pub suppress_history: bool,
}

/// What was sent.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Sent {
    /// The pane.
    pub pane_id: String,
    /// Bytes of text typed.
    pub text_bytes: usize,
    /// Keys pressed (including Enter).
    pub keys: Vec<String>,
    /// A cursor taken just before sending: pass it to wait_for_text or
    /// capture_since to see exactly what followed.
    pub cursor: String,
}

async fn send_one(c: &Call<'_>, pane: &PaneRow, a: &SendKeys) -> Result<Sent, ToolError> {
    let (mut text_in, mut keys) = (a.text.clone(), Vec::new());
    match (&a.keys, a.literal) {
        (Some(Keys::One(s)), true) => text_in = Some(text_in.unwrap_or_default() + s),
        (Some(Keys::One(s)), false) => keys = s.split_whitespace().map(str::to_string).collect(),
        (Some(Keys::Many(v)), _) => keys = v.clone(),
        (None, _) => {}
    }
    if text_in.is_none() && keys.is_empty() {
        return Err(ToolError::invalid(
            "text",
            "nothing to send",
            "give text (typed literally) and/or keys (key names)",
        ));
    }
    for k in &keys {
        text::key(k)?;
    }
    let mut sent_keys = Vec::new();
    let mut bytes = 0;
    let (offset, _) = c.s.hub().subscribe(pane.num);
    let cursor = inspect::cursor_for(c, pane, offset);
    if let Some(t) = &text_in {
        text::input("text", t, c.s.max_input)?;
        let t = if a.suppress_history {
            format!(" {t}")
        } else {
            t.clone()
        };
        bytes = t.len();
        if !t.is_empty() {
            leave_modes(c, pane).await?;
            c.s.hub()
                .run(
                    &Cmd::new("send-keys")
                        .flag("-l")
                        .opt("-t", &pane.pane_id)
                        .rest([t.as_bytes()]),
                )
                .await?;
        }
    }
    if !keys.is_empty() {
        c.s.hub()
            .run(
                &Cmd::new("send-keys")
                    .opt("-t", &pane.pane_id)
                    .rest(keys.iter().map(|k| k.as_bytes())),
            )
            .await?;
        sent_keys.extend(keys);
    }
    if text_in.is_some() && a.enter.unwrap_or(true) {
        c.s.hub()
            .run(&Cmd::new("send-keys").opt("-t", &pane.pane_id).arg("Enter"))
            .await?;
        sent_keys.push("Enter".into());
    }
    Ok(Sent {
        pane_id: pane.pane_id.clone(),
        text_bytes: bytes,
        keys: sent_keys,
        cursor,
    })
}

/// Text is meant for the program in the pane: a pane in copy mode (or any
/// mode) would instead take each character as a mode command, so the mode is
/// left first. Key names are still delivered to the mode (`q`, `Up`, ...).
async fn leave_modes(c: &Call<'_>, pane: &PaneRow) -> Result<(), ToolError> {
    if pane.in_mode {
        c.s.hub()
            .run(&Cmd::new("copy-mode").flag("-q").opt("-t", &pane.pane_id))
            .await?;
    }
    Ok(())
}

/// Types text and/or presses keys.
pub async fn send_keys(c: &Call<'_>, a: SendKeys) -> Result<Sent, ToolError> {
    let p = targets::pane(c, &a.p).await?;
    send_one(c, &p, &a).await
}

/// `send_keys_batch`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendBatch {
    /// 1–100 send_keys operations.
    pub operations: Vec<SendKeys>,
    /// After an error: stop (default) or continue.
    pub on_error: Option<crate::mcp::choices::OnError>,
    /// Seconds for the whole batch.
    pub timeout: Option<f64>,
}

/// One batch result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BatchSentItem {
    /// Position.
    pub index: usize,
    /// Pane, when resolved.
    pub pane_id: Option<String>,
    /// Whether it was sent.
    pub success: bool,
    /// Why not.
    pub error: Option<String>,
    /// Seconds since the batch began.
    pub elapsed: f64,
}

/// Batch result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BatchSent {
    /// Results in order.
    pub results: Vec<BatchSentItem>,
}

/// Sends several operations.
pub async fn send_keys_batch(c: &Call<'_>, a: SendBatch) -> Result<BatchSent, ToolError> {
    let total: usize = a
        .operations
        .iter()
        .map(|o| o.text.as_ref().map_or(0, String::len))
        .sum();
    if total > c.s.max_input {
        return Err(ToolError::invalid(
            "operations",
            &format!(
                "carry {total} bytes of text; the limit is {}",
                c.s.max_input
            ),
            "split the batch",
        ));
    }
    let stop = super::batch_rules(a.operations.len(), a.on_error)?;
    let limit = c.clamp(a.timeout, c.s.wait_max.as_secs_f64())?;
    let t0 = Instant::now();
    let mut results = Vec::new();
    for (index, op) in a.operations.iter().enumerate() {
        if t0.elapsed() > limit {
            results.push(BatchSentItem {
                index,
                pane_id: None,
                success: false,
                error: Some("the batch deadline passed".into()),
                elapsed: t0.elapsed().as_secs_f64(),
            });
            break;
        }
        let r = match targets::pane(c, &op.p).await {
            Ok(p) => send_one(c, &p, op).await,
            Err(e) => Err(e),
        };
        let failed = r.is_err();
        results.push(match r {
            Ok(s) => BatchSentItem {
                index,
                pane_id: Some(s.pane_id),
                success: true,
                error: None,
                elapsed: t0.elapsed().as_secs_f64(),
            },
            Err(e) => BatchSentItem {
                index,
                pane_id: op.p.pane_id.clone(),
                success: false,
                error: Some(e.to_string()),
                elapsed: t0.elapsed().as_secs_f64(),
            },
        });
        if failed && stop {
            break;
        }
    }
    Ok(BatchSent { results })
}

/// `paste_text`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct PasteText {
    /// The text (multi-line is fine).
    pub text: String,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
    /// Bracketed paste (default true).
    pub bracket: Option<bool>,
}

/// Pastes text through a temporary buffer.
pub async fn paste_text(c: &Call<'_>, a: PasteText) -> Result<Sent, ToolError> {
    text::input("text", &a.text, c.s.max_input)?;
    let p = targets::pane(c, &a.p).await?;
    let name = format!(
        "{}paste_{}",
        super::manage::BUFFER_PREFIX,
        &crate::nonce::hex()[..8]
    );
    let (offset, _) = c.s.hub().subscribe(p.num);
    let cursor = inspect::cursor_for(c, &p, offset);
    c.s.hub()
        .run(&Cmd::new("set-buffer").opt("-b", &name).arg(&a.text))
        .await?;
    let mut cmd = Cmd::new("paste-buffer")
        .flag("-d")
        .opt("-b", &name)
        .opt("-t", &p.pane_id);
    if a.bracket.unwrap_or(true) {
        cmd = cmd.flag("-p");
    }
    let r = c.s.hub().run(&cmd).await;
    if r.is_err() {
        let _ =
            c.s.hub()
                .run(&Cmd::new("delete-buffer").opt("-b", &name))
                .await;
    }
    r?;
    Ok(Sent {
        pane_id: p.pane_id,
        text_bytes: a.text.len(),
        keys: vec![],
        cursor,
    })
}

/// `paste_buffer`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct PasteBuffer {
    /// A name returned by load_buffer.
    pub buffer_name: String,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
    /// Bracketed paste (default true).
    pub bracket: Option<bool>,
}

/// Pastes a buffer.
pub async fn paste_buffer(c: &Call<'_>, a: PasteBuffer) -> Result<Sent, ToolError> {
    inspect::buffer_name(&a.buffer_name)?;
    let p = targets::pane(c, &a.p).await?;
    let (offset, _) = c.s.hub().subscribe(p.num);
    let cursor = inspect::cursor_for(c, &p, offset);
    let mut cmd = Cmd::new("paste-buffer")
        .opt("-b", &a.buffer_name)
        .opt("-t", &p.pane_id);
    if a.bracket.unwrap_or(true) {
        cmd = cmd.flag("-p");
    }
    c.s.hub().run(&cmd).await?;
    Ok(Sent {
        pane_id: p.pane_id,
        text_bytes: 0,
        keys: vec![],
        cursor,
    })
}

/// `run_command`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunCommand {
    /// A shell command line.
    pub command: String,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub p: PaneSel,
    /// Seconds (default 30).
    pub timeout: Option<f64>,
    /// Keep the last N output lines (default 500).
    pub max_lines: Option<usize>,
    /// Keep it out of shell history (default true).
    pub suppress_history: Option<bool>,
    /// On timeout, press C-c.
    #[serde(default)]
    pub interrupt_on_timeout: bool,
    /// If the pane is not at its shell prompt: refuse (default), or type
    /// into the foreground program anyway.
    pub when_busy: Option<WhenBusy>,
}

/// What `run_command` does with a pane that is not at its prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WhenBusy {
    /// Refuse, naming the foreground program.
    #[default]
    Refuse,
    /// Type the command into whatever is in the foreground.
    Type,
}

/// A command's result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RunResult {
    /// completed | timeout | interrupted | pane_exited (the command ended the
    /// pane's shell: `exit`, `set -e` and a failure).
    pub status: String,
    /// Exit status (when completed; for pane_exited, tmux's when it kept the pane).
    pub exit_status: Option<i32>,
    /// What the command printed (plain text; tail kept).
    pub output: String,
    /// Bytes of output before capping.
    pub bytes: usize,
    /// Whether output was cut.
    pub truncated: bool,
    /// Lines cut from the head.
    pub truncated_lines: usize,
    /// Output was lost because it scrolled past sandmux's buffer.
    pub missed: bool,
    /// The pane.
    pub pane_id: String,
    /// Seconds.
    pub elapsed: f64,
    /// The timeout that applied, in seconds.
    pub timeout: f64,
    /// Why it is not the one asked for (the profile's ceiling); absent when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_note: Option<String>,
    /// On timeout, the id `wait_for_command` collects the still-running
    /// command with; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command_id: Option<String>,
}

/// The line typed for a command: the pane's `__sandmux_run` (exported to
/// bash by the pane gate, see [`crate::sandbox::pane::RUN_FUNCTION`]) with
/// the command single-quoted, so the screen shows the command as written
/// (`'` as `'\''`; control characters other than newline, which would act as
/// keys in the line editor, as `$(printf '\ooo')`). The markers are printed by
/// the function as OSC sequences nothing draws.
pub fn wrap(command: &str, nonce: &str, quiet: bool) -> String {
    let mut q = String::with_capacity(command.len() + 16);
    for ch in command.chars() {
        match ch {
            '\'' => q.push_str("'\\''"),
            '\n' => q.push('\n'),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                q.push_str(&format!("'\"$(printf '\\{:03o}')\"'", c as u32))
            }
            c => q.push(c),
        }
    }
    format!(
        "{}__sandmux_run {nonce} '{q}'",
        if quiet { " " } else { "" }
    )
}

/// The same for a shell without `__sandmux_run` (not bash, or the function
/// was removed): one POSIX line, the command as octal escapes for `eval`, so
/// no quote in it can swallow the end marker; longer on screen.
pub fn wrap_posix(command: &str, nonce: &str, quiet: bool) -> String {
    let mut oct = String::new();
    for &b in command.as_bytes() {
        if b.is_ascii_alphanumeric() {
            oct.push(b as char);
        } else {
            oct.push_str(&format!("\\{b:03o}"));
        }
    }
    format!(
        "{}printf '\\033]6973;B%s;%s\\007' {nonce} \"$$\"; eval \"$(printf '{oct}')\"; printf '\\033]6973;E%s;%s\\007' {nonce} \"$?\"",
        if quiet { " " } else { "" }
    )
}

/// Types `line` and Enter into a pane.
async fn type_line(c: &Call<'_>, pane: &str, line: &str) -> Result<(), ToolError> {
    c.s.hub()
        .run(
            &Cmd::new("send-keys")
                .flag("-l")
                .opt("-t", pane)
                .rest([line.as_bytes()]),
        )
        .await?;
    c.s.hub()
        .run(&Cmd::new("send-keys").opt("-t", pane).arg("Enter"))
        .await?;
    Ok(())
}

/// Runs a command and follows its output until its end marker.
pub async fn run_command(c: &Call<'_>, a: RunCommand) -> Result<RunResult, ToolError> {
    text::input("command", &a.command, c.s.max_input)?;
    if a.command.trim().is_empty() {
        return Err(ToolError::invalid("command", "is empty", "give a command"));
    }
    let timeout = c.clamp(a.timeout, 30.0)?;
    let note = a.timeout.filter(|t| *t > timeout.as_secs_f64()).map(|t| {
        format!(
            "asked for {t} s; the profile's ceiling ([mcp] wait_max_seconds) is {} s",
            timeout.as_secs_f64()
        )
    });
    if !c.s.commands.has_room() {
        return Err(ToolError::refused(format!("{} long commands are still running in this instance (each run_command that timed out keeps one until it ends); collect them with wait_for_command or stop them (send_keys C-c) first", commands::MAX_COMMANDS)));
    }
    let p = targets::pane(c, &a.p).await?;
    if p.dead {
        return Err(ToolError::refused(format!(
            "pane {} is dead; respawn_pane it first",
            p.pane_id
        )));
    }
    let fg = foreground(c, &p.pane_id).await?;
    let at_prompt = refuse_if_busy(c, &p.pane_id, &fg).is_ok();
    if a.when_busy.unwrap_or_default() == WhenBusy::Refuse {
        refuse_if_busy(c, &p.pane_id, &fg)?;
    }
    leave_modes(c, &p).await?;
    let nonce = crate::nonce::hex()[..12].to_string();
    let num = p.num;
    let hub = c.s.hub();
    // Follow from before the keys are sent.
    let (start, _) = hub.subscribe(num);
    let quiet = a.suppress_history.unwrap_or(true);
    let bash = fg == "bash" || fg.is_empty();
    let line = if bash {
        wrap(&a.command, &nonce, quiet)
    } else {
        wrap_posix(&a.command, &nonce, quiet)
    };
    type_line(c, &p.pane_id, &line).await?;
    let follow = Mutex::new(commands::Follow::new(&p, &nonce, start));
    let mut wait = Wait::call(c, timeout)
        .progress("command running")
        .cancel_says("cancelled by the client; the command may still be running");
    let max_lines = a.max_lines.unwrap_or(inspect::MAX_LINES).min(100_000);
    let total = timeout.as_secs_f64();
    let mut retyped = !bash;
    let ended = loop {
        let every = Duration::from_millis(250);
        match commands::follow_until(&hub, &follow, &mut wait, every).await? {
            commands::Until::NoFunction if !retyped => {
                // The shell has no __sandmux_run: the command did not run.
                retyped = true;
                let (pos, _) = hub.subscribe(num);
                *follow.lock().unwrap_or_else(|p| p.into_inner()) =
                    commands::Follow::new(&p, &nonce, pos);
                type_line(c, &p.pane_id, &wrap_posix(&a.command, &nonce, quiet)).await?;
            }
            commands::Until::Ended => break true,
            _ => break false,
        }
    };
    let f = follow.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut r = if ended {
        f.result(f.status(), max_lines, total)
    } else {
        if a.interrupt_on_timeout {
            hub.run(&Cmd::new("send-keys").opt("-t", &p.pane_id).arg("C-c"))
                .await?;
        }
        let status = if a.interrupt_on_timeout {
            "interrupted"
        } else {
            "timeout"
        };
        let mut r = f.result(status, max_lines, total);
        // Kept only when it was typed at a shell prompt: typed into another
        // program (when_busy = "type"), no marker may ever come.
        if !a.interrupt_on_timeout && at_prompt {
            r.command_id =
                c.s.commands
                    .keep(hub.clone(), &c.s.info().generation, f, max_lines);
        }
        r
    };
    r.timeout_note = note;
    Ok(r)
}

/// The pane's foreground program (`#{pane_current_command}`), waiting (at
/// most 3 s) while the pane is still starting (tmux's fork, then the gate).
async fn foreground(c: &Call<'_>, pane: &str) -> Result<String, ToolError> {
    let cmd = Cmd::new("display-message")
        .flag("-p")
        .opt("-t", pane)
        .arg("#{pane_id} #{pane_current_command}");
    let t0 = Instant::now();
    loop {
        let lines = c.s.hub().run(&cmd).await?;
        let l = lines
            .first()
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .unwrap_or_default();
        let (id, fg) = l.split_once(' ').unwrap_or((l.as_str(), ""));
        if id != pane {
            return Ok(String::new());
        }
        let starting = fg == "tmux" || fg.starts_with(crate::sandbox::pane::GATE_NAME);
        if !starting || t0.elapsed() > Duration::from_secs(3) {
            return Ok(fg.to_string());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Refuses when the pane's foreground program is not its shell: the
/// command's keys would go to that program (a REPL, a pager, an editor) or
/// queue behind a running job. A nested shell of the same name counts as the
/// prompt.
fn refuse_if_busy(c: &Call<'_>, pane: &str, fg: &str) -> Result<(), ToolError> {
    let shell = std::path::Path::new(&c.s.policy.sandbox.shell)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if fg.is_empty() || fg == shell {
        return Ok(());
    }
    let fg = text::clean(fg.as_bytes());
    Err(ToolError::refused(format!(
        "pane {pane} is not at its shell prompt: its foreground program is {fg:?}, not {shell}, so the command's keys would go to {fg:?} (or wait behind it). Use another pane (split_window), talk to {fg:?} with send_keys, wait for it to end (wait_for_stable), or pass when_busy = \"type\" to type the command anyway"
    )))
}

/// `Some(status)` when the pane has exited: it is gone (its shell ended and
/// tmux closed it) or dead under `remain-on-exit` (with tmux's exit status).
pub(crate) async fn pane_exited(hub: &Hub, pane: &str) -> Result<Option<Option<i32>>, ToolError> {
    let cmd = Cmd::new("display-message")
        .flag("-p")
        .opt("-t", pane)
        .arg("#{pane_id} #{pane_dead} #{pane_dead_status}");
    match hub.run(&cmd).await {
        Ok(lines) => {
            // tmux 3.3 answers a target that no longer exists with empty
            // fields, not an error: the pane id tells.
            let l = lines
                .first()
                .map(|l| String::from_utf8_lossy(l).into_owned())
                .unwrap_or_default();
            let mut it = l.split_whitespace();
            if it.next() != Some(pane) {
                return Ok(Some(None));
            }
            Ok((it.next() == Some("1")).then(|| it.next().and_then(|s| s.parse().ok())))
        }
        Err(crate::tmux::client::TmuxError::Command(_)) => Ok(Some(None)),
        Err(e) => Err(ToolError::Tmux(e)),
    }
}

/// Options `set_option` may set, with their allowed values.
const OPTIONS: &[(&str, &str)] = &[
    ("history-limit", "int:0:100000"),
    ("remain-on-exit", "on|off|failed"),
    ("mode-keys", "vi|emacs"),
    ("status-keys", "vi|emacs"),
    ("mouse", "on|off"),
    ("synchronize-panes", "on|off"),
    ("automatic-rename", "on|off"),
    ("allow-rename", "on|off"),
    ("aggressive-resize", "on|off"),
    ("main-pane-width", "int:1:1000"),
    ("main-pane-height", "int:1:1000"),
    ("base-index", "int:0:1000"),
    ("pane-base-index", "int:0:1000"),
    ("renumber-windows", "on|off"),
    ("monitor-silence", "int:0:86400"),
    ("wrap-search", "on|off"),
    ("display-time", "int:0:60000"),
    ("repeat-time", "int:0:60000"),
];

/// `set_option`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SetOption {
    /// One of the allowed option names.
    pub option: String,
    /// Its new value.
    pub value: String,
    /// server, session, window or pane.
    pub scope: Option<Scope>,
    /// A session, window or pane id.
    pub target: Option<String>,
    /// Set the global value.
    #[serde(default)]
    pub global_: bool,
}

/// Sets an allowlisted option.
pub async fn set_option(c: &Call<'_>, a: SetOption) -> Result<Done, ToolError> {
    let Some((_, rule)) = OPTIONS.iter().find(|(n, _)| *n == a.option) else {
        return Err(ToolError::refused(format!(
            "option {:?} is not on sandmux's list of harmless options ({}); shells, commands, formats, hooks, passthrough and clipboard options are never settable",
            a.option,
            OPTIONS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        )));
    };
    let ok = if let Some(r) = rule.strip_prefix("int:") {
        let mut it = r.split(':').map(|x| x.parse::<i64>().unwrap_or(0));
        let (lo, hi) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        a.value.parse::<i64>().is_ok_and(|v| (lo..=hi).contains(&v))
    } else {
        rule.split('|').any(|v| v == a.value)
    };
    if !ok {
        return Err(ToolError::invalid(
            "value",
            &format!("{:?} is not allowed for {}", a.value, a.option),
            &format!("allowed: {rule}"),
        ));
    }
    let cmd = inspect::scope_cmd(Cmd::new("set-option"), a.scope, &a.target, a.global_)?
        .arg(&a.option)
        .arg(&a.value);
    c.s.hub().run(&cmd).await?;
    Ok(Done {
        done: format!("{} set to {}", a.option, a.value),
    })
}

/// `set_environment`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SetEnv {
    /// Variable name.
    pub name: String,
    /// The value to set.
    pub value: String,
    /// Session name (global when omitted).
    pub session_name: Option<String>,
    /// Session id (`$N`).
    pub session_id: Option<String>,
}

/// Sets an environment variable for later panes.
pub async fn set_environment(c: &Call<'_>, a: SetEnv) -> Result<Done, ToolError> {
    text::env_name("name", &a.name, &c.s.policy)?;
    text::env_value("value", &a.value, c.s.max_input)?;
    let cmd = if a.session_name.is_none() && a.session_id.is_none() {
        Cmd::new("set-environment").flag("-g")
    } else {
        let s = targets::session(c, &SessionSel::new(&a.session_name, &a.session_id)).await?;
        Cmd::new("set-environment").opt("-t", &s.session_id)
    };
    c.s.hub().run(&cmd.arg(&a.name).arg(&a.value)).await?;
    Ok(Done {
        done: format!("{} set", a.name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NASTY: &[&str] = &[
        "echo 'unbalanced",
        "a'b\"c$d`e\\f",
        "tab\there\x01\x7f",
        "line one\nline two!\n",
        "héllo ✓ '' '\\''",
    ];

    /// Bash reads the typed line back to exactly the command (a stub
    /// `__sandmux_run` prints its second argument).
    #[test]
    fn typed_line_carries_the_command_exactly() {
        for cmd in NASTY {
            let line = wrap(cmd, "abc123", true);
            assert!(line.starts_with(' ') && !line.contains('\x1b'), "{line:?}");
            let script = format!("__sandmux_run() {{ printf %s \"$2\"; }}\n{line}\n");
            let out = std::process::Command::new("bash")
                .args(["-c", &script])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), *cmd, "{line:?}");
        }
    }

    /// The POSIX line runs the command as data between its markers, whatever
    /// quotes it holds, and its echo holds no marker.
    #[test]
    fn posix_line_never_loses_its_end_marker() {
        let line = wrap_posix("echo 'unbalanced", "abc123", false);
        assert!(!line.contains('\x1b'));
        let out = std::process::Command::new("bash")
            .args(["-c", &line])
            .output()
            .unwrap();
        let o = String::from_utf8_lossy(&out.stdout);
        assert!(o.starts_with("\x1b]6973;Babc123;"), "{o:?}");
        assert!(o.ends_with("\x1b]6973;Eabc123;2\x07"), "{o:?}");
    }
}
