//! What a human is shown of a question (`sandmux approvals`, the attach
//! line, the MCP client's elicitation): sandmux's own rows and fields hold
//! only values sandmux checked, and the agent's words appear only in their
//! container, on lines labelled as the agent's.
//!
//! The agent chooses a tool call's arguments. Escaping controls is not
//! enough: plain text and runs of spaces, wrapped by a terminal, draw a
//! line that looks like one of sandmux's own question rows. So:
//! - a question's row (number, kind, name, times) names only what
//!   [`checked_name_in`] accepts: a tool of the catalog, or `scheme://host:port`
//!   with the proxy's canonical host (letters, digits, `-`, `_`, dots: no
//!   space and none of the punctuation a row is made of);
//! - the arguments are JSON text ([`detail`]): every character outside
//!   printable ASCII, and every space that follows a space, written
//!   `\uXXXX`, so no newline, no run of spaces, nothing that acts on a
//!   terminal; it parses back to the very arguments (unless cut);
//! - on a terminal they are shown only on lines starting [`LABEL`], in
//!   pieces ([`chunks`]) that fit the terminal's width: the terminal never
//!   wraps the agent's text onto a line of its own.

use serde_json::Value;

/// Longest arguments shown with a question, in bytes of [`detail`] text.
pub(crate) const DETAIL_MAX: usize = 300;

/// What every line of the agent's text starts with, and nothing else does.
pub(crate) const LABEL: &str = "    agent wrote: ";

/// A call's arguments as a human is shown them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Detail {
    /// JSON text, printable ASCII with no two spaces in a row.
    pub(crate) text: String,
    /// When cut: the length of the whole arguments' JSON, in bytes.
    pub(crate) cut_from: Option<usize>,
}

/// The arguments as compact JSON, escaped as the module says, cut between
/// escaped forms to at most [`DETAIL_MAX`] bytes.
pub(crate) fn detail(args: &Value) -> Detail {
    let json = serde_json::to_string(args).unwrap_or_default();
    let mut text = String::with_capacity(json.len().min(DETAIL_MAX + 8));
    let mut prev = '\0';
    for c in json.chars() {
        if text.len() > DETAIL_MAX {
            break;
        }
        match c {
            ' ' if prev == ' ' => text.push_str("\\u0020"),
            ' '..='~' => text.push(c),
            c => {
                for u in c.encode_utf16(&mut [0u16; 2]) {
                    text.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
        prev = c;
    }
    if text.len() <= DETAIL_MAX {
        return Detail {
            text,
            cut_from: None,
        };
    }
    let end = chunks(&text, DETAIL_MAX).first().map_or(0, |c| c.len());
    text.truncate(end);
    Detail {
        text,
        cut_from: Some(json.len()),
    }
}

/// The escaped forms of [`detail`] text (`\uXXXX`, `\"`, `\\`, `\n`…) and
/// its plain characters, each whole.
fn tokens(s: &str) -> impl Iterator<Item = &str> {
    let mut rest = s;
    std::iter::from_fn(move || {
        let b = rest.as_bytes();
        let len = match (b.first()?, b.get(1)) {
            (b'\\', Some(b'u')) => 6,
            (b'\\', Some(_)) => 2,
            _ => rest.chars().next().map_or(1, char::len_utf8),
        };
        let len = len.min(rest.len());
        let (t, r) = rest.split_at(len);
        rest = r;
        Some(t)
    })
}

/// `s` in pieces of at most `width` bytes (at least one escaped form
/// each), never cutting an escaped form.
pub(crate) fn chunks(s: &str, width: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut end) = (0, 0);
    for t in tokens(s) {
        if end > start && end + t.len() - start > width {
            out.push(&s[start..end]);
            start = end;
        }
        end += t.len();
    }
    if end > start {
        out.push(&s[start..end]);
    }
    out
}

/// The lines a terminal `cols` wide shows the agent's text on: each starts
/// [`LABEL`] and none is wider than `cols - 1` (down to a floor of 16
/// bytes of text a line).
pub(crate) fn labelled(text: &str, cols: usize) -> Vec<String> {
    let width = cols.saturating_sub(LABEL.len() + 1).max(16);
    chunks(text, width)
        .into_iter()
        .map(|c| format!("{LABEL}{c}"))
        .collect()
}

/// A question's name, when it is of sandmux's own form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Name<'a> {
    /// `tool NAME`: a tool of the catalog.
    Tool(&'static str),
    /// `http://host:port` or `https://host:port`, the host canonical.
    Host(&'a str),
}

/// `name` when sandmux could have written it (the proxy's canonical names,
/// the catalog's tools: `tool` gives a tool's name as the catalog spells it,
/// the protocol layer's `mcp::shown::checked_name` hands in the catalog);
/// anything else is not shown as sandmux's.
pub(crate) fn checked_name_in<'a>(
    name: &'a str,
    tool: &dyn Fn(&str) -> Option<&'static str>,
) -> Option<Name<'a>> {
    if let Some(t) = name.strip_prefix("tool ") {
        return tool(t).map(Name::Tool);
    }
    let (scheme, rest) = name.split_once("://")?;
    let (host, port) = rest.rsplit_once(':')?;
    let port_ok = !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u16>().is_ok_and(|p| p > 0);
    let host_ok = crate::profile::allow::name::canonical(host).is_ok_and(|c| c == host);
    (matches!(scheme, "http" | "https") && port_ok && host_ok).then_some(Name::Host(name))
}

#[cfg(test)]
mod tests;
