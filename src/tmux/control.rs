//! The tmux control-mode protocol (`tmux -C`), parsed as bytes.
//!
//! Control mode sends one line per notification. Command replies are framed by
//! `%begin TIME NUMBER FLAGS` … `%end|%error TIME NUMBER FLAGS`; lines between
//! are the reply, taken verbatim. A block ends only on a guard line whose time,
//! number and flags all equal those of its `%begin`, so reply text (a pane
//! path, a name) cannot close it early unless it guesses all three — and
//! sandmux requests hostile strings with tmux's `q:` modifier, which escapes
//! every `%`, so no reply line it asks for can start with `%end`.
//!
//! `%output %PANE DATA` (and `%extended-output %PANE AGE ... : DATA` once flow
//! control is on) carry pane output with bytes below 32 and `\` escaped as
//! `\ooo` octal; everything else is raw bytes, not necessarily UTF-8.

/// One parsed control-mode event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A command reply.
    Reply {
        /// The command number tmux assigned.
        number: u64,
        /// Guard flags: 1 when the command came from this client.
        flags: u32,
        /// `%error` instead of `%end`.
        error: bool,
        /// Reply lines (without newlines).
        lines: Vec<Vec<u8>>,
    },
    /// Output of a pane, decoded.
    Output {
        /// Pane id number (`%3` → 3).
        pane: u32,
        /// The bytes the pane wrote.
        data: Vec<u8>,
    },
    /// tmux paused a pane's output to this client (flow control).
    Pause {
        /// Pane id number.
        pane: u32,
    },
    /// The client is exiting, with an optional reason.
    Exit(Option<String>),
    /// Any other notification line, raw.
    Notification(Vec<u8>),
}

/// Incremental parser: feed bytes as they arrive, get events.
#[derive(Debug, Default)]
pub struct Parser {
    buf: Vec<u8>,
    block: Option<(Guard, Vec<Vec<u8>>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Guard {
    time: u64,
    number: u64,
    flags: u32,
}

/// Upper bound for one line; longer lines are cut (tmux bounds its own lines,
/// so only a broken peer reaches this).
pub const MAX_LINE: usize = 4 << 20;

fn guard(line: &[u8], word: &[u8]) -> Option<Guard> {
    let rest = line.strip_prefix(word)?.strip_prefix(b" ")?;
    let s = std::str::from_utf8(rest).ok()?;
    let mut parts = s.split(' ');
    // Only tmux's own spelling: digits, no sign, no leading zero.
    fn num<T: std::str::FromStr>(p: Option<&str>) -> Option<T> {
        let p = p?;
        let canonical = !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_digit())
            && (p == "0" || !p.starts_with('0'));
        if canonical {
            p.parse().ok()
        } else {
            None
        }
    }
    let g = Guard {
        time: num(parts.next())?,
        number: num(parts.next())?,
        flags: num(parts.next())?,
    };
    if parts.next().is_some() {
        return None;
    }
    Some(g)
}

/// Decodes the `\ooo` escapes of a `%output` payload: the runs between
/// backslashes are copied whole, not byte by byte.
pub fn decode_output(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = next_backslash(rest) {
        out.extend_from_slice(&rest[..i]);
        let esc = &rest[i..];
        match esc.get(1..4) {
            Some(d) if d.iter().all(|c| (b'0'..=b'7').contains(c)) => {
                let v = (d[0] - b'0') as u32 * 64 + (d[1] - b'0') as u32 * 8 + (d[2] - b'0') as u32;
                out.push((v & 0xff) as u8);
                rest = &esc[4..];
            }
            _ => {
                out.push(b'\\');
                rest = &esc[1..];
            }
        }
    }
    out.extend_from_slice(rest);
    out
}

/// Where the next `\` is. Escapes come close together in terminal output
/// (CR LF after each short line, `yes`): the next few bytes are looked at by
/// hand before `memchr` takes the long runs.
fn next_backslash(s: &[u8]) -> Option<usize> {
    let near = s.len().min(16);
    match s[..near].iter().position(|&b| b == b'\\') {
        Some(i) => Some(i),
        None => memchr::memchr(b'\\', &s[near..]).map(|i| i + near),
    }
}

fn pane_id(s: &[u8]) -> Option<u32> {
    std::str::from_utf8(s.strip_prefix(b"%")?)
        .ok()?
        .parse()
        .ok()
}

impl Parser {
    /// A new parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; returns every event completed by them. A line wholly
    /// inside `bytes` is parsed where it lies; only a line split across
    /// reads is gathered in the buffer.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        let mut rest = bytes;
        while let Some(nl) = memchr::memchr(b'\n', rest) {
            let (head, tail) = rest.split_at(nl);
            let e = if self.buf.is_empty() {
                self.line(&head[..head.len().min(MAX_LINE)])
            } else {
                self.push(head);
                let line = std::mem::take(&mut self.buf);
                self.line(&line)
            };
            events.extend(e);
            rest = &tail[1..];
        }
        self.push(rest);
        events
    }

