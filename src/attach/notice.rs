//! The bottom row of `sandmux attach`: its text (the instance, the mode, the
//! open approval questions), capped to the terminal's width, and when it may
//! be drawn: only between the tmux client's escape sequences and characters,
//! which the `vte` parser tells.
//!
//! The text is ASCII: agent-chosen strings are escaped ([`crate::term::printable`])
//! and so is every other non-ASCII character, so one byte is one column in
//! every terminal and the line can be cut exactly, never wrapping or
//! scrolling the screen.

use crate::mcp::shown::checked_name;
use serde_json::Value;

/// The line for an instance: `approvals` is the endpoint's answer (`None`
/// for an instance without one, `sandmux run`).
pub(crate) fn text(
    id: &str,
    read_write: bool,
    approvals: Option<Result<Value, super::AttachError>>,
) -> String {
    let mode = if read_write {
        "read-write"
    } else {
        "read-only"
    };
    let head = format!("sandmux {} {mode}", ascii(id));
    let v = match approvals {
        None => return head,
        Some(Err(e)) => return format!("{head}: questions unknown: {}", ascii(&e.to_string())),
        Some(Ok(v)) => v,
    };
    let open = v["approvals"]["open"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if open.is_empty() {
        return format!("{head}: no questions");
    }
    let each: Vec<String> = open.iter().map(question).collect();
    let (n, one) = (open.len(), open.len() == 1);
    format!(
        "{head}: {n} question{}: {}{HINT} - sandmux approvals {}",
        if one { "" } else { "s" },
        each.join(", "),
        ascii(id)
    )
}

/// Between the line and the part of it shown only when there is room (the
/// command that answers). A tab never occurs in [`ascii`] text.
const HINT: char = '\t';

/// One open question: `#3 https://example.org:443 56s`; a long name is cut
/// (the whole line is cut again to the terminal's width). Only a name of
/// sandmux's own form is shown (a catalog tool, a canonical host: no space
/// or comma to draw a question of its own); a tool call's arguments, the
/// agent's words, never are (`sandmux approvals` shows them, labelled).
fn question(q: &Value) -> String {
    let raw = q["name"].as_str().unwrap_or("");
    let name = match checked_name(raw) {
        Some(_) => ascii(raw),
        None => "(a name not of sandmux's form)".into(),
    };
    let left = q["deny_in_s"]
        .as_u64()
        .map(|s| format!(" {s}s"))
        .unwrap_or_default();
    let n = q["question"].as_u64().map_or("?".into(), |n| n.to_string());
    format!("#{n} {}{left}", fit(&name, 80))
}

/// [`crate::term::printable`], and every non-ASCII character escaped too:
/// `\u{263a}`. Nothing in it acts on a terminal, and its width is its length.
pub(crate) fn ascii(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in crate::term::printable(s).chars() {
        match c.is_ascii() {
            true => out.push(c),
            false => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    out
}

/// `s` (ASCII, as [`ascii`] makes it) in at most `cols` columns: cut between
/// escaped forms (never inside `\x1b` or `\u{…}`), ending `...` when cut.
pub(crate) fn fit(s: &str, cols: usize) -> String {
    if s.len() <= cols {
        return s.to_string();
    }
    let room = cols.saturating_sub(3);
    let mut end = 0;
    for (start, len) in tokens(s) {
        if start + len > room {
            break;
        }
        end = start + len;
    }
    format!("{}{}", &s[..end], &"..."[..cols.min(3)])
}

/// The escaped forms `printable` writes (`\\`, `\xNN`, `\u{…}`) and the
/// plain characters of an ASCII string, as (start, length).
fn tokens(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let len = match (b[i], b.get(i + 1)) {
            (b'\\', Some(b'x')) => 4,
            (b'\\', Some(b'u')) => s[i..].find('}').map_or(1, |j| j + 1),
            (b'\\', Some(_)) => 2,
            _ => 1,
        };
        let len = len.min(b.len() - i);
        out.push((i, len));
        i += len;
    }
    out
}

/// `line` in `cols` columns: with its hint when both fit, else the line cut.
fn shown(line: &str, cols: usize) -> String {
    match line.split_once(HINT) {
        Some((main, hint)) if main.len() + hint.len() <= cols => format!("{main}{hint}"),
        Some((main, _)) => fit(main, cols),
        None => fit(line, cols),
    }
}

/// The bytes that draw `line` on `row` (1-based) of a terminal `cols` wide
/// and put everything back: save the cursor (with its attributes, charset
/// and origin mode), absolute addressing, the plain charset, reset
/// attributes, erase the row, the line in reverse video, restore. One column
/// stays free, so the cursor never reaches the last cell (no pending wrap).
pub(crate) fn draw(row: u16, cols: u16, line: &str) -> Vec<u8> {
    let shown = shown(line, usize::from(cols.saturating_sub(1)));
    format!("\x1b7\x1b[?6l\x1b(B\x0f\x1b[{row};1H\x1b[0m\x1b[2K\x1b[7m{shown}\x1b[0m\x1b8")
        .into_bytes()
}

/// Whether the output so far ends between sequences (the parser's ground
/// state), as the `vte` parser sees it. It is fed one byte at a time and
/// believes ground only when a byte completed something that ends there: a
/// character, a CSI, ESC or OSC sequence, a DCS string. Unsure is "not at a
/// boundary": the line waits for the next one.
pub(crate) struct Boundary {
    parser: vte::Parser,
    ground: bool,
}

/// What one byte made the parser do.
#[derive(Default)]
struct Seen {
    ended: bool,
    executed: bool,
}

impl vte::Perform for Seen {
    fn print(&mut self, _: char) {
        self.ended = true;
    }
    fn execute(&mut self, _: u8) {
        self.executed = true;
    }
    fn unhook(&mut self) {
        self.ended = true;
    }
    fn osc_dispatch(&mut self, _: &[&[u8]], _: bool) {
        self.ended = true;
    }
    fn csi_dispatch(&mut self, _: &vte::Params, _: &[u8], _: bool, _: char) {
        self.ended = true;
    }
    fn esc_dispatch(&mut self, _: &[u8], _: bool, _: u8) {
        self.ended = true;
    }
}

impl Boundary {
    pub(crate) fn new() -> Self {
        Self {
            parser: vte::Parser::new(),
            ground: true,
        }
    }

    /// Takes the next output bytes.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            let mut seen = Seen::default();
            self.parser.advance(&mut seen, &[b]);
            self.ground = match b {
                // ESC starts a sequence wherever it is (an OSC or DCS string
                // it ends is dispatched on it, but ST's `\` is still to come).
                0x1b => false,
                // CAN and SUB cancel any sequence.
                0x18 | 0x1a => true,
                _ if seen.ended => true,
                // A C0 control is executed in the middle of a CSI or ESC
                // sequence as well as between them: no change.
                _ if seen.executed => self.ground,
                _ => false,
            };
        }
    }

    /// Whether bytes of our own may go in now.
    pub(crate) fn at_ground(&self) -> bool {
        self.ground
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attach::AttachError::Endpoint;
    use serde_json::json;

    #[test]
    fn the_line_says_what_waits() {
        assert_eq!(text("3f2a", false, None), "sandmux 3f2a read-only");
        let none = json!({"ok": true, "approvals": {"open": []}});
        assert_eq!(
            text("3f2a", true, Some(Ok(none))),
            "sandmux 3f2a read-write: no questions"
        );
        let two = json!({"ok": true, "approvals": {"open": [
            {"question": 3, "kind": "network", "name": "https://example.org:443", "deny_in_s": 56},
            {"question": 4, "kind": "tool", "name": "tool kill_session", "deny_in_s": 9},
        ]}});
        assert_eq!(
            text("3f2a", false, Some(Ok(two.clone()))),
            "sandmux 3f2a read-only: 2 questions: #3 https://example.org:443 56s, #4 tool kill_session 9s\t - sandmux approvals 3f2a"
        );
        let t = text("3f2a", false, Some(Ok(two)));
        assert!(shown(&t, 200).ends_with("9s - sandmux approvals 3f2a"));
        assert!(shown(&t, 80).ends_with("..."), "{}", shown(&t, 80));
        let one = json!({"ok": true, "approvals": {"open": [{"question": 1, "name": "http://a.test:80", "deny_in_s": 7}]}});
        let t = text("5f2867f6ee69", false, Some(Ok(one)));
        assert_eq!(
            shown(&t, 79),
            "sandmux 5f2867f6ee69 read-only: 1 question: #1 http://a.test:80 7s"
        );
        let e = text("3f2a", false, Some(Err(Endpoint("refused\x1b[2J".into()))));
        assert_eq!(
            e,
            "sandmux 3f2a read-only: questions unknown: refused\\x1b[2J"
        );
    }

    #[test]
    fn hostile_names_are_inert_ascii_and_cut_whole() {
        let q = json!({"ok": true, "approvals": {"open": [
            {"question": 1, "name": "a\x1b[999;1HFAKE\u{9b}2J\u{202e}\u{4e2d}\u{301}\r\n\x07", "deny_in_s": 5},
        ]}});
        let line = text("x", false, Some(Ok(q)));
        // Not of sandmux's form: not shown at all.
        assert!(
            line.starts_with(
                "sandmux x read-only: 1 question: #1 (a name not of sandmux's form) 5s"
            ),
            "{line}"
        );
        let t = &ascii("a\x1b[999;1HFAKE\u{9b}2J\u{202e}\u{4e2d}\u{301}\r\n\x07");
        assert!(t.bytes().all(|b| (0x20..0x7f).contains(&b)), "{t}");
        assert_eq!(
            t,
            "a\\x1b[999;1HFAKE\\x9b2J\\u{202e}\\u{4e2d}\\u{301}\\x0d\\x0a\\x07"
        );
        for cols in 0..t.len() + 2 {
            let f = fit(t, cols);
            assert!(f.len() <= cols, "{cols}: {f}");
            let body = f.trim_end_matches('.');
            assert!(t.starts_with(body), "{cols}: {f}");
            // Never half an escaped form: what is kept ends where a token does.
            assert!(tokens(t).iter().any(|(s, l)| s + l == body.len()) || body.is_empty());
        }
        let d = String::from_utf8(draw(24, 20, t)).unwrap();
        assert!(d.starts_with("\x1b7") && d.ends_with("\x1b8") && d.contains("\x1b[24;1H"));
    }

    #[test]
    fn a_name_cannot_draw_a_question_of_its_own() {
        // Positive control: the same text as a name of sandmux's form
        // would be a second question on the line.
        let forged = "https://a.test:443 5s, #2 tool kill_session";
        let q = |name: &str| json!({"approvals": {"open": [{"question": 1, "kind": "network", "name": name, "deny_in_s": 5}]}});
        let t = text("x", false, Some(Ok(q("https://a.test:443"))));
        assert!(t.contains("#1 https://a.test:443 5s"), "{t}");
        let naive = format!("#1 {forged} 5s");
        assert!(naive.contains("#2 tool kill_session"));
        let t = text("x", false, Some(Ok(q(forged))));
        assert!(!t.contains("#2") && !t.contains("kill_session"), "{t}");
    }

    #[test]
    fn the_boundary_is_between_sequences_and_characters() {
        let cases: &[(&[u8], bool)] = &[
            (b"plain", true),
            (b"\x1b", false),
            (b"\x1b[", false),
            (b"\x1b[3", false),
            (b"\x1b[31m", true),
            (b"\x1b[3\n", false),
            (b"\x1b[3\n1m", true),
            (b"\x1b]0;title", false),
            (b"\x1b]0;title\x07", true),
            (b"\x1b]0;title\x1b", false),
            (b"\x1b]0;title\x1b\\", true),
            (b"\x1bPtmux;x", false),
            (b"\x1bPtmux;x\x1b\\", true),
            (b"\xe4\xb8", false),
            (b"\xe4\xb8\xad", true),
            (b"\x1b(", false),
            (b"\x1b(B", true),
            (b"\x1b[1\x18", true),
            (b"a\r\n", true),
            (b"\x1b_apc", false),
        ];
        for (bytes, ground) in cases {
            let mut b = Boundary::new();
            b.feed(bytes);
            assert_eq!(b.at_ground(), *ground, "{bytes:?}");
            // Split anywhere: the same answer.
            for i in 0..bytes.len() {
                let mut b = Boundary::new();
                b.feed(&bytes[..i]);
                b.feed(&bytes[i..]);
                assert_eq!(b.at_ground(), *ground, "{bytes:?} at {i}");
            }
        }
    }
}
