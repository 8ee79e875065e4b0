//! Text rules for what crosses the MCP boundary: names and titles that tmux
//! would expand as formats, key names, environment names, and pane output
//! turned into plain text with explicit caps.

use super::error::ToolError;

/// A name or title: 1–128 characters, no control characters.
pub(crate) fn name(arg: &str, s: &str) -> Result<(), ToolError> {
    if s.is_empty() || s.chars().count() > 128 {
        return Err(ToolError::invalid(
            arg,
            "must be 1-128 characters",
            "pick a shorter name",
        ));
    }
    if s.chars().any(|c| c.is_control()) {
        return Err(ToolError::invalid(
            arg,
            "contains a control character",
            "use printable text",
        ));
    }
    Ok(())
}

/// A session name: a name without `:` or `.` (tmux target separators).
pub(crate) fn session_name(arg: &str, s: &str) -> Result<(), ToolError> {
    name(arg, s)?;
    if s.contains(':') || s.contains('.') {
        return Err(ToolError::invalid(
            arg,
            "contains ':' or '.'",
            "tmux uses them to separate targets; choose another name",
        ));
    }
    if s.starts_with(super::targets::RESERVED_PREFIX) {
        return Err(ToolError::refused(format!(
            "{arg}: names starting with '{}' are reserved for sandmux",
            super::targets::RESERVED_PREFIX
        )));
    }
    Ok(())
}

/// Text input capped at the profile's `max_input_bytes`, without NUL bytes.
pub(crate) fn input(arg: &str, s: &str, max: usize) -> Result<(), ToolError> {
    if s.len() > max {
        return Err(ToolError::invalid(
            arg,
            &format!("is {} bytes; the limit is {max}", s.len()),
            "split it into several calls, or raise [mcp] max_input_bytes in your profile",
        ));
    }
    if s.contains('\0') {
        return Err(ToolError::invalid(arg, "contains a NUL byte", "remove it"));
    }
    Ok(())
}

/// Named keys tmux understands (besides single characters).
const KEYS: &[&str] = &[
    "Enter", "Escape", "Tab", "BTab", "Space", "BSpace", "Up", "Down", "Left", "Right", "Home",
    "End", "PageUp", "PgUp", "PPage", "PageDown", "PgDn", "NPage", "Insert", "IC", "Delete", "DC",
    "F1", "F2", "F3", "F4", "F5", "F6", "F7", "F8", "F9", "F10", "F11", "F12", "KP0", "KP1", "KP2",
    "KP3", "KP4", "KP5", "KP6", "KP7", "KP8", "KP9", "KP/", "KP*", "KP-", "KP+", "KP.", "KPEnter",
];

/// Longest key name (`C-M-S-BSpace` and the like are far shorter).
const KEY_MAX: usize = 32;
/// Most key names in one call: tmux parses them all as one command, and
/// thousands overflow its parser.
pub(crate) const MAX_KEYS: usize = 512;

/// Validates a tmux key name such as `C-c`, `M-x`, `Enter`, `S-Up`, `F5` or a
/// single character. Anything else is refused, never typed as text.
pub(crate) fn key(k: &str) -> Result<(), ToolError> {
    if k.len() > KEY_MAX {
        return Err(ToolError::invalid(
            "keys",
            &format!("{:?} is not a key name", shown(k)),
            "use names like C-c, Enter, Escape, Up, F5, M-x; send literal text with the `text` argument",
        ));
    }
    let mut rest = k;
    loop {
        match rest.get(..2) {
            Some("C-") | Some("M-") | Some("S-") if rest.len() > 2 => rest = &rest[2..],
            _ => break,
        }
    }
    let single = rest.chars().count() == 1 && !rest.chars().next().is_some_and(|c| c.is_control());
    if single || KEYS.contains(&rest) {
        Ok(())
    } else {
        Err(ToolError::invalid(
            "keys",
            &format!("{:?} is not a key name", shown(k)),
            "use names like C-c, Enter, Escape, Up, F5, M-x; send literal text with the `text` argument",
        ))
    }
}

/// Names that may not be set in the sandbox's environment.
pub(crate) fn env_name(
    arg: &str,
    n: &str,
    policy: &crate::profile::Policy,
) -> Result<(), ToolError> {
    let ok = !n.is_empty()
        && n.len() <= 128
        && !n.starts_with(|c: char| c.is_ascii_digit())
        && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        return Err(ToolError::invalid(
            arg,
            &format!("{n:?} is not a variable name"),
            "use letters, digits and _",
        ));
    }
    let _ = policy;
    if crate::profile::schema_is_forbidden_env(n) {
        return Err(ToolError::refused(format!("{arg}: {n} may not be set (tmux, sandmux, loader and session-bus variables act before or outside the pane's confinement)")));
    }
    Ok(())
}

