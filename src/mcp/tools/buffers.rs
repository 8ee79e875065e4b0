//! Buffer tools: buffers are sandmux's own (named [`super::BUFFER_PREFIX`]
//! plus a label and a nonce), made over the control connection, never from
//! a file.

use super::read::{caps, Captured};
use super::{buffer_name, done, Done, BUFFER_PREFIX};
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::text;
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `load_buffer`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct LoadBuffer {
    /// The text to store.
    pub content: String,
    /// A label ([A-Za-z0-9_.-], at most 64) that becomes part of the name.
    pub logical_name: Option<String>,
}

/// A buffer reference.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct BufferRef {
    /// The buffer's name; pass it to paste_buffer, show_buffer, delete_buffer.
    pub buffer_name: String,
    /// Bytes stored.
    pub bytes: usize,
}

/// Stores text in a new buffer.
pub(crate) async fn load_buffer(c: &Call<'_>, a: LoadBuffer) -> Result<BufferRef, ToolError> {
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

/// `show_buffer`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ShowBuffer {
    /// A name returned by load_buffer.
    pub buffer_name: String,
    /// Line cap (default 500).
    pub max_lines: Option<usize>,
}

/// Shows a buffer.
pub(crate) async fn show_buffer(c: &Call<'_>, a: ShowBuffer) -> Result<Captured, ToolError> {
    buffer_name(&a.buffer_name)?;
    let r =
        c.s.hub()
            .run_checked(&Cmd::new("show-buffer").opt("-b", &a.buffer_name))
            .await?;
    let t: String = r.iter().map(|l| text::clean(l) + "\n").collect();
    let (l, b) = caps(a.max_lines, None);
    Ok(Captured {
        source: a.buffer_name,
        content: text::cap(&t, l, b),
    })
}

/// `delete_buffer`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct DeleteBuffer {
    /// A name returned by load_buffer.
    pub buffer_name: String,
}

/// Deletes a buffer.
pub(crate) async fn delete_buffer(c: &Call<'_>, a: DeleteBuffer) -> Result<Done, ToolError> {
    buffer_name(&a.buffer_name)?;
    c.s.hub()
        .run(&Cmd::new("delete-buffer").opt("-b", &a.buffer_name))
        .await?;
    done(format!("buffer {} deleted", a.buffer_name))
}
