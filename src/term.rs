//! Text for a human's terminal. Strings the agent chose (tool names, resource
//! URIs, request ids, client names, file and branch names, session names)
//! reach `journal`, `ps`, `check`, `attach`, errors and `serve`'s stderr; none
//! of their bytes may act on the terminal. [`printable`] shows every control
//! character escaped instead of emitting it: C0 and C1 controls and DEL (so no
//! escape sequence, clipboard write, cleared screen or carriage return that
//! overwrites a row), the Unicode bidirectional and line-separator controls
//! (which reorder or split what is shown), and the backslash itself, so an
//! escaped form can never be forged by a name that spells it out.

/// Characters that are not controls to Rust but still rearrange or hide
/// what a terminal shows: bidi embeddings, overrides, isolates and marks,
/// the Unicode line and paragraph separators, and the invisible format
/// characters (soft hyphen, zero-width spaces and joiners, word joiner and
/// invisible operators, the deprecated format controls, the byte-order mark,
/// interlinear annotation, and the tag characters, which can carry a whole
/// hidden text).
fn reorders(c: char) -> bool {
    matches!(c,
        '\u{00ad}' | '\u{061c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}' | '\u{e0000}'..='\u{e007f}')
}

/// `s` with every control character escaped: `\x1b`, `\u{202e}`, `\\`.
pub(crate) fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if c.is_control() && (c as u32) < 0x100 => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() || reorders(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// [`printable`] of a JSON value that should be a string (anything else
/// prints as its JSON text, escaped the same way); `dflt` when absent.
pub(crate) fn field(v: &serde_json::Value, dflt: &str) -> String {
    match v {
        serde_json::Value::String(s) => printable(s),
        serde_json::Value::Null => dflt.to_string(),
        other => printable(&other.to_string()),
    }
}

/// [`printable`] line by line: newlines stay, every other control is escaped.
pub(crate) fn lines(s: &str) -> String {
    s.split('\n').map(printable).collect::<Vec<_>>().join("\n")
}

/// [`lines`] for a message printed after a `sandmux: ` prefix: lines after
/// the first are indented, so none can pass for a message of its own.
pub(crate) fn message(s: &str) -> String {
    lines(s).replace('\n', "\n  ")
}

/// JSON text safe for a terminal: `serde_json` output with the characters
/// JSON leaves raw (DEL, C1 controls, bidi and line separators) written as
/// `\uXXXX`. Still valid JSON, parsing to the same value; outside strings
/// JSON text is plain ASCII, so escaping every such character is exact.
pub(crate) fn json_text(v: &serde_json::Value) -> String {
    inert_json(v.to_string())
}

/// [`json_text`] of JSON text already written (e.g. pretty-printed).
pub(crate) fn inert_json(raw: String) -> String {
    if raw.is_ascii() && !raw.contains('\x7f') {
        return raw;
    }
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        if c == '\x7f' || (c.is_control() && c as u32 >= 0x80) || reorders(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// A writer whose text reaches a terminal through [`lines`]: what the
/// program formats keeps its newlines, and nothing inside can act.
pub(crate) struct Safe<W: std::io::Write>(pub W);

impl<W: std::io::Write> std::io::Write for Safe<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // `write!` hands over whole `str` pieces, so lossy decoding never
        // splits a character that was whole.
        self.0
            .write_all(lines(&String::from_utf8_lossy(buf)).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_acts_on_a_terminal() {
        let hostile = "a\x1b]52;c;aGk=\x07b\x1b[2J\r\u{9b}31m\u{202e}gpj.exe\u{2028}\x7f\\x1b";
        let p = printable(hostile);
        assert_eq!(
            p,
            "a\\x1b]52;c;aGk=\\x07b\\x1b[2J\\x0d\\x9b31m\\u{202e}gpj.exe\\u{2028}\\x7f\\\\x1b"
        );
        assert!(p.chars().all(|c| !c.is_control() && !reorders(c)));
        let hidden = "ok\u{e0041}\u{e0042}\u{200b}\u{feff}\u{ad}";
        assert_eq!(
            printable(hidden),
            "ok\\u{e0041}\\u{e0042}\\u{200b}\\u{feff}\\u{ad}"
        );
        assert_eq!(message("a\nsandmux: forged"), "a\n  sandmux: forged");
        assert_eq!(printable("plain/path ünïcode"), "plain/path ünïcode");
        assert_eq!(lines("a\nb\x1b"), "a\nb\\x1b");
    }

    #[test]
    fn json_stays_json_and_inert() {
        let v = serde_json::json!({"tool": "x\u{9b}2J\u{7f}\u{202e}\x1b", "n": 1});
        let t = json_text(&v);
        assert!(t.is_ascii(), "{t}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&t).unwrap(), v);
    }
}