/// An environment value: capped, no control characters but tab.
pub(crate) fn env_value(arg: &str, v: &str, max: usize) -> Result<(), ToolError> {
    input(arg, v, max)?;
    if v.chars().any(|c| c.is_control() && c != '\t') {
        return Err(ToolError::invalid(
            arg,
            "contains a control character",
            "use printable text",
        ));
    }
    Ok(())
}

/// Turns raw terminal output into plain text: escape sequences (CSI, OSC, DCS,
/// APC, PM, SOS and two-byte ESC sequences) are removed, `\r\n` becomes `\n`,
/// a lone `\r` and other control characters except `\n` and `\t` are dropped,
/// and invalid UTF-8 becomes U+FFFD. Nothing raw reaches the client (E3).
/// sandmux's own wrapper around a `run_command` line shows as the command.
pub(crate) fn clean(bytes: &[u8]) -> String {
    commands_as_typed(&clean_lines(bytes))
}

/// [`clean`] of a piece of a screen, for a caller that joins the pieces
/// and passes the whole to [`commands_as_typed`] (a wrapper may span them).
pub(crate) fn clean_lines(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            0x1b => {
                i += 1;
                match bytes.get(i) {
                    Some(b'[') => {
                        i += 1;
                        while i < bytes.len() && !(0x40..=0x7e).contains(&bytes[i]) {
                            i += 1;
                        }
                        i += 1;
                    }
                    Some(b']') | Some(b'P') | Some(b'_') | Some(b'^') | Some(b'X') => {
                        i += 1;
                        while i < bytes.len() {
                            if bytes[i] == 0x07 {
                                i += 1;
                                break;
                            }
                            if bytes[i] == 0x1b && bytes.get(i + 1) == Some(&b'\\') {
                                i += 2;
                                break;
                            }
                            i += 1;
                        }
                    }
                    Some(b'(') | Some(b')') | Some(b'*') | Some(b'+') | Some(b'#') | Some(b'%') => {
                        i += 2
                    }
                    Some(_) => i += 1,
                    None => {}
                }
            }
            b'\r' | b'\n' | b'\t' => {
                out.push(b);
                i += 1;
            }
            c if c < 0x20 || c == 0x7f => i += 1,
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    // C1 controls (U+0080–U+009F) act like escapes on some terminals: dropped too.
    let text: String = String::from_utf8_lossy(&out)
        .chars()
        .filter(|c| !('\u{80}'..='\u{9f}').contains(c))
        .collect();
    // The last piece has no line end yet (a prompt waiting for input, as
    // "$ "): its trailing spaces are content a wait may look for.
    let pieces: Vec<&str> = text.split('\n').collect();
    let last = pieces.len() - 1;
    pieces
        .iter()
        .enumerate()
        .map(|(i, l)| as_seen(l, i < last))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One line as a terminal leaves it: a carriage return goes back to the
/// line's start and what follows overwrites (a progress line is its last
/// state), and trailing padding of an ended line is gone.
fn as_seen(line: &str, ended: bool) -> String {
    let mut s = if line.contains('\r') {
        let mut cells: Vec<char> = Vec::new();
        let mut col = 0;
        for ch in line.chars() {
            if ch == '\r' {
                col = 0;
                continue;
            }
            match cells.get_mut(col) {
                Some(c) => *c = ch,
                None => cells.push(ch),
            }
            col += 1;
        }
        cells.into_iter().collect()
    } else {
        line.to_string()
    };
    if ended {
        s.truncate(s.trim_end_matches(' ').len());
    }
    s
}

/// Every `__sandmux_run NONCE 'CMD'` in `text` (the line `run_command`
/// types, as the shell echoes it) → `CMD`. The quoted command may run over
/// lines (a multi-line command, its continuation lines behind the shell's
/// `> `), and one line may hold it twice (typed ahead of the prompt: the
/// terminal's echo, then the line editor's). Anything not in the form
/// sandmux types is left as it is.
pub(crate) fn commands_as_typed(text: &str) -> String {
    const FN: &str = "__sandmux_run ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(FN) {
        out.push_str(&rest[..at]);
        let after = &rest[at + FN.len()..];
        match typed_command(after) {
            Some((cmd, used)) => {
                out.push_str(&cmd);
                rest = &after[used..];
            }
            None => {
                out.push_str(FN);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `NONCE 'CMD'…` → (CMD with `'\''` as `'`, bytes up to the closing quote).
fn typed_command(s: &str) -> Option<(String, usize)> {
    let nonce = s.get(..12)?;
    if !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let body = s.get(12..)?.strip_prefix(" '")?;
    let start = s.len() - body.len();
    let mut cmd = String::new();
    let mut i = 0;
    loop {
        let quote = i + body[i..].find('\'')?;
        cmd.push_str(&body[i..quote]);
        if body[quote..].starts_with("'\\''") {
            cmd.push('\'');
            i = quote + 4;
        } else {
            return Some((cmd, start + quote + 1));
        }
    }
}

/// Text kept within a line and byte budget, tail first.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub(crate) struct Capped {
    /// The text (the tail when cut).
    pub text: String,
    /// Lines returned.
    pub lines: usize,
    /// Whether lines or bytes were cut from the head.
    pub truncated: bool,
    /// Lines cut from the head.
    pub truncated_lines: usize,
}

/// Keeps the last `max_lines` lines and at most `max_bytes` bytes of `text`.
pub(crate) fn cap(text: &str, max_lines: usize, max_bytes: usize) -> Capped {
    let trimmed = text.strip_suffix('\n').unwrap_or(text);
    let all: Vec<&str> = if trimmed.is_empty() {
        vec![]
    } else {
        trimmed.split('\n').collect()
    };
    let mut keep: Vec<&str> = all.iter().rev().take(max_lines).copied().collect();
    keep.reverse();
    let mut joined = keep.join("\n");
    let mut cut_bytes = false;
    if joined.len() > max_bytes {
        let mut start = joined.len() - max_bytes;
        while !joined.is_char_boundary(start) {
            start += 1;
        }
        joined = joined[start..].to_string();
        cut_bytes = true;
    }
    let lines = if joined.is_empty() {
        0
    } else {
        joined.split('\n').count()
    };
    Capped {
        truncated: cut_bytes || lines < all.len(),
        truncated_lines: all.len().saturating_sub(lines),
        text: joined,
        lines,
    }
}

/// A string the client sent, as an error message quotes it: at most 200
/// characters, so no answer echoes megabytes back.
pub(crate) fn shown(s: &str) -> String {
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_like_a_terminal() {
        assert_eq!(clean(b"10%\r50%\r100%\r\n"), "100%\n");
        assert_eq!(clean(b"abcdef\rXY"), "XYcdef");
        assert_eq!(clean(b"x   \r\n  y  \n$ "), "x\n  y\n$ ");
        let typed = format!(
            "$  {}",
            crate::mcp::tools::commands::wrap("echo 'hi'", "0123456789ab", false)
        );
        assert_eq!(clean(typed.as_bytes()), "$  echo 'hi'");
        // Typed ahead of the prompt: the terminal's echo, then the line editor's.
        let twice = format!("{typed}user@box:~$ {}\r\nout\n", &typed[2..]);
        assert_eq!(
            clean(twice.as_bytes()),
            "$  echo 'hi'user@box:~$  echo 'hi'\nout\n"
        );
        // A multi-line command, its second line behind the shell's `> `.
        let multi = crate::mcp::tools::commands::wrap("echo a\necho 'b'", "0123456789ab", false);
        let shown = format!("$ {}\r\na\r\nb\r\n", multi.replace('\n', "\r\n> "));
        assert_eq!(clean(shown.as_bytes()), "$ echo a\n> echo 'b'\na\nb\n");
        // Not the form sandmux types: left as it is.
        for l in [
            "__sandmux_run 0123456789ab \"a\"",
            "__sandmux_run nothex000000 'a'",
            "__sandmux_run 0123456789ab 'open",
        ] {
            assert_eq!(clean(l.as_bytes()), l);
        }
    }

    #[test]
    fn keys() {
        for k in ["C-c", "Enter", "M-x", "C-M-a", "S-Up", "F5", "q", "KPEnter"] {
            assert!(key(k).is_ok(), "{k}");
        }
        for k in ["C-", "ls -la", "Entr", "C-cc", "\u{7}"] {
            assert!(key(k).is_err(), "{k}");
        }
    }

    #[test]
    fn cleaning() {
        assert_eq!(clean(b"\x1b[1;31mred\x1b[0m\r\nnext\r\n"), "red\nnext\n");
        assert_eq!(clean(b"a\x1b]52;c;ZXZpbA==\x07b\x1bP+q544e\x1b\\c"), "abc");
        assert_eq!(clean(b"bell\x07\x00\x7f"), "bell");
        assert_eq!(clean(b"\xff"), "\u{fffd}");
        assert_eq!(clean("a\u{9b}31mb".as_bytes()), "a31mb");
    }

    #[test]
    fn capping() {
        let c = cap("1\n2\n3\n4\n", 2, 1000);
        assert_eq!(
            (c.text.as_str(), c.lines, c.truncated, c.truncated_lines),
            ("3\n4", 2, true, 2)
        );
        let c = cap("abcdef", 10, 3);
        assert_eq!((c.text.as_str(), c.truncated), ("def", true));
        let c = cap("", 10, 10);
        assert_eq!((c.lines, c.truncated), (0, false));
    }

    #[test]
    fn literal_formats() {
        assert_eq!(
            crate::tmux::fmt_literal("a#(touch x)#{pid}"),
            "a##(touch x)##{pid}"
        );
    }
}
