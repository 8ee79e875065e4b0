//! Typing into a pane: text and keys, batches of them, and pastes (of text,
//! or of a buffer made by load_buffer).

use super::read::cursor_for;
use super::{batch_rules, buffer_name, BUFFER_PREFIX};
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::targets::{self, PaneRef, PaneSel};
use crate::mcp::text;
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Keys: one name (or several separated by spaces), or a list of names.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum Keys {
    One(String),
    Many(Vec<String>),
}

/// `send_keys`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SendKeys {
    /// Text typed literally.
    pub text: Option<String>,
    /// Key names pressed after the text, e.g. ["C-c"] or "Escape".
    pub keys: Option<Keys>,
    #[serde(flatten)]
    pub p: PaneSel,
    /// Press Enter after `text` (default true).
    pub enter: Option<bool>,
    /// Type a string `keys` as text.
    #[serde(default)]
    pub literal: bool,
    /// Prefix a space (keeps the text out of shell history).
    #[serde(default)]
    pub suppress_history: bool,
}

/// What was sent.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Sent {
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

async fn send_one(c: &Call<'_>, pane: &PaneRef, a: &SendKeys) -> Result<Sent, ToolError> {
    let (text_in, mut keys) = what_to_send(a, c.s.max_input)?;
    let bytes = text_in.as_ref().map_or(0, String::len);
    let enter = text_in.is_some() && a.enter.unwrap_or(true);
    let (offset, _) = c.s.hub().subscribe(pane.num);
    let cursor = cursor_for(c, pane.num, offset);
    let typed = text_in.as_ref().filter(|t| !t.is_empty());
    let cmds = writes(&pane.pane_id, typed, &keys, enter);
    if enter {
        keys.push("Enter".into());
    }
    let replies =
        c.s.hub()
            .run_many(&cmds)
            .await
            .map_err(|e| pane.gone(e.into()))?;
    // Keys in a mode other than copy or view mode (customize, tree, buffer
    // mode) can set options with no command in tmux's log: the next call
    // waits for a full drift scan, as after a call that changes tmux.
    let mode = replies
        .first()
        .filter(|_| typed.is_none())
        .and_then(|r| r.first());
    if mode.is_some_and(|m| !m.is_empty() && m != b"copy-mode" && m != b"view-mode") {
        c.s.drift.after_call();
    }
    Ok(Sent {
        pane_id: pane.pane_id.clone(),
        text_bytes: bytes,
        keys,
        cursor,
    })
}

/// The text (checked, with the history-suppressing space) and the key
/// names (checked) one `send_keys` asks for.
fn what_to_send(
    a: &SendKeys,
    max_input: usize,
) -> Result<(Option<String>, Vec<String>), ToolError> {
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
    if keys.len() > text::MAX_KEYS {
        return Err(ToolError::invalid(
            "keys",
            &format!("{} key names; at most {} in one call", keys.len(), text::MAX_KEYS),
            "split them over several send_keys calls (or send_keys_batch), or type literal text with the `text` argument",
        ));
    }
    for k in &keys {
        text::key(k)?;
    }
    let text_in = match &text_in {
        Some(t) => {
            text::input("text", t, max_input)?;
            Some(if a.suppress_history {
                format!(" {t}")
            } else {
                t.clone()
            })
        }
        None => None,
    };
    Ok((text_in, keys))
}

/// One write: out of copy mode (typing would drive it), the text, the
/// keys, Enter. tmux refuses each if the pane is not there. Keys alone go
/// to the pane's mode, if it is in one; which mode is read in the same
/// write (its reply is the first).
fn writes(pane_id: &str, typed: Option<&String>, keys: &[String], enter: bool) -> Vec<Cmd> {
    let target = || Cmd::new("send-keys").opt("-t", pane_id);
    let mut cmds = Vec::new();
    if let Some(t) = typed {
        cmds.push(Cmd::new("copy-mode").flag("-q").opt("-t", pane_id));
        cmds.push(target().flag("-l").rest([t.as_bytes()]));
    } else {
        cmds.push(
            Cmd::new("display-message")
                .flag("-p")
                .opt("-t", pane_id)
                .arg("#{pane_mode}"),
        );
    }
    if !keys.is_empty() {
        cmds.push(target().rest(keys.iter().map(|k| k.as_bytes())));
    }
    if enter {
        cmds.push(target().arg("Enter"));
    }
    cmds
}

/// Types text and/or presses keys.
pub(crate) async fn send_keys(c: &Call<'_>, a: SendKeys) -> Result<Sent, ToolError> {
    let p = targets::pane_ref(c, &a.p).await?;
    send_one(c, &p, &a).await
}

/// `send_keys_batch`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SendBatch {
    /// 1–100 operations, each with send_keys's arguments (described there).
    #[schemars(transform = crate::mcp::schema::undescribed_items)]
    pub operations: Vec<SendKeys>,
    /// After an error (default: stop).
    pub on_error: Option<crate::mcp::choices::OnError>,
    /// Seconds for the whole batch.
    pub timeout: Option<f64>,
}

/// One batch result.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct BatchSentItem {
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
pub(crate) struct BatchSent {
    /// Results in order.
    pub results: Vec<BatchSentItem>,
}

/// Sends several operations.
pub(crate) async fn send_keys_batch(c: &Call<'_>, a: SendBatch) -> Result<BatchSent, ToolError> {
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
    let stop = batch_rules(a.operations.len(), a.on_error)?;
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
        let r = match targets::pane_ref(c, &op.p).await {
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
pub(crate) struct PasteText {
    /// The text (multi-line is fine).
    pub text: String,
    #[serde(flatten)]
    pub p: PaneSel,
    /// Bracketed paste (default true).
    pub bracket: Option<bool>,
}

/// Pastes text through a temporary buffer.
pub(crate) async fn paste_text(c: &Call<'_>, a: PasteText) -> Result<Sent, ToolError> {
    text::input("text", &a.text, c.s.max_input)?;
    let p = targets::pane(c, &a.p).await?;
    let name = format!("{}paste_{}", BUFFER_PREFIX, &crate::nonce::hex()[..8]);
    let (offset, _) = c.s.hub().subscribe(p.num);
    let cursor = cursor_for(c, p.num, offset);
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
pub(crate) struct PasteBuffer {
    /// A name returned by load_buffer.
    pub buffer_name: String,
    #[serde(flatten)]
    pub p: PaneSel,
    /// Bracketed paste (default true).
    pub bracket: Option<bool>,
}

/// Pastes a buffer.
pub(crate) async fn paste_buffer(c: &Call<'_>, a: PasteBuffer) -> Result<Sent, ToolError> {
    buffer_name(&a.buffer_name)?;
    let p = targets::pane(c, &a.p).await?;
    let (offset, _) = c.s.hub().subscribe(p.num);
    let cursor = cursor_for(c, p.num, offset);
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