    /// Gathers part of a line, cut at [`MAX_LINE`].
    fn push(&mut self, bytes: &[u8]) {
        let room = MAX_LINE.saturating_sub(self.buf.len());
        self.buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    // tmux ends lines with `\n` alone; a `\r` before it is data (a value that
    // ends in CR) and is kept.
    fn line(&mut self, line: &[u8]) -> Option<Event> {
        if let Some((g, lines)) = &mut self.block {
            for (word, error) in [(&b"%end"[..], false), (&b"%error"[..], true)] {
                if guard(line, word) == Some(*g) {
                    let (g, lines) = self.block.take().expect("in a block");
                    return Some(Event::Reply {
                        number: g.number,
                        flags: g.flags,
                        error,
                        lines,
                    });
                }
            }
            lines.push(line.to_vec());
            return None;
        }
        if let Some(g) = guard(line, b"%begin") {
            self.block = Some((g, Vec::new()));
            return None;
        }
        if let Some(rest) = line.strip_prefix(b"%output ") {
            let sp = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
            if let Some(pane) = pane_id(&rest[..sp]) {
                let data = decode_output(rest.get(sp + 1..).unwrap_or(&[]));
                return Some(Event::Output { pane, data });
            }
        }
        if let Some(rest) = line.strip_prefix(b"%extended-output ") {
            let sp = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
            let colon = rest.windows(3).position(|w| w == b" : ");
            if let (Some(pane), Some(c)) = (pane_id(&rest[..sp]), colon) {
                return Some(Event::Output {
                    pane,
                    data: decode_output(&rest[c + 3..]),
                });
            }
        }
        if let Some(rest) = line.strip_prefix(b"%pause ") {
            if let Some(pane) = pane_id(rest) {
                return Some(Event::Pause { pane });
            }
        }
        if line == b"%exit" {
            return Some(Event::Exit(None));
        }
        if let Some(r) = line.strip_prefix(b"%exit ") {
            return Some(Event::Exit(Some(String::from_utf8_lossy(r).into_owned())));
        }
        if line.is_empty() {
            return None;
        }
        Some(Event::Notification(line.to_vec()))
    }
}

/// Encodes one argument for tmux's command parser: a double-quoted string in
/// which every byte outside a small safe set is an octal escape, so no quote,
/// `$`, `~`, `#`, `;`, `{` or newline in the text can change how tmux parses
/// the line. (Formats are a separate concern: see `mcp::crate::tmux::fmt_literal`.)
pub fn quote(arg: &[u8]) -> String {
    let safe = |b: u8| b.is_ascii_alphanumeric() || b"_./:,+=@-".contains(&b);
    if !arg.is_empty() && arg.iter().all(|&b| safe(b)) && arg[0] != b'-' {
        return String::from_utf8_lossy(arg).into_owned();
    }
    let mut s = String::with_capacity(arg.len() + 2);
    s.push('"');
    for &b in arg {
        if safe(b) {
            s.push(b as char);
        } else {
            s.push('\\');
            for shift in [6, 3, 0] {
                s.push(char::from(b'0' + ((b >> shift) & 7)));
            }
        }
    }
    s.push('"');
    s
}

/// Reverses tmux's `#{q:...}` escaping (a backslash before special characters).
pub fn unquote_q(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut it = s.iter();
    while let Some(&b) = it.next() {
        if b == b'\\' {
            if let Some(&n) = it.next() {
                out.push(n);
            }
        } else {
            out.push(b);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_blocks_and_output() {
        let mut p = Parser::new();
        let ev = p.feed(b"%begin 1 5 1\nline one\n%end 1 6 1\n%end 2 5 1\n%end 1 5 1\n%output %3 a\\015\\012b\\134\n%exit\n");
        assert_eq!(
            ev,
            vec![
                Event::Reply {
                    number: 5,
                    flags: 1,
                    error: false,
                    lines: vec![
                        b"line one".to_vec(),
                        b"%end 1 6 1".to_vec(),
                        b"%end 2 5 1".to_vec()
                    ]
                },
                Event::Output {
                    pane: 3,
                    data: b"a\r\nb\\".to_vec()
                },
                Event::Exit(None),
            ]
        );
    }

    #[test]
    fn split_feeds_errors_and_extended_output() {
        let mut p = Parser::new();
        assert!(p.feed(b"%begin 1 7 1\nno such").is_empty());
        let ev = p.feed(b" pane\n%error 1 7 1\n%extended-output %2 10 : hi\\012\n%pause %2\n");
        assert_eq!(
            ev,
            vec![
                Event::Reply {
                    number: 7,
                    flags: 1,
                    error: true,
                    lines: vec![b"no such pane".to_vec()]
                },
                Event::Output {
                    pane: 2,
                    data: b"hi\n".to_vec()
                },
                Event::Pause { pane: 2 },
            ]
        );
    }

    #[test]
    fn raw_high_bytes_survive() {
        assert_eq!(decode_output(b"\xff\xfe\\00"), b"\xff\xfe\\00".to_vec());
        assert_eq!(decode_output(b"\\033[0m"), b"\x1b[0m".to_vec());
        assert_eq!(decode_output(b"x\\1"), b"x\\1".to_vec());
    }

    #[test]
    fn quoting_round_trips_through_tmux_rules() {
        assert_eq!(quote(b"abc"), "abc");
        assert_eq!(quote(b""), "\"\"");
        assert_eq!(quote(b"-t"), "\"-t\"");
        assert_eq!(
            quote(b"a b;#{x}\n$HOME"),
            "\"a\\040b\\073\\043\\173x\\175\\012\\044HOME\""
        );
        assert_eq!(unquote_q(b"a\\ b\\%end\\\\"), b"a b%end\\".to_vec());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        for seed in 1..300u64 {
            let mut x = seed;
            let mut bytes = Vec::new();
            for _ in 0..2000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let choices: &[&[u8]] = &[
                    b"%begin 1 2 1\n",
                    b"%end 1 2 1\n",
                    b"%error 1 2 1\n",
                    b"%output %1 ",
                    b"%extended-output %1 3 : ",
                    b"\\0",
                    b"\\",
                    b"\n",
                    b"x",
                    b"\xff",
                    b"%exit\n",
                    b"%pause %9\n",
                ];
                bytes.extend_from_slice(choices[(x % choices.len() as u64) as usize]);
            }
            let mut p = Parser::new();
            for chunk in bytes.chunks((seed % 17 + 1) as usize) {
                let _ = p.feed(chunk);
            }
        }
    }
}
